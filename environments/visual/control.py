"""Visual's control: a null is a claim the service proves (camg.episodes.null_proof).

A trainer masks every episode whose reward is null, so a page that can make
its own render or judging fail would hide every episode it expects to lose:
typed arrays allocated until the tab dies, a page that never settles, a
dist/ over its limit, a screenshot the judge refuses. Before such a failure
becomes a null, the same path runs again on fresh resources with a control
submission the agent never touched:

* a failure of the finish step (copying dist/ out, rendering it): CONTROL_PAGE,
  rendered by the same Renderer (same renderer image, limits and mirror) in
  a new sandbox. It renders: the page caused the failure, reward 0.0,
  integrity ``obstructed``. It fails too (the renderer image is missing,
  the helper cannot start a sandbox): the null stands.
* a judge failure (the grade): the control page rendered again and put
  through the same two judge calls (addressing.py, then the rubric's vision
  call). The judge answers: the page's screenshot or text made it fail.
* another infrastructure failure of a step (the task container died or
  refused a command): a fresh task container from the same pool runs a
  trivial command and is removed.

Nothing of the episode reaches a control: not its dist/, its container or
its sandbox. What stays open: a failure the page causes only sometimes
(a control that happens to fail too leaves a null), and a judge that fails
at random on honest pages while the control passes gives that page 0.
"""

from __future__ import annotations

import io
import tarfile
import time

from camg import errors

CONTROL_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>Control page</title>
<style>
body { margin: 0; font-family: "DejaVu Sans", sans-serif; background: #f4f1ea; }
header { padding: 48px; font-size: 40px; color: #fff; background: #1d3557; }
section { height: 500px; padding: 40px; border-bottom: 4px solid #e63946; }
</style></head><body><header>Control page</header>
<section><p>A fixed page the service renders to check its own renderer.</p></section>
</body></html>
"""


def control_tar() -> bytes:
    """CONTROL_PAGE as the renderer receives a delivery (relative to dist/)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        data = CONTROL_PAGE.encode()
        info = tarfile.TarInfo("index.html")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def render_control(renderer):
    """The control page's Shot; RenderError when the renderer fails on it too."""
    shot = renderer.render(control_tar())
    if not shot.jpeg or shot.width <= 0 or shot.height <= 0:
        raise errors.RenderError("the control page gave no image", reason="control")
    return shot


def prove(episode, failure: Exception, phase: str) -> list[str] | None:
    """Evidence lines when the control succeeds; raises when it fails too;
    None where there is no control."""
    env, started = episode.env, time.monotonic()
    if (
        isinstance(failure, errors.RenderError)
        and getattr(failure, "details", {}).get("reason") == "sandbox"
    ):
        # The renderer sandbox failed at the helper (its init killed, the
        # helper gone or restarted): the page runs as uid 2000 inside it and
        # can reach neither, so a control page's success would wrongly
        # blame the page.
        raise errors.RenderError(
            f"the renderer sandbox failed at the helper, an infrastructure "
            f"failure: {str(failure)[:300]}",
            reason="sandbox",
        )
    if phase == "grade":
        shot = render_control(env.renderer)
        score, _, found = env.judge_page(episode.task, shot.jpeg, shot.text)
        if found:
            raise errors.JudgeError(
                "the judge found the control page addressing it", reason="control"
            )
        return [
            f"control: a fixed control page rendered in the same renderer image and "
            f"judged by the same judge with the same calls (score {score:g}, "
            f"{time.monotonic() - started:.1f} s)"
        ]
    if isinstance(failure, errors.RenderError) or getattr(episode, "finishing", False):
        shot = render_control(env.renderer)
        reason = getattr(failure, "details", {}).get("reason") or type(failure).__name__
        return [
            f"render failed ({reason}): {str(failure)[:300]}",
            f"control: a fixed control page rendered in the same renderer image on a fresh "
            f"sandbox ({shot.width}x{shot.height}, {time.monotonic() - started:.1f} s)",
        ]
    if isinstance(failure, errors.InfraFailure):
        box = env.open_box(episode.task, f"{episode.episode_id}-control")
        try:
            res = box.exec("true", user="agent", cwd="/", timeout=60, output_limit=200)
        finally:
            box.remove()
        if res.exit_code != 0 or res.timed_out:
            raise errors.SandboxDied(
                f"a fresh task container failed the control command (exit {res.exit_code})"
            )
        return [
            f"control: a fresh task container of the same image ran a command "
            f"({time.monotonic() - started:.1f} s)"
        ]
    return None
