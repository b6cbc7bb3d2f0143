"""The Visual environment: web-development tasks scored from real screenshots by a vision judge.

Per episode: a task container (the container substrate, camg/sandboxes/containers.py:
manifest image by digest, no network, helper-mediated) where the agent
builds a site under /workspace/dist with shell actions; at the end the
container is removed, a copy of dist/ is rendered by headless Chromium in a
renderer sandbox (render.py), and one vision call judges the screenshot
against the seven-dimension rubric (rubric.py). Upstream: NeMo-Gym's
``webdev_eval_v1``.

What decides a reward and is hashed: the task rows, the renderer tree's
renderer.json (Debian package versions, wheel pins), the CDN mirror's
mirror.json (each file's sha256 is checked at start), the rubric text and
the judge model. Judge credentials (WD_JUDGE_URL/MODEL/KEY) come only from
the service's environment (under systemd the operator's
/etc/camg/credentials/visual-judge.env); without them ``camg.serve
--check-config`` and the service's start fail, naming the variables.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from camg import atomic, errors, typed
from camg.environment import Environment, Grade, ServiceContext, Submission, Task
from camg.sandboxes.containers import read_usage
from camg.sandboxes.shell_schema import command_observation, shell_action
from environments.visual import judging, rubric
from environments.visual.episode import VisualEpisode
from environments.visual.render import Mirror, Renderer, RenderLimits, Shot
from environments.visual.settings import Settings

if TYPE_CHECKING:
    from camg.grading.judge import Judge
    from camg.helper_client import HelperClient
    from camg.sandboxes.containers import ContainerClient

log = logging.getLogger("camg.visual")

ACTION_SCHEMA = shell_action(finish="render dist/ and judge it.", cwd="the task's cwd (/workspace)")

IMAGE_SCHEMA = {
    "type": "object",
    "description": "An image: PNG bytes as base64, with their sha256 and the pixel size.",
    "required": ["mime", "base64", "sha256", "width", "height"],
    "properties": {
        "mime": {"const": "image/png"},
        "base64": {"type": "string"},
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "width": {"type": "integer"},
        "height": {"type": "integer"},
    },
}

OBSERVATION_SCHEMA = command_observation(
    finished_by={"enum": ["finish", "step_limit"]},
    screenshot=IMAGE_SCHEMA,
    console_errors={"type": "array", "items": {"type": "string"}},
)


JUDGE_ENV_FILE = "/etc/camg/credentials/visual-judge.env"


def judge_config(settings: Settings, environ: Mapping[str, str] | None = None):
    """The vision judge from WD_JUDGE_URL/MODEL/KEY with upstream's webdev
    client rules (/v1 appended, "openai/" stripped, temperature 1.0, no
    max_tokens). A missing variable is a ConfigError naming it (never a value)."""
    from camg.grading.judge import JudgeConfig

    s = settings
    try:
        return JudgeConfig.from_env(
            s.judge_env_prefix,
            environ,
            ensure_v1=True,
            strip_openai_prefix=True,
            temperature=s.judge_temperature,
            timeout_s=s.judge_timeout_s,
            attempts=s.judge_attempts,
            backoff_s=s.judge_backoff_s,
        )
    except errors.ConfigError as exc:
        raise errors.ConfigError(
            f"visual: {exc.message} (the operator provides them; under "
            f"systemd in {JUDGE_ENV_FILE}, see environments/visual/README.md)",
            **exc.details,
        ) from None


class ContainerBox:
    """A task container through the helper's container verbs."""

    def __init__(self, client, container) -> None:
        self.client = client
        self.container = container

    def exec(self, command: str, *, user: str, cwd: str, timeout: float, output_limit: int):
        return self.client.exec(
            self.container.id,
            command,
            user=user,
            cwd=cwd,
            timeout=timeout,
            output_limit=output_limit,
        )

    def get_archive(self, path: str) -> bytes:
        return self.client.get_archive(self.container.id, path)

    def remove(self) -> None:
        self.client.remove(self.container.id)

    def usage(self) -> dict | None:
        return read_usage(self.client, self.container.id)

    def fork(self, episode_id: str) -> ContainerBox:
        return ContainerBox(self.client, self.client.fork(self.container.id, episode_id=episode_id))


class VisualEnvironment(Environment):
    name = "visual"
    action_schema = ACTION_SCHEMA
    observation_schema = OBSERVATION_SCHEMA
    rubric_id = rubric.RUBRIC_ID
    rubric_hash = rubric.RUBRIC_HASH

    def __init__(self, context: ServiceContext, tasks: Sequence[Task]) -> None:
        super().__init__(context, tasks)
        self.settings = typed.parse(
            Settings, context.settings, "visual.settings", errors.ConfigError
        )
        self.renderer: Renderer | None = None
        self.renderer_info: dict = {}
        self.mirror_urls: list[str] = []
        self.judge: Judge | None = None
        self.judge_problem = ""
        self.helper: HelperClient | None = None
        self.containers: ContainerClient | None = None
        self.pools: dict[str, Any] = {}
        self._pool_lock = threading.Lock()
        self.shots_dir = Path(context.state_dir) / self.settings.screenshots_dir

    # -- start / stop ------------------------------------------------------------
    def start(self) -> None:
        from camg.helper_client import DEFAULT_SOCKET, HelperClient
        from camg.sandboxes.containers import ContainerClient

        s = self.settings
        self._start_judge()  # first: a missing judge fails before anything is touched
        files = self.context.verified_files
        for label in ("renderer", "cdn_mirror"):
            if label not in files:
                raise errors.ConfigError(
                    f"the visual manifest names no {label!r} file "
                    "(python -m camg.prepare --environment visual)"
                )
        info_path = Path(files["renderer"]["path"])
        self.renderer_info = json.loads(info_path.read_text())
        rootfs = info_path.parent / "rootfs"
        if not (rootfs / self.renderer_info["browser"].lstrip("/")).is_file():
            raise errors.PreparationMissing(
                f"renderer tree {rootfs} has no browser",
                step="python -m environments.visual.build.renderer_rootfs",
            )
        mirror = Mirror.load(files["cdn_mirror"]["path"])
        self.mirror_urls = sorted(mirror.files)
        self.helper = HelperClient(
            self.context.helper_socket or DEFAULT_SOCKET, owner=s.helper_owner
        )
        self.containers = ContainerClient(helper=self.helper)
        # A previous instance killed with -9 leaves its task containers,
        # warm pool and renderer sandboxes (browsers included) behind; they
        # belong to this (uid, owner) and nothing else may use them.
        released = self.helper.release_all()
        if released:
            log.warning("released %d container(s)/sandbox(es) a previous instance left", released)
        self.renderer = Renderer(
            self.helper,
            str(rootfs),
            self.renderer_info,
            mirror,
            RenderLimits(
                timeout=s.render_timeout,
                memory_bytes=s.render_memory_bytes,
                cpu_quota=s.render_cpu,
                pids_max=s.render_pids_max,
                dist_bytes=s.dist_bytes,
            ),
        )
        self.shots_dir.mkdir(parents=True, exist_ok=True)
        for image in sorted({t.data["image"] for t in self.tasks}):
            self._pool(image)

    @classmethod
    def check_config(cls, config) -> None:
        """``camg.serve --check-config``: the judge variables must be in the environment."""
        judge_config(typed.parse(Settings, config.settings, "visual.settings", errors.ConfigError))

    def _start_judge(self) -> None:
        from camg.grading.judge import Judge

        # No judge, no service: a degraded Visual would only mask episodes.
        self.judge = Judge(judge_config(self.settings))

    def _pool(self, image: str):
        from camg.sandboxes.containers import ContainerPool, ContainerSpec

        s = self.settings
        containers = self.containers
        assert containers is not None  # pools are made once start() has the client
        with self._pool_lock:
            pool = self.pools.get(image)
            if pool is None:
                spec = ContainerSpec(
                    image=image,
                    cpu=s.cpu,
                    memory_bytes=s.memory_bytes,
                    pids_max=s.pids_max,
                    command=("sleep", "infinity"),
                )
                try:
                    containers.pull(image)
                except errors.CamgError as exc:
                    # As General does: a registry that is gone (a demo's
                    # loopback one) is fine when dockerd holds the image by
                    # digest already; if not, the pool's creates fail.
                    log.warning("pulling %s failed: %s", image, exc)
                pool = self.pools[image] = ContainerPool(containers, spec, size=s.pool_size)
            return pool

    def stop(self) -> None:
        for pool in list(self.pools.values()):
            try:
                pool.close()
            except errors.CamgError as exc:
                log.warning("closing a container pool: %s", exc)
        self.pools.clear()
        if self.judge is not None:
            self.judge.close()
        if self.helper is not None:
            self.helper.close()

    # -- what episodes use -------------------------------------------------------------
    def create_episode(self, task: Task, *, seed: int | None, episode_id: str) -> VisualEpisode:
        return VisualEpisode(self, task, episode_id)

    def open_box(self, task: Task, episode_id: str) -> ContainerBox:
        container = self._pool(task.data["image"]).claim(episode_id)
        return ContainerBox(self.containers, container)

    def store_screenshot(self, episode_id: str, shot: Shot) -> str:
        path = self.shots_dir / f"{episode_id}.jpg"
        atomic.write_bytes(path, shot.jpeg, mode=0o600)
        return str(path)

    def judge_shot(self, task: Task, shot: Shot):
        if self.judge is None:
            raise errors.JudgeError(
                f"judge unconfigured: {self.judge_problem}", reason="unconfigured"
            )
        return judging.vision(self.judge, task.data["problem_statement"], shot.jpeg)

    def judge_page(self, task: Task, jpeg: bytes, text: str) -> tuple[float, dict, list[str]]:
        """judging.judge_page with this service's judge."""
        if self.judge is None:
            raise errors.JudgeError(
                f"judge unconfigured: {self.judge_problem}", reason="unconfigured"
            )
        return judging.judge_page(self.judge, task.data["problem_statement"], jpeg, text)

    def regrade(self, task: Task, submission: Submission) -> Grade:
        """The stored screenshot and page text before the judge again (new
        judge calls, the address question first: the verdict of a sampled
        judge may differ; the rubric and judge hashes say what was asked of
        whom)."""
        import hashlib

        meta = submission.meta
        path = self.shots_dir / os.path.basename(str(meta.get("screenshot") or ""))
        try:
            jpeg = path.read_bytes() if meta.get("screenshot") else None
        except FileNotFoundError:
            jpeg = None
        if jpeg is None or hashlib.sha256(jpeg).hexdigest() != meta.get("sha256"):
            raise errors.NoSubmission(f"the episode's screenshot {path.name} is gone or changed")
        if meta.get("integrity") == "tampered":
            # delivery.py's rule holds on a regrade too: 0, the judge is not asked
            return Grade(
                0.0,
                {
                    "integrity": "tampered",
                    "integrity_evidence": list(meta.get("integrity_evidence") or ()),
                    "rubric_id": self.rubric_id,
                    "rubric_hash": self.rubric_hash,
                },
            )
        score, records, found = self.judge_page(
            task, jpeg, submission.data.decode("utf-8", "replace")
        )
        out: dict[str, Any] = {"rubric_id": self.rubric_id, "rubric_hash": self.rubric_hash}
        if "judge" in records:
            out["judge"] = records["judge"]
        if "address" in records:
            out["judge_address"] = records["address"]
        if found:
            out.update(integrity="tampered", integrity_evidence=found)
        return Grade(score, out)

    # -- service surface ------------------------------------------------------------
    def health(self) -> list[str]:
        reasons = []
        if self.judge is None:
            reasons.append(f"judge unconfigured: {self.judge_problem or 'not started'}")
        return reasons

    def metadata(self) -> Mapping[str, Any]:
        meta: dict[str, Any] = {
            "rubric": {
                "id": self.rubric_id,
                "sha256": self.rubric_hash,
                "query_cap": rubric.QUERY_CAP,
            },
            "renderer": {k: self.renderer_info.get(k) for k in ("key", "packages", "wheels")},
            "render": {
                "viewport": [1440, 900],
                "jpeg_quality": 75,
                "max_pixels": 20_000_000,
                "timeout_s": self.settings.render_timeout,
            },
            "cdn_mirror_urls": self.mirror_urls,
            "images": sorted({t.data["image"] for t in self.tasks}),
        }
        if self.judge is not None:
            meta["judge"] = {k: v for k, v in self.judge.config.describe().items() if k != "host"}
            meta["judge"]["temperature"] = self.settings.judge_temperature
        return meta
