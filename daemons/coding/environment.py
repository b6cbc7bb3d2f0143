"""The Coding environment: fix a bug in a real repository inside a helper sandbox.

Reset starts a sandbox over [materialized image rootfs, task agent layer]:
the repository is already at /testbed in a lower layer, so reset costs one
CreateSandbox and nothing proportional to the image or the repository.
Actions (seed 001): ``{"operation": "shell", "command": ...}`` runs as the
agent uid from /testbed with a 60 s limit and the output's final 12000
bytes; ``{"operation": "finish"}`` — or the 64th step — ends the episode.
The agent's diff is taken before its sandbox is destroyed; grading then
runs SWE-smith's procedure in a fresh sandbox over [image, grader layer].
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from camg import errors, typed
from camg.environment import Environment, Episode, ServiceContext, Step, Task
from camg.hashing import sha256_bytes, sha256_json

from daemons.coding import grading, images, layers, mirrors, profiles, rows

log = logging.getLogger("camg.coding")

WORKDIR = "/testbed"
DIFF_LIMIT = 1 << 20          # bytes of base64 the helper returns for a diff
GRADE_OUTPUT_LIMIT = 1 << 20

INSTRUCTIONS = (
    "\n\nRepository: /testbed. Use shell actions to inspect, edit, and test it. "
    'Return {{"operation":"finish"}} when ready for the hidden tests. '
    "Each shell call starts in the repository; use cd within a command as needed. "
    "Commands time out after {timeout:g} seconds and output is truncated to its final "
    "{output} bytes. The episode ends after {steps} steps.")

ACTION_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["operation"],
    "properties": {
        "operation": {"enum": ["shell", "finish"],
                      "description": "Run a bash command, or finish and grade the repository."},
        "command": {"type": "string", "maxLength": 16000,
                    "description": "Bash command; each call starts in the task repository."},
    },
    "if": {"properties": {"operation": {"const": "shell"}}},
    "then": {"required": ["command"]},
}

OBSERVATION_SCHEMA = {
    "type": "object",
    "required": ["task_id", "output"],
    "properties": {
        "task_id": {"type": "string"},
        "output": {"type": "string"},
        "exit_code": {"type": ["integer", "null"]},
        "timed_out": {"type": "boolean"},
        "truncated": {"type": "boolean"},
        "step": {"type": "integer"},
    },
}


@dataclasses.dataclass(frozen=True)
class Settings:
    mirrors_root: str
    images: str                                   # materialized-images.json
    layers_root: str = "/var/lib/camg/task-layers/coding"
    build_layers: bool = True                     # build missing layers at start (root only)
    memory_bytes: int = 4 << 30
    cpu_quota: float = 1.0
    pids_max: int = 1024
    command_timeout: float = 60.0
    output_bytes: int = 12000
    max_command_chars: int = 16000
    max_steps: int = 64
    grade_timeout: float = 0.0                    # 0: the profile's own timeout
    helper_owner: str = "coding"

    def __post_init__(self) -> None:
        for name in ("mirrors_root", "images", "layers_root"):
            if not os.path.isabs(getattr(self, name)):
                raise ValueError(f"{name} must be an absolute path")
        if not 0 < self.command_timeout <= 3600 or self.grade_timeout < 0:
            raise ValueError("timeouts must be positive")
        if self.max_steps < 1 or self.output_bytes < 1 or self.max_command_chars < 1:
            raise ValueError("max_steps, output_bytes and max_command_chars must be positive")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Everything an episode of one task needs, checked once at start."""

    row: rows.Row
    ref: mirrors.TaskRef
    image: Any                 # camg.oci.images.MaterializedImage
    layers: layers.TaskLayers
    profile: profiles.Profile


class CodingEnvironment(Environment):
    name = "coding"
    action_schema = ACTION_SCHEMA
    observation_schema = OBSERVATION_SCHEMA

    def __init__(self, context: ServiceContext, tasks: Sequence[Task]) -> None:
        super().__init__(context, tasks)
        self.settings = typed.parse(Settings, context.settings, "coding.settings")
        self.prepared: dict[str, Prepared] = {}
        self.helper = None
        self._catalog_hash = ""

    def start(self) -> None:
        from camg.helper_client import DEFAULT_SOCKET, HelperClient

        s = self.settings
        catalog = images.load(s.images)
        self._catalog_hash = catalog.hash
        build = s.build_layers and os.geteuid() == 0
        for task in self.tasks:
            self.prepared[task.task_id] = self._prepare_task(task, catalog, build)
        grading.preload()
        self.helper = HelperClient(self.context.helper_socket or DEFAULT_SOCKET,
                                   owner=s.helper_owner)
        log.info("coding: %d task(s) verified", len(self.prepared))

    def _prepare_task(self, task: Task, catalog, build: bool) -> Prepared:
        data = dict(task.data)
        try:
            recorded_ref = mirrors.TaskRef(**data.pop("mirror"))
            recorded_image = data.pop("image")
            row = rows.validate(data, 0)
        except (KeyError, TypeError, errors.DatasetError) as exc:
            raise errors.ConfigError(f"task {task.task_id!r}: not a prepared coding task "
                                     f"({exc})") from None
        if row.instance_id != task.task_id:
            raise errors.ConfigError(f"task {task.task_id!r} carries row {row.instance_id!r}")
        try:
            expected = str(mirrors.mirror_path(self.settings.mirrors_root, row))
        except errors.DatasetError as exc:
            raise errors.ConfigError(str(exc)) from None
        if expected != recorded_ref.mirror:
            raise errors.ConfigError(f"task {task.task_id!r}: prepared with mirror "
                                     f"{recorded_ref.mirror}, settings give {expected}")
        mirrors.verify(recorded_ref)
        image = images.verify(catalog, recorded_image)
        built = layers.ensure(self.settings.layers_root, recorded_ref, build=build)
        try:
            profile = profiles.for_repo(row.repo)
        except errors.DatasetError as exc:
            raise errors.ConfigError(str(exc)) from None
        return Prepared(row, recorded_ref, image, built, profile)

    def stop(self) -> None:
        if self.helper is not None:
            self.helper.close()

    def health(self) -> list[str]:
        if self.helper is None:
            return ["not started"]
        try:
            self.helper.ping()
        except errors.CamgError as exc:
            return [f"helper: {exc}"]
        return []

    def metadata(self) -> Mapping[str, Any]:
        here = os.path.dirname(os.path.abspath(__file__))
        grader_sources = b"".join(open(os.path.join(here, name), "rb").read()
                                  for name in ("grading.py", "profiles.py"))
        return {
            "images": self._catalog_hash,
            "task_commits": sha256_json({k: p.ref.to_data() for k, p in self.prepared.items()}),
            "task_layers": sha256_json({k: p.layers.snapshot for k, p in self.prepared.items()}),
            "grader": sha256_json({"sources": sha256_bytes(grader_sources),
                                   "swebench": _version("swebench"),
                                   "test_cmds": {k: p.profile.test_cmd
                                                 for k, p in self.prepared.items()}}),
        }

    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        if self.helper is None:
            raise errors.Unavailable("the coding environment is not started")
        return CodingEpisode(self, self.prepared[task.task_id], episode_id)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


# The helper creates /dev/null & co. through the process umask (0644), which
# the agent uid cannot write to; every shell snippet and pytest needs them.
# Remove once the helper's init makes them 0666 itself.
DEV_FIX = "exec chmod 0666 /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty"


def fix_dev_nodes(helper, sandbox: str) -> None:
    result = helper.exec(sandbox, DEV_FIX, user="root", cwd="/", timeout=10, output_limit=2000)
    if result.exit_code != 0:
        raise errors.InfraFailure(f"cannot prepare /dev in the sandbox: {result.output[-300:]}")


class CodingEpisode(Episode):
    def __init__(self, env: CodingEnvironment, prepared: Prepared, episode_id: str) -> None:
        self.env = env
        self.settings = env.settings
        self.helper = env.helper
        self.task = prepared
        self.episode_id = episode_id
        self.fields = {"EPISODE_ID": episode_id, "TASK_ID": prepared.row.instance_id}
        self.sandbox: str | None = None
        self.grader: str | None = None
        self.steps = 0
        self.terminal: Step | None = None
        self.diff: bytes | None = None
        self.diff_problem: str | None = None
        self.report: grading.Report | None = None
        self._closed = False
        self._dev_ready = False
        self._lock = threading.Lock()        # guards sandbox ids and _closed
        self._step_lock = threading.Lock()   # one step at a time
        image_env = dict(e.split("=", 1) for e in prepared.image.env if "=" in e)
        self.exec_env = {k: v for k, v in image_env.items()
                         if k not in ("HOME", "USER", "LOGNAME", "HOSTNAME")}

    # -- lifecycle ------------------------------------------------------

    def reset(self) -> Mapping[str, Any]:
        # /dev is fixed before the first command instead: reset stays one call.
        sandbox = self._create([self.task.image.rootfs, self.task.layers.agent], fix_dev=False)
        with self._lock:
            if self._closed:
                self._destroy_quietly(sandbox)
                raise errors.SandboxDied("episode closed during reset")
            self.sandbox = sandbox
        s = self.settings
        text = self.task.row.problem_statement + INSTRUCTIONS.format(
            timeout=s.command_timeout, output=s.output_bytes, steps=s.max_steps)
        return {"task_id": self.task.row.instance_id, "output": text, "exit_code": None,
                "timed_out": False, "truncated": False, "step": 0}

    def step(self, action: Mapping[str, Any]) -> Step:
        with self._step_lock:
            if self.terminal is not None:
                return self.terminal
            operation = action.get("operation")
            command = action.get("command")
            if operation == "shell":
                if not isinstance(command, str):
                    raise errors.InvalidAction("a shell action needs a command string")
                if len(command) > self.settings.max_command_chars:
                    raise errors.InvalidAction(
                        f"command is longer than {self.settings.max_command_chars} characters")
                if "\x00" in command:
                    raise errors.InvalidAction("command contains a NUL character")
            elif operation == "finish":
                if command not in (None, ""):
                    raise errors.InvalidAction("a finish action takes no command")
            else:
                raise errors.InvalidAction("operation must be 'shell' or 'finish'")
            self.steps += 1
            if operation == "finish" or self.steps >= self.settings.max_steps:
                return self._finish(auto=operation != "finish")
            return self._shell(command)

    def _shell(self, command: str) -> Step:
        sandbox = self._sandbox()
        if not self._dev_ready:
            self._call(fix_dev_nodes, self.helper, sandbox)
            self._dev_ready = True
        result = self._call(self.helper.exec, sandbox, command, user="agent", cwd=WORKDIR,
                            env=self.exec_env, timeout=self.settings.command_timeout,
                            output_limit=self.settings.output_bytes)
        output = result.output
        if result.timed_out:
            output += f"\n[command timed out after {self.settings.command_timeout:g} seconds]"
        return Step({"task_id": self.task.row.instance_id, "output": output,
                     "exit_code": None if result.timed_out else result.exit_code,
                     "timed_out": result.timed_out, "truncated": result.truncated,
                     "step": self.steps})

    def _finish(self, *, auto: bool) -> Step:
        sandbox = self._sandbox()
        self._collect_diff(sandbox)
        with self._lock:
            self.sandbox = None
        self._destroy_quietly(sandbox)
        text = ("Step limit reached; the repository was submitted for grading." if auto
                else "Finished; the repository was submitted for grading.")
        self.terminal = Step({"task_id": self.task.row.instance_id, "output": text,
                              "exit_code": None, "timed_out": False, "truncated": False,
                              "step": self.steps}, done=True)
        return self.terminal

    def _collect_diff(self, sandbox: str) -> None:
        command = ("set -o pipefail; ( " + grading.diff_command(self.task.layers.snapshot)
                   + " ) | base64 -w0")
        result = self._call(self.helper.exec, sandbox, command, user="root", cwd=WORKDIR,
                            env={}, timeout=max(60.0, self.settings.command_timeout),
                            output_limit=DIFF_LIMIT)
        if result.truncated:
            # The agent's own changes exceed what a submission may be.
            self.diff, self.diff_problem = b"", "diff_too_large"
        elif result.exit_code != 0 or result.timed_out:
            raise errors.GraderError(f"collecting the agent's diff failed (exit "
                                     f"{result.exit_code}): {result.output[-500:]}")
        else:
            try:
                self.diff = base64.b64decode(result.output.strip(), validate=True)
            except ValueError as exc:
                raise errors.GraderError(f"the agent's diff is not base64: {exc}") from None
        log.info("diff collected: %d bytes", len(self.diff), extra=self.fields)

    def grade(self) -> float:
        if self.diff is None:
            raise errors.GraderError("grade() before the episode finished")
        if self.diff_problem is not None:
            self.report = grading.Report(False, self.diff_problem)
            return 0.0
        kept, dropped = grading.filter_diff(self.diff)
        script = grading.eval_script(self.task.profile, self.task.ref.tests)
        timeout = self.settings.grade_timeout or self.task.profile.timeout
        try:
            grader = self._create([self.task.image.rootfs, self.task.layers.grader])
        except errors.SandboxDied as exc:
            raise errors.GraderError(f"grader sandbox: {exc}") from None
        with self._lock:
            self.grader = grader
            closed = self._closed
        try:
            if closed:
                raise errors.GraderError("episode closed during grading")
            try:
                result = self._call(self.helper.exec, grader, script, user="agent", cwd=WORKDIR,
                                    env=self.exec_env, stdin=kept, timeout=timeout,
                                    output_limit=GRADE_OUTPUT_LIMIT)
            except errors.SandboxDied as exc:
                raise errors.GraderError(f"grader sandbox died: {exc}") from None
        finally:
            with self._lock:
                self.grader = None
            self._destroy_quietly(grader)
        self.report = grading.evaluate(result.output, self.task.row, exit_code=result.exit_code,
                                       timed_out=result.timed_out, dropped=dropped)
        log.info("graded: %s (reward %.1f, %d F2P and %d P2P failed, dropped %s)",
                 self.report.reason, self.report.reward, len(self.report.fail_to_pass_failed),
                 len(self.report.pass_to_pass_failed), list(dropped) or "nothing",
                 extra=self.fields)
        return self.report.reward

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sandboxes = [s for s in (self.sandbox, self.grader) if s is not None]
            self.sandbox = self.grader = None
        for sandbox in sandboxes:
            self._destroy_quietly(sandbox)

    def state(self) -> Mapping[str, Any]:
        body: dict[str, Any] = {"steps": self.steps, "finished": self.terminal is not None}
        if self.report is not None:
            body["grade"] = {"reason": self.report.reason, "resolved": self.report.resolved,
                             "fail_to_pass_failed": list(self.report.fail_to_pass_failed),
                             "pass_to_pass_failed": list(self.report.pass_to_pass_failed),
                             "dropped_paths": list(self.report.dropped_paths)}
        return body

    # -- helper plumbing --------------------------------------------------

    def _sandbox(self) -> str:
        with self._lock:
            if self._closed or self.sandbox is None:
                raise errors.SandboxDied("the episode's sandbox is gone (episode closed)")
            return self.sandbox

    def _create(self, lowers: list[str], *, fix_dev: bool = True) -> str:
        s = self.settings
        sandbox = self._call(self.helper.create_sandbox, lowers, memory_bytes=s.memory_bytes,
                             cpu_quota=s.cpu_quota, pids_max=s.pids_max, hostname="testbed")
        if fix_dev:
            try:
                self._call(fix_dev_nodes, self.helper, sandbox)
            except Exception:
                self._destroy_quietly(sandbox)
                raise
        return sandbox

    def _call(self, fn, *args, **kwargs):
        """Helper errors that are not already episode failures become InfraFailure."""
        try:
            return fn(*args, **kwargs)
        except errors.SandboxDied:
            raise
        except errors.InfraFailure as exc:
            # A call racing the death of the sandbox's init can come back as a
            # generic failure; the helper's own view of the sandbox decides.
            sandbox = next((a for a in args if isinstance(a, str)), None)
            if sandbox is not None and self._dead(sandbox):
                raise errors.SandboxDied(f"sandbox {sandbox} died: {exc}") from None
            raise
        except errors.NotFound as exc:
            # The sandbox vanished under us (destroyed by close() or a sweep).
            raise errors.SandboxDied(f"sandbox is gone: {exc}") from None
        except errors.CamgError as exc:
            raise errors.InfraFailure(f"helper: {exc}") from None

    def _dead(self, sandbox: str) -> bool:
        # The helper may take a moment to reap a killed init: ask a few times.
        for _ in range(10):
            try:
                listing = self.helper.list_sandboxes()
            except errors.CamgError:
                return False
            if any(entry.get("sandbox_id") == sandbox and entry.get("alive") is False
                   for entry in listing):
                return True
            time.sleep(0.1)
        return False

    def _destroy_quietly(self, sandbox: str) -> None:
        try:
            self.helper.destroy(sandbox)
        except errors.CamgError as exc:
            # The helper's sweep reclaims what a failed destroy leaves.
            log.warning("destroying sandbox %s failed: %s", sandbox, exc, extra=self.fields)
