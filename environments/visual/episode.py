"""One Visual episode: build a website in a task container, then render and judge it.

Actions (seed 001): ``{"operation": "shell", "command": ...}`` runs as uid
2000 from the task's cwd (/workspace) in the episode's own container, 60 s,
the output's final 12000 bytes with the truncation note, exit 124 on
timeout; ``{"operation": "finish"}`` -- or the 64th step -- ends the
episode. The terminal observation is sticky (the episode manager keeps it).

At the end, dist/ is copied out of the container as a tar stream and the
container is removed: the agent is gone before anything is rendered. The
copy is rendered in a renderer sandbox (render.py); the terminal
observation carries the screenshot (PNG, base64, sha256, width, height).
``grade`` then asks the judge whether the page's text addresses its
evaluator (addressing.py) and, when it does not, the vision judge for the
rubric's score. A render failure is ``render_error`` and a judge failure
``judge_error``, reward null, unless the episode's control (control.py)
renders and judges a fixed page on fresh resources: then the page caused
the failure and scores 0.0 (integrity ``obstructed``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from camg import errors
from camg.environment import Episode, Step, Submission
from camg.episodes.cost import judge_tokens
from environments.visual import addressing, control, delivery
from environments.visual.render import Shot

log = logging.getLogger("camg.visual")

DELIVERY = (
    "Build the website described below and deliver it to {dist}/: opening {dist}/index.html "
    "in a browser has to show the finished site. Always deliver a working site and never ask "
    "the user to confirm details.\n\n"
    "- Work however you like under {cwd}; only {dist}/ is delivered. If you use a build step, "
    "put its static output there.\n"
    "- The entry point must be exactly {dist}/index.html, starting with <!DOCTYPE html>. "
    "Everything it needs (scripts, styles, images, fonts) must be inside {dist}/ and referenced "
    "by paths relative to it.\n"
    "- You may use Tailwind CSS from its CDN build "
    '(<script src="https://cdn.jsdelivr.net/npm/@tailwindcss/browser@4"></script>) and/or '
    "inline <style>. Other external URLs will not load when the site is reviewed.\n\n"
    "Request:\n\n{brief}\n\n"
    'Use shell actions ({{"operation": "shell", "command": ...}}) to work; each starts in '
    "{cwd}, runs for at most 60 seconds, and shows the final 12000 bytes of output. Send "
    '{{"operation": "finish"}} when the site is ready: it is then rendered as one '
    "full-page screenshot at 1440x900 and reviewed."
)


class TaskBox(Protocol):
    """The agent's container, as the episode uses it."""

    def exec(
        self, command: str, *, user: str, cwd: str, timeout: float, output_limit: int
    ) -> Any: ...

    def get_archive(self, path: str) -> bytes: ...

    def remove(self) -> None: ...

    def usage(self) -> dict | None: ...  # its cost so far (camg.episodes.cost); None: unknown

    def fork(self, episode_id: str) -> TaskBox: ...  # a copy of its filesystem as it stands


def png_image(jpeg: bytes) -> dict:
    """An image for an observation: PNG bytes as base64, with sha256 and size."""
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as im:
        buf = io.BytesIO()
        im.convert("RGB").save(buf, "PNG", optimize=False, compress_level=6)
        width, height = im.size
    data = buf.getvalue()
    return {
        "mime": "image/png",
        "base64": base64.b64encode(data).decode("ascii"),
        "sha256": hashlib.sha256(data).hexdigest(),
        "width": width,
        "height": height,
    }


class VisualEpisode(Episode):
    def __init__(self, env, task, episode_id: str) -> None:
        self.env = env
        self.settings = env.settings
        self.task = task
        self.episode_id = episode_id
        self.cwd = str(task.data.get("cwd") or "/workspace")
        self.box: TaskBox | None = None
        self.steps = 0
        self.shot: Shot | None = None
        self.shot_path: str | None = None
        self.verdict: dict | None = None
        #: the address question's verdict record (addressing.py), when asked
        self.address: dict | None = None
        #: the page text the address question is asked about (addressing.excerpt)
        self.screen_text = ""
        self.failure: dict | None = None
        self.evidence: list[str] = []  # delivery.py's integrity evidence
        self.usage: dict | None = None  # the container's, read at finish (camg.episodes.cost)
        #: dist/ is copied out and goes to the renderer: a failure now is the render's
        self.finishing = False
        self._lock = threading.Lock()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------
    def reset(self) -> Mapping[str, Any]:
        box = self.env.open_box(self.task, self.episode_id)
        with self._lock:
            if self._closed:
                box.remove()
                raise errors.InfraFailure("episode closed during reset")
            self.box = box
        # Upstream's environment setup is exactly this.
        res = box.exec(
            f"mkdir -p {self.cwd}/dist && chown -R 2000:2000 {self.cwd}",
            user="root",
            cwd="/",
            timeout=60,
            output_limit=2000,
        )
        if res.exit_code != 0:
            raise errors.InfraFailure(f"workspace setup failed: {res.output[-500:]}")
        dist = f"{self.cwd.rstrip('/')}/dist"
        text = DELIVERY.format(dist=dist, cwd=self.cwd, brief=self.task.data["problem_statement"])
        return {"task_id": self.task.task_id, "output": text, "step": 0}

    def step(self, action: Mapping[str, Any]) -> Step:
        s = self.settings
        self.steps += 1
        if action["operation"] == "finish":
            return self._finish("finish")
        command = action.get("command", "")
        if len(command) > s.max_command_chars:
            raise errors.InvalidAction(f"command longer than {s.max_command_chars} characters")
        box = self._box()
        res = box.exec(
            command,
            user="agent",
            cwd=self.cwd,
            timeout=s.command_timeout,
            output_limit=s.output_bytes,
        )
        obs = {
            "task_id": self.task.task_id,
            "output": res.output,
            "exit_code": res.exit_code,
            "timed_out": res.timed_out,
            "truncated": res.truncated,
            "step": self.steps,
        }
        if self.steps >= s.max_steps:
            return self._finish("step_limit", last=obs)
        return Step(observation=obs)

    def fork(self, episode_id: str) -> VisualEpisode:
        """A snapshot of the container (the helper's ContainerFork): the
        workspace as it stands, and the step count. Nothing else decides the
        grade before finish: the child's dist/ is copied, rendered and
        judged from its own container, and delivery.py's evidence comes
        from that copy and render."""
        child = VisualEpisode(self.env, self.task, episode_id)
        child.box = self._box().fork(episode_id)
        child.steps = self.steps
        return child

    def _box(self) -> TaskBox:
        with self._lock:
            if self._closed or self.box is None:
                raise errors.SandboxDied("the episode's container is gone")
            return self.box

    def _finish(self, why: str, last: Mapping[str, Any] | None = None) -> Step:
        box = self._box()
        dist = f"{self.cwd.rstrip('/')}/dist"
        try:
            tar = box.get_archive(dist)
        except errors.NotFound:
            tar = b""  # no dist/ at all: rendered like a missing index.html
        finally:
            self.usage = box.usage()
            self._drop_box()
        self.finishing = True
        tar, self.evidence = delivery.strip_top(tar, self.settings.dist_bytes)
        self.shot = self.env.renderer.render(tar)
        self.evidence += delivery.shot_evidence(self.shot)
        self.screen_text = addressing.asked_text(self.shot.text, tar)
        self.shot_path = self.env.store_screenshot(self.episode_id, self.shot)
        obs = {
            "task_id": self.task.task_id,
            "step": self.steps,
            "finished_by": why,
            "output": (last or {}).get("output", "Site delivered; rendered for review."),
            "screenshot": png_image(self.shot.jpeg),
            "console_errors": list(self.shot.console_errors),
        }
        return Step(observation=obs, done=True, graded=False)

    def grade(self) -> float:
        if self.shot is None:
            raise errors.GraderError("nothing was rendered")
        if delivery.verdict(self.evidence)["integrity"] == "tampered":
            return 0.0  # reaching outside dist/: 0 by rule, the judge is not asked
        try:
            score, records, found = self.env.judge_page(self.task, self.shot.jpeg, self.screen_text)
        except errors.JudgeError as first:
            # Once more before the failure goes to the control (control.py),
            # which gives the page 0.0 when the judge answers a fixed page:
            # an outage that ends between the two must not become this
            # page's 0.
            log.warning("the judge failed on the page (%s); asking once more", first.message)
            try:
                score, records, found = self.env.judge_page(
                    self.task, self.shot.jpeg, self.screen_text
                )
            except errors.JudgeError as exc:  # the record says what was asked of whom
                self.failure = {"judge_failure": exc.message, **exc.details}
                raise
        self.address, self.verdict = records.get("address"), records.get("judge")
        self.evidence += found
        return score

    def control(self, failure: Exception, phase: str):
        """control.py: the same render or judging path with a fixed page on
        fresh resources."""
        return control.prove(self, failure, phase)

    def submission(self) -> Submission | None:
        """The screenshot the judge saw, by reference: it is already kept
        in the service's screenshots directory (no second copy)."""
        if self.shot is None or self.shot_path is None:
            return None
        # data: the page text the address question was asked about, so a
        # regrade asks the same question
        return Submission(
            data=self.screen_text.encode(),
            meta={
                "screenshot": os.path.basename(self.shot_path),
                "sha256": self.shot.sha256,
                "width": self.shot.width,
                "height": self.shot.height,
                "downscaled": self.shot.downscaled,
                **delivery.verdict(self.evidence),
            },
        )

    def outcome(self) -> Mapping[str, Any]:
        out: dict[str, Any] = {
            "rubric_id": self.env.rubric_id,
            "rubric_hash": self.env.rubric_hash,
            "image": self.task.data["image"],
        }
        if self.shot is not None:
            out["screenshot"] = {
                "sha256": self.shot.sha256,
                "width": self.shot.width,
                "height": self.shot.height,
                "path": self.shot_path,
                "downscaled": self.shot.downscaled,
                "format": "jpeg",
                "render_timings": dict(self.shot.timings),
            }
        if self.verdict is not None:
            out["judge"] = self.verdict
        if self.address is not None:
            out["judge_address"] = self.address
        if self.failure is not None:
            out["judge_failure"] = self.failure
        out.update(delivery.verdict(self.evidence))
        tokens = judge_tokens([r.get("judge_tokens") for r in (self.address, self.verdict) if r])
        out["cost"] = {**(self.usage or {}), **tokens}
        return out

    def state(self) -> Mapping[str, Any]:
        return {"steps": self.steps, "rendered": self.shot is not None}

    def reference_action(self) -> Mapping[str, Any] | None:
        """The next action of the task's prepared reference site (reference.py)."""
        from environments.visual import reference

        steps = reference.plan(
            self.task.task_id,
            self.task.data,
            cwd=self.cwd,
            max_command_chars=self.settings.max_command_chars,
        )
        return steps[min(self.steps, len(steps) - 1)]

    def _drop_box(self) -> None:
        with self._lock:
            box, self.box = self.box, None
        if box is not None:
            box.remove()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._drop_box()
