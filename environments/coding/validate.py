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

Impossible variants (environments/coding/mutations.py) are validated
inverted (``validate_variants``): the task's gold fix, graded over the
variant's grader layer, must fail, and fail only the mutated test (or its
conflicting copy), with an honest verdict; the no-op must fail too; and
the unmutated gold must pass the task itself. A variant that does not hold
is dropped, never served.

What a grade proved is kept beside the layers (environments/coding/validation_cache.py),
keyed by all that decides it: the same selection prepared again grades
nothing again.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path

from camg.config.hashing import sha256_bytes
from camg.errors import CamgError, DatasetError
from environments.coding import mirrors, validation_cache


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
            gold = mirrors.gold_diff(task.ref)
            key = validation_cache.key(task, "task", gold=sha256_bytes(gold))
            where = Path(task.layers.agent).parent
            cached = validation_cache.load(where, key)
            if cached is not None:
                results.append(
                    Result(
                        task.row.instance_id,
                        cached["gold"],
                        cached["noop"],
                        cached.get("problem", ""),
                        tuple(cached.get("leaks", ())),
                    )
                )
                continue
            rewards: dict[str, float | None] = {}
            problem = ""
            for kind, diff in (("gold", gold), ("noop", b"")):
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
            result = Result(
                task.row.instance_id, rewards.get("gold"), rewards.get("noop"), problem, leaked
            )
            results.append(result)
            if None not in rewards.values():  # an infrastructure failure is graded again
                validation_cache.store(
                    where,
                    key,
                    {"gold": result.gold, "noop": result.noop, "problem": problem, "leaks": leaked},
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


@dataclasses.dataclass(frozen=True)
class VariantResult:
    variant_id: str
    origin: str
    gold: float | None  # the task's gold fix, graded on the variant
    noop: float | None
    origin_gold: float | None  # the same gold fix on the task itself
    problem: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.gold == 0.0 and self.noop == 0.0 and self.origin_gold == 1.0 and not self.problem
        )

    def to_data(self) -> dict:
        body: dict[str, object] = {
            "gold": self.gold,
            "noop": self.noop,
            "origin_gold": self.origin_gold,
        }
        if self.problem:
            body["problem"] = self.problem[:300]
        return body


def _base(node_id: str) -> str:
    return node_id.split("[", 1)[0]


def validate_variants(
    built: Sequence, origins: dict, settings, helper_socket: str, origin_gold: dict[str, float]
) -> list[VariantResult]:
    """Grade each variant inverted (see the module's docstring). ``built``:
    environments.coding.prepare_variants.Built; ``origins``: task id ->
    episode.Prepared; ``origin_gold``: the gold rewards validation already
    has (the rest are graded here)."""
    from camg.helper_client import HelperClient
    from environments.coding import log_evaluation
    from environments.coding.episode import Prepared

    log_evaluation.preload()
    helper = HelperClient(helper_socket, owner="coding-validate")
    known = dict(origin_gold)
    results = []
    try:
        for made in built:
            variant = made.variant
            origin = origins[variant.origin]
            prepared = Prepared(
                dataclasses.replace(origin.row, fail_to_pass=tuple(variant.data["FAIL_TO_PASS"])),
                made.ref,
                origin.image,
                dataclasses.replace(origin.layers, grader=made.grader),
                origin.profile,
            )
            gold = mirrors.gold_diff(origin.ref)
            key = validation_cache.key(
                prepared,
                "variant",
                gold=sha256_bytes(gold),
                variant=variant.variant_id,
                origin=origin.ref.tests,
            )
            where = Path(made.grader).parent
            cached = validation_cache.load(where, key)
            if cached is not None:
                results.append(VariantResult(variant.variant_id, variant.origin, **cached))
                continue
            if variant.origin not in known:
                known[variant.origin] = _reward(settings, helper, origin, None, gold, "origin")[0]
            problem = ""
            rewards: dict[str, float | None] = {}
            copy = made.mutation.copy
            mutated = {_base(made.mutation.test), *([copy] if copy else [])}
            for kind, diff in (("gold", gold), ("noop", b"")):
                reward, report, error = _reward(settings, helper, prepared, origin, diff, kind)
                rewards[kind] = reward
                if error:
                    problem = problem or f"{kind}: {error}"
                elif report is not None and reward == 0.0:
                    failed = {*report.fail_to_pass_failed, *report.pass_to_pass_failed}
                    if report.integrity != "ok" or report.reason != "tests_failed":
                        problem = problem or (
                            f"{kind}: {report.reason}, integrity {report.integrity}"
                        )
                    elif kind == "gold" and not {_base(t) for t in failed} <= mutated:
                        problem = problem or (
                            "gold: fails tests the mutation did not touch: "
                            f"{sorted(t for t in failed if _base(t) not in mutated)[:3]}"
                        )
                elif reward is not None and reward != 0.0:
                    problem = problem or f"{kind}: passes the variant"
            result = VariantResult(
                variant.variant_id,
                variant.origin,
                rewards.get("gold"),
                rewards.get("noop"),
                known[variant.origin],
                problem,
            )
            results.append(result)
            if None not in (result.gold, result.noop, result.origin_gold):
                validation_cache.store(
                    where,
                    key,
                    {
                        "gold": result.gold,
                        "noop": result.noop,
                        "origin_gold": result.origin_gold,
                        "problem": problem,
                    },
                )
    finally:
        helper.close()
    return results


def _reward(settings, helper, prepared, origin, diff: bytes, kind: str):
    """(reward or None, report, error text) of one grade."""
    from environments.coding.episode import CodingEpisode

    episode = CodingEpisode(
        settings, helper, prepared, f"validate-{kind}-{prepared.row.instance_id[-8:]}", origin
    )
    episode.diff = diff
    try:
        reward = episode.grade()
        return reward, episode.report, ""
    except CamgError as exc:
        return None, None, f"{exc.name}: {str(exc)[:200]}"
    finally:
        episode.close()


def refuse_bad(results: Sequence[Result]) -> None:
    bad = [r for r in results if not r.ok]
    if bad:
        lines = "; ".join(f"{r.task_id} (gold {r.gold}, no-op {r.noop}: {r.problem})" for r in bad)
        raise DatasetError(f"validation refused {len(bad)} of {len(results)} task(s): {lines}")
