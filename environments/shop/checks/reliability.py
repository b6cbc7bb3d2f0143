"""How the reliability suites (devtools/reliability) run Shop: its target
(the plugin's ``reliability``: how a real service of it is prepared and
configured from the caches the privileged tests build) and its kill-storm
drive (the plugin's ``storm``: how a storm's episodes reach its grader).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from devtools.reliability.killstorm_guest import Env, Guest, first_task
from devtools.reliability.targets import Target


def _shop_prepare(work: Path, socket: str) -> tuple[Path, dict, str | None]:
    from devtools.harness.shop import prepared

    prepared_dir, settings = prepared()
    return (
        prepared_dir / "manifest.json",
        dict(settings, jvm_heap_mb=512, verify_index_full=False),
        None,
    )


TARGET = Target("shop", {"action": "search[red shoes]"}, prepare=_shop_prepare)


def storm(guest: Guest, env: Env) -> Env:
    return dataclasses.replace(
        env,
        create={"task_id": first_task(guest, env)["task_id"]},
        slow_step={
            "action": "search[wireless bluetooth headphones with "
            "noise cancelling long battery life]"
        },
    )
