"""The General demo's data: opensource-code tasks made from the Coding demo
set, the office tasks, one image per task.

What the plugin's ``demo_prepare`` names (camg.plugins), run by
packaging/prepare_demo.py as root: takes (DATA, CACHE, helper socket) and
returns the manifest it wrote.
"""

from __future__ import annotations

from pathlib import Path

from environments.coding.demo import data as coding_data
from tools import demo_data


def prepare(data: Path, cache: Path, helper_socket: str) -> Path:
    from environments.general.demo import assemble as demo

    demo_set = data / "coding" / "demo"
    if not (demo_set / "tasks.jsonl").is_file():
        demo_set = coding_data.find_demo_set(data, cache, helper_socket)
    result = demo.prepare_data(data, cache, demo_set)
    demo_data.readable(data / "general")
    return Path(result["manifest"])
