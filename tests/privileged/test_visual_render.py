"""Visual renderer: real headless Chromium in a real helper sandbox over the renderer rootfs.

The rootfs (environments/visual/build/renderer_rootfs.py) and the CDN mirror
(environments/visual/build/cdn_mirror.py, npm registry) are built once and cached under
$CAMG_CACHE. Every test ends with the conftest's leak check (no sandbox,
cgroup, mount or process left), and the renderer sandbox itself has
loopback only.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

import conftest as pc
from camg import errors

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

STATIC_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><style>
* { box-sizing: border-box; }
body { margin: 0; font-family: "DejaVu Sans", sans-serif; background: #f4f1ea; }
header { height: 200px; background: #1d3557; color: #fff; padding: 48px; font-size: 40px; }
section { height: 700px; padding: 40px; border-bottom: 4px solid #e63946; }
@keyframes spin { from { transform: rotate(0) } to { transform: rotate(360deg) } }
.spin { width: 80px; height: 80px; background: #457b9d; animation: spin 1s linear infinite; }
</style></head><body>
<header>Known static page</header>
<section><p>First section, plain text in DejaVu Sans.</p><div class="spin"></div></section>
<section><p>Second section.</p></section>
</body></html>
"""

TAILWIND_PAGE = """<!DOCTYPE html>
<html><head><script src="https://cdn.jsdelivr.net/npm/@tailwindcss/browser@4"></script></head>
<body class="m-0"><div class="bg-red-600 text-white p-10 text-4xl font-bold">Styled</div>
<div class="h-[600px] bg-blue-500"></div></body></html>
"""


def dist_tar(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def renderer_dir(lower_root):
    from environments.visual.build.renderer_rootfs import ensure_renderer_rootfs
    return ensure_renderer_rootfs(lower_root)


@pytest.fixture(scope="module")
def mirror_manifest():
    from environments.visual.build.cdn_mirror import build_mirror
    return build_mirror(pc.CACHE / "visual" / "cdn-mirror")


@pytest.fixture
def renderer(client, renderer_dir, mirror_manifest):
    from environments.visual.render import Mirror, Renderer, RenderLimits
    info = json.loads((renderer_dir / "renderer.json").read_text())
    return Renderer(client, str(renderer_dir / "rootfs"), info, Mirror.load(mirror_manifest),
                    RenderLimits(timeout=90))


def _pixels(jpeg: bytes):
    from PIL import Image
    with Image.open(io.BytesIO(jpeg)) as im:
        return im.size, hashlib.sha256(im.convert("RGB").tobytes()).hexdigest(), im.convert("RGB")


def test_known_page_dimensions_and_stable_pixels(renderer):
    first = renderer.render(dist_tar({"index.html": STATIC_PAGE}))
    second = renderer.render(dist_tar({"./index.html": STATIC_PAGE}))
    # 1440 wide (the viewport), full page: a 200 px header and two 700 px sections.
    assert (first.width, first.height) == (1440, 1600) and not first.downscaled
    size1, pix1, im = _pixels(first.jpeg)
    size2, pix2, _ = _pixels(second.jpeg)
    assert size1 == size2 == (first.width, first.height)
    assert pix1 == pix2, "the same page must give the same pixels (fonts, animations frozen)"
    assert first.sha256 == second.sha256
    # Across runs: the first run on this machine records the checksum for
    # this renderer tree (its key pins the browser and font packages);
    # every later run must reproduce it.
    golden = pc.CACHE / "visual" / f"golden-{renderer.rootfs.split('/')[-2]}.json"
    golden.parent.mkdir(parents=True, exist_ok=True)
    if not golden.exists():
        golden.write_text(json.dumps({"pixels": pix1, "size": list(size1)}))
    assert json.loads(golden.read_text()) == {"pixels": pix1, "size": list(size1)}
    r, g, b = im.getpixel((10, 10))
    assert abs(r - 0x1d) < 12 and abs(g - 0x35) < 12 and abs(b - 0x57) < 12  # the header


def test_tailwind_from_local_mirror_is_styled(renderer):
    shot = renderer.render(dist_tar({"index.html": TAILWIND_PAGE}))
    _, _, im = _pixels(shot.jpeg)
    r, g, b = im.getpixel((20, 20))
    assert r > 180 and g < 60 and b < 60, "bg-red-600 must come from the mirrored Tailwind build"
    r, g, b = im.getpixel((20, 400))
    assert b > 200 and r < 100, "bg-blue-500"


def test_external_asset_outside_mirror_is_refused_and_the_page_shot_without_it(renderer):
    # A name no resolver answers: the route refuses the request before any
    # lookup, and the sandbox has loopback only, so nothing leaves the machine.
    page = ('<!DOCTYPE html><html><head><script src="https://cdn.example.invalid/lib.js">'
            '</script></head><body><h1 style="background:#1d3557;color:#fff">x</h1></body></html>')
    shot = renderer.render(dist_tar({"index.html": page}))
    assert shot.blocked == ("https://cdn.example.invalid/lib.js",)
    assert shot.width == 1440 and shot.height == 900 and "x" in shot.text


def test_a_page_taller_than_the_limit_is_shot_to_the_limit(renderer):
    from environments.visual.shot_script import MAX_HEIGHT
    page = ('<!DOCTYPE html><html><head><title>Tall</title></head><body style="margin:0">'
            '<div style="height:65000px;background:linear-gradient(#1d3557,#e63946)"></div>'
            '<nav aria-label="site menu"></nav><noscript>no script here</noscript></body></html>')
    shot = renderer.render(dist_tar({"index.html": page}))
    assert shot.clipped_from >= 65000 and shot.downscaled
    # downscaled from 1440 x MAX_HEIGHT to 20 MP, proportionally
    assert abs(shot.height / shot.width - MAX_HEIGHT / 1440) < 0.01
    # what is written for a reader but not drawn is read too
    assert all(t in shot.text for t in ("Tall", "site menu", "no script here"))


def test_missing_renderer_image_leaves_the_null_standing(client, renderer_dir, mirror_manifest,
                                                         tmp_path):
    """The renderer cannot start for a reason no page causes (its image is
    missing): the render fails, the control fails the same way, so the
    episode keeps reward null with failure class render_error."""
    import types

    from environments.visual import control
    from environments.visual.render import Mirror, Renderer, RenderLimits
    info = json.loads((renderer_dir / "renderer.json").read_text())
    gone = Renderer(client, str(renderer_dir.parent / "visual-renderer-missing" / "rootfs"), info,
                    Mirror.load(mirror_manifest), RenderLimits(timeout=60))
    with pytest.raises(errors.RenderError) as err:
        gone.render(dist_tar({"index.html": STATIC_PAGE}))
    assert err.value.failure_class == errors.FailureClass.RENDER_ERROR
    episode = types.SimpleNamespace(env=types.SimpleNamespace(renderer=gone), task=None,
                                    episode_id="e")
    with pytest.raises(errors.RenderError) as again:
        control.prove(episode, err.value, "step")
    assert again.value.failure_class == errors.FailureClass.RENDER_ERROR


def test_missing_index_renders_the_404_page(renderer):
    # Upstream's rule: not a drop; the loopback server's 404 page is what
    # gets screenshotted and judged.
    shot = renderer.render(dist_tar({"other.html": "<!DOCTYPE html><p>hi</p>"}))
    assert shot.width == 1440 and shot.height == 900


def test_browser_that_cannot_start_is_render_error(client, renderer_dir, mirror_manifest):
    from environments.visual.render import Mirror, Renderer, RenderLimits
    info = dict(json.loads((renderer_dir / "renderer.json").read_text()),
                browser="/usr/lib/chromium/no-such-browser")
    broken = Renderer(client, str(renderer_dir / "rootfs"), info, Mirror.load(mirror_manifest),
                      RenderLimits(timeout=60))
    with pytest.raises(errors.RenderError) as err:
        broken.render(dist_tar({"index.html": STATIC_PAGE}))
    assert err.value.details["reason"] == "browser"


def test_render_timeout_is_render_error(client, renderer_dir, mirror_manifest):
    from environments.visual.render import Mirror, Renderer, RenderLimits
    info = json.loads((renderer_dir / "renderer.json").read_text())
    slow = Renderer(client, str(renderer_dir / "rootfs"), info, Mirror.load(mirror_manifest),
                    RenderLimits(timeout=3))
    with pytest.raises(errors.RenderError) as err:
        slow.render(dist_tar({"index.html": STATIC_PAGE}))
    assert err.value.details["reason"] == "timeout"


def test_visual_canaries_lose_in_real_renderer_sandboxes(renderer, client, renderer_dir,
                                                        mirror_manifest):
    """environments/visual/checks/canaries.py: external and file: loads, symlinks out of
    dist/, a DOM rewritten after the screenshot, a WebSocket beyond loopback,
    fifos and devices, huge and crowded dist/ trees, text addressing the
    judge (plain, faint, CSS content, canvas, split over boxes, an SVG image)
    and the same in paraphrase (a paragraph, CSS attr(), <title>,
    aria-label, <noscript>, an SVG image), a renderer crash, a 65 000 px page, a render
    that never settles -- tampered or obstructed at 0.0, or exactly what the
    page earns without its trick; none ends null; nothing of ref/, etc/ or
    up/ reaches the renderer."""
    from environments.visual.render import Mirror, Renderer, RenderLimits
    from devtools.canary_table import render
    from environments.visual.checks import canaries

    info = json.loads((renderer_dir / "renderer.json").read_text())
    slow = Renderer(client, str(renderer_dir / "rootfs"), info, Mirror.load(mirror_manifest),
                    RenderLimits(timeout=20))
    results, checks = canaries.run(renderer.render, slow.render)
    text, failed = render("visual", results)
    print(text)
    assert not failed and not checks, text + "\n" + "\n".join(checks)
    by = {r.technique: r for r in results}
    assert all(r.reward is not None for r in results), "no canary may end null"
    assert by["base_page"].reward > 0.2
    assert by["after_screenshot_socket_fifo"].reward == by["base_page"].reward
    assert "websocket" in by["after_screenshot_socket_fifo"].detail
    assert "special_file" in by["after_screenshot_socket_fifo"].detail
    assert by["file_url_loads"].integrity == by["symlinks_out_of_dist"].integrity == "tampered"
    # external loads: refused, the page shot without them (its own score)
    for name in ("external_http_https", "external_load"):
        assert by[name].reward == by["base_page"].reward and "external_load x" in by[name].detail
    # what makes a render fail is the page's: the control page renders, 0.0 obstructed
    for name in ("renderer_crash", "never_settles"):
        for row in (by[name], by[name + "_alone"]):
            assert row.integrity == "obstructed" and row.reward == 0.0, row
    assert by["endless_animation"].reward <= by["base_page"].reward
    assert by["never_settles"].detail.startswith("timeout")
    assert by["huge_dist"].detail.startswith("dist_too_large")
    assert by["huge_dist"].integrity == by["many_entries"].integrity == "obstructed"
    assert "page_clipped x1" in by["huge_page"].detail
    assert by["huge_page"].reward <= by["base_page"].reward
    # text addressing the judge, however it is put on the page: read from the
    # render, tampered (the credulous vision judge they play gives them 1.0)
    judged = [r for r in results if r.technique in canaries.JUDGE_TEXT]
    assert len(judged) == len(canaries.JUDGE_TEXT) == 6
    assert all(r.integrity == "tampered" and r.reward == 0.0 for r in judged), judged
    # both screens: the rendered text (all but the SVG image, which shows no
    # text node) and dist/'s files
    assert all("judge_addressed x" in r.detail for r in judged
               if r.technique != "judge_text_svg_image"), judged
    assert all("judge_addressed_file x" in r.detail for r in judged), judged
    # paraphrases pass the rules; the judge's own address question finds
    # them. Those drawn in the screenshot win 1.0 before the credulous
    # vision judge without it.
    para = [r for r in results if r.technique.removesuffix("_alone") in canaries.PARAPHRASED]
    assert len(para) == 12
    for row in para:
        assert row.integrity == "tampered" and row.reward == 0.0, row
        assert "judge_addressed_model x1" in row.detail and "judge_addressed x" not in row.detail
    for name in ("paraphrase_paragraph", "paraphrase_css_attr", "paraphrase_svg_image"):
        assert "undefended 1.0000" in by[name].detail, by[name]
