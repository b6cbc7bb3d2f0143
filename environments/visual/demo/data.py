"""The Visual demo's data: tasks, the renderer tree, the CDN mirror and the
task image, pulled into dockerd by digest.

What the plugin's ``demo_prepare`` names (camg.plugins), run by
packaging/prepare_demo.py as root: takes (DATA, CACHE, helper socket) and
returns the manifest it wrote.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tools import demo_data


def prepare(data: Path, cache: Path, helper_socket: str) -> Path:
    from environments.visual.demo import prepare_demo as visual
    from tools.loopback_registry import LocalRegistry

    out = data / "visual"
    with (
        tempfile.TemporaryDirectory(prefix="camg-visual-registry.") as state,
        LocalRegistry(Path(state)) as registry,
    ):
        manifest = visual.prepare(out, cache / "helper", registry.address, cache)
        refs = json.loads((out / "images.json").read_text())["images"]
        demo_data.pull_into_dockerd(refs)
    demo_data.readable(out)
    return manifest
