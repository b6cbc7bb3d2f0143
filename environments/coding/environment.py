"""The Coding environment: fix a bug in a real repository inside a helper sandbox.

Reset starts a sandbox over [materialized image rootfs, task agent layer]:
the repository is already at /testbed in a lower layer, so reset costs one
CreateSandbox and nothing proportional to the image or the repository.
Actions (seed 001): ``{"operation": "shell", "command": ...}`` runs as the
agent uid from /testbed with a 60 s limit and the output's final 12000
bytes; ``{"operation": "finish"}`` — or the 64th step — ends the episode.
The agent's diff is taken before its sandbox is destroyed; grading then
runs SWE-smith's procedure in a fresh sandbox over [image, grader layer].

Impossible variants (camg.config.variants; environments/coding/variant_layers.py)
are served with their task's agent layer and graded over their own grader
layer, whose tests commit has one FAIL_TO_PASS test mutated.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from camg import errors, typed
from camg.config.hashing import sha256_bytes, sha256_json
from camg.environment import Environment, Episode, Grade, ServiceContext, Submission, Task
from camg.grading import code_screen
from camg.sandboxes.shell_schema import command_observation, shell_action
from environments.coding import (
    images,
    layers,
    log_evaluation,
    mirrors,
    profiles,
    rows,
    variant_layers,
)
from environments.coding.episode import INSTRUCTIONS, WORKDIR, CodingEpisode, Prepared
from environments.coding.settings import Settings

if TYPE_CHECKING:
    from camg.helper_client import HelperClient

log = logging.getLogger("camg.coding")

ACTION_SCHEMA = shell_action(finish="grade the repository.", cwd="the task repository")
OBSERVATION_SCHEMA = command_observation()


class CodingEnvironment(Environment):
    name = "coding"
    action_schema = ACTION_SCHEMA
    observation_schema = OBSERVATION_SCHEMA
    serves_variants = True

    def __init__(self, context: ServiceContext, tasks: Sequence[Task]) -> None:
        super().__init__(context, tasks)
        self.settings = typed.parse(
            Settings, context.settings, "coding.settings", errors.ConfigError
        )
        self.prepared: dict[str, Prepared] = {}
        #: impossible variants by variant id (camg.config.variants)
        self.variants: dict[str, Prepared] = {}
        self.helper: HelperClient | None = None
        self._catalog_hash = ""

    def start(self) -> None:
        from camg.helper_client import DEFAULT_SOCKET, HelperClient

        s = self.settings
        catalog = images.load(s.images)
        self._catalog_hash = catalog.hash
        for task in self.tasks:
            self.prepared[task.task_id] = self._prepare_task(task, catalog)
        for variant in self.context.variants:
            self.variants[variant.variant_id] = self._prepare_variant(variant)
        log_evaluation.preload()
        self.helper = HelperClient(
            self.context.helper_socket or DEFAULT_SOCKET,
            owner=s.helper_owner or self.context.environment,
        )
        log.info(
            "coding: %d task(s) and %d impossible variant(s) verified",
            len(self.prepared),
            len(self.variants),
        )

    def _prepare_task(self, task: Task, catalog) -> Prepared:
        data = dict(task.data)
        try:
            recorded_ref = mirrors.TaskRef(**data.pop("mirror"))
            recorded_image = data.pop("image")
            row = rows.validate(data, 0)
        except (KeyError, TypeError, errors.DatasetError) as exc:
            raise errors.ConfigError(
                f"task {task.task_id!r}: not a prepared coding task ({exc})"
            ) from None
        if row.instance_id != task.task_id:
            raise errors.ConfigError(f"task {task.task_id!r} carries row {row.instance_id!r}")
        try:
            expected = str(mirrors.mirror_path(self.settings.mirrors_root, row))
        except errors.DatasetError as exc:
            raise errors.ConfigError(str(exc)) from None
        if expected != recorded_ref.mirror:
            raise errors.ConfigError(
                f"task {task.task_id!r}: prepared with mirror "
                f"{recorded_ref.mirror}, settings give {expected}"
            )
        mirrors.verify(recorded_ref)
        image = images.verify(catalog, recorded_image)
        # Built by preparation as root; the service, even as root, only checks
        # them (a missing layer names the preparation command).
        built = layers.verified(self.settings.layers_root, recorded_ref, image_key=image.hash)
        try:
            profile = profiles.for_repo(row.repo)
        except errors.DatasetError as exc:
            raise errors.ConfigError(str(exc)) from None
        return Prepared(row, recorded_ref, image, built, profile)

    def _prepare_variant(self, variant) -> Prepared:
        """The variant's grade: its origin's image, agent layer and profile,
        its own grader layer and FAIL_TO_PASS (the conflicting copy added)."""
        origin = self.prepared[variant.origin]
        data = variant.data
        try:
            ref = variant_layers.variant_ref(origin.ref, data)
            fail_to_pass = tuple(str(t) for t in data["FAIL_TO_PASS"])
        except (KeyError, TypeError) as exc:
            raise errors.ConfigError(
                f"variant {variant.variant_id!r}: not a prepared coding variant ({exc})"
            ) from None
        grader = variant_layers.verified(
            self.settings.layers_root, origin.ref, ref, image_key=origin.image.hash
        )
        return Prepared(
            dataclasses.replace(origin.row, fail_to_pass=fail_to_pass),
            ref,
            origin.image,
            dataclasses.replace(origin.layers, grader=grader),
            origin.profile,
        )

    def _episode(self, task: Task, episode_id: str) -> CodingEpisode:
        if self.helper is None:
            raise errors.Unavailable("the coding environment is not started")
        origin = self.prepared[task.task_id]
        if task.variant is None:
            return CodingEpisode(self.settings, self.helper, origin, episode_id)
        prepared = self.variants[task.variant.variant_id]
        return CodingEpisode(self.settings, self.helper, prepared, episode_id, origin)

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
        grader_sources = b"".join(
            open(os.path.join(here, name), "rb").read()
            for name in (
                "diff_paths.py",
                "grader_scripts.py",
                "log_evaluation.py",
                "integrity.py",
                "profiles.py",
            )
        )
        # The code screen decides a reward too (integrity "suspicious").
        grader_sources += open(code_screen.__file__, "rb").read()
        variant_commits = (
            # only where there are variants: a manifest without them hashes as before
            {"variant_commits": sha256_json({k: p.ref.to_data() for k, p in self.variants.items()})}
            if self.variants
            else {}
        )
        return {
            **variant_commits,
            "images": self._catalog_hash,
            "task_commits": sha256_json({k: p.ref.to_data() for k, p in self.prepared.items()}),
            "task_layers": sha256_json({k: p.layers.snapshot for k, p in self.prepared.items()}),
            "grader": sha256_json(
                {
                    "sources": sha256_bytes(grader_sources),
                    "swebench": _version("swebench"),
                    "suspicious_reward": self.settings.suspicious_reward,
                    "test_cmds": {k: p.profile.test_cmd for k, p in self.prepared.items()},
                }
            ),
        }

    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> Episode:
        return self._episode(task, episode_id)

    def regrade(self, task: Task, submission: Submission) -> Grade:
        """The stored diff through grade() of a grading-only episode: the
        same filter, screen and SWE-smith run in a fresh sandbox over
        [image, grader layer] as the original grade."""
        episode = self._episode(task, f"regrade-{uuid.uuid4().hex[:12]}")
        episode.diff = submission.data
        episode.diff_problem = submission.meta.get("diff_problem")
        try:
            try:
                return Grade(episode.grade(), episode.outcome())
            except errors.InfraFailure as exc:
                # As the episode's own grade was proved (camg.episodes.null_proof): a
                # failure a control on fresh sandboxes does not share is the
                # submission's. The control failing too re-raises it (null).
                try:
                    evidence = episode.control(exc, "grade")
                except Exception as control_exc:
                    log.warning("regrade failed and its control failed too: %s", control_exc)
                    raise exc from None
                if evidence is None:
                    raise
                failed = f"grade failed ({exc.failure_class.value}): {exc}"[:500]
                return Grade(
                    0.0,
                    {
                        **episode.outcome(),
                        "integrity": "obstructed",
                        "grade_reason": "obstructed",
                        "integrity_evidence": [failed, *evidence],
                    },
                )
        finally:
            episode.close()


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "missing"


__all__ = ["CodingEnvironment", "CodingEpisode", "Settings", "INSTRUCTIONS", "WORKDIR"]
