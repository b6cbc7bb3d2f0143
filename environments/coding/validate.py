"""Validation at preparation, as SWE-smith validates its task instances.

For each selected task (or a seeded sample of them) the gold fix and the
empty submission are graded exactly as an episode grades them: a fresh
grader sandbox over [image, grader layer], the guard, swebench's parse.
A task is kept only if gold earns 1.0 and the no-op earns 0.0; otherwise
preparation refuses, naming every bad task and what it earned.

The gold fix is the "Bug Patch" commit reversed, taken from the mirror
(``git diff <bug> <bug>~1``), i.e. what an agent that undid the bug would
submit.

Each task's agent view is also checked, in an agent sandbox as the agent
(environments.coding.leaks): a task whose image shows anything built from the
clean sources (bytecode, copies, archives, git objects) is refused too.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from camg.errors import CamgError, DatasetError
from environments.coding import mirrors


@dataclasses.dataclass(frozen=True)
class Result:
    task_id: str
    gold: float | None
    noop: float | None
    problem: str = ""
    leaks: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.gold == 1.0 and self.noop == 0.0 and not self.leaks

    def to_data(self) -> dict:
        body: dict[str, object] = {"gold": self.gold, "noop": self.noop}
        if self.leaks:
            body["leaks"] = list(self.leaks[:5])
        if self.problem:
            body["problem"] = self.problem[:300]
        return body


def sample(ids: Sequence[str], size: int | None, seed: int | None) -> list[str]:
    if size is None or size >= len(ids):
        return list(ids)
    if size < 1:
        raise DatasetError("--sample must be at least 1")
    chosen = set(random.Random(seed or 0).sample(list(ids), size))
    return [i for i in ids if i in chosen]


def validate(prepared: Sequence, settings, helper_socket: str) -> list[Result]:
    """Grade gold and no-op of every ``prepared`` task (episode.Prepared)."""
    from camg.helper_client import HelperClient
    from environments.coding import log_evaluation
    from environments.coding.episode import CodingEpisode

    log_evaluation.preload()
    helper = HelperClient(helper_socket, owner="coding-validate")
    results = []
    try:
        for task in prepared:
            rewards: dict[str, float | None] = {}
            problem = ""
            for kind, diff in (("gold", mirrors.gold_diff(task.ref)), ("noop", b"")):
                episode = CodingEpisode(
                    settings, helper, task, f"validate-{kind}-{task.row.instance_id[-8:]}"
                )
                episode.diff = diff
                try:
                    rewards[kind] = episode.grade()
                    report = episode.report
                    if kind == "gold" and rewards[kind] != 1.0:
                        assert report is not None  # grade() returned: it made the report
                        problem = (
                            f"gold: {report.reason}, integrity {report.integrity}, "
                            f"F2P failed {list(report.fail_to_pass_failed)[:3]}, "
                            f"P2P failed {list(report.pass_to_pass_failed)[:3]}"
                        )
                    elif kind == "noop" and rewards[kind] != 0.0:
                        problem = "no-op: resolved without any change"
                except CamgError as exc:
                    rewards[kind] = None
                    problem = f"{kind}: {exc.name}: {str(exc)[:200]}"
                finally:
                    episode.close()
            leaked = view_leaks(settings, helper, task)
            if leaked and not problem:
                problem = f"agent view: {leaked[0]}"
            results.append(
                Result(
                    task.row.instance_id, rewards.get("gold"), rewards.get("noop"), problem, leaked
                )
            )
    finally:
        helper.close()
    return results


def view_leaks(settings, helper, task) -> tuple[str, ...]:
    """What of the clean sources the task's agent view shows (see
    environments.coding.leaks), checked in a fresh agent sandbox."""
    from environments.coding import leaks
    from environments.coding.episode import CodingEpisode

    clean = leaks.prepared_clean_sources(task)
    if not clean:
        return ()
    episode = CodingEpisode(settings, helper, task, f"validate-view-{task.row.instance_id[-8:]}")
    try:
        episode.reset()
        assert episode.sandbox is not None  # reset() holds it
        found, _ = leaks.sandbox_findings(helper, episode.sandbox, clean)
    except CamgError as exc:
        return (f"leak check failed: {exc.name}: {str(exc)[:200]}",)
    finally:
        episode.close()
    return tuple(str(f) for f in found)


def refuse_bad(results: Sequence[Result]) -> None:
    bad = [r for r in results if not r.ok]
    if bad:
        lines = "; ".join(f"{r.task_id} (gold {r.gold}, no-op {r.noop}: {r.problem})" for r in bad)
        raise DatasetError(f"validation refused {len(bad)} of {len(results)} task(s): {lines}")
