"""A minimal environment whose every episode holds a real helper sandbox.

It is what the suites run when an environment's own data is not prepared,
and the baseline of every environment that uses sandboxes: the episode
manager, the HTTP contract and the helper, with nothing of a product in the
way. An action is one shell command run as the agent; the task's answer
is a number the agent must print (graded like the Coding demo: by running
something in the sandbox after the episode).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from camg.environment import Environment, Episode, Step, Task
from camg.errors import SandboxDied
from camg.helper_client import HelperClient

ACTION_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["operation"],
    "properties": {
        "operation": {"enum": ["shell", "finish"]},
        "command": {"type": "string", "maxLength": 4096},
    },
}
OBSERVATION_SCHEMA = {
    "type": "object",
    "properties": {"output": {"type": "string"}, "exit_code": {"type": "integer"}},
}


class SandboxEpisode(Episode):
    def __init__(self, env: "SandboxEnvironment", task: Task) -> None:
        self.env = env
        self.task = task
        self.sandbox: str | None = None
        self.lock = threading.Lock()
        self.closed = False

    def reset(self) -> Mapping[str, Any]:
        s = self.env.settings
        sandbox = self.env.helper.create_sandbox(
            list(s["lowers"]), memory_bytes=int(s.get("memory_bytes", 256 << 20)),
            cpu_quota=float(s.get("cpu_quota", 1.0)), pids_max=int(s.get("pids_max", 128)),
            upper_bytes=int(s.get("upper_bytes", 64 << 20)))
        with self.lock:
            if self.closed:  # closed while the sandbox was being made
                self.env.helper.destroy(sandbox)
                raise SandboxDied("closed during reset")
            self.sandbox = sandbox
        return {"output": f"Print {self.task.data['target']}.", "exit_code": 0}

    def step(self, action: Mapping[str, Any]) -> Step:
        if action["operation"] == "finish":
            return Step({"output": "", "exit_code": 0}, done=True)
        r = self._exec(action.get("command", "true"))
        return Step({"output": r.output, "exit_code": r.exit_code})

    def _exec(self, command: str):
        with self.lock:
            sandbox = self.sandbox
        if sandbox is None:
            raise SandboxDied("the episode's sandbox is gone")
        return self.env.helper.exec(sandbox, command, timeout=30, output_limit=4096)

    def grade(self) -> float:
        r = self._exec("cat /tmp/answer 2>/dev/null")
        return 1.0 if r.output.strip() == str(self.task.data["target"]) else 0.0

    def close(self) -> None:
        with self.lock:
            self.closed = True
            sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            self.env.helper.destroy(sandbox)

    def state(self) -> Mapping[str, Any]:
        return {"sandbox": self.sandbox is not None}


class SandboxEnvironment(Environment):
    name = "sandbox"
    action_schema = ACTION_SCHEMA
    observation_schema = OBSERVATION_SCHEMA

    def __init__(self, context, tasks) -> None:
        super().__init__(context, tasks)
        self.settings = dict(context.settings)
        self.helper = HelperClient(context.helper_socket, owner="reliability-sandbox",
                                   pool_size=64)

    def start(self) -> None:
        self.helper.ping()

    def stop(self) -> None:
        self.helper.release_all()
        self.helper.close()

    def health(self) -> list[str]:
        try:
            return [] if self.helper.ping()["probes_ok"] else ["helper probes failed"]
        except Exception as exc:
            return [f"helper unreachable: {exc}"]

    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        return SandboxEpisode(self, task)

    def metadata(self) -> Mapping[str, Any]:
        return {"grader": "reliability-sandbox/1"}
