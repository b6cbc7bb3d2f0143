"""The AutoResearch environment: long research runs in helper sandboxes, graded privately.

Start-up, in order: claim the state directory (refused unless
``--check-clean`` marked it clean), verify every task's public workspace
and the image against the prepared manifest, start the private grader
(which checks the answers' hashes), connect to the helper. The grader is
the service's supervised child: if it exits, the service stops as failed
(``stop-failed`` in the state directory, SIGTERM to the serving master) and
under systemd both come back.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from camg import errors, typed
from camg.config.hashing import sha256_bytes, sha256_json, sha256_tree
from camg.environment import Environment, Episode, Grade, ServiceContext, Submission, Task
from camg.sandboxes.shell_schema import command_observation
from environments.autoresearch import runstate
from environments.autoresearch.episode import Prepared, ResearchEpisode, graded
from environments.autoresearch.settings import Settings
from environments.autoresearch.supervisor import Grader

if TYPE_CHECKING:
    from camg.helper_client import HelperClient

log = logging.getLogger("camg.autoresearch")

ACTION_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["operation"],
    "properties": {
        "operation": {"enum": ["shell", "background", "jobs", "log", "submit"]},
        "command": {"type": "string", "maxLength": 16000},
        "job": {"type": "integer", "minimum": 1},
    },
}

OBSERVATION_SCHEMA = command_observation(
    elapsed_s={"type": "number"},
    remaining_s={"type": ["number", "null"]},
    job={"type": "integer"},
)


def load_settings(raw: Mapping[str, Any]) -> Settings:
    return typed.parse(Settings, raw, "autoresearch.settings", errors.ConfigError)


class ResearchEnvironment(Environment):
    name = "autoresearch"
    action_schema = ACTION_SCHEMA
    observation_schema = OBSERVATION_SCHEMA

    def __init__(self, context: ServiceContext, tasks: Sequence[Task]) -> None:
        super().__init__(context, tasks)
        self.settings = load_settings(context.settings)
        self.prepared: dict[str, Prepared] = {}
        self.helper: HelperClient | None = None
        self.grader: Grader | None = None
        self.ledger: runstate.RunLedger | None = None
        self.grader_failed: int | None = None
        self._image_hash = ""

    # -- start / stop -----------------------------------------------------

    def start_in_only_thread(self) -> None:
        """Claim the state directory and start the grader, the one use of
        CAP_SETUID/CAP_SETGID, which the grader's supervisor drops right
        after the spawn: here no other thread exists to keep them."""
        from camg.helper_client import DEFAULT_SOCKET

        s = self.settings
        socket_path = self.context.helper_socket or DEFAULT_SOCKET
        self.ledger = runstate.RunLedger(self.context.state_dir, s.helper_owner, socket_path)
        self.ledger.claim(os.environ.get("CAMG_SERVE_CONFIG", "prepared/autoresearch.json"))
        answers = {task.task_id: task.data["answers_sha256"] for task in self.tasks}
        self.grader = Grader(
            private_root=s.private_root,
            tasks=list(answers),
            user=s.grader_user,
            expected_answers=answers,
            python=s.grader_python or _interpreter(),
            timeout=s.grade_timeout,
            on_exit=self._grader_exited,
        )
        self.grader.start()
        self.ledger.set(grader_pid=self.grader.pid)

    def start(self) -> None:
        from camg.helper_client import DEFAULT_SOCKET, HelperClient
        from camg.oci.images import by_name, load_materialized

        s = self.settings
        if self.grader is None:  # started without the service (tests, benchmarks)
            self.start_in_only_thread()
        assert self.grader is not None  # start_in_only_thread set it
        images = by_name(load_materialized(s.images))
        if s.image not in images:
            raise errors.ConfigError(f"image {s.image!r} is not in {s.images}")
        image = images[s.image]
        self._image_hash = image.hash
        for task in self.tasks:
            self.prepared[task.task_id] = self._verify(task, image)
        socket_path = self.context.helper_socket or DEFAULT_SOCKET
        self.helper = HelperClient(socket_path, owner=s.helper_owner)
        log.info(
            "autoresearch: %d task(s) verified, grader pid %d", len(self.prepared), self.grader.pid
        )

    def _verify(self, task: Task, image) -> Prepared:
        data = task.data
        try:
            recorded_image = data["image"]
            workspace = os.path.join(self.settings.workspaces_root, task.task_id)
            statement = str(data["statement"])
            recorded_tree = data["workspace_sha256"]
        except (KeyError, TypeError) as exc:
            raise errors.ConfigError(
                f"task {task.task_id!r}: not a prepared autoresearch task (missing {exc})"
            ) from None
        if recorded_image.get("digest") != image.digest or recorded_image.get("hash") != image.hash:
            raise errors.ConfigError(
                f"task {task.task_id!r}: prepared for image "
                f"{recorded_image.get('digest')}, now {image.digest}"
            )
        if not os.path.isdir(workspace) or sha256_tree(workspace) != recorded_tree:
            raise errors.ConfigError(
                f"task {task.task_id!r}: public workspace {workspace} is "
                "missing or changed since preparation"
            )
        return Prepared(task.task_id, statement, workspace, image)

    def _grader_exited(self, status: int) -> None:
        self.grader_failed = status
        request_failed_stop(
            self.context.state_dir, f"the private grader exited with status {status}"
        )

    def stop(self) -> None:
        if self.grader is not None:
            self.grader.stop()
        if self.helper is not None:
            self.helper.close()

    # -- the service's view -------------------------------------------------

    def health(self) -> list[str]:
        reasons: list[str] = []
        if self.grader is None or self.helper is None:
            return ["not started"]
        if not self.grader.alive:
            reasons.append(f"grader exited (status {self.grader.exit_status})")
        try:
            if not self.helper.ping().get("probes_ok", True):
                reasons.append("helper: isolation probes have not passed")
        except errors.CamgError as exc:
            reasons.append(f"helper: {exc}")
        return reasons

    def metadata(self) -> Mapping[str, Any]:
        here = os.path.dirname(os.path.abspath(__file__))
        sources = b"".join(
            open(os.path.join(here, n), "rb").read()
            for n in ("grader.py", "metrics.py", "gradewire.py")
        )
        return {
            "images": self._image_hash,
            "workspaces": sha256_json(
                {k: t.data.get("workspace_sha256") for k, t in ((t.task_id, t) for t in self.tasks)}
            ),
            "grader": sha256_json(
                {
                    "sources": sha256_bytes(sources),
                    "answers": {t.task_id: t.data.get("answers_sha256") for t in self.tasks},
                }
            ),
        }

    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        if self.helper is None or self.grader is None:
            raise errors.Unavailable("the autoresearch environment is not started")
        return ResearchEpisode(
            self.settings,
            self.helper,
            self._grade,
            self.prepared[task.task_id],
            episode_id,
            self.ledger,
        )

    def _grade(self, task_id: str, submission: bytes) -> dict:
        grader = self.grader
        assert grader is not None  # episodes and regrades exist only once it started
        return grader.grade(task_id, submission)

    def regrade(self, task: Task, submission: Submission) -> Grade:
        """The stored submission bytes through the private grader again."""
        if self.grader is None:
            raise errors.Unavailable("the autoresearch environment is not started")
        data = None if submission.meta.get("missing") else submission.data
        reward, report = graded(
            self._grade, task.task_id, data, list(submission.meta.get("integrity_evidence") or ())
        )
        outcome: dict[str, Any] = {
            "grade": dataclasses.asdict(report),
            "integrity": report.integrity,
        }
        if report.integrity != "ok":
            outcome["integrity_evidence"] = list(report.evidence)
        return Grade(reward, outcome)

    # -- operator checks ----------------------------------------------------

    @classmethod
    def check_clean(cls, config) -> tuple[bool, list[str]]:
        """``camg.serve --check-clean``: see runstate.check_clean."""
        settings = load_settings(config.settings)
        return runstate.check_clean(
            config.state_dir, helper_socket=config.helper_socket, owner=settings.helper_owner
        )


def request_failed_stop(state_dir: str, reason: str) -> None:
    """Stop the whole service as failed (camg.serve then exits non-zero)."""
    log.critical("stopping the service: %s", reason)
    try:
        with open(os.path.join(state_dir, runstate.STOP_FAILED), "w", encoding="utf-8") as f:
            f.write(reason + "\n")
    except OSError as exc:
        log.error("cannot record the failed stop: %s", exc)
    master = os.environ.get("CAMG_SERVE_PID", "")
    if master.isdigit():
        os.kill(int(master), signal.SIGTERM)


def _interpreter() -> str:
    import sys

    return sys.executable
