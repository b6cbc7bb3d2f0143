"""Visual canaries: delivered sites that try to put into the screenshot what
is not in dist/ (external or file: content, symlinks out of dist/), change
after the screenshot, never settle, or carry fifos and huge trees.

Each canary is a Docker-shaped archive of /workspace/dist, taken through the
episode's own path: ``delivery.strip_top`` (what reaches the renderer, the
evidence), a real renderer sandbox (``render.Renderer``: headless Chromium,
loopback only), the integrity verdict, and the scripted judge's score
(tools/judge_stub.py, the one the tests and the demo use). Every trick page
is the base page plus a trick that would add a large coloured block only if
it reached something it must not: its ``allowed`` is the base page's score,
so any leak scores above it and wins. A render failure is ``null`` (no win);
a tampered delivery must score 0.0.

    python -m tools.visual.canaries --helper-socket SOCK --renderer DIR --mirror mirror.json

(as root, beside a running helper whose lower_roots hold the renderer).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from camg import errors
from tools.canary_table import CanaryResult, report

from daemons.visual import delivery, rubric

# Documentation address space (RFC 5737): routed nowhere even if it escaped.
OUTSIDE = "192.0.2.1"
BASE = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body { margin: 0; font-family: "DejaVu Sans", sans-serif; background: #fff; }
h1 { margin: 0; padding: 40px; font-size: 40px; color: #fff; background: #1d3557; }
#leak { display: block; }
</style></head><body><h1>Plain delivered page</h1><div id="leak"></div>{trick}</body></html>
"""
# What a trick shows when it succeeds: enough ink and colour to lift the score.
SHOW = ("document.getElementById('leak').innerHTML = "
        "'<div style=\"height:900px;background:linear-gradient(90deg,red,lime,blue)\"></div>'")


@dataclasses.dataclass(frozen=True)
class Canary:
    technique: str
    entries: list            # (name under dist/, kind, value) as in a Docker archive
    expect: str              # "rendered" | "tampered" | "render_error"


def page(trick: str = "") -> str:
    return BASE.replace("{trick}", trick)


def canaries() -> list[Canary]:
    script = "<script>%s</script>"
    return [
        Canary("base_page", [("index.html", "file", page())], "rendered"),
        Canary("external_http_https", [("index.html", "file", page(
            f'<img src="http://{OUTSIDE}/a.png" width="1" height="1">'
            + script % (f"fetch('https://{OUTSIDE}/x').then(() => {{ {SHOW} }})")))],
            "render_error"),
        Canary("file_url_loads", [("index.html", "file", page(
            '<img src="file:///etc/passwd"><iframe src="file:///etc/hostname" width="0" '
            'height="0" style="border:0"></iframe>'
            + script % (f"fetch('file:///srv/camg/data/visual/demo/oracle.json')"
                        f".then(() => {{ {SHOW} }}).catch(() => 0);"
                        "const x = new XMLHttpRequest(); x.open('GET', 'file:///etc/shadow');"
                        "try { x.send(); } catch (e) {}"
                        "setTimeout(() => { location.href = 'file:///etc/'; }, 500)")))],
            "tampered"),
        Canary("symlinks_out_of_dist", [
            ("index.html", "file", page(script % (
                "fetch('ref/index.html').then(r => r.ok && (" + SHOW + ")).catch(() => 0);"
                "fetch('etc/passwd').then(r => r.ok && (" + SHOW + ")).catch(() => 0)"))),
            ("ref", "sym", "/srv/camg/data/visual/demo/reference"),
            ("etc", "sym", "/etc"), ("up", "sym", "../../../../"),
            ("inside.html", "sym", "index.html")], "tampered"),
        Canary("after_screenshot_socket_fifo", [
            ("index.html", "file", page(
                '<script src="pipe.js"></script>' + script % (
                    f"setTimeout(() => {{ {SHOW} }}, 20000);"
                    f"try {{ const ws = new WebSocket('ws://{OUTSIDE}/'); "
                    f"ws.onopen = () => {{ {SHOW} }}; }} catch (e) {{}}"))),
            ("pipe.js", "fifo", None), ("tty", "chr", None)], "rendered"),
        Canary("never_settles", [("index.html", "file", page(
            script % "setTimeout(() => { for (;;) {} }, 2500)"))], "render_error"),
        Canary("huge_dist", [("index.html", "file", page()),
                             ("big.bin", "zeros", 49 << 20)], "render_error"),
        Canary("many_entries", [("index.html", "file", page())]
               + [(f"f{i}", "file", "") for i in range(20_001)], "render_error"),
    ]


def docker_tar(entries) -> bytes:
    """The archive Docker gives of /workspace/dist."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("dist")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for name, kind, value in entries:
            info = tarfile.TarInfo(f"dist/{name}")
            data = None
            if kind == "file":
                data = value.encode()
            elif kind == "zeros":
                data = bytes(value)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, value
            else:
                info.type = {"fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}[kind]
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def judge_score(jpeg: bytes) -> float:
    from tools.judge_stub import verdict
    return rubric.score(json.dumps(verdict(jpeg)))


def play(canary: Canary, render: Callable[[bytes], object], dist_bytes: int = 48 << 20) -> dict:
    """One canary through the episode's path; {reward, integrity, evidence,
    failure, shipped (names that reached the renderer)}."""
    out: dict = {"reward": None, "failure": None, "evidence": [], "shipped": []}
    try:
        tar, evidence = delivery.strip_top(docker_tar(canary.entries), dist_bytes)
        out["evidence"] = evidence
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            out["shipped"] = t.getnames()
        shot = render(tar)
        out["evidence"] += delivery.render_evidence(shot.local_loads, shot.sockets)
    except errors.RenderError as exc:
        out["failure"] = exc.details.get("reason") or "render_error"
        out["evidence"] += delivery.render_evidence((), (), exc.details.get("blocked") or ())
    out.update(delivery.verdict(out["evidence"]))
    if out["failure"] is None:
        out["reward"] = 0.0 if out["integrity"] == "tampered" else judge_score(shot.jpeg)
    return out


def run(render: Callable[[bytes], object], slow_render: Callable[[bytes], object] | None = None
        ) -> tuple[list[CanaryResult], list[str]]:
    """All canaries; ``slow_render`` (a renderer with a short wall-clock
    limit) plays never_settles."""
    results, checks = [], []
    base = None
    for canary in canaries():
        use = slow_render if canary.technique == "never_settles" and slow_render else render
        got = play(canary, use)
        kind = ("render_error" if got["failure"] else
                "tampered" if got["integrity"] == "tampered" else "rendered")
        if kind != canary.expect:
            checks.append(f"{canary.technique}: {kind}, expected {canary.expect} ({got})")
        if canary.technique == "base_page":
            base = got["reward"]
        leaked = [n for n in got["shipped"] if n.split("/")[0] in ("ref", "etc", "up")]
        if leaked:
            checks.append(f"{canary.technique}: {leaked} reached the renderer")
        allowed = 0.0 if kind == "tampered" or base is None else base
        rules = [e.split(":")[0] for e in got["evidence"]]
        detail = "; ".join(([got["failure"]] if got["failure"] else [])
                           + [f"{r} x{rules.count(r)}" for r in dict.fromkeys(rules)])
        results.append(CanaryResult(canary.technique, got["reward"], got["integrity"],
                                    allowed, detail))
    return results, checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--helper-socket", required=True)
    parser.add_argument("--renderer", required=True, help="the renderer dir (renderer.json, rootfs/)")
    parser.add_argument("--mirror", required=True, help="the CDN mirror's mirror.json")
    parser.add_argument("--owner", default="visual-canaries")
    args = parser.parse_args(argv)
    from camg.helper_client import HelperClient
    from daemons.visual.render import Mirror, Renderer, RenderLimits

    info = json.loads((Path(args.renderer) / "renderer.json").read_text())
    helper = HelperClient(args.helper_socket, owner=args.owner)
    try:
        make = lambda timeout: Renderer(helper, str(Path(args.renderer) / "rootfs"), info,  # noqa: E731
                                        Mirror.load(args.mirror), RenderLimits(timeout=timeout))
        results, checks = run(make(90).render, make(12).render)
    finally:
        helper.close()
    return report("visual", results, checks=checks)


if __name__ == "__main__":
    sys.exit(main())
