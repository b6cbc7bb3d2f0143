"""JSON Schemas of the seed-001 shell action space, shared by the
environments whose agents run commands (Coding, Visual, AutoResearch …).

Seed 001 fixes the shape: ``{"operation": "shell", "command": …}`` (at most
16000 characters) or ``{"operation": "finish"}``; an observation carries the
task id, the command's output (its final bytes), exit code, whether it timed
out or was cut, and the step. Environments add their own properties.
"""

from __future__ import annotations

from typing import Any

MAX_COMMAND = 16000


def shell_action(
    *,
    finish: str,
    cwd: str,
    max_command: int = MAX_COMMAND,
    operations: tuple[str, ...] = (),
    **extra: Any,
) -> dict[str, Any]:
    """shell/finish; ``finish`` says what finishing does, ``cwd`` where commands start.

    An environment's own ``operations`` go between the two (their
    properties in ``extra``)."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["operation"],
        "properties": {
            "operation": {
                "enum": ["shell", *operations, "finish"],
                "description": f"Run a bash command, or finish: {finish}",
            },
            "command": {
                "type": "string",
                "maxLength": max_command,
                "description": f"Bash command; each call starts in {cwd}.",
            },
            **extra,
        },
        "if": {"properties": {"operation": {"const": "shell"}}},
        "then": {"required": ["command"]},
    }


def command_observation(**extra: Any) -> dict[str, Any]:
    """An observation of a command's result, plus ``extra`` properties."""
    return {
        "type": "object",
        "required": ["task_id", "output"],
        "properties": {
            "task_id": {"type": "string"},
            "output": {"type": "string"},
            "exit_code": {"type": ["integer", "null"]},
            "timed_out": {"type": "boolean"},
            "truncated": {"type": "boolean"},
            "step": {"type": "integer"},
            **extra,
        },
    }
