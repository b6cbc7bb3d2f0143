"""A toy environment shaped like General's general_agent tasks: a ``tool``
action (server, name, arguments) and a first observation that lists the
task's own MCP tools, so camg.web.mcp_server's pass-through is tested without
a container. The task: look a customer's id up with crm.lookup, finish
with it as the answer (1.0; anything else 0.0)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from camg.environment import Environment, Episode, Step, Task

ACTION_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["operation"],
    "properties": {
        "operation": {"enum": ["tool", "finish"],
                      "description": "tool: call an MCP tool of the task; finish: answer"},
        "server": {"type": "string", "maxLength": 128},
        "name": {"type": "string", "maxLength": 128},
        "arguments": {"type": "object"},
        "answer": {"type": "string", "maxLength": 1000},
    },
}

OBSERVATION_SCHEMA = {"type": "object", "properties": {
    "text": {"type": "string"}, "tools": {"type": ["array", "null"]}}}

TOOLS = [
    {"server": "crm", "name": "lookup", "description": "A customer's id.",
     "input_schema": {"type": "object", "properties": {"customer": {"type": "string"}},
                      "required": ["customer"]}},
    # not a valid MCP tool name: reachable through the tool action only
    {"server": "crm", "name": "two words", "description": "", "input_schema": {}},
]


class ToolEpisode(Episode):
    def __init__(self, task: Task) -> None:
        self.task = task
        self.answer: str | None = None

    def reset(self) -> Mapping[str, Any]:
        return {"text": "Answer with ada's customer id.", "tools": TOOLS}

    def step(self, action: Mapping[str, Any]) -> Step:
        if action["operation"] == "finish":
            self.answer = action.get("answer")
            return Step({"text": "finished", "tools": None}, done=True)
        call = (action.get("server"), action.get("name"), action.get("arguments") or {})
        if call[:2] == ("crm", "lookup"):
            found = self.task.data["ids"].get(call[2].get("customer"))
            text = f"id {found}" if found else "no such customer"
        else:
            text = f"no tool {call[0]}.{call[1]}"
        return Step({"text": text, "tools": None})

    def grade(self) -> float:
        return 1.0 if self.answer == str(self.task.data["ids"]["ada"]) else 0.0

    def close(self) -> None:
        pass

    def state(self) -> Mapping[str, Any]:
        return {}


class ToolEnvironment(Environment):
    name = "tooly"
    action_schema = ACTION_SCHEMA
    observation_schema = OBSERVATION_SCHEMA

    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        return ToolEpisode(task)

    def metadata(self) -> Mapping[str, Any]:
        return {"grader": "tooly/1"}
