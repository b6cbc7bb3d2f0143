"""Visual renderer: real headless Chromium in a real helper sandbox over the renderer rootfs.

The rootfs (tools/visual/renderer_rootfs.py) and the CDN mirror
(tools/visual/cdn_mirror.py, npm registry) are built once and cached under
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
    from tools.visual.renderer_rootfs import ensure_renderer_rootfs
    return ensure_renderer_rootfs(lower_root)


@pytest.fixture(scope="module")
def mirror_manifest():
    from tools.visual.cdn_mirror import build_mirror
    return build_mirror(pc.CACHE / "visual" / "cdn-mirror")


@pytest.fixture
def renderer(client, renderer_dir, mirror_manifest):
    from daemons.visual.render import Mirror, Renderer, RenderLimits
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


def test_external_asset_outside_mirror_is_render_error(renderer):
    page = ('<!DOCTYPE html><html><head><script src="https://cdn.example.invalid/lib.js">'
            '</script></head><body>x</body></html>')
    with pytest.raises(errors.RenderError) as info:
        renderer.render(dist_tar({"index.html": page}))
    assert info.value.failure_class == errors.FailureClass.RENDER_ERROR
    assert info.value.details["reason"] == "external_assets"
    assert "https://cdn.example.invalid/lib.js" in info.value.details["blocked"]


def test_missing_index_renders_the_404_page(renderer):
    # Upstream's rule: not a drop; the loopback server's 404 page is what
    # gets screenshotted and judged.
    shot = renderer.render(dist_tar({"other.html": "<!DOCTYPE html><p>hi</p>"}))
    assert shot.width == 1440 and shot.height == 900


def test_browser_that_cannot_start_is_render_error(client, renderer_dir, mirror_manifest):
    from daemons.visual.render import Mirror, Renderer, RenderLimits
    info = dict(json.loads((renderer_dir / "renderer.json").read_text()),
                browser="/usr/lib/chromium/no-such-browser")
    broken = Renderer(client, str(renderer_dir / "rootfs"), info, Mirror.load(mirror_manifest),
                      RenderLimits(timeout=60))
    with pytest.raises(errors.RenderError) as err:
        broken.render(dist_tar({"index.html": STATIC_PAGE}))
    assert err.value.details["reason"] == "browser"


def test_render_timeout_is_render_error(client, renderer_dir, mirror_manifest):
    from daemons.visual.render import Mirror, Renderer, RenderLimits
    info = json.loads((renderer_dir / "renderer.json").read_text())
    slow = Renderer(client, str(renderer_dir / "rootfs"), info, Mirror.load(mirror_manifest),
                    RenderLimits(timeout=3))
    with pytest.raises(errors.RenderError) as err:
        slow.render(dist_tar({"index.html": STATIC_PAGE}))
    assert err.value.details["reason"] == "timeout"


def test_visual_canaries_lose_in_real_renderer_sandboxes(renderer, client, renderer_dir,
                                                        mirror_manifest):
    """tools/visual/canaries.py: external and file: loads, symlinks out of
    dist/, a DOM rewritten after the screenshot, a WebSocket beyond loopback,
    fifos and devices, a render that never settles, huge and crowded dist/
    trees, text addressing the judge (plain, faint, CSS content, canvas, split
    over boxes, an SVG image) -- render_error, tampered at 0.0, or exactly the base page's
    score; nothing of ref/, etc/ or up/ reaches the renderer."""
    from daemons.visual.render import Mirror, Renderer, RenderLimits
    from tools.canary_table import render
    from tools.visual import canaries

    info = json.loads((renderer_dir / "renderer.json").read_text())
    slow = Renderer(client, str(renderer_dir / "rootfs"), info, Mirror.load(mirror_manifest),
                    RenderLimits(timeout=12))
    results, checks = canaries.run(renderer.render, slow.render)
    text, failed = render("visual", results)
    print(text)
    assert not failed and not checks, text + "\n" + "\n".join(checks)
    by = {r.technique: r for r in results}
    assert by["base_page"].reward > 0.2
    assert by["after_screenshot_socket_fifo"].reward == by["base_page"].reward
    assert "websocket" in by["after_screenshot_socket_fifo"].detail
    assert "special_file" in by["after_screenshot_socket_fifo"].detail
    assert by["file_url_loads"].integrity == by["symlinks_out_of_dist"].integrity == "tampered"
    assert by["never_settles"].detail == "timeout" and by["huge_dist"].detail == "dist_too_large"
    assert by["external_http_https"].detail.startswith("external_assets; external_load x")
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
