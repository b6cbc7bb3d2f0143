"""The General environment: each episode is a fresh Docker container running
the MiMo transport (mimoagent.transport), reached through the helper.

Per episode: claim a started, never-used container of the task's image from
a bounded warm pool (or create one), get a socket to the transport inside it
from the helper (containers have no network), and proxy reset/step over the
OpenEnv WebSocket protocol. Software tasks are graded by the MiMo verifier
in a second, fresh container of the task's image, given only the changed
regular files the agent's transport collected (never in the container
where the agent's code ran); general_agent tasks leave judge
requests that this service answers with the LLM judge (only the service
holds GA_JUDGE_*). Transport and verifier failures end the episode with
reward null and a failure class; judge failures with ``judge_error``.
Closing removes the container.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from camg import errors, typed
from camg.environment import Environment, Episode, Grade, ServiceContext, Step, Submission, Task
from camg.episodes.cost import judge_tokens
from camg.fifo_gate import Gate
from camg.sandboxes.containers import ENDPOINT, Container, ContainerClient, read_usage
from environments.general import rubric, submission
from environments.general.channel import TransportChannel, observation_of
from environments.general.schemas import ACTION_SCHEMA, OBSERVATION_SCHEMA, allowed_action
from environments.general.settings import Settings

if TYPE_CHECKING:
    from camg.grading.judge import Judge

log = logging.getLogger("camg.general")

KINDS = ("opensource-code", "general_agent")
#: the transport's step budget (mimoagent.transport.common): step 64 finishes
MAX_STEPS = 64
TASK_ROOT = "/opt/mimo-task"
AGENT_ENV = "/opt/camg/agent-env"
VERIFIER_OUT = "/logs/verifier"


def transport_command() -> tuple[str, ...]:
    # It listens only on the container's endpoint socket (root-only; the
    # helper connects there as root): no port of the container's loopback,
    # which the agent's uid could open too.
    return (f"{AGENT_ENV}/bin/python", "-m", "mimoagent.transport", "--root", TASK_ROOT)


JUDGE_ENV_FILE = "/etc/camg/credentials/general-judge.env"


class BootGate(Gate):
    """Container boots in flight (Settings.concurrent_boots); a reset that
    waited its boot_wait_s in vain is refused like a full service."""

    def late(self, message: str) -> Exception:
        return errors.AtCapacity(message, retry_after=30)


def boot_limit(settings: Settings, cores: int | None = None) -> int:
    """Settings.concurrent_boots, or 4 per core: a boot is mostly CPU (the
    container's start, the transport's interpreter, one start of each MCP
    server), so more at once only makes each slower; a few per core keep
    the cores busy while some wait on dockerd."""
    return settings.concurrent_boots or 4 * (cores or os.cpu_count() or 1)


def judge_config(settings: Settings, environ: Mapping[str, str] | None = None):
    """GA_JUDGE_URL/MODEL/KEY (+ optional GA_JUDGE_API). A missing variable
    is a ConfigError naming it (never a value): no judge, no service."""
    from camg.grading.judge import JudgeConfig

    try:
        return JudgeConfig.from_env(
            settings.judge_env,
            environ,
            timeout_s=settings.judge_timeout_s,
            attempts=settings.judge_attempts,
            backoff_s=settings.judge_backoff_s,
            backoff_max_s=max(60.0, settings.judge_backoff_s),
        )
    except errors.ConfigError as exc:
        raise errors.ConfigError(
            f"general: {exc.message} (the operator provides them; under "
            f"systemd in {JUDGE_ENV_FILE}, see environments/general/README.md)",
            **exc.details,
        ) from None


class GeneralEnvironment(Environment):
    name = "general"
    action_schema = ACTION_SCHEMA
    observation_schema = OBSERVATION_SCHEMA

    def __init__(self, context: ServiceContext, tasks: Sequence[Task]) -> None:
        super().__init__(context, tasks)
        self.settings = typed.parse(
            Settings, context.settings, "general.settings", errors.ConfigError
        )
        for task in tasks:
            if task.data.get("kind") not in KINDS or not str(task.data.get("image", "")).count(
                "@sha256:"
            ):
                raise errors.ConfigError(
                    f"general task {task.task_id!r}: needs kind in {KINDS} "
                    "and an image pinned by digest"
                )
        self.client: ContainerClient | None = None
        self.pools: dict[str, Any] = {}
        self.judge: Judge | None = None
        self.boots = BootGate(boot_limit(self.settings), "container boot")
        self._lock = threading.Lock()

    @classmethod
    def check_config(cls, config) -> None:
        """``camg.serve --check-config``: the judge variables must be in the environment."""
        settings = typed.parse(Settings, config.settings, "general.settings", errors.ConfigError)
        judge_config(settings)

    # -- service life cycle ------------------------------------------------------
    def start(self) -> None:
        from camg.grading.judge import Judge
        from camg.helper_client import DEFAULT_SOCKET
        from camg.sandboxes.containers import ContainerClient, ContainerPool

        s = self.settings
        self.judge = Judge(judge_config(s))
        self.client = ContainerClient(
            self.context.helper_socket or DEFAULT_SOCKET, owner=s.helper_owner
        )
        # Containers of an earlier run of this service (killed with -9, say)
        # carry our owner label: nothing of theirs is reusable.
        left = self.client.release_all()
        if left:
            log.warning("removed %d container(s) left by an earlier run", left)
        for image in sorted({t.data["image"] for t in self.tasks}):
            try:
                self.client.pull(image)
            except errors.CamgError as exc:
                # A registry that is gone (the demo's loopback one) is fine
                # when dockerd holds the image by digest already; if not,
                # the pool's creates fail and health() says so.
                log.warning("pulling %s failed: %s", image, exc)
            self.pools[image] = ContainerPool(self.client, self.spec(image), s.pool_size)

    def spec(self, image: str):
        from camg.sandboxes.containers import ContainerSpec

        s = self.settings
        return ContainerSpec(
            image=image,
            command=transport_command(),
            cpu=s.cpu,
            memory_bytes=s.memory_bytes,
            pids_max=s.pids_max,
            mount_agent_env=True,
        )

    def stop(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        if self.judge is not None:
            self.judge.close()
        if self.client is not None:
            self.client.close()

    def health(self) -> list[str]:
        return [
            f"container pool for {image.rsplit('@', 1)[-1][:19]}: {pool.last_error}"
            for image, pool in self.pools.items()
            if pool.last_error is not None
        ]

    def metadata(self) -> Mapping[str, Any]:
        kinds: dict[str, int] = {}
        for task in self.tasks:
            kinds[task.data["kind"]] = kinds.get(task.data["kind"], 0) + 1
        uncovered = [
            t.task_id
            for t in self.tasks
            if t.data["kind"] == "opensource-code"
            and not (t.data.get("test_guard") or {}).get("covered", True)
        ]
        return {
            "task_kinds": kinds,
            # opensource-code tasks whose test command camg's test guard
            # cannot cover (not pytest): graded by screen and exit status only
            "test_guard_not_covered": {"count": len(uncovered), "tasks": uncovered[:50]},
            "images": sorted({t.data["image"] for t in self.tasks}),
            "judge": self.judge.config.describe() if self.judge else None,
            "pool": {
                "size_per_image": self.settings.pool_size,
                "hits": sum(p.hits for p in self.pools.values()),
                "misses": sum(p.misses for p in self.pools.values()),
            },
            # pool misses booting a container now, and those waiting to
            "boots": self.boots.status(),
            "container": {
                "cpu": self.settings.cpu,
                "memory_bytes": self.settings.memory_bytes,
                "pids_max": self.settings.pids_max,
                "network": "none",
            },
        }

    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        return GeneralEpisode(self, task, episode_id)

    def regrade(self, task: Task, submission: Submission) -> Grade:
        """general_agent: the stored verifier detail before the judge again
        (new judge calls; the rule items' scores are the verifier's).
        opensource-code: the stored verifier records before the current
        screen and cross-check (the test run itself is not repeated)."""
        if submission.meta.get("task_kind") == "opensource-code":
            return self._regrade_code(task, submission)
        if not submission.data:
            raise errors.RegradeUnsupported("the episode left no verifier detail to judge again")
        if self.judge is None:
            raise errors.JudgeError("the judge is not started", reason="unconfigured")
        try:
            detail = json.loads(submission.data)
        except ValueError as exc:
            raise errors.GraderError(f"the stored verifier detail is not JSON: {exc}") from None
        reward, records = rubric.judge_episode(
            self.judge, detail, deadline_s=self.settings.judge_deadline_s
        )
        verdict = rubric.integrity(detail)  # general_agent integrity (rubric.py)
        reward = rubric.screened(verdict, reward)
        if self.settings.binarize:
            reward = 1.0 if reward >= 1.0 - 1e-6 else 0.0
        return Grade(reward, {"task_kind": "general_agent", "judge": records, **verdict})

    def _regrade_code(self, task: Task, submission: Submission) -> Grade:
        """opensource-code: the test run happened in a container that is
        gone; its records (the change record, the test guard's channel and
        the command's exit status) are judged again by the current screen
        and cross-check (environments/general/integrity.py)."""
        from environments.general import integrity

        if not submission.data:
            raise errors.RegradeUnsupported(
                "opensource-code episodes are graded by the verifier inside their container, "
                "which is gone; this one kept no verifier records to judge again"
            )
        try:
            records = json.loads(submission.data)
            reward, verdict = integrity.verdict(
                records["changes"],
                records["guard"],
                task.data.get("test_guard"),
                self.settings.suspicious_reward,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.GraderError(f"the stored verifier records are unreadable: {exc}") from None
        # (0.0 or 1.0 already: binarizing changes nothing)
        return Grade(
            reward,
            {
                "task_kind": "opensource-code",
                "verifier_exit_code": records["guard"]["exit_code"],
                **verdict,
            },
        )


#: how long a container that still shows as running is watched for an exit
#: before a failed episode's control may run
LOST_CHECK_S = 5.0


class GeneralEpisode(Episode):
    def __init__(self, env: GeneralEnvironment, task: Task, episode_id: str) -> None:
        self.env = env
        self.task = task
        self.kind = task.data["kind"]
        self.episode_id = episode_id
        self.container: Container | None = None
        self.channel: TransportChannel | None = None
        self.pending_judge = False
        self.verifier_exit: int | None = None
        self.judge_records: list[dict] = []
        self.judge_failure: dict | None = None
        self.detail: dict | None = None  # the verifier's reward_detail.json (regrade)
        self.integrity: dict | None = None  # the tamper screen's part of the outcome
        self.code_records: dict | None = None  # opensource-code: changes + guard (regrade)
        self.steps = 0  # actions the transport took (the reference's position)
        self.usage: dict | None = None  # the container's, at the terminal step (camg.episodes.cost)
        self.reaped: dict | None = None  # ContainerReap's reply before the terminal step
        # opensource-code: the fresh container the verifier ran in, what
        # travelled there, and why it was lost when it was (not the agent's doing)
        self.verifier_container: str | None = None
        self.submitted: dict | None = None
        self.verifier_lost: str | None = None
        self._closed = False
        self._lock = threading.Lock()

    def reset(self) -> Mapping[str, Any]:
        env = self.env
        pool = env.pools[self.task.data["image"]]
        container = pool.take(self.episode_id)
        if container is not None:  # warm: its transport has set up already
            return self._begin(container)
        # A boot holds its slot until the transport's reset has answered,
        # i.e. through the setup that starts the MCP servers.
        with env.boots.slot(time.monotonic() + env.settings.boot_wait_s):
            if self._closed:
                raise errors.InfraFailure("episode closed during reset")
            return self._begin(pool.create(self.episode_id))

    def _begin(self, container) -> Mapping[str, Any]:
        with self._lock:
            self.container = container
            if self._closed:  # closed while claiming
                self._remove()
                raise errors.InfraFailure("episode closed during reset")
        observation, _, _ = observation_of(self._open_transport())
        return {**observation, "task_kind": self.kind}

    def _client(self) -> ContainerClient:
        client = self.env.client
        assert client is not None  # episodes run only in a started environment
        return client

    def _open_transport(self) -> dict:
        s = self.env.settings
        container = self.container
        assert container is not None  # _begin and fork set it first
        sock = self._client().connect(container.id, ENDPOINT, timeout=s.connect_timeout_s)
        self.channel = TransportChannel(sock, open_timeout=s.connect_timeout_s)
        return self.channel.request(
            "reset",
            {"task_id": self.task.data["instance_id"], "episode_id": self.episode_id},
            timeout=s.step_timeout_s,
        )

    def fork(self, episode_id: str) -> GeneralEpisode:
        """A snapshot of this episode's container (the helper's ContainerFork)
        with a transport of its own, which continues this episode from the
        records the parent's transport keeps (mimoagent.transport.checkpoint:
        the step count, the verifier's setup snapshot, the findings so far),
        so the child's integrity checks see the parent's actions too."""
        if self.container is None or self.channel is None:
            raise errors.NotForkable("the episode has no container yet", what="container")
        child = GeneralEpisode(self.env, self.task, episode_id)
        child.container = self._client().fork(self.container.id, episode_id=episode_id)
        child.steps = self.steps
        try:
            child._open_transport()
            assert child.channel is not None  # _open_transport opened it
            carried = child.channel.state(timeout=self.env.settings.step_timeout_s).get(
                "step_count"
            )
            if carried != self.steps:
                # An agent environment without checkpoints prepared a fresh
                # episode over the snapshot: nothing of the parent's went on.
                raise errors.NotForkable(
                    f"the child's transport is at step {carried}, not "
                    f"{self.steps}: it did not resume",
                    what="transport_state",
                )
        except BaseException:
            child.close()
            raise
        return child

    def step(self, action: Mapping[str, Any]) -> Step:
        problem = allowed_action(self.kind, action)
        if problem:
            raise errors.InvalidAction(problem)
        if self.channel is None:
            raise errors.InfraFailure("step before a successful reset")
        terminal = action.get("operation") == "finish" or self.steps + 1 >= MAX_STEPS
        if terminal:
            self._reap()
        if terminal and self.kind == "opensource-code":
            return self._finish_code()
        payload = self.channel.request(
            "step", dict(action), timeout=self.env.settings.step_timeout_s
        )
        self.steps += 1
        observation, reward, done = observation_of(payload)
        if not done:
            return Step(observation=observation, reward=0.0)
        # The agent and the verifier are done with the container; a judge
        # still to come costs tokens, not container time.
        if self.container is not None:
            self.usage = read_usage(self.env.client, self.container.id)
        self.verifier_exit = observation.get("exit_code")
        if self.kind == "general_agent":  # the transport's findings (rubric.integrity)
            self.integrity = rubric.integrity(None, observation)
        if self.kind == "general_agent" and observation.get("verifier") == "pending_judge":
            self.pending_judge = True
            return Step(observation=observation, reward=0.0, done=True, graded=False)
        if reward is None:
            raise errors.GraderError("the transport finished without a reward")
        if self.kind == "opensource-code":
            # Only _finish_code ends these: a grade from the agent's own container is none.
            raise errors.GraderError("the agent's transport ended the episode by itself")
        assert self.integrity is not None  # a general_agent episode's, set above
        reward = rubric.screened(self.integrity, reward)
        return Step(observation=observation, reward=self._binarized(reward), done=True, graded=True)

    def _finish_code(self) -> Step:
        """The terminal step of an opensource-code episode. The agent's
        container only gives up its changes (its transport, root: every
        agent process killed, the change record and the changed regular
        files, nothing written there); the MiMo verifier runs in a fresh
        container of the task's image with those files over its pristine
        repository. Whatever the agent left outside the repository, or as
        something other than a regular file in it, stays behind."""
        s = self.env.settings
        assert self.channel is not None  # step() checked it
        payload = self.channel.request("step", {"operation": "collect"}, timeout=s.step_timeout_s)
        self.steps += 1
        collected, _, done = observation_of(payload)
        if (
            not done
            or not isinstance(collected.get("changes"), dict)
            or not isinstance(collected["changes"].get("changes"), list)
        ):
            raise errors.GraderError("the agent's transport gave no change record")
        files = submission.checked(collected.get("submission"))
        self.submitted = submission.stats(collected["submission"])
        if self.container is not None:
            self.usage = read_usage(self.env.client, self.container.id)
        observation, reward, tar = self._verify(files)
        self.verifier_exit = observation.get("exit_code")
        if reward is None:
            raise errors.GraderError("the verifier finished without a reward")
        reward = self._screened(reward, tar, collected)
        return Step(observation=observation, reward=self._binarized(reward), done=True, graded=True)

    def _verify(self, files: dict) -> tuple[dict, float | None, bytes]:
        """The verifier in a fresh container (a never-used one of the pool,
        or a new one): reset, ``grade`` with the submission, its records
        (/logs/verifier) taken; the container removed after."""
        grader = GeneralEpisode(self.env, self.task, f"{self.episode_id[:110]}.verifier")
        try:
            grader.reset()
            assert grader.container is not None and grader.channel is not None  # reset opened them
            self.verifier_container = grader.container.id
            if self.container is not None and grader.container.id == self.container.id:
                raise errors.GraderError("the verifier's container is the agent's")
            payload = grader.channel.request(
                "step",
                {"operation": "grade", "submission": files},
                timeout=self.env.settings.step_timeout_s,
            )
            observation, reward, done = observation_of(payload)
            if not done:
                raise errors.GraderError("the fresh container's verifier did not finish")
            return (
                observation,
                reward,
                self._client().get_archive(grader.container.id, VERIFIER_OUT),
            )
        except errors.CamgError:
            # (a container removed from outside is no failure of the agent's)
            self.verifier_lost = grader._lost_from_outside()
            raise
        finally:
            grader.close()

    def _reap(self) -> None:
        """Before the terminal step: every process the agent left is killed
        from outside (the helper's ContainerReap: frozen, killed, thawed),
        so none can hold the pids limit, the disk or the test run while the
        verifier grades. The transport's own kill at finish forks inside
        the container, and a detached process filling its pids limit made
        that fork fail (EAGAIN, a null the agent chose). A reap that fails
        raises: the null is then proved or disproved by ``control``."""
        if self.container is None:
            return
        self.reaped = self._client().reap(self.container.id)

    def _lost_from_outside(self) -> str | None:
        """Why this episode's container is the infrastructure's loss, or
        None. The agent runs as uid 2000 and can signal neither the
        container's init nor the root transport: a container removed (a
        helper restart's sweep, a kill) or no longer running died from
        outside, and a fresh container's success would wrongly blame the
        agent."""
        if self.verifier_lost is not None:
            return f"the verifier's fresh container: {self.verifier_lost}"
        container = self.container
        if container is None:
            return None
        # A container whose init was just killed can still show as running
        # for a moment (Docker learns of the exit from containerd after the
        # transport's connection has already dropped): asked again a few
        # times before the control may blame the agent.
        deadline = time.monotonic() + LOST_CHECK_S
        while True:
            try:
                listed = [c for c in self._client().list() if c.get("container_id") == container.id]
            except errors.CamgError as exc:
                return f"the helper could not list the episode's container ({exc.name})"
            if not listed:
                return "the episode's container was removed from outside (a helper restart, a kill)"
            if listed[0].get("state") not in ("running", "paused"):
                return f"the episode's container is {listed[0].get('state')}: its init died"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.25)

    def control(self, failure: Exception, phase: str) -> list[str]:
        """Prove a null (camg.episodes.null_proof): the same path, from reset through
        the terminal step and the judge, in a fresh container of the task's
        pristine image (a never-used one from the pool, or a new one),
        never the agent's, playing the task's reference (the gold patch;
        the reference actions and answer) or, without one, a bare finish.
        It grades: the infrastructure works and the agent's submission
        made its own grade fail (evidence lines). It fails too, or the gold
        patch does not earn 1.0: the grading path is broken (raises)."""
        from environments.general import reference

        lost = self._lost_from_outside()
        if lost is not None:
            raise errors.SandboxDied(f"{lost}: an infrastructure failure, no control")
        try:
            plan, played = reference.plan(self.task.task_id, self.task.data), "reference"
        except errors.NotFound:
            plan, played = [{"operation": "finish"}], "no-op finish"
        if self.kind == "opensource-code" and played == "reference":
            played = "gold patch"
        started = time.monotonic()
        probe = GeneralEpisode(self.env, self.task, f"{self.episode_id[:110]}.control")
        try:
            probe.reset()
            step = None
            for action in plan:
                step = probe.step(action)
                if step.done:
                    break
            if step is None or not step.done:
                raise errors.GraderError(f"control: the {played} did not finish the episode")
            reward = step.reward if step.graded else probe.grade()
        except errors.CamgError as exc:
            raise errors.GraderError(
                f"control ({played} in a fresh container) failed too: {exc.name}: {exc.message}"
            ) from exc
        finally:
            probe.close()
        verdict = (probe.integrity or {}).get("integrity", "ok")
        # (a gold patch the code screen calls suspicious still went the whole path)
        if verdict == "tampered" or (played == "gold patch" and verdict == "ok" and reward != 1.0):
            raise errors.GraderError(
                f"control: the {played} earned {reward} with integrity "
                f"{verdict} in a fresh container: the grading path is broken"
            )
        how = (
            "the verifier"
            if self.kind == "opensource-code"
            else "the transport's verifier and the judge"
        )
        took = time.monotonic() - started
        lines = [
            f"control: the {played} in a fresh container of the task's image, through "
            f"{how}, earned {reward} (integrity {verdict}) in {took:.1f} s"
        ]
        if self.reaped is not None:
            lines.append(
                f"the agent's container: {self.reaped.get('killed')} agent process(es) "
                "killed from outside before the terminal step"
            )
        return lines

    def grade(self) -> float:
        if not self.pending_judge:
            raise errors.GraderError("nothing to grade: the transport gave no reward")
        # pending_judge: the transport finished in this container of a started environment
        assert self.container is not None and self.env.judge is not None
        tar = self._client().get_archive(self.container.id, VERIFIER_OUT)
        detail = self.detail = rubric.read_detail(tar)
        self.integrity = rubric.integrity(detail)
        try:
            reward, self.judge_records = rubric.judge_episode(
                self.env.judge, detail, deadline_s=self.env.settings.judge_deadline_s
            )
        except errors.JudgeError as exc:
            self.judge_failure = {k: v for k, v in exc.details.items()}
            raise
        return self._binarized(rubric.screened(self.integrity, reward))

    def _screened(self, reward: float, tar: bytes, collected: dict) -> float:
        """The tamper screen of what the agent changed and the test guard's
        cross-check (environments/general/integrity.py): any finding makes it
        0.0. The change record screened is the agent's whole one (links,
        bytecode, .git, files too large to travel included), taken in its
        container; the guard's record and counts are the fresh verifier's
        (/logs/verifier there)."""
        from environments.general import integrity

        fresh = integrity.read_changes(tar)
        changes = {
            **collected["changes"],
            "test_patch_paths": list(fresh.get("test_patch_paths") or ()),
            # the agent's processes its transport killed at collect
            "guard": {
                **(fresh.get("guard") or {}),
                "processes_killed": int(collected.get("processes_killed") or 0),
            },
        }
        records = {"changes": changes, "guard": integrity.read_guard(tar)}
        # (GraderError when the test runner never reported to the guard)
        _, self.integrity = integrity.verdict(
            records["changes"], records["guard"], self.task.data.get("test_guard")
        )
        self.code_records = records
        return integrity.screened_reward(
            self.integrity, reward, self.env.settings.suspicious_reward
        )

    def _binarized(self, reward: float) -> float:
        if self.env.settings.binarize:
            return 1.0 if reward >= 1.0 - 1e-6 else 0.0
        return reward

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.channel is not None:
            self.channel.close()
        self._remove()

    def _remove(self) -> None:
        if self.container is None or self.env.client is None:
            return
        try:
            self.env.client.remove(self.container.id)
        except errors.CamgError as exc:  # the helper's release and sweeps take it
            log.warning("removing container %s failed: %s", self.container.id[:12], exc)

    def reference_action(self) -> Mapping[str, Any] | None:
        """The next action of the task's prepared reference (environments/general/reference.py)."""
        from environments.general import reference

        steps = reference.plan(self.task.task_id, self.task.data)
        return steps[min(self.steps, len(steps) - 1)]

    def state(self) -> Mapping[str, Any]:
        return {
            "task_kind": self.kind,
            "container": self.container.id[:12] if self.container else None,
        }

    def submission(self) -> Submission | None:
        """general_agent: the verifier's reward_detail.json (rule scores and
        the LLM items' judge requests; a few KiB), judged again by a regrade.
        opensource-code: the change record and the test guard's record (the
        run's channel, key, exit status and log; the key served that grade
        only), which a regrade judges again."""
        if self.detail is not None:
            return Submission(json.dumps(self.detail, sort_keys=True).encode())
        if self.kind == "opensource-code" and self.code_records is not None:
            return Submission(
                json.dumps(self.code_records, sort_keys=True).encode(),
                meta={"task_kind": self.kind},
            )
        if self.kind == "opensource-code" and self.verifier_exit is not None:
            return Submission(meta={"task_kind": self.kind})
        return None

    def outcome(self) -> Mapping[str, Any]:
        record: dict[str, Any] = {
            "task_kind": self.kind,
            "image": self.task.data["image"],
            "verifier_exit_code": self.verifier_exit,
        }
        if self.judge_records:
            record["judge"] = self.judge_records
        if self.judge_failure:
            record["judge_failure"] = self.judge_failure
        if self.reaped is not None:
            # agent processes the helper killed from outside before finish
            record["reaped"] = self.reaped
        if self.kind == "opensource-code":
            record["container"] = self.container.id if self.container else None
            # the fresh container the verifier ran in, never the agent's
            record["verifier_container"] = self.verifier_container
            if self.submitted is not None:
                # what travelled to it ("submission" is the episode manager's)
                record["carried"] = self.submitted
        if self.integrity:
            record.update(self.integrity)
        record["cost"] = {
            **(self.usage or {}),
            **judge_tokens(r.get("judge_tokens") for r in self.judge_records),
        }
        return record
