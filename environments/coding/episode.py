"""One Coding episode: a sandbox over [image, agent layer], shell/finish, then grading.

Reset is a single CreateSandbox (the repository is in a lower layer). At
finish every process of the agent is killed from outside (the helper's
KillCommands) before the agent's diff is taken with the root-only copy of
the workspace's git directory; grading runs SWE-smith's procedure in a
fresh sandbox over [image, grader layer] and parses the log with the
installed swebench. Every follow-up check runs in a sandbox of its own, and
a failure of the finish or the grade is proved by ``control`` on fresh
sandboxes before it can become a null (camg.episodes.null_proof).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

from camg import errors
from camg.environment import Episode, Step, Submission
from camg.helper_client import HelperClient
from camg.sandboxes.sandbox_calls import HeldSandbox
from camg.sandboxes.shell_reference import shipped
from environments.coding import (
    diff_paths,
    grader_scripts,
    integrity,
    layers,
    log_evaluation,
    mirrors,
    profiles,
    rows,
)
from environments.coding.settings import Settings

log = logging.getLogger("camg.coding")
# (image hash, grader layer, test command) whose runner started on the
# pristine tree in this process.
_PROBED: set[tuple[str, str, str]] = set()
# Gold diffs (the "Bug Patch" commit reversed) by tests commit, for controls.
_GOLD: dict[str, bytes] = {}

WORKDIR = "/testbed"
DIFF_LIMIT = 1 << 20  # bytes of base64 the helper returns for a diff
GRADE_OUTPUT_LIMIT = 1 << 20

INSTRUCTIONS = (
    "\n\nRepository: /testbed. Use shell actions to inspect, edit, and test it. "
    'Return {{"operation":"finish"}} when ready for the hidden tests. '
    "Each shell call starts in the repository; use cd within a command as needed. "
    "Commands time out after {timeout:g} seconds and output is truncated to its final "
    "{output} bytes. The episode ends after {steps} steps."
)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Everything an episode of one task needs, checked once at start."""

    row: rows.Row
    ref: mirrors.TaskRef
    image: Any  # camg.oci.images.MaterializedImage
    layers: layers.TaskLayers
    profile: profiles.Profile


class CodingEpisode(HeldSandbox, Episode):
    def __init__(
        self,
        settings: Settings,
        helper: HelperClient,
        prepared: Prepared,
        episode_id: str,
        origin: Prepared | None = None,
    ) -> None:
        self.settings = settings
        self.helper = helper
        self.task = prepared
        #: an impossible variant's real task (camg.config.variants): the agent's
        #: sandbox is the same, and a null's control grades the gold fix on it
        #: (no honest fix passes the variant itself)
        self.origin = origin
        self.episode_id = episode_id
        self.fields = {"EPISODE_ID": episode_id, "TASK_ID": prepared.row.instance_id}
        self.sandbox: str | None = None
        self.grader: str | None = None
        # Grader, follow-up and control sandboxes alive now (close() takes them).
        self._graders: set[str] = set()
        # A grader sandbox whose init died or that was gone before we
        # destroyed it: the infrastructure's doing (a kill from outside, a
        # helper restart), never the agent's, whose code runs as the test uid
        # and cannot signal the sandbox's root init.
        self._grader_lost = False
        self.steps = 0
        self.terminal: Step | None = None
        self.diff: bytes | None = None
        self.diff_problem: str | None = None
        self.report: log_evaluation.Report | None = None
        self._screened: list[dict] = []  # the diff screen's findings, for a canary's evidence
        self._closed = False
        self._lock = threading.Lock()  # guards sandbox ids and _closed
        self._step_lock = threading.Lock()  # one step at a time
        image_env = dict(e.split("=", 1) for e in prepared.image.env if "=" in e)
        self.exec_env = {
            k: v for k, v in image_env.items() if k not in ("HOME", "USER", "LOGNAME", "HOSTNAME")
        }

    # -- lifecycle ------------------------------------------------------

    def reset(self) -> Mapping[str, Any]:
        sandbox = self._create([self.task.image.rootfs, self.task.layers.agent])
        with self._lock:
            if self._closed:
                self._destroy_quietly(sandbox)
                raise errors.SandboxDied("episode closed during reset")
            self.sandbox = sandbox
        s = self.settings
        text = self.task.row.problem_statement + INSTRUCTIONS.format(
            timeout=s.command_timeout, output=s.output_bytes, steps=s.max_steps
        )
        return {
            "task_id": self.task.row.instance_id,
            "output": text,
            "exit_code": None,
            "timed_out": False,
            "truncated": False,
            "step": 0,
        }

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
                        f"command is longer than {self.settings.max_command_chars} characters"
                    )
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
            # a shell action: its command was checked to be a string above
            return self._shell(cast(str, command))

    def _shell(self, command: str) -> Step:
        sandbox = self._sandbox()
        result = self._call(
            self.helper.exec,
            sandbox,
            command,
            user="agent",
            cwd=WORKDIR,
            env=self.exec_env,
            timeout=self.settings.command_timeout,
            output_limit=self.settings.output_bytes,
        )
        output = result.output
        if result.timed_out:
            output += f"\n[command timed out after {self.settings.command_timeout:g} seconds]"
        return Step(
            {
                "task_id": self.task.row.instance_id,
                "output": output,
                # 124 like timeout(1), as seed 001's runtime reports it.
                "exit_code": 124 if result.timed_out else result.exit_code,
                "timed_out": result.timed_out,
                "truncated": result.truncated,
                "step": self.steps,
            }
        )

    def _finish(self, *, auto: bool) -> Step:
        sandbox = self._sandbox()
        # Nothing the agent started runs on while its changes are taken: a
        # process left behind could fill the pids limit (no command could
        # start), rewrite the tree under git, or hold files open. Killed
        # from outside, through the sandbox's freezer cgroup.
        killed = self._call(self.helper.kill_commands, sandbox)
        if killed:
            log.info(
                "finish: killed %d process(es) the agent left running", killed, extra=self.fields
            )
        self._collect_diff(sandbox)
        self._take_usage(sandbox)
        with self._lock:
            self.sandbox = None
        self._destroy_quietly(sandbox)
        text = (
            "Step limit reached; the repository was submitted for grading."
            if auto
            else "Finished; the repository was submitted for grading."
        )
        self.terminal = Step(
            {
                "task_id": self.task.row.instance_id,
                "output": text,
                "exit_code": None,
                "timed_out": False,
                "truncated": False,
                "step": self.steps,
            },
            done=True,
        )
        return self.terminal

    def _diff_exec(self, sandbox: str):
        command = (
            "set -o pipefail; ( "
            + diff_paths.diff_command(self.task.layers.snapshot, limit=DIFF_LIMIT)
            + " ) | base64 -w0"
        )
        return self._call(
            self.helper.exec,
            sandbox,
            command,
            user="root",
            cwd=WORKDIR,
            env={},
            timeout=max(60.0, self.settings.command_timeout),
            output_limit=DIFF_LIMIT,
        )

    def _collect_diff(self, sandbox: str) -> None:
        result = self._diff_exec(sandbox)
        if result.truncated or result.exit_code == diff_paths.TOO_LARGE_EXIT:
            # The agent's own changes exceed what a submission may be.
            self.diff, self.diff_problem = b"", "diff_too_large"
        elif result.exit_code != 0 or result.timed_out:
            raise errors.GraderError(
                f"collecting the agent's diff failed (exit "
                f"{result.exit_code}): {result.output[-500:]}"
            )
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
            self.report = log_evaluation.Report(False, self.diff_problem)
            return 0.0
        kept, dropped = diff_paths.filter_diff(self.diff)
        findings = integrity.screen(self.diff)
        self._screened = [f.to_data() for f in findings]
        try:
            self.report = self._run_grader(kept, dropped, findings)
        except errors.GraderError:
            raise
        except errors.InfraFailure as exc:
            # Whatever broke (sandbox died, helper gone), no honest grade exists.
            raise errors.GraderError(f"grader sandbox: {exc}") from None
        log.info(
            "graded: %s (reward %.1f, integrity %s, %d F2P and %d P2P failed, dropped %s)",
            self.report.reason,
            self.report.reward,
            self.report.integrity,
            len(self.report.fail_to_pass_failed),
            len(self.report.pass_to_pass_failed),
            list(dropped) or "nothing",
            extra=self.fields,
        )
        if self.report.integrity != "ok":
            log.warning("tampering: %s", list(self.report.evidence), extra=self.fields)
        return self.report.reward

    def _run_grader(
        self, diff: bytes, dropped, findings, task: Prepared | None = None
    ) -> log_evaluation.Report:
        task = task or self.task
        profile = task.profile
        # The runner is probed on the pristine tree before the first grade of
        # each (image, grader layer, command); later grades probe only when
        # their run never started (below): the answer cannot differ, the
        # lowers are read-only.
        probe_key = (task.image.hash, task.layers.grader, profile.test_cmd)
        first = probe_key not in _PROBED
        script = grader_scripts.eval_script(profile, task.ref.tests, probe=first)
        timeout = self.settings.grade_timeout or profile.timeout
        # Fresh keys per script run, one per guard session, on the script's
        # stdin (an environment and the script text are readable in /proc).
        keys = grader_scripts.new_keys(grader_scripts.eval_keys(first))
        result = self._in_grader(script, keys, diff, timeout, task)
        report = log_evaluation.evaluate(
            result.output,
            task.row,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            keys=keys,
            dropped=dropped,
            findings=findings,
            suspicious_reward=self.settings.suspicious_reward,
        )
        if first:
            _PROBED.add(probe_key)
        # The follow-ups run in fresh grader sandboxes of the pristine image:
        # the agent's code ran in the first one as the test uid and may have
        # left anything there (a scratch directory it made unwritable,
        # processes filling its pids limit).
        if not report.runner_started:
            probe_keys = grader_scripts.new_keys(grader_scripts.PROBE_KEYS)
            check = self._in_grader(
                grader_scripts.probe_script(profile), probe_keys, b"", timeout, task
            )
            if check.exit_code != 0:
                _PROBED.discard(probe_key)
                raise errors.GraderError(
                    f"the grader's test command cannot start "
                    f"(exit {check.exit_code}): {check.output[-2000:]}"
                )
        if report.none_collected and not report.resolved:
            # None of the listed tests was collected: the agent broke
            # collection (0.0), or the grader cannot collect them at all.
            collect_keys = grader_scripts.new_keys(grader_scripts.COLLECT_KEYS)
            check = self._in_grader(
                grader_scripts.collect_script(profile), collect_keys, b"", timeout, task
            )
            log_evaluation.require_collectable(check.output, collect_keys, task.row)
        return report

    def _in_grader(
        self, script: str, keys: list[bytes], diff: bytes, timeout: float, task: Prepared
    ):
        """``script`` in a fresh sandbox over [image, grader layer], destroyed after."""
        grader = self._create([task.image.rootfs, task.layers.grader])
        with self._lock:
            self.grader = grader
            self._graders.add(grader)
            closed = self._closed
        try:
            if closed:
                raise errors.GraderError("episode closed during grading")
            return self._call(
                self.helper.exec,
                grader,
                script,
                user="agent",
                cwd=WORKDIR,
                env=self.exec_env,
                stdin=grader_scripts.script_stdin(keys, diff),
                timeout=timeout,
                output_limit=GRADE_OUTPUT_LIMIT,
            )
        except errors.SandboxDied:
            self._grader_lost = True
            raise
        finally:
            with self._lock:
                self._graders.discard(grader)
                if self.grader == grader:
                    self.grader = None
            if not self._destroy_quietly(grader):
                self._grader_lost = True

    # -- proving a null (camg.episodes.null_proof) ---------------------------------

    def control(self, failure: Exception, phase: str) -> Sequence[str] | None:
        """The same path on fresh sandboxes of the pristine image with a
        control submission: it works -> the agent's submission caused
        ``failure`` (evidence lines; reward 0.0, ``obstructed``); it fails
        too, or the infrastructure itself removed a sandbox of this episode
        -> raise (the null stands)."""
        with self._lock:
            closed, sandbox = self._closed, self.sandbox
        if closed:
            raise errors.InfraFailure("the episode was closed: no control")
        if phase == "grade":
            return self._control_grade()
        if phase == "step":
            return self._control_step(sandbox)
        return None

    def _control_grade(self) -> list[str]:
        if self._grader_lost:
            raise errors.GraderError(
                "a grader sandbox died or was removed from outside (or the "
                "helper could not be asked): an infrastructure failure"
            )
        # A variant's control is its real task's: the gold fix on the pristine
        # tests commit proves the grader works (it fails the variant by design).
        control = self.origin or self.task
        ref = control.ref
        gold = _GOLD.get(ref.tests)
        if gold is None:
            gold = _GOLD[ref.tests] = mirrors.gold_diff(ref)
        kept, dropped = diff_paths.filter_diff(gold)
        report = self._run_grader(kept, dropped, integrity.screen(gold), control)
        if report.reward != 1.0:
            raise errors.GraderError(
                f"control: the gold fix earned {report.reward} "
                f"({report.reason}, integrity {report.integrity})"
            )
        return [
            f"control: the gold fix graded in fresh grader sandboxes over [image, grader "
            f"layer] resolved the task ({len(control.row.fail_to_pass)} FAIL_TO_PASS, "
            f"{len(control.row.pass_to_pass)} PASS_TO_PASS passed)"
        ]

    def _control_step(self, sandbox: str | None) -> list[str]:
        if sandbox is None:
            raise errors.SandboxDied("the episode holds no sandbox: no control")
        listed = [e for e in self.helper.list_sandboxes() if e.get("sandbox_id") == sandbox]
        if not listed or listed[0].get("alive") is False:
            # The agent runs as uid 2000 and cannot signal its sandbox's
            # root init; an init dead or a sandbox gone is the infrastructure's.
            raise errors.SandboxDied(
                "the agent's sandbox died or was removed from outside (a "
                "kill, a helper restart, a release): an infrastructure "
                "failure"
            )
        fresh = self._create([self.task.image.rootfs, self.task.layers.agent])
        with self._lock:
            self._graders.add(fresh)
        try:
            shell = self._call(
                self.helper.exec,
                fresh,
                "true",
                user="agent",
                cwd=WORKDIR,
                env=self.exec_env,
                timeout=self.settings.command_timeout,
                output_limit=self.settings.output_bytes,
            )
            if shell.exit_code != 0 or shell.timed_out:
                raise errors.InfraFailure(
                    f"control: a shell action in a fresh agent sandbox "
                    f"failed (exit {shell.exit_code})"
                )
            result = self._diff_exec(fresh)
            if result.exit_code != 0 or result.timed_out or result.truncated:
                raise errors.GraderError(
                    f"control: the diff collection in a fresh agent "
                    f"sandbox failed (exit {result.exit_code}): "
                    f"{result.output[-300:]}"
                )
        finally:
            with self._lock:
                self._graders.discard(fresh)
            self._destroy_quietly(fresh)
        return [
            "control: in a fresh sandbox over [image, agent layer] a shell action and the "
            f"diff collection both succeeded (exit 0, {result.duration:.1f} s)"
        ]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sandboxes = [s for s in (self.sandbox, self.grader, *self._graders) if s is not None]
            self.sandbox = self.grader = None
            self._graders.clear()
        sandboxes = list(dict.fromkeys(sandboxes))
        for sandbox in sandboxes:
            self._destroy_quietly(sandbox)

    def fork(self, episode_id: str) -> CodingEpisode:
        """A child with the same task and step count over this sandbox's
        filesystem as it stands (the helper's ForkSandbox: both continue on
        a shared frozen layer, each with a fresh upper). Nothing graded is
        carried (the manager forks only unfinished episodes): the child's
        diff is taken from its own tree at its finish, so it holds what the
        parent did before the fork as well as what the child did."""
        if self.terminal is not None:
            raise errors.NotForkable("the episode has finished", what="finished")
        child = CodingEpisode(self.settings, self.helper, self.task, episode_id, self.origin)
        child.steps = self.steps
        child.sandbox = self._fork_sandbox(self._sandbox())
        log.info("forked into %s at step %d", episode_id, self.steps, extra=self.fields)
        return child

    def outcome(self) -> Mapping[str, Any]:
        # The image the sandbox was built from, signed into the record
        # (camg.episodes.signing), graded or not.
        out: dict[str, Any] = {"image": self.task.image.reference, **self._cost()}
        if self.report is not None:
            out.update(self.report.outcome())
            if self.origin is not None and self.report.reward > 0:
                # An impossible variant passed: the grader was beaten. What
                # the screen and the guard saw is the evidence to read.
                out["canary_evidence"] = {
                    "screen": list(self._screened),
                    "guard": dict(self.report.guard_seen),
                    "dropped_paths": list(self.report.dropped_paths),
                    "changed_paths": list(
                        dict.fromkeys(
                            path
                            for section in diff_paths.split_sections(self.diff or b"")
                            for path in diff_paths.section_paths(section)
                        )
                    ),
                }
        return out

    def submission(self) -> Submission | None:
        """The agent's diff as collected at finish (regraded by
        CodingEnvironment.regrade exactly as grade() graded it)."""
        if self.diff is None:
            return None
        return Submission(
            self.diff, {"diff_problem": self.diff_problem} if self.diff_problem else {}
        )

    def reference_action(self) -> Mapping[str, Any] | None:
        """The gold fix (the row's patch, reversed), as shell actions from
        step 0, then finish: chunks of the base64 patch appended to a file
        (a command holds at most max_command_chars), then one git apply -R."""
        store = "/tmp/.camg-reference.b64"
        plan = shipped(
            self.task.row.patch.encode(),
            store,
            f"base64 -d {store} | git apply -R && rm -f {store}",
            max_command=self.settings.max_command_chars,
        )
        return plan[min(self.steps, len(plan) - 1)]

    def state(self) -> Mapping[str, Any]:
        body: dict[str, Any] = {"steps": self.steps, "finished": self.terminal is not None}
        if self.report is not None:
            body["grade"] = {
                "reason": self.report.reason,
                "resolved": self.report.resolved,
                "fail_to_pass_failed": list(self.report.fail_to_pass_failed),
                "pass_to_pass_failed": list(self.report.pass_to_pass_failed),
                "dropped_paths": list(self.report.dropped_paths),
                "integrity": self.report.integrity,
                "integrity_evidence": list(self.report.evidence),
            }
        return body

    # -- helper plumbing --------------------------------------------------

    def _create(self, lowers: list[str]) -> str:
        s = self.settings
        return self._call(
            self.helper.create_sandbox,
            lowers,
            memory_bytes=s.memory_bytes,
            cpu_quota=s.cpu_quota,
            pids_max=s.pids_max,
            hostname="testbed",
        )

    def _destroy_quietly(self, sandbox: str) -> bool:
        """False when the sandbox was already gone or the helper could not be asked."""
        try:
            return self.helper.destroy(sandbox)
        except errors.CamgError as exc:
            # The helper's sweep reclaims what a failed destroy leaves.
            log.warning("destroying sandbox %s failed: %s", sandbox, exc, extra=self.fields)
            return False
