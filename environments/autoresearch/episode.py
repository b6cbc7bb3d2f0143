"""One AutoResearch episode: a sandbox over [image rootfs, the task's public workspace].

The agent runs experiments as uid 2000 from /workspace (writable: the
sandbox's disk upper, ``disk_bytes``), reads the task from /task (the
read-only public workspace), may start long commands in the background
(their output goes to /workspace/.jobs/N.log, read back by a later
``jobs`` or ``log`` action) and ends with ``submit``: the bytes of
/workspace/submission.csv are copied out of the sandbox, the sandbox is
destroyed, and only those bytes go to the private grader.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from camg import errors
from camg.environment import Episode, Step, Submission
from camg.sandboxes.sandbox_calls import HeldSandbox
from camg.sandboxes.shell_reference import shipped
from environments.autoresearch.settings import Settings

log = logging.getLogger("camg.autoresearch")

WORKDIR = "/workspace"
TASK_DIR = "/task"
SUBMISSION = "/workspace/submission.csv"
JOBS = "/workspace/.jobs"
MAX_SUBMISSION = 8 << 20
#: the least a control (the reference solution in a fresh sandbox) must earn
#: to prove that the grading path works (validation's REFERENCE_MIN)
CONTROL_MIN = 0.9

INSTRUCTIONS = (
    "\n\nThe task's files are in /task (read-only); work in /workspace. "
    'Actions: {{"operation":"shell","command":...}} runs bash (at most {minutes:g} minutes; '
    'output is cut to its final {output} bytes); {{"operation":"background","command":...}} '
    "starts a long job and returns its number at once (its output goes to /workspace/.jobs/N.log); "
    '{{"operation":"jobs"}} lists jobs with their state and the end of their logs; '
    '{{"operation":"log","job":N}} shows the end of one job\'s log; '
    '{{"operation":"submit"}} grades /workspace/submission.csv (CSV header id,prediction) '
    "and ends the episode. The episode ends on its own after {episode:g} minutes or "
    "{steps} steps; whatever /workspace/submission.csv holds then is graded."
)

_JOB_LAUNCH = (
    # The log exists before the job starts, so a listing right after sees it.
    # The launcher waits until the job runs in a session of its own (its
    # .started marker): the sandbox's init kills the exec's process group
    # when the launcher exits, and setsid -f's child, not yet scheduled on a
    # loaded machine, was still in that group and died with it (the job then
    # never ran: rehearsals at b3d9d1c and 8ffd67c).
    "mkdir -p {jobs} && : > {jobs}/{n}.log && cd {work} && "
    "setsid -f bash -c ': > {jobs}/$0.started; "
    'timeout -s KILL "$1" bash -c "$2" > {jobs}/$0.log 2>&1 < /dev/null; '
    'echo $? > {jobs}/$0.exit\' {n} {seconds} "$CAMG_JOB_COMMAND" && '
    "for i in $(seq 1200); do [ -e {jobs}/{n}.started ] && echo started && exit 0; sleep 0.05; "
    "done; echo 'the job did not start within 60 s'; exit 1"
)
_JOBS_LIST = (
    "cd {jobs} 2>/dev/null || {{ echo 'no jobs'; exit 0; }}; "
    "for log in $(ls *.log 2>/dev/null | sort -n); do n=${{log%.log}}; "
    'if [ -f $n.exit ]; then s="exited $(cat $n.exit)"; else s=running; fi; '
    'echo "== job $n: $s, $(stat -c %s $log) bytes of output"; tail -n 5 $log; done'
)


@dataclasses.dataclass(frozen=True)
class Prepared:
    task_id: str
    statement: str
    workspace: str  # the public workspace lower
    image: Any  # camg.oci.images.MaterializedImage


# At finish nothing of the agent's runs while its submission is taken. The
# helper kills every process of the sandbox but its init from outside (the
# freezer cgroup: nothing forks away) and returns once they are gone from the
# cgroup, their last system calls finished, before any command of the
# collection starts. A job therefore never sees the collection begin, and
# nothing is left that could change the file: the bytes graded are the
# file as it stood when the episode ended. Only then does a fresh command,
# as the sandbox's root (no chmod of the agent's keeps it out), read the
# file's state, and the helper copies it.
#
# The collection used to run its checks inside the sandbox while the
# agent's jobs still ran and kill them from there: a job that watched for
# it wrote new bytes into place before its first look and was graded on
# them (and one merely slow to write again slipped past its before/after
# comparison), the agent could kill, starve or trace those checks, and the
# writer scan ran as the agent itself.
PROBE_TIMEOUT_S = 60
_STATE = (
    "S={path}; if [ -L $S ]; then echo \"state=link $(readlink $S | tr -d '\\n' | head -c 160)\"; "
    "elif [ -e $S ]; then echo \"state=$(stat -c '%F|%s' $S)\"; else echo state=missing; fi"
)

#: What the helper says when the sandbox's init cannot fork a command
#: (helper/sandbox.py): the sandbox's own process table (pids_max) or memory
#: is full, which only the agent's processes can do. A finished episode then
#: has no submission to take; a step shows it as the command's output.
_NOT_STARTED = "could not start the command"


def _not_started(exc: errors.InfraFailure) -> bool:
    return not isinstance(exc, errors.SandboxDied) and _NOT_STARTED in str(exc)


@dataclasses.dataclass(frozen=True)
class _Unstarted:
    """An agent command the sandbox could not start, as the helper's result."""

    output: str
    exit_code: int = 126
    timed_out: bool = False
    truncated: bool = False


@dataclasses.dataclass
class Report:
    submitted: bool
    valid: bool = False
    score: float | None = None
    detail: str = ""
    grade_seconds: float | None = None
    rule: str = ""  # why an invalid submission is (metrics.SubmissionInvalid)
    integrity: str = "ok"  # "ok" | "tampered"
    evidence: list[str] = dataclasses.field(default_factory=list)


def graded(
    grade: Callable[[str, bytes], dict],
    task_id: str,
    submitted: bytes | None,
    evidence: Sequence[str] = (),
) -> tuple[float, Report]:
    """(reward, report) of a submission by the private grader; no file is 0.
    ``evidence``: what the collection saw (a link, a fifo, a job still
    writing); any evidence, or ids the test set does not have, makes the
    verdict "tampered" and the reward 0.0. An episode's grade and a regrade
    (ResearchEnvironment.regrade) both come here."""
    found = list(evidence)
    if submitted is None:
        reward, report = 0.0, Report(submitted=False, detail="missing")
    else:
        reply = grade(task_id, submitted)
        reward = float(reply["reward"])
        report = Report(
            True,
            bool(reply.get("valid")),
            reply.get("score"),
            str(reply.get("detail", "")),
            reply.get("seconds"),
            str(reply.get("rule", "")),
        )
        if report.rule == "unknown_id":
            found.append(f"submission_unknown_id: {report.detail[:120]}")
    if found:
        reward, report.integrity, report.evidence = 0.0, "tampered", found
    return reward, report


class ResearchEpisode(HeldSandbox, Episode):
    def __init__(
        self,
        settings: Settings,
        helper,
        grade: Callable[[str, bytes], dict],
        prepared: Prepared,
        episode_id: str,
        ledger=None,
    ) -> None:
        self.settings = settings
        self.helper = helper
        self.grade_submission = grade
        self.task = prepared
        self.episode_id = episode_id
        self.ledger = ledger
        self.fields = {"EPISODE_ID": episode_id, "TASK_ID": prepared.task_id}
        self.sandbox: str | None = None
        self.steps = 0
        self.jobs = 0
        self.started = 0.0
        self.terminal: Step | None = None
        self.submitted: bytes | None = None
        self.evidence: list[str] = []  # what the collection saw (graded's evidence)
        self.report: Report | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._step_lock = threading.Lock()
        image_env = dict(e.split("=", 1) for e in prepared.image.env if "=" in e)
        self.exec_env = {
            k: v for k, v in image_env.items() if k not in ("USER", "LOGNAME", "HOSTNAME")
        }
        self.exec_env["HOME"] = WORKDIR

    # -- lifecycle ------------------------------------------------------

    def reset(self) -> Mapping[str, Any]:
        s = self.settings
        sandbox = self._call(
            self.helper.create_sandbox,
            [self.task.image.rootfs, self.task.workspace],
            memory_bytes=s.memory_bytes,
            cpu_quota=s.cpu_quota,
            pids_max=s.pids_max,
            hostname="research",
            upper="disk",
            upper_bytes=s.disk_bytes,
        )
        if self.ledger is not None:
            self.ledger.add_sandbox(sandbox)
        with self._lock:
            if self._closed:
                self._destroy(sandbox)
                raise errors.SandboxDied("episode closed during reset")
            self.sandbox = sandbox
        self.started = time.monotonic()
        text = self.task.statement + INSTRUCTIONS.format(
            minutes=s.command_minutes,
            output=s.output_bytes,
            episode=s.episode_minutes,
            steps=s.max_steps,
        )
        return self._observation(text, None)

    def _remaining(self) -> float:
        return self.settings.episode_minutes * 60 - (time.monotonic() - self.started)

    def _observation(self, output: str, exit_code: int | None, **extra: Any) -> dict:
        body = {
            "task_id": self.task.task_id,
            "output": output,
            "exit_code": exit_code,
            "timed_out": False,
            "truncated": False,
            "step": self.steps,
            "elapsed_s": round(time.monotonic() - self.started, 3) if self.started else 0.0,
            "remaining_s": round(max(0.0, self._remaining()), 3) if self.started else None,
        }
        body.update(extra)
        return body

    def step(self, action: Mapping[str, Any]) -> Step:
        with self._step_lock:
            if self.terminal is not None:
                return self.terminal
            op = action.get("operation")
            command = action.get("command")
            if op in ("shell", "background"):
                if not isinstance(command, str) or not command.strip():
                    raise errors.InvalidAction(f"a {op} action needs a command string")
                if len(command) > self.settings.max_command_chars or "\x00" in command:
                    raise errors.InvalidAction(
                        f"command must be at most "
                        f"{self.settings.max_command_chars} characters, "
                        "without NUL"
                    )
            elif op == "log":
                if not isinstance(action.get("job"), int) or not 1 <= action["job"] <= self.jobs:
                    raise errors.InvalidAction(f"job must be a started job number (1..{self.jobs})")
            elif op not in ("jobs", "submit"):
                raise errors.InvalidAction(
                    "operation must be shell, background, jobs, log or submit"
                )
            self.steps += 1
            if op == "submit":
                return self._finish("Submitted.")
            if self._remaining() <= 0:
                return self._finish(
                    "The episode's wall time is over; the workspace's "
                    "submission was taken as it is."
                )
            if self.steps >= self.settings.max_steps:
                return self._finish(
                    "Step limit reached; the workspace's submission was taken as it is."
                )
            # shell and background commands were checked to be strings above
            if op == "shell":
                return self._shell(cast(str, command))
            if op == "background":
                return self._background(cast(str, command))
            if op == "jobs":
                return self._run_quiet(_JOBS_LIST.format(jobs=JOBS))
            return self._run_quiet(
                f"tail -c {self.settings.output_bytes} {JOBS}/{action['job']}.log"
            )

    def _shell(self, command: str) -> Step:
        budget = min(self.settings.command_minutes * 60, max(1.0, self._remaining()))
        r = self._agent_exec(command, timeout=budget, output_limit=self.settings.output_bytes)
        output = r.output
        if r.timed_out:
            output += f"\n[command timed out after {budget:g} seconds]"
        return Step(
            self._observation(
                output,
                124 if r.timed_out else r.exit_code,
                timed_out=r.timed_out,
                truncated=r.truncated,
            )
        )

    def _background(self, command: str) -> Step:
        if self.jobs >= self.settings.max_jobs:
            raise errors.InvalidAction(f"at most {self.settings.max_jobs} background jobs")
        self.jobs += 1
        minutes = self.settings.background_minutes or self.settings.episode_minutes
        seconds = int(max(1.0, min(minutes * 60, self._remaining())))
        script = _JOB_LAUNCH.format(jobs=JOBS, work=WORKDIR, n=self.jobs, seconds=seconds)
        r = self._agent_exec(
            script,
            env={**self.exec_env, "CAMG_JOB_COMMAND": command},
            timeout=60,
            output_limit=4000,
        )
        if r.exit_code != 0:
            return Step(self._observation(f"the job did not start: {r.output}", r.exit_code))
        return Step(
            self._observation(
                f"job {self.jobs} started; its output goes to "
                f"{JOBS}/{self.jobs}.log (limit {seconds} s)",
                0,
                job=self.jobs,
            )
        )

    def _run_quiet(self, script: str) -> Step:
        r = self._agent_exec(script, timeout=60, output_limit=self.settings.output_bytes)
        return Step(self._observation(r.output, r.exit_code, truncated=r.truncated))

    def _agent_exec(
        self,
        command: str,
        *,
        timeout: float,
        output_limit: int,
        env: Mapping[str, str] | None = None,
    ):
        """``command`` as the agent in /workspace. A command the sandbox cannot
        start because the agent's own processes fill it is the agent's
        result, not an infrastructure failure (that would end the episode with
        reward null: a way to have any episode masked)."""
        try:
            return self._call(
                self.helper.exec,
                self._sandbox(),
                command,
                user="agent",
                cwd=WORKDIR,
                env=self.exec_env if env is None else env,
                timeout=timeout,
                output_limit=output_limit,
            )
        except errors.InfraFailure as exc:
            if not _not_started(exc):
                raise
            return _Unstarted(
                f"[the command could not start ({str(exc)[:120]}): the sandbox's "
                f"processes (at most {self.settings.pids_max}) or memory are "
                "used up]\n"
            )

    def _finish(self, text: str) -> Step:
        sandbox = self._sandbox()
        self.submitted, problem, self.evidence = self._collect(sandbox)
        self._take_usage(sandbox)
        with self._lock:
            self.sandbox = None
        self._destroy(sandbox)
        if problem:
            text += f" ({problem})"
        self.terminal = Step(self._observation(text, None), done=True)
        return self.terminal

    def _collect(self, sandbox: str) -> tuple[bytes | None, str, list[str]]:
        """The submission's bytes, read once every agent process is gone
        (killed from outside by the helper); the evidence seen on the way."""
        evidence: list[str] = []
        killed = self._call(self.helper.kill_commands, sandbox)
        if killed:
            log.info(
                "finish: killed %d process(es) the agent left running", killed, extra=self.fields
            )
        try:
            probe = self._call(
                self.helper.exec,
                sandbox,
                _STATE.format(path=SUBMISSION),
                user="root",
                cwd="/",
                env={},
                timeout=PROBE_TIMEOUT_S,
                output_limit=4000,
            )
        except errors.InfraFailure as exc:
            if not _not_started(exc):
                raise
            # With no agent process left, only what the agent left in memory
            # (files in a memory-backed /tmp or /dev/shm) can stop init from
            # forking: nothing can read the file.
            return (
                None,
                "the sandbox could start no command at finish",
                [f"collection_obstructed: no command could start in the sandbox ({exc})"[:200]],
            )
        states = [
            line[6:].strip() for line in probe.output.splitlines() if line.startswith("state=")
        ]
        if probe.exit_code != 0 or probe.timed_out or len(states) != 1:
            # Nothing of the agent's runs any more: the sandbox itself failed.
            raise errors.InfraFailure(
                f"the submission probe failed (exit {probe.exit_code}, "
                f"timed out {probe.timed_out}): {probe.output[-300:]!r}"
            )
        state = states[0]
        if state == "missing":
            return None, "no /workspace/submission.csv", evidence
        if state.startswith("link "):
            evidence.append(f"submission_link: {SUBMISSION} -> {state[5:]}")
            return None, "submission is a symbolic link", evidence
        kind, size = (state.split("|") + ["", ""])[:2]
        if not kind.startswith("regular"):
            evidence.append(f"submission_not_regular: {SUBMISSION} is a {kind[:40]}")
            return None, f"submission is a {kind[:40]}, not a regular file", evidence
        if not size.isdigit() or int(size) > MAX_SUBMISSION:
            return (
                None,
                f"submission is not a regular file of at most {MAX_SUBMISSION} bytes",
                evidence,
            )
        archive = self._call(self.helper.get_archive, sandbox, SUBMISSION)
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
                member = tar.next()
                if member is None or not member.isfile() or member.size > MAX_SUBMISSION:
                    return None, "submission is not a regular file", evidence
                extracted = tar.extractfile(member)
                assert extracted is not None  # a regular file's member has its data
                data = extracted.read()
        except (tarfile.TarError, OSError) as exc:
            raise errors.InfraFailure(f"reading the submission archive failed: {exc}") from None
        if len(data) != int(size):
            # Nothing of the agent's was left to change it: kept as a check.
            evidence.append(
                f"submission_written_at_finish: {size} bytes at the probe, {len(data)} copied"
            )
        log.info(
            "submission collected: %d bytes%s",
            len(data),
            f", evidence {evidence}" if evidence else "",
            extra=self.fields,
        )
        return data, "", evidence

    def grade(self) -> float:
        if self.terminal is None:
            raise errors.GraderError("grade() before the episode finished")
        reward, self.report = graded(
            self.grade_submission, self.task.task_id, self.submitted, self.evidence
        )
        log.info("graded: reward %.4f %s", reward, self.report, extra=self.fields)
        return reward

    def outcome(self) -> Mapping[str, Any]:
        """The image the sandbox was built from and the integrity verdict,
        as Coding and General record them."""
        if self.report is None:
            return {"image": self.task.image.reference, **self._cost()}
        body: dict[str, Any] = {
            "image": self.task.image.reference,
            **self._cost(),
            "integrity": self.report.integrity,
        }
        if self.report.integrity != "ok":
            body["integrity_evidence"] = list(self.report.evidence)
        return body

    def submission(self) -> Submission | None:
        """The submitted CSV's bytes (at most 8 MiB); a missing file is
        kept as such (it earns 0 again)."""
        if self.terminal is None:
            return None
        meta = {"integrity_evidence": list(self.evidence)} if self.evidence else {}
        if self.submitted is None:
            return Submission(meta={"missing": True, **meta})
        return Submission(self.submitted, meta)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sandbox, self.sandbox = self.sandbox, None
        if sandbox is not None:
            self._destroy(sandbox)

    def fork(self, episode_id: str) -> ResearchEpisode:
        """A child with the same task, step and job counts and wall clock
        (``started``: a fork buys no time) over this sandbox's workspace as
        it stands (the helper's ForkSandbox). A background job still running
        cannot be carried: NotForkable(what="background_jobs"), from the
        helper's own count of the sandbox's processes, which no file in the
        workspace can fake. The child collects and is graded on its own
        submission, with evidence of its own."""
        if self.terminal is not None:
            raise errors.NotForkable("the episode has finished", what="finished")
        sandbox = self._fork_sandbox(self._sandbox(), processes="background_jobs")
        if self.ledger is not None:
            self.ledger.add_sandbox(sandbox)
        child = ResearchEpisode(
            self.settings, self.helper, self.grade_submission, self.task, episode_id, self.ledger
        )
        child.steps, child.jobs, child.started = self.steps, self.jobs, self.started
        child.sandbox = sandbox
        log.info("forked into %s at step %d", episode_id, self.steps, extra=self.fields)
        return child

    def _lost_from_outside(self, phase: str) -> str | None:
        """Why a failed step is the infrastructure's, or None. The agent runs
        as uid 2000 and cannot signal its sandbox's root init: a sandbox the
        helper no longer lists (a helper restart's sweep, a release) or lists
        dead was lost from outside, and a fresh sandbox's success would
        wrongly blame the agent."""
        with self._lock:
            sandbox = self.sandbox
        if phase != "step" or sandbox is None:
            return None
        try:
            listed = [e for e in self.helper.list_sandboxes() if e.get("sandbox_id") == sandbox]
        except errors.CamgError as exc:
            return f"the helper could not list the episode's sandbox ({exc.name})"
        if not listed:
            return "the episode's sandbox was removed from outside (a helper restart, a release)"
        if listed[0].get("alive") is False:
            return "the episode's sandbox init died"
        return None

    def control(self, failure: Exception, phase: str) -> Sequence[str] | None:
        """Prove a null (camg.episodes.null_proof): a fresh sandbox over the same
        [image, public workspace] runs the task's reference solution as the
        agent, the same collection (``_collect``) takes its submission and
        the same grader scores it. A control that collects a valid,
        untampered submission earning at least CONTROL_MIN proves the path
        works, so this episode's failure was its own doing (the manager then
        records 0.0, ``obstructed``); anything less raises and the null
        stands. Nothing of the failed episode (its sandbox, /workspace,
        processes) is used. No reference solution: None (unproven)."""
        lost = self._lost_from_outside(phase)
        if lost is not None:
            raise errors.SandboxDied(f"{lost}: an infrastructure failure, no control")
        path = os.path.join(self.settings.packages_root, self.task.task_id, "reference", "solve.py")
        try:
            with open(path, "rb") as handle:
                script = handle.read()
        except FileNotFoundError:
            return None
        s = self.settings
        started = time.monotonic()
        sandbox = self._call(
            self.helper.create_sandbox,
            [self.task.image.rootfs, self.task.workspace],
            memory_bytes=s.memory_bytes,
            cpu_quota=s.cpu_quota,
            pids_max=s.pids_max,
            hostname="research",
            upper="disk",
            upper_bytes=s.disk_bytes,
        )
        if self.ledger is not None:
            self.ledger.add_sandbox(sandbox)
        try:
            store = f"{WORKDIR}/.camg-control.py"
            r = self._call(
                self.helper.exec,
                sandbox,
                f"cat > {store} && python {store} {TASK_DIR} {SUBMISSION}",
                user="agent",
                cwd=WORKDIR,
                env=self.exec_env,
                stdin=script,
                timeout=s.grade_timeout,
                output_limit=2000,
            )
            if r.exit_code != 0 or r.timed_out:
                raise errors.GraderError(
                    f"control: the reference solution failed in a fresh "
                    f"sandbox (exit {r.exit_code}): {r.output[-200:]}"
                )
            submitted, problem, evidence = self._collect(sandbox)
        finally:
            self._destroy(sandbox)
        reward, report = graded(self.grade_submission, self.task.task_id, submitted, evidence)
        if not report.valid or report.integrity != "ok" or reward < CONTROL_MIN:
            raise errors.GraderError(
                f"control: the reference submission earned {reward:.4f} "
                f"(valid {report.valid}, integrity {report.integrity}, "
                f"{problem or report.detail or 'collected'})"[:300]
            )
        log.info(
            "control after a failed %s: the reference earned %.4f in a fresh sandbox",
            phase,
            reward,
            extra=self.fields,
        )
        return [
            f"control: the task's reference solution, run in a fresh sandbox over the same "
            f"image and workspace, collected and graded by the same path, earned "
            f"{reward:.4f} (valid, integrity ok, {len(submitted or b'')} bytes, "
            f"{time.monotonic() - started:.1f} s)"
        ]

    def reference_action(self) -> Mapping[str, Any] | None:
        """The task's reference solution from step 0: its solve.py written to
        /workspace in base64 chunks, run on /task, then submit.

        solve.py is read from the task package (``packages_root``: operators'
        root, never a helper lower, so no sandbox sees it) only here, i.e.
        only when the deployment serves references; the private answers
        are never read by the service."""
        path = os.path.join(self.settings.packages_root, self.task.task_id, "reference", "solve.py")
        try:
            with open(path, "rb") as handle:
                script = handle.read()
        except OSError as exc:
            raise errors.NotFound(
                f"task {self.task.task_id!r} has no reference solution ({exc.strerror}: {path})"
            ) from None
        store = f"{WORKDIR}/.camg-reference"
        plan = shipped(
            script,
            f"{store}.b64",
            f"base64 -d {store}.b64 > {store}.py && rm -f {store}.b64 && "
            f"python {store}.py {TASK_DIR} {SUBMISSION} && rm -f {store}.py",
            max_command=self.settings.max_command_chars,
            finish={"operation": "submit"},
        )
        return plan[min(self.steps, len(plan) - 1)]

    def state(self) -> Mapping[str, Any]:
        body: dict[str, Any] = {
            "steps": self.steps,
            "jobs": self.jobs,
            "finished": self.terminal is not None,
        }
        if self.report is not None:
            body["grade"] = dataclasses.asdict(self.report)
        return body

    # -- helper plumbing --------------------------------------------------

    def _destroy(self, sandbox: str) -> None:
        try:
            self.helper.destroy(sandbox)
        except errors.CamgError as exc:
            # The ledger keeps naming it: --check-clean releases it.
            log.warning("destroying sandbox %s failed: %s", sandbox, exc, extra=self.fields)
            return
        if self.ledger is not None:
            self.ledger.remove_sandbox(sandbox)
