"""The Shop demo's data: the shipped 1k catalog indexed with pyserini.

What the plugin's ``demo_prepare`` names (camg.plugins), run by
packaging/prepare_demo.py as root: takes (DATA, CACHE, helper socket) and
returns the manifest it wrote.
"""

from __future__ import annotations

from pathlib import Path

from camg.errors import CamgError
from tools import demo_data


def prepare(data: Path, cache: Path, helper_socket: str) -> Path:
    from environments.shop import javahome
    from environments.shop import prepare as shop

    out = data / "shop"
    java_home = out / "java"
    javahome.build_layout("/usr/lib/jvm/java-17-openjdk-amd64", java_home)
    args = shop.parser().parse_args(
        ["--output", str(out), "--java-home", str(java_home), "--sample-index-check"]
    )
    try:
        # A verified earlier preparation is kept: Lucene writes random segment
        # ids, so rebuilding would change the index hash on every install.
        shop.verify(args)
    except (CamgError, OSError, ValueError):
        shop.prepare(args)
    demo_data.readable(out)
    return out / "manifest.json"
