"""A reference solution shipped into a sandbox or container as shell actions.

The environments whose agents run commands (Coding, AutoResearch, General,
Visual) play a task's reference (``GET /episodes/{id}/reference``) through
the agent's own action space: the payload, base64, appended to a file in
chunks that each fit one command (seed 001's bound, camg.sandboxes.shell_schema), then
one command that decodes and applies it, then the environment's finishing
action. Nothing but the actions an agent could send reaches the episode.
"""

from __future__ import annotations

import base64

#: a chunk's command besides the chunk itself (printf, the store's path)
_OVERHEAD = 200


def shipped(
    payload: bytes, store: str, apply: str, *, max_command: int, finish: dict | None = None
) -> list[dict]:
    """``payload`` written to ``store`` base64 (``printf`` chunks of at most
    ``max_command`` characters a command), then ``apply`` (a command that
    reads ``store``), then ``finish`` (``{"operation": "finish"}`` by default)."""
    encoded = base64.b64encode(payload).decode()
    size = max(1000, max_command - _OVERHEAD)
    steps = [
        {"operation": "shell", "command": f"printf %s '{encoded[i : i + size]}' >> {store}"}
        for i in range(0, len(encoded), size)
    ]
    steps.append({"operation": "shell", "command": apply})
    steps.append(dict(finish or {"operation": "finish"}))
    return steps
