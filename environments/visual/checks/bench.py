#!/usr/bin/env python3
"""Benchmark of the Visual renderer: render time per page and memory per concurrent render.

    sudo .venv/bin/python -m environments.visual.checks.bench \
        [--rounds 5] [--concurrency 1,2,4] [--json OUT]

Pages: the demo tasks' reference sites (environments/visual/demo/demo_tasks.py; three use
the mirrored Tailwind build) and a blank page. Measures, in one run:
  * host baseline: the same shot script run directly on the host (host
    playwright + Debian's chromium-headless-shell), no sandbox;
  * sandboxed render (environments.visual.render.Renderer through a private
    camg-helper over the renderer rootfs): p50/p99 per page, and the ratio to
    the host baseline (the isolation's cost);
  * k renders at once: wall time and peak memory per render, read from each
    renderer sandbox's memory cgroup (memory.max_usage_in_bytes, sampled
    every 50 ms until the sandbox goes away).
Ratios are taken within this run, so a loaded machine moves both sides.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from devtools.harness.helpers import start_private

ROOT = Path(__file__).resolve().parents[3]

CACHE = Path(os.environ.get("CAMG_CACHE", "/var/cache/camg-test"))
HOST_BROWSER = "/usr/lib/chromium/chromium-headless-shell"


def note(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(samples: list[float]) -> dict:
    return {
        "n": len(samples),
        "p50_s": round(pct(samples, 0.5), 3),
        "p99_s": round(pct(samples, 0.99), 3),
        "mean_s": round(statistics.mean(samples), 3),
    }


def pages() -> dict[str, dict[str, bytes]]:
    from environments.visual.demo import demo_tasks

    out = {t["instance_id"]: demo_tasks.reference_files(t) for t in demo_tasks.TASKS}
    out["blank"] = {"index.html": b"<!DOCTYPE html><html><body></body></html>\n"}
    return out


def tar_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def host_render(files: dict[str, bytes], mirror_json: Path) -> float:
    """The shot script on the host, no sandbox: the baseline."""
    mirror = json.loads(mirror_json.read_text())["urls"]
    with tempfile.TemporaryDirectory(prefix="camg-bench-visual-") as tmp:
        dist = Path(tmp) / "dist"
        dist.mkdir()
        for name, data in files.items():
            (dist / name).write_bytes(data)
        job = {
            "dist": str(dist),
            "out": f"{tmp}/shot.jpg",
            "browser": HOST_BROWSER,
            "mirror": {u: str(mirror_json.parent / e["file"]) for u, e in mirror.items()},
        }
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        t = time.perf_counter()
        out = subprocess.run(
            [sys.executable, str(ROOT / "environments/visual/shot_script.py"), f"{tmp}/job.json"],
            capture_output=True,
            check=True,
            timeout=300,
        )
        took = time.perf_counter() - t
        if not json.loads(out.stdout.splitlines()[-1])["ok"]:
            raise SystemExit(f"host render failed: {out.stdout[-500:]}")
        return took


class MemorySampler:
    """Peak memory of every renderer sandbox cgroup below ``parent``."""

    def __init__(self, parent: str) -> None:
        self.parent = Path(parent)
        self.peaks: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for d in self.parent.iterdir():
                    f = d / "memory.max_usage_in_bytes"
                    try:
                        self.peaks[d.name] = max(self.peaks.get(d.name, 0), int(f.read_text()))
                    except (OSError, ValueError):
                        pass  # the sandbox just went away
            except FileNotFoundError:
                pass
            time.sleep(0.05)

    def close(self) -> list[int]:
        self.stop.set()
        self.thread.join()
        return list(self.peaks.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root (the helper builds sandboxes)")
    from environments.visual.build.cdn_mirror import build_mirror
    from environments.visual.build.renderer_rootfs import ensure_renderer_rootfs
    from environments.visual.render import Mirror, Renderer, RenderLimits

    lower = CACHE / "helper"
    note("renderer rootfs and CDN mirror (cached)")
    rdir = ensure_renderer_rootfs(lower)
    mirror_json = build_mirror(CACHE / "visual" / "cdn-mirror")
    info = json.loads((rdir / "renderer.json").read_text())
    helper = start_private("bench-visual", [str(lower)], [str(lower / "bookworm-minbase")])
    result: dict = {"renderer": info["packages"], "rounds": args.rounds, "pages": {}}
    try:
        client = helper.client(owner="bench-visual", pool_size=16)
        renderer = Renderer(
            client, str(rdir / "rootfs"), info, Mirror.load(mirror_json), RenderLimits(timeout=300)
        )
        site = pages()
        renderer.render(tar_of(site["blank"]))  # warm page cache of the rootfs
        host_render(site["blank"], mirror_json)
        for name, files in site.items():
            host = [host_render(files, mirror_json) for _ in range(args.rounds)]
            boxed, height = [], 0
            for _ in range(args.rounds):
                t = time.perf_counter()
                shot = renderer.render(tar_of(files))
                boxed.append(time.perf_counter() - t)
                height = shot.height
            result["pages"][name] = {
                "height": height,
                "host": summary(host),
                "sandbox": summary(boxed),
                "ratio_p50": round(pct(boxed, 0.5) / pct(host, 0.5), 3),
            }
            note(
                f"{name}: sandbox {result['pages'][name]['sandbox']} host p50 "
                f"{result['pages'][name]['host']['p50_s']}"
            )
        result["concurrent"] = {}
        ref = tar_of(site[sorted(site)[0]])
        for k in [int(x) for x in args.concurrency.split(",")]:
            sampler = MemorySampler(helper.config["cgroup_parents"]["memory"])
            times: list[float] = []
            errors: list[Exception] = []

            def one(times: list[float] = times, errors: list[Exception] = errors) -> None:
                t = time.perf_counter()
                try:
                    renderer.render(ref)
                except Exception as exc:  # reported below
                    errors.append(exc)
                times.append(time.perf_counter() - t)

            t0 = time.perf_counter()
            threads = [threading.Thread(target=one) for _ in range(k)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            peaks = sampler.close()
            result["concurrent"][str(k)] = {
                "wall_s": round(wall, 3),
                "per_render": summary(times),
                "errors": len(errors),
                "peak_mib_per_render_max": round(max(peaks) / 2**20, 1) if peaks else None,
                "peak_mib_per_render_mean": round(statistics.mean(peaks) / 2**20, 1)
                if peaks
                else None,
            }
            note(f"{k} at once: {result['concurrent'][str(k)]}")
        client.close()
    finally:
        helper.stop()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
