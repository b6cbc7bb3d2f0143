"""The general_agent transport: seed 001's rules plus upstream's tools.

Actions:
* ``shell`` -- as in the software transport (uid 2000, from the workspace,
  60 s, final 12000 bytes, exit 124 on timeout);
* ``tool`` -- call one of the task's MCP tools: ``server`` (a tools/*.py
  stem), ``name`` and JSON ``arguments``; the result text is the output,
  ``exit_code`` 0 or 1 (the tool reported an error). The server runs as root
  over stdio, so its SQLite state stays out of the agent's reach;
* ``finish`` -- ``answer`` is the final reply, written to ``answer.md`` in
  the workspace (unless the agent already left a non-empty one) before the
  verifier runs, as upstream's verifier expects.
Step 64 finishes (without an answer). The terminal observation is sticky.
The verifier scores rule items here; LLM items are left as judge requests
in ``/logs/verifier`` for the General service (``metadata.pending_judge``).

At finish, before answer.md is written or anything is read, every process
of the agent uid is killed (none may remain: the verifier reads the
workspace as root, and a live process could swap a file for a symlink
between a check and a read). Attempts on the grade (tool calls outside the
task's servers, commands naming the verifier's files, an answer.md that is
not a regular file, agent-owned entries in the root-only directories) are
findings (mimoagent.verify.general_integrity) in the terminal observation's
``integrity_evidence`` and in ``reward_detail.json`` for the service.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from mimoagent.environments.datasets.general_agent import GeneralAgentEnvironment
from mimoagent.tools.mcp_bridge import ToolServerDown
from mimoagent.transport import verifier_guard
from mimoagent.transport.checkpoint import Checkpoint
from mimoagent.transport.protocol import Action, Environment, Observation, Spec, State
from mimoagent.verify import general_integrity as watch
from mimoagent.transport.common import (AGENT_UID, COMMAND_TIMEOUT, MAX_COMMAND_CHARS, MAX_STEPS,
                                        OUTPUT_LIMIT, InfraError, prewarmer, VerifierExecution, chown_tree,
                                        run_command)

MAX_ANSWER_CHARS = 100000


class GeneralAction(Action):
    FIELDS = {
        "operation": Spec(str, None, choices=("shell", "tool", "finish"), description=(
            "Run a bash command, call an MCP tool, or finish with the final answer.")),
        "command": Spec(str, "", max_length=MAX_COMMAND_CHARS,
                        description="shell: bash command; each call starts in the workspace."),
        "server": Spec(str, "", max_length=128, description="tool: the MCP server name."),
        "name": Spec(str, "", max_length=128, description="tool: the tool name."),
        "arguments": Spec(dict, None, description="tool: JSON arguments."),
        "answer": Spec(str, "", max_length=MAX_ANSWER_CHARS,
                       description="finish: the final answer (written to answer.md)."),
    }


class GeneralObservation(Observation):
    FIELDS = {
        "task_id": "", "output": "", "exit_code": None, "tools": None,
        #: terminal only: "complete" (reward final) or "pending_judge" (LLM items
        #: await the judge; openenv does not serialize metadata, so it is a field)
        "verifier": None,
        #: terminal only: what the transport saw of attempts on the grade
        "integrity_evidence": None,
        "processes_killed": None,
    }


def _tail(text: str) -> str:
    data = text.encode("utf-8", "replace")
    if len(data) <= OUTPUT_LIMIT:
        return text
    return (f"[output truncated to final {OUTPUT_LIMIT} bytes]\n"
            + data[-OUTPUT_LIMIT:].decode("utf-8", "replace"))


def bind(root: Path, agent_uid: int = AGENT_UID, *, reap: bool = True, checkpoint: str | None = None,
         **paths: str) -> type:
    """``reap=False`` only for in-process tests (outside a container's pid
    namespace the sweep would reach every process of the uid on the host).
    ``checkpoint``: where the episode is recorded for a fork's child to
    resume (transport/checkpoint.py); None: not recorded."""
    instance = json.loads((root / "instance.json").read_text())
    workspace = Path(instance["cwd"])
    ckpt = Checkpoint(checkpoint)

    def _task():
        return GeneralAgentEnvironment(VerifierExecution(cwd=str(workspace), privileged=True),
                                       instance, task_dir=str(root), **paths)

    def _prepare():
        task = _task()
        try:
            task.setup_environment()
        except ToolServerDown as exc:
            raise InfraError("infra", f"tool server down at setup: {exc}") from None
        chown_tree(str(workspace), agent_uid)
        ckpt.save("setup.json", {"tools": task.tools})
        return task

    def _resume(setup: dict):
        """The parent's task on the forked filesystem (workspace and tool
        state are the parent's; a server starts on the child's first call to it)."""
        task = _task()
        task.env.start()
        task.tools = setup["tools"]
        return task

    _take_prewarmed, prewarm = prewarmer(_prepare)

    class GeneralEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = False

        def __init__(self):
            super().__init__()
            self._state = State()
            self.task = None
            self.terminal = None
            self.findings: list[dict] = []

        def reset(self, seed=None, episode_id=None, task_id=None, **kwargs):
            if task_id not in (None, instance["instance_id"]):
                raise ValueError("This image does not contain that task_id")
            resumed = ckpt.resumed()
            if resumed is not None:  # a fork's child: the parent's episode, findings and all
                setup, episode = resumed
                task, steps, findings = _resume(setup), int(episode["step_count"]), \
                    list(episode["findings"])
            else:
                task, steps, findings = _take_prewarmed() or _prepare(), 0, []
            self.task, self.terminal, self.findings = task, None, findings
            self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=steps)
            self._checkpoint()
            catalogue = [{"server": server, **tool} for server, tools in task.tools.items()
                         for tool in tools]
            lines = [f"- {t['server']}.{t['name']}: {t['description']} "
                     f"args={json.dumps(t['input_schema'].get('properties', {}))}" for t in catalogue]
            text = (instance["problem_statement"]
                    + f"\n\nWorkspace: {workspace}. Actions: "
                    '{"operation":"shell","command":...} runs bash in the workspace (60 s, output '
                    'truncated); {"operation":"tool","server":...,"name":...,"arguments":{...}} '
                    'calls a tool; {"operation":"finish","answer":...} submits your final answer.'
                    "\nTools:\n" + "\n".join(lines))
            return GeneralObservation(task_id=instance["instance_id"], output=_tail(text),
                                      reward=0.0, tools=catalogue)

        def _checkpoint(self) -> None:
            ckpt.save("episode.json", {"episode_id": self._state.episode_id,
                                       "step_count": self._state.step_count,
                                       "findings": self.findings})

        def step(self, action, timeout_s=None, **kwargs):
            observation = self._step(action, timeout_s)
            if not observation.done:
                self._checkpoint()
            return observation

        def _step(self, action, timeout_s):
            if self.task is None:
                raise RuntimeError("reset is required before step")
            if self.terminal is not None:
                return self.terminal
            self._state.step_count += 1
            if action.operation == "finish" or self._state.step_count >= MAX_STEPS:
                return self._finish(action.answer if action.operation == "finish" else None)
            if action.operation == "tool":
                return self._tool(action)
            self.findings += watch.shell_findings(action.command)
            result = run_command(action.command, str(workspace),
                                 min(COMMAND_TIMEOUT, timeout_s or COMMAND_TIMEOUT),
                                 agent=True, agent_uid=agent_uid)
            return GeneralObservation(task_id=instance["instance_id"], output=result["output"],
                                      exit_code=result["returncode"], reward=0.0)

        def _tool(self, action):
            self.findings += watch.tool_findings(action.server, action.name, action.arguments,
                                                 self.task.tools)
            known = {t["name"] for t in self.task.tools.get(action.server, [])}
            if action.name not in known:
                text = (f"unknown tool {action.server}.{action.name}; available: "
                        + ", ".join(f"{s}.{t['name']}" for s, ts in self.task.tools.items() for t in ts))
                return GeneralObservation(task_id=instance["instance_id"], output=_tail(text),
                                          exit_code=1, reward=0.0)
            try:
                result = self.task.call_tool(action.server, action.name, action.arguments,
                                             timeout=COMMAND_TIMEOUT)
            except ToolServerDown as exc:
                raise InfraError("infra", f"tool server down: {exc}") from None
            return GeneralObservation(task_id=instance["instance_id"],
                                      output=_tail("\n".join(result["content"])),
                                      exit_code=1 if result["is_error"] else 0, reward=0.0)

        def _finish(self, answer):
            try:
                killed = verifier_guard.reap(agent_uid) if reap else 0
            except RuntimeError as exc:
                raise InfraError("grader_error", f"agent processes survive: {exc}") from None
            odd = watch.answer_finding(str(workspace))
            if odd:
                self.findings.append(odd)
            if answer is not None:
                self.task.write_answer(answer)
                chown_tree(str(workspace), agent_uid)
            self.findings += watch.owned_entries(agent_uid, [
                str(self.task.verifier_out), str(self.task.state_root), str(self.task.task_dir)])
            findings = watch.capped(self.findings)
            reward, output, info = self.task.calculate_reward(
                timeout=instance.get("verifier_timeout_sec", 900))
            if info.get("error_category") or info.get("transport_error") \
                    or "verifier_returncode" not in info:
                raise InfraError("grader_error", "MiMo verifier infrastructure failed; no valid "
                                 f"reward ({info.get('reward_error') or 'no verifier_returncode'})")
            pending = bool(info.get("pending_judge"))
            self.task.record_integrity(findings, killed)
            self.terminal = GeneralObservation(
                task_id=instance["instance_id"], output="Verifier completed.",
                exit_code=info["verifier_returncode"], reward=None if pending else float(reward),
                done=True, verifier="pending_judge" if pending else "complete",
                integrity_evidence=findings, processes_killed=killed,
                metadata={"pending_judge": pending,
                                     "verifier_returncode": info["verifier_returncode"]})
            return self.terminal

        @property
        def state(self):
            return self._state

    GeneralEnvironment.prewarm = staticmethod(prewarm)
    return GeneralEnvironment
