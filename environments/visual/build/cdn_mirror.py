"""The local mirror of allowlisted CDN URLs the Visual renderer may load.

Upstream renders with internet access; camg's renderer has none. The URLs a
task prompt itself offers (the Tailwind browser build on jsDelivr) are served
from a mirror prepared here, like any other asset: each allowlisted URL names
an npm package, an exact version and a file inside it. The tarball is
fetched from the npm registry (``$npm_config_registry``, default
registry.npmjs.org; no npm client needed) and checked against the sha512
integrity the registry publishes for that version, the file is read out of
it, and ``mirror.json`` records, per URL, the file, its sha256, the package,
version and the tarball's integrity string. ``camg.configure``
hashes mirror.json and every file it names; the renderer answers exactly
these URLs and aborts every other external request.

    python -m environments.visual.build.cdn_mirror --output DIR [--allowlist FILE]
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import io
import json
import os
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

from camg.errors import DatasetError

FORMAT = "camg.visual.cdn-mirror/1"


@dataclasses.dataclass(frozen=True)
class Entry:
    package: str
    version: str
    file: str
    urls: tuple[str, ...]


# jsDelivr's /npm/<pkg>@<range> answers the package's "jsdelivr"/"browser"
# file; the prompt's URL uses the major-version range, so the range, the
# exact version and the explicit file path all map to the same bytes.
TAILWIND_VERSION = "4.3.4"
DEFAULT_ALLOWLIST = (
    Entry(
        "@tailwindcss/browser",
        TAILWIND_VERSION,
        "dist/index.global.js",
        tuple(
            f"https://cdn.jsdelivr.net/npm/@tailwindcss/browser@{ver}{suffix}"
            for ver in ("4", TAILWIND_VERSION)
            for suffix in ("", "/", "/dist/index.global.js")
        ),
    ),
)


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.read()
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cdn mirror: cannot fetch {url}: {exc}") from None


def _npm_tarball(package: str, version: str) -> tuple[bytes, str]:
    """The package tarball of an exact version, verified against the sha512
    integrity the registry publishes for it."""
    registry = os.environ.get("npm_config_registry", "https://registry.npmjs.org/")
    name = urllib.parse.quote(package, safe="@")
    try:
        dist = json.loads(_fetch(f"{registry.rstrip('/')}/{name}/{version}"))["dist"]
        tarball_url, integrity = dist["tarball"], dist["integrity"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"cdn mirror: no dist for {package}@{version}: {exc}") from None
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512":
        raise DatasetError(f"cdn mirror: {package}@{version} has no sha512 integrity ({integrity})")
    tarball = _fetch(tarball_url)
    if base64.b64encode(hashlib.sha512(tarball).digest()).decode() != expected:
        raise DatasetError(f"cdn mirror: {tarball_url} does not match its integrity {integrity}")
    return tarball, integrity


def _member(tarball: bytes, name: str) -> bytes:
    # Read one regular file by name (no extraction to disk: nothing in the
    # archive decides a path here).
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name == f"package/{name}":
                f = tar.extractfile(member)
                assert f is not None
                return f.read()
    raise DatasetError(f"cdn mirror: {name} is not in the package tarball")


def build_mirror(output: Path, allowlist: tuple[Entry, ...] = DEFAULT_ALLOWLIST) -> Path:
    """Write ``output``/mirror.json and files/; returns mirror.json. Idempotent."""
    output = Path(output).absolute()
    (output / "files").mkdir(parents=True, exist_ok=True)
    urls: dict[str, dict] = {}
    for entry in allowlist:
        tarball, integrity = _npm_tarball(entry.package, entry.version)
        data = _member(tarball, entry.file)
        digest = hashlib.sha256(data).hexdigest()
        suffix = Path(entry.file).suffix or ".bin"
        name = f"files/{digest}{suffix}"
        path = output / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            path.write_bytes(data)
            os.chmod(path, 0o644)
        for url in entry.urls:
            urls[url] = {
                "file": name,
                "sha256": digest,
                "package": entry.package,
                "version": entry.version,
                "path": entry.file,
                "tarball_integrity": integrity,
            }
    manifest = output / "mirror.json"
    tmp_manifest = manifest.with_suffix(".json.tmp")
    tmp_manifest.write_text(
        json.dumps({"format": FORMAT, "urls": urls}, indent=2, sort_keys=True) + "\n"
    )
    os.replace(tmp_manifest, manifest)
    return manifest


def _load_allowlist(path: Path) -> tuple[Entry, ...]:
    try:
        rows = json.loads(path.read_text())
        return tuple(Entry(r["package"], r["version"], r["file"], tuple(r["urls"])) for r in rows)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"cdn mirror: bad allowlist {path}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m environments.visual.build.cdn_mirror",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument(
        "--allowlist",
        type=Path,
        help="JSON list of {package, version, file, urls}; default: the Tailwind build",
    )
    args = ap.parse_args(argv)
    try:
        allow = _load_allowlist(args.allowlist) if args.allowlist else DEFAULT_ALLOWLIST
        print(build_mirror(args.output, allow))
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
