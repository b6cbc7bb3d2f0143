"""The software-task transport (seed 001), for ``opensource-code`` instances.

Actions: ``shell`` (a bash command of at most 16000 characters, run as uid
2000 from the repository, 60 s, output cut to the final 12000 bytes with a
note, timeout exit 124) and ``finish``. Step 64 finishes. The terminal
observation is sticky. Finishing runs the MiMo verifier; an infrastructure
failure of the verifier (``error_category``, ``transport_error`` or no
``verifier_returncode``) raises instead of returning a reward.

Two operations only the General service sends (its action filter refuses
them from a trainer), so that the verifier never runs where the agent's
code ran (transport/submission.py):

* ``collect`` in the agent's container: every agent process killed, the
  change record and the submission (the changed regular files) returned,
  nothing written to that container's disk; terminal;
* ``grade`` with that ``submission`` in a fresh container of the pristine
  image (no action taken there before): the files applied over its
  repository, then exactly what ``finish`` does.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import uuid
from pathlib import Path

from mimoagent.environments.datasets.opensource_code import OpenSourceCodeEnvironment
from mimoagent.transport import submission as carried
from mimoagent.transport import verifier_guard
from mimoagent.transport.checkpoint import Checkpoint
from mimoagent.transport.protocol import Action, Environment, Observation, Spec, State
from mimoagent.transport.common import (AGENT_UID, prewarmer, COMMAND_TIMEOUT, MAX_COMMAND_CHARS, MAX_STEPS,
                                        InfraError, VerifierExecution, chown_tree, run_command)


class ShellAction(Action):
    FIELDS = {
        "operation": Spec(str, None, choices=("shell", "finish", "collect", "grade"),
                          description="Run a bash command or finish and grade the repository."),
        "command": Spec(str, "", max_length=MAX_COMMAND_CHARS,
                        description="Bash command; each call starts in the task repository."),
        "submission": Spec(dict, None, description="grade: the files collect returned."),
    }


class ShellObservation(Observation):
    FIELDS = {"task_id": "", "output": "", "exit_code": None}


class CollectObservation(Observation):
    """``collect``'s answer: the change record (what the service screens)
    and the submission (what a fresh container's verifier grades)."""

    FIELDS = {"task_id": "", "output": "", "changes": None, "submission": None,
              "processes_killed": 0}


WORKSPACES = (Path("/testbed"), Path("/workspace/repo"))


def bind(root: Path, agent_uid: int = AGENT_UID, workspaces: tuple[Path, ...] = WORKSPACES,
         guard: verifier_guard.GuardConfig | None = None, checkpoint: str | None = None) -> type:
    """The environment class for the task under ``root`` (instance.json, workspace.tar).

    ``guard`` isolates the grade from what the agent left (verifier_guard:
    its processes killed, pristine .git, clean HOME/TMP, the change record);
    the transport's entry point always passes it. None only for in-process
    tests, where a reap of the agent uid would reach the host's processes.
    ``checkpoint``: where the episode is recorded for a fork's child to
    resume (transport/checkpoint.py); None: not recorded."""
    instance = json.loads((root / "instance.json").read_text())
    workspace = Path(instance["cwd"])
    ckpt = Checkpoint(checkpoint)

    def _prepare():
        """A fresh workspace and a set-up verifier (history stripped)."""
        if workspace not in workspaces:
            raise RuntimeError("Unsupported workspace in pinned task")
        if workspace.exists():
            shutil.rmtree(workspace)
        workspace.parent.mkdir(parents=True, exist_ok=True)
        # 3.11.2's tarfile has no extraction filters; the archive is ours (built with the image).
        subprocess.run(["tar", "-C", str(workspace.parent), "-xf", str(root / "workspace.tar")],
                       check=True)
        chown_tree(str(workspace), agent_uid)
        verifier = OpenSourceCodeEnvironment(
            VerifierExecution(cwd=str(workspace), agent_uid=agent_uid), instance)
        verifier.setup_environment()
        verifier.pristine = None
        if guard is not None:
            verifier.pristine = verifier_guard.Pristine(str(workspace), str(root / "workspace.tar"),
                                                        agent_uid, guard.state_root)
            verifier.pristine.snapshot()
        entries = None if verifier.pristine is None else {
            rel: dataclasses.asdict(e) for rel, e in verifier.pristine.entries.items()}
        ckpt.save("setup.json", {"base_ref": verifier.base_ref, "entries": entries})
        return verifier

    def _resume(setup: dict):
        """The parent's verifier on the forked filesystem (its setup ran
        there already: history stripped, .git copied, snapshot taken)."""
        verifier = OpenSourceCodeEnvironment(
            VerifierExecution(cwd=str(workspace), agent_uid=agent_uid), instance)
        verifier.env.start()
        verifier.base_ref = setup["base_ref"]
        verifier.pristine = None
        if guard is not None:
            if setup.get("entries") is None:
                raise RuntimeError("the parent's setup snapshot is missing")
            verifier.pristine = verifier_guard.Pristine(str(workspace), str(root / "workspace.tar"),
                                                        agent_uid, guard.state_root)
            verifier.pristine.entries = {rel: verifier_guard.Entry(**e)
                                         for rel, e in setup["entries"].items()}
        return verifier

    def _isolate(verifier) -> None:
        """Before the verifier runs: nothing of the agent's may reach it."""
        if guard is None:
            return
        try:
            env, _, verifier.test_guard = verifier_guard.before_grade(
                guard, verifier.pristine, verifier.patch_paths(instance["test_patch"]))
        except Exception as exc:  # noqa: BLE001 -- no isolated grade, no reward
            raise InfraError("grader_error", f"cannot isolate the verifier: {exc}") from None
        verifier.env.extra_env = env

    def _seal(verifier, info: dict, output: str) -> None:
        """The guard's channel for the service's cross-check (its verdict
        decides the grade: environments/general/integrity.py)."""
        if guard is None:
            return
        try:
            verifier_guard.seal(verifier.test_guard, agent_uid, info["verifier_returncode"],
                                output, guard.reap_deadline_s)
        except Exception as exc:  # noqa: BLE001 -- no channel, no trusted grade
            raise InfraError("grader_error", f"cannot collect the test guard's channel: {exc}") \
                from None

    def _collect(verifier) -> CollectObservation:
        """The agent's work, taken out of its container: nothing of the
        agent's runs meanwhile, nothing is written here."""
        if guard is None or verifier.pristine is None:
            raise InfraError("grader_error", "collect needs the guard's setup snapshot")
        try:
            killed = verifier_guard.reap(agent_uid, guard.reap_deadline_s)
            record = verifier.pristine.changes()
            taken = carried.collect(str(workspace), record)
        except Exception as exc:  # noqa: BLE001 -- no record, no grade
            raise InfraError("grader_error", f"cannot collect the agent's changes: {exc}") \
                from None
        return CollectObservation(
            task_id=instance["instance_id"], changes=record, submission=taken,
            processes_killed=killed, done=True,
            output=f"collected {len(taken['files'])} file(s), {len(taken['deleted'])} removal(s)")

    def _apply(verifier, submission, fresh: bool) -> None:
        """The agent's files over this container's pristine repository;
        only in a container where nothing ran as the agent before."""
        if guard is None or not fresh:
            raise InfraError("grader_error", "grade runs only in a fresh container")
        try:
            carried.apply(str(workspace), submission, agent_uid)
        except Exception as exc:  # noqa: BLE001 -- what cannot be applied is not graded
            raise InfraError("grader_error", f"cannot apply the submission: {exc}") from None

    _take_prewarmed, prewarm = prewarmer(_prepare)

    class MiMoEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = False

        def __init__(self):
            super().__init__()
            self._state = State()
            self.verifier = None
            self.terminal = None

        def reset(self, seed=None, episode_id=None, task_id=None, **kwargs):
            if task_id not in (None, instance["instance_id"]):
                raise ValueError("This image does not contain that task_id")
            resumed = ckpt.resumed()
            if resumed is not None:  # a fork's child: the parent's episode goes on
                setup, episode = resumed
                self.verifier, steps = _resume(setup), int(episode["step_count"])
            else:
                self.verifier, steps = _take_prewarmed() or _prepare(), 0
            self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=steps)
            self.terminal = None
            self._checkpoint()
            text = (instance["problem_statement"]
                    + f"\n\nRepository: {workspace}. Use shell actions to inspect, edit, and test it. "
                    'Return {"operation":"finish"} when ready for the original MiMo tests. '
                    "Each shell call starts in the repository; use cd within a command as needed. "
                    "Commands time out after 60 seconds and output is truncated.")
            return ShellObservation(task_id=instance["instance_id"], output=text, reward=0.0)

        def _checkpoint(self) -> None:
            ckpt.save("episode.json", {"episode_id": self._state.episode_id,
                                       "step_count": self._state.step_count})

        def step(self, action, timeout_s=None, **kwargs):
            observation = self._step(action, timeout_s)
            if not observation.done:
                self._checkpoint()
            return observation

        def _step(self, action, timeout_s):
            if self.verifier is None:
                raise RuntimeError("reset is required before step")
            if self.terminal is not None:
                return self.terminal
            fresh = self._state.step_count == 0
            self._state.step_count += 1
            if action.operation == "collect":
                self.terminal = _collect(self.verifier)
                return self.terminal
            if action.operation == "grade":
                _apply(self.verifier, action.submission, fresh)
            if action.operation in ("finish", "grade") or self._state.step_count >= MAX_STEPS:
                _isolate(self.verifier)
                reward, output, info = self.verifier.calculate_reward(
                    timeout=instance["verifier_timeout_sec"])
                if info.get("error_category") or info.get("transport_error") \
                        or "verifier_returncode" not in info:
                    raise InfraError("grader_error",
                                     "MiMo verifier infrastructure failed; no valid reward"
                                     + (f" ({info.get('error_category')}: {info.get('error')})"
                                        if info.get("error_category") else ""))
                _seal(self.verifier, info, output)
                self.terminal = ShellObservation(
                    task_id=instance["instance_id"], output="Original MiMo verifier completed.",
                    exit_code=info["verifier_returncode"], reward=float(reward), done=True,
                    metadata={"verifier_returncode": info["verifier_returncode"],
                              "test_duration": info.get("test_duration"),
                              "test_output_tail": output[-2000:]})
                return self.terminal
            result = run_command(action.command, str(workspace),
                                 min(COMMAND_TIMEOUT, timeout_s or COMMAND_TIMEOUT),
                                 agent=True, agent_uid=agent_uid)
            return ShellObservation(task_id=instance["instance_id"], output=result["output"],
                                    exit_code=result["returncode"], reward=0.0)

        @property
        def state(self):
            return self._state

    MiMoEnvironment.prewarm = staticmethod(prewarm)
    return MiMoEnvironment
