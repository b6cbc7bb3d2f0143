"""The Visual renderer's root filesystem: Debian bookworm + headless Chromium + Playwright.

The renderer runs in a helper sandbox whose only lower is this tree, so what
takes a screenshot is fixed by Debian packages and two pinned wheels:

1. ``debootstrap --variant=minbase bookworm`` with python3;
2. from bookworm + bookworm-updates + bookworm-security (a browser wants its
   security fixes): ``chromium-headless-shell`` (Playwright's headless
   binary, without GTK) and the fonts screenshots are drawn with
   (``FONT_PACKAGES``: the pixel checksum is only stable because these are
   pinned by the tree's dpkg status);
3. Playwright-for-Python and greenlet (pinned as in requirements/visual.in),
   installed with ``pip --target`` into ``/opt/camg-render/site``.
   Playwright's own browser download is never used: the render script
   points ``executable_path`` at the Debian binary.

The result is ``<output>/visual-renderer-<key>/rootfs`` plus ``renderer.json``
(package versions, wheel pins, key); the tree is built in a temporary
directory and renamed into place only when complete, under a lock, so
concurrent builders and a crashed build never leave a half tree. Operators
put it under the helper's lower_roots (``/var/lib/camg/oci-rootfs``); tests
under ``$CAMG_CACHE/helper``.

    python -m environments.visual.build.renderer_rootfs --output /var/lib/camg/oci-rootfs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from camg.config.hashing import sha256_json
from camg.errors import DatasetError
from tools.oci_demo import locked

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY = "http://deb.debian.org/debian-security"
# Playwright's driver is a node binary that links libatomic.
BROWSER_PACKAGES = ("chromium-headless-shell", "libatomic1")
FONT_PACKAGES = ("fonts-dejavu-core", "fonts-liberation", "fontconfig")
WHEELS = ("playwright==1.65.2", "greenlet==3.5.6")
SITE = "opt/camg-render/site"
BROWSER = "/usr/lib/chromium/chromium-headless-shell"
LAYOUT_VERSION = 1
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
}


def key() -> str:
    return sha256_json(
        {
            "suite": SUITE,
            "mirror": MIRROR,
            "security": SECURITY,
            "browser": BROWSER_PACKAGES,
            "fonts": FONT_PACKAGES,
            "wheels": WHEELS,
            "layout": LAYOUT_VERSION,
        }
    ).split(":", 1)[1][:16]


def target_for(output: Path) -> Path:
    return Path(output).absolute() / f"visual-renderer-{key()}"


def _run(argv: list[str], what: str, timeout: float = 3600, env: dict | None = None) -> str:
    proc = subprocess.run(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        env=env,
        check=False,
    )
    out = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise DatasetError(
            f"renderer rootfs: {what} failed (exit {proc.returncode}): {out[-3000:]}"
        )
    return out


def _chroot(rootfs: Path, command: str, what: str) -> str:
    # A private mount namespace: the /proc apt's maintainer scripts want
    # disappears with it, even when the command fails.
    script = f"mount -t proc proc {rootfs}/proc && exec chroot {rootfs} /bin/sh -c '{command}'"
    return _run(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script],
        what,
        env=CHROOT_ENV,
    )


def _build(work: Path) -> dict:
    rootfs = work / "rootfs"
    _run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "debootstrap",
            "--variant=minbase",
            "--include=python3,ca-certificates",
            SUITE,
            str(rootfs),
            MIRROR,
        ],
        "debootstrap",
    )
    (rootfs / "etc/apt/sources.list").write_text(
        f"deb {MIRROR} {SUITE} main\ndeb {MIRROR} {SUITE}-updates main\n"
        f"deb {SECURITY} {SUITE}-security main\n"
    )
    packages = " ".join(BROWSER_PACKAGES + FONT_PACKAGES)
    _chroot(
        rootfs,
        "apt-get update -q && apt-get install -y -q --no-install-recommends "
        f"{packages} && apt-get clean && fc-cache -f",
        "apt-get install",
    )
    for junk in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for entry in (rootfs / junk).glob("*"):
            if entry.is_file() and entry.name != "lock":
                entry.unlink()
    site = rootfs / SITE
    site.mkdir(parents=True)
    # Same interpreter family as the rootfs (bookworm's 3.11, glibc 2.36):
    # binary wheels only, no dependency resolution beyond the pins.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--abi",
            "cp311",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "manylinux1_x86_64",
            "--target",
            str(site),
            *WHEELS,
        ],
        "pip install --target",
    )
    versions = _chroot(
        rootfs,
        'dpkg-query -W -f "\\${Package}=\\${Version}\\n" '
        + " ".join(BROWSER_PACKAGES + FONT_PACKAGES + ("python3", "chromium-common")),
        "dpkg-query",
    )
    if not (rootfs / BROWSER.lstrip("/")).is_file():
        raise DatasetError(f"renderer rootfs: {BROWSER} missing after install")
    return {
        "key": key(),
        "suite": SUITE,
        "packages": sorted(versions.split()),
        "wheels": list(WHEELS),
        "browser": BROWSER,
        "site": "/" + SITE,
    }


def ensure_renderer_rootfs(output: Path) -> Path:
    """Build (or reuse) the renderer tree under ``output``; returns its directory."""
    final = target_for(output)
    with locked(final.parent / f".{final.name}.lock"):
        if (final / "renderer.json").is_file():
            return final
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        os.chmod(work, 0o755)
        try:
            info = _build(work)
            (work / "renderer.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            os.rename(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m environments.visual.build.renderer_rootfs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--output", type=Path, required=True, help="directory under one of the helper's lower_roots"
    )
    args = ap.parse_args(argv)
    try:
        path = ensure_renderer_rootfs(args.output)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
