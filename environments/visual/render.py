"""Render a delivered site into one screenshot, in a sandbox of its own.

The agent's container is gone by the time this runs; what reaches the
renderer is a copy of dist/ (a tar stream, regular files and directories
only). A helper sandbox over the renderer rootfs (environments/visual/build/
renderer_rootfs.py: Debian's chromium-headless-shell, pinned fonts,
Playwright) receives that copy, the allowlisted CDN files and the shot
script; it has loopback only, uid 2000, no capabilities, cgroup limits, and
a wall-clock limit that kills the whole tree. The screenshot comes back as
bytes; the sandbox is destroyed whatever happened.

Failures are ``RenderError`` (failure class ``render_error``): the browser
did not start or crashed, the render overran its limit, or no image came
back. Whether that is a null or the page's own 0 is decided by the
episode's control (control.py): the same renderer image on a fresh sandbox
with a fixed page. External assets outside the mirror are not a failure:
the page is rendered without them and the URLs are evidence
(``Shot.blocked``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path

from camg import errors

SCRIPT = Path(__file__).with_name("shot_script.py")
WORK = "/tmp/camg-render"
MAX_PIXELS = 20_000_000
#: dist/ entries a render takes (a million empty files would cost the tar
#: and the copy-in far more than dist_bytes suggests)
MAX_ENTRIES = 20_000
JPEG_QUALITY = 75


@dataclasses.dataclass(frozen=True)
class RenderLimits:
    timeout: float = 150.0
    memory_bytes: int = 1536 << 20
    cpu_quota: float = 1.0
    pids_max: int = 512
    dist_bytes: int = 48 << 20


@dataclasses.dataclass(frozen=True)
class Shot:
    jpeg: bytes
    width: int
    height: int
    downscaled: bool
    console_errors: tuple[str, ...]
    timings: Mapping[str, float]
    #: file: URLs the page tried (Chromium refused them) and WebSockets
    #: beyond its origin: integrity evidence (delivery.render_evidence)
    local_loads: tuple[str, ...] = ()
    sockets: tuple[str, ...] = ()
    #: the text the page showed (shot_script._page_text): screened for text
    #: addressing the judge (delivery.judge_findings)
    text: str = ""
    #: external URLs the renderer refused (the page was shot without them)
    blocked: tuple[str, ...] = ()
    #: the page's full height when it was taller than the shot (shot_script.MAX_HEIGHT)
    clipped_from: int = 0

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.jpeg).hexdigest()


@dataclasses.dataclass(frozen=True)
class Mirror:
    """The allowlisted CDN URLs: url -> (name inside the sandbox, bytes)."""

    files: Mapping[str, tuple[str, bytes]]

    @classmethod
    def load(cls, manifest: str | Path | None) -> Mirror:
        if not manifest:
            return cls({})
        base = Path(manifest).parent
        try:
            data = json.loads(Path(manifest).read_text())
            files = {}
            for url, entry in data["urls"].items():
                blob = (base / entry["file"]).read_bytes()
                if hashlib.sha256(blob).hexdigest() != entry["sha256"]:
                    raise errors.ConfigError(
                        f"cdn mirror file {entry['file']} does not match its sha256 in mirror.json"
                    )
                files[url] = (Path(entry["file"]).name, blob)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise errors.ConfigError(f"cdn mirror {manifest} is unreadable: {exc}") from None
        return cls(files)


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def job_archive(dist_tar: bytes, mirror: Mirror, browser: str, limit: int) -> bytes:
    """The sandbox's /tmp/camg-render: dist/ (regular files and dirs only),
    the mirror, the shot script and its job."""
    out = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=out, mode="w") as tar:
        for d in ("dist", "mirror", "out"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o777 if d == "out" else 0o755
            tar.addfile(info)
        with tarfile.open(fileobj=io.BytesIO(dist_tar), mode="r:*") as src:
            members = src.getmembers()
            if len(members) > MAX_ENTRIES:
                raise errors.RenderError(
                    f"dist/ has more than {MAX_ENTRIES} entries", reason="dist_too_large"
                )
            for member in members:
                name = member.name
                while name.startswith("./"):
                    name = name[2:]
                parts = Path(name).parts
                if name in ("", ".") or ".." in parts or name.startswith("/"):
                    continue
                if member.isdir():
                    info = tarfile.TarInfo(f"dist/{name}")
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
                elif member.isfile():
                    total += member.size
                    if total > limit:
                        raise errors.RenderError(
                            f"dist/ is larger than {limit} bytes", reason="dist_too_large"
                        )
                    f = src.extractfile(member)
                    _add(tar, f"dist/{name}", f.read() if f else b"")
        for name, blob in mirror.files.values():
            _add(tar, f"mirror/{name}", blob)
        job = {
            "dist": f"{WORK}/dist",
            "out": f"{WORK}/out/shot.jpg",
            "browser": browser,
            "mirror": {url: f"{WORK}/mirror/{name}" for url, (name, _) in mirror.files.items()},
        }
        _add(tar, "job.json", json.dumps(job).encode())
        _add(tar, "shot.py", SCRIPT.read_bytes())
    return out.getvalue()


def downscale(jpeg: bytes) -> tuple[bytes, int, int, bool]:
    """Upstream's rule: above 20 MP, shrink proportionally (Lanczos) back to
    20 MP and re-encode JPEG q75; never normalise the width."""
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as im:
        w, h = im.size
        if w * h <= MAX_PIXELS:
            return jpeg, w, h, False
        scale = (MAX_PIXELS / (w * h)) ** 0.5
        size = (max(1, int(w * scale)), max(1, int(h * scale)))
        small = im.convert("RGB").resize(size, Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        small.save(buf, "JPEG", quality=JPEG_QUALITY)
        return buf.getvalue(), size[0], size[1], True


def _member(tar_bytes: bytes, name: str) -> bytes | None:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:*") as tar:
        for member in tar.getmembers():
            if member.isfile() and Path(member.name).name == name:
                f = tar.extractfile(member)
                return f.read() if f else None
    return None


class Renderer:
    """Renders in helper sandboxes over the renderer rootfs."""

    def __init__(
        self,
        helper,
        rootfs: str,
        renderer_info: Mapping[str, str],
        mirror: Mirror,
        limits: RenderLimits = RenderLimits(),
    ) -> None:
        self.helper = helper
        self.rootfs = rootfs
        self.browser = renderer_info["browser"]
        self.site = renderer_info["site"]
        self.mirror = mirror
        self.limits = limits

    def render(self, dist_tar: bytes) -> Shot:
        lim = self.limits
        archive = job_archive(dist_tar, self.mirror, self.browser, lim.dist_bytes)
        started = time.monotonic()
        try:
            sid = self.helper.create_sandbox(
                [self.rootfs],
                memory_bytes=lim.memory_bytes,
                cpu_quota=lim.cpu_quota,
                pids_max=lim.pids_max,
                hostname="renderer",
            )
        except errors.CamgError as exc:
            raise errors.RenderError(
                f"renderer sandbox did not start: {exc.message}", reason="sandbox"
            ) from None
        try:
            self.helper.put_archive(sid, WORK, archive, user="agent")
            env = {
                "PYTHONPATH": self.site,
                "HOME": f"{WORK}/home",
                "TMPDIR": f"{WORK}/out",
                "LANG": "C.UTF-8",
                "PLAYWRIGHT_BROWSERS_PATH": "/nonexistent",
                "PATH": "/usr/bin:/bin",
            }
            res = self.helper.exec(
                sid,
                f"mkdir -p {WORK}/home && exec python3 {WORK}/shot.py "
                f"{WORK}/job.json > {WORK}/out/result.json",
                cwd=WORK,
                env=env,
                timeout=lim.timeout,
                output_limit=4000,
            )
            if res.timed_out:
                raise errors.RenderError(f"render exceeded {lim.timeout:g} s", reason="timeout")
            out = self.helper.get_archive(sid, f"{WORK}/out")
        except errors.RenderError:
            raise
        except errors.CamgError as exc:
            raise errors.RenderError(f"renderer failed: {exc.message}", reason="sandbox") from None
        finally:
            try:
                self.helper.destroy(sid)
            except errors.CamgError:
                pass  # the helper's ledger and sweep reclaim it
        raw = _member(out, "result.json")
        try:
            result = json.loads(raw or b"")
        except ValueError:
            raise errors.RenderError(
                "the browser process died without a result",
                reason="browser",
                output=res.output[-1500:],
            ) from None
        if not result.get("ok"):
            raise errors.RenderError(
                f"the browser failed: {result.get('error')}: {result.get('message', '')[:500]}",
                reason="browser",
            )
        jpeg = _member(out, "shot.jpg")
        if not jpeg:
            raise errors.RenderError("no screenshot was produced", reason="no_image")
        jpeg, width, height, shrunk = downscale(jpeg)
        timings = dict(result.get("timings", {}), wall=round(time.monotonic() - started, 3))
        return Shot(
            jpeg,
            width,
            height,
            shrunk,
            tuple(result.get("console_errors", ())),
            timings,
            tuple(result.get("local_loads", ())),
            tuple(result.get("sockets", ())),
            str(result.get("text") or ""),
            tuple(result.get("blocked", ())),
            int(result.get("clipped_from") or 0),
        )
