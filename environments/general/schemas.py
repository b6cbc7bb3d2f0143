"""General's action and observation schemas, per task kind.

Software (``opensource-code``) tasks take seed 001's two actions; general_agent
tasks add upstream's tools and an answer-carrying finish. /schema serves both
(``anyOf``, one branch per task kind); the episode refuses an action its
task kind does not have (422, nothing changed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# MAX_COMMAND is re-exported: the reference plans are checked against it.
from camg.sandboxes.shell_schema import MAX_COMMAND as MAX_COMMAND
from camg.sandboxes.shell_schema import command_observation, shell_action

MAX_ANSWER = 100000

SOFTWARE_ACTION = {
    "title": "opensource-code action (seed 001)",
    "description": "shell: bash as uid 2000 from the repository, 60 s, output cut to the final "
    "12000 bytes, exit 124 on timeout; finish: run the MiMo verifier. Step 64 "
    "finishes.",
    **shell_action(finish="run the MiMo verifier.", cwd="the repository"),
}

GENERAL_ACTION = {
    "title": "general_agent action",
    "description": "shell as above (from the workspace); tool: call an MCP tool of the task "
    "(server, name, JSON arguments); finish: the final answer, written to "
    "answer.md, then the verifier and the judge grade. Step 64 finishes.",
    **shell_action(
        finish="the final answer (answer.md), then the verifier and the judge grade.",
        cwd="the workspace",
        operations=("tool",),
        server={"type": "string", "maxLength": 128},
        name={"type": "string", "maxLength": 128},
        arguments={"type": "object"},
        answer={"type": "string", "maxLength": MAX_ANSWER},
    ),
}

ACTION_SCHEMA = {
    "description": "One action; which branch applies depends on the episode's task_kind "
    "(reset observation): opensource-code or general_agent.",
    "anyOf": [SOFTWARE_ACTION, GENERAL_ACTION],
}

OBSERVATION_SCHEMA = command_observation(
    task_kind={"enum": ["opensource-code", "general_agent"]},
    tools={"type": ["array", "null"], "items": {"type": "object"}},
    verifier={"type": ["string", "null"]},
    # general_agent, terminal only: what the transport saw of attempts on
    # the grade (mimoagent.verify.general_integrity), and agent processes
    # it killed before grading
    integrity_evidence={"type": ["array", "null"], "items": {"type": "object"}},
    processes_killed={"type": ["integer", "null"]},
)


def allowed_action(kind: str, action: Mapping[str, Any]) -> str | None:
    """Why ``action`` does not fit ``kind`` (None when it does)."""
    operation = action.get("operation")
    if kind == "opensource-code":
        extra = set(action) - {"operation", "command"}
        if operation not in ("shell", "finish") or extra:
            return "opensource-code tasks take only {operation: shell|finish, command}" + (
                f"; got {sorted(extra)}" if extra else f"; got operation {operation!r}"
            )
        return None
    if operation == "tool" and not (action.get("server") and action.get("name")):
        return "a tool action needs server and name"
    return None
