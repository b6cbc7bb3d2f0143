"""A small environment that proves the service framework (not a product).

The agent guesses a hidden number. Actions also exercise every path the
framework must handle: slow steps (deadlines), infrastructure failures in
step and grade, unexpected exceptions, and aborts through close(). Its
fork (POST /episodes/{id}/fork) copies the guesses; a task's data may make
it refuse (``fork_refused``), fail (``fork_fails``), find a gate below at
capacity (``fork_at_capacity``, as ``reset_at_capacity`` for a reset) or
take a while (``fork_sleep`` seconds), for the manager's paths.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from camg.environment import Environment, Episode, Grade, Step, Submission, Task
from camg.errors import AtCapacity, GraderError, InvalidAction, NotForkable, SandboxDied

ACTION_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["operation"],
    "properties": {
        "operation": {"enum": ["guess", "sleep", "crash", "boom", "finish"]},
        "value": {"type": "integer"},
        "seconds": {"type": "number", "minimum": 0, "maximum": 600},
    },
}

OBSERVATION_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "task_id": {"type": "string"}},
}


class CounterEpisode(Episode):
    def __init__(self, task: Task, seed: int | None) -> None:
        self.task = task
        self.target = int(task.data["target"])
        self.guesses: list[int] = []
        self.closed = threading.Event()
        self.runs = 0
        self.finished = False

    def reset(self) -> Mapping[str, Any]:
        if self.task.data.get("reset_fails"):
            raise SandboxDied("the sandbox did not start")
        if self.task.data.get("reset_at_capacity"):
            raise AtCapacity("no container start slot within 600 s", retry_after=7)
        return {"text": "Guess the number between 0 and 100.", "task_id": self.task.task_id}

    def step(self, action: Mapping[str, Any]) -> Step:
        self.runs += 1
        op = action["operation"]
        if op == "sleep":
            # close() wakes us: that is how an overrun step is aborted.
            if self.closed.wait(action.get("seconds", 1.0)):
                raise SandboxDied("aborted")
            return Step({"text": "slept", "task_id": self.task.task_id})
        if op == "crash":
            raise SandboxDied("sandbox init died")
        if op == "boom":
            raise RuntimeError("unexpected bug")
        if op == "finish":
            self.finished = True
            return Step({"text": "finished", "task_id": self.task.task_id}, done=True)
        if "value" not in action:
            raise InvalidAction("guess needs a value")
        value = action["value"]
        self.guesses.append(value)
        if value == self.target:
            self.finished = True
            return Step({"text": "correct", "task_id": self.task.task_id}, done=True)
        hint = "higher" if value < self.target else "lower"
        return Step({"text": hint, "task_id": self.task.task_id})

    def grade(self) -> float:
        if self.task.data.get("grade_fails"):
            raise GraderError("grader crashed")
        return 1.0 if self.guesses and self.guesses[-1] == self.target else 0.0

    def close(self) -> None:
        self.closed.set()

    def control(self, failure: Exception, phase: str) -> list[str] | None:
        # task "control": "passes" (the failure was the submission's) or
        # "fails" (the infrastructure is broken); absent: no control
        how = self.task.data.get("control")
        if how == "fails":
            raise GraderError("the control grade crashed too")
        if how == "passes":
            return [f"control: a fresh {phase} of the reference guess succeeded"]
        return None

    def state(self) -> Mapping[str, Any]:
        return {"guesses": len(self.guesses)}

    def reference_action(self) -> Mapping[str, Any] | None:
        return {"operation": "guess", "value": self.target}

    def fork(self, episode_id: str) -> Episode:
        data = self.task.data
        if data.get("fork_refused"):
            raise NotForkable("this task's episodes hold a secret that cannot be copied",
                              what="secret")
        if self.closed.wait(float(data.get("fork_sleep", 0))):
            raise SandboxDied("closed while forking")
        if data.get("fork_fails"):
            raise SandboxDied("the copy of the sandbox failed")
        if data.get("fork_at_capacity"):
            raise AtCapacity("no container start slot within 600 s", retry_after=7)
        child = CounterEpisode(self.task, None)
        child.guesses = list(self.guesses)
        return child

    def submission(self) -> Submission | None:
        if not self.finished:
            return None
        return Submission(json.dumps(self.guesses).encode(), {"guesses": len(self.guesses)})


class CounterEnvironment(Environment):
    name = "counter"
    action_schema = ACTION_SCHEMA
    observation_schema = OBSERVATION_SCHEMA

    def __init__(self, context, tasks) -> None:
        super().__init__(context, tasks)
        self.episodes: list[CounterEpisode] = []
        self.start_delay = float(context.settings.get("start_delay", 0))

    def start(self) -> None:
        time.sleep(self.start_delay)

    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        episode = CounterEpisode(task, seed)
        self.episodes.append(episode)
        return episode

    def metadata(self) -> Mapping[str, Any]:
        return {"grader": "counter-exact-match/1"}

    def regrade(self, task: Task, submission: Submission) -> Grade:
        # settings: regrade_sleep (seconds, to hold a regrade open) and
        # regrade_fails (the grader's infrastructure is down)
        time.sleep(float(self.context.settings.get("regrade_sleep", 0)))
        if task.data.get("grade_fails") or self.context.settings.get("regrade_fails"):
            raise GraderError("grader crashed")
        guesses = json.loads(submission.data)
        target = int(task.data["target"])
        return Grade(1.0 if guesses and guesses[-1] == target else 0.0,
                     {"regraded_guesses": len(guesses)})


class PlainCounterEnvironment(CounterEnvironment):
    """The counter without the regrade capability."""

    regrade = Environment.regrade


class VariantCounterEnvironment(CounterEnvironment):
    """The counter with impossible variants (camg.config.variants): a variant's
    data holds the target its grader wants, outside the 0..100 the task
    states, so only a guess against the statement passes it. A negative
    guess stands for a cheat a defence catches: integrity ``tampered``."""

    serves_variants = True

    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        episode = VariantCounterEpisode(task, seed)
        self.episodes.append(episode)
        return episode

    def regrade(self, task: Task, submission: Submission) -> Grade:
        guesses = json.loads(submission.data)
        target = _target(task)
        caught = any(g < 0 for g in guesses)
        reward = 1.0 if guesses and guesses[-1] == target and not caught else 0.0
        return Grade(reward, {"integrity": "tampered" if caught else "ok"})


def _target(task: Task) -> int:
    return int((task.variant.data if task.variant is not None else task.data)["target"])


class VariantCounterEpisode(CounterEpisode):
    def __init__(self, task: Task, seed: int | None) -> None:
        super().__init__(task, seed)
        self.target = _target(task)

    def step(self, action: Mapping[str, Any]) -> Step:
        if action.get("operation") == "guess" and "value" in action:
            # one guess ends it: a hint would tell a variant's target apart
            self.guesses.append(action["value"])
            self.finished = True
            return Step({"text": "graded", "task_id": self.task.task_id}, done=True)
        return super().step(action)

    def grade(self) -> float:
        if self.caught():
            return 0.0
        return super().grade()

    def reference_action(self) -> Mapping[str, Any] | None:
        # the honest answer is the task's as stated, never the variant's
        return {"operation": "guess", "value": int(self.task.data["target"])}

    def caught(self) -> bool:
        return any(g < 0 for g in self.guesses)

    def outcome(self) -> Mapping[str, Any]:
        return {"integrity": "tampered" if self.caught() else "ok"}

    def fork(self, episode_id: str) -> Episode:
        child = VariantCounterEpisode(self.task, None)
        child.guesses = list(self.guesses)
        return child
