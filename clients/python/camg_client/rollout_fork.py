"""``python -m camg_client ... --fork-at K --branches N``: rollouts that share
a prefix (branching GRPO, best-of-N from one point, counterfactual credit).

Each of ``--episodes`` prefixes is an episode the policy plays for K
actions; then it is forked N times (``POST /episodes/{id}/fork``, so every
branch starts from the same state, history and observation), the prefix
episode is closed, and each branch is played out by the same policy (a
policy with per-episode memory, like ``openai``, gives each branch the
prefix's conversation). A prefix that ends before K actions is kept as an
episode of its own with no branches.

Besides the usual summary (over the branches), it prints one row per
prefix: the branches' reward mean, min, max and spread (max - min; over
the branches that earned a reward), which is what a trainer that
branches learns from. Each branch is one ``--out`` line with
``forked_from`` and ``fork_step``.

At most ``--concurrency`` episodes are in flight: ``concurrency // (N+1)``
prefixes at once (at least one), since a prefix holds its slot while its N
children take theirs; the service's capacity must be at least N+1.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

from camg_client.client import AsyncClient, ServiceError
from camg_client.rollout import Result, for_each_index, make_policy, play, summary

#: the longest a branch waits in the service's admission line for its slot
FORK_WAIT_S = 3600.0


def carry_policy(policy, parent: str, child: str) -> None:
    """Give the child the parent's per-episode memory, where the policy has one."""
    fork = getattr(policy, "fork", None)
    if callable(fork):
        fork(parent, child)


async def run_prefix(
    client: AsyncClient,
    policy,
    *,
    task_id: str | None,
    seed: int | None,
    fork_at: int,
    branches: int,
) -> tuple[dict, list[Result]]:
    """(its row, the branches' results) of one prefix."""
    started = time.monotonic()
    try:
        created = await client.create(task_id=task_id, seed=seed, wait=FORK_WAIT_S)
    except ServiceError as exc:
        failed = Result(
            None,
            task_id,
            None,
            exc.failure_class or exc.name,
            0,
            time.monotonic() - started,
            [],
            error=str(exc),
        )
        return _row(None, task_id, None, []), [failed]
    parent_id: str = created["episode_id"]
    parent = Result(parent_id, created["task_id"], None, None, 0, time.monotonic() - started, [])
    children: list[Result] = []
    starts: list[Any] = []
    try:
        await play(client, policy, parent, created["observation"], stop_after=fork_at)
        if parent.ended or parent.error:
            # it ended (or failed) within the prefix: an episode of its own
            return _row(parent.episode_id, parent.task_id, None, [parent]) | {"branches": 0}, [
                parent
            ]
        for _ in range(branches):
            t0 = time.monotonic()
            try:
                child = await client.fork(parent_id, wait=FORK_WAIT_S)
            except ServiceError as exc:
                children.append(
                    Result(
                        None,
                        parent.task_id,
                        None,
                        exc.failure_class or exc.name,
                        0,
                        time.monotonic() - t0,
                        [],
                        error=str(exc),
                        forked_from=parent.episode_id,
                        fork_step=parent.steps,
                    )
                )
                continue
            carry_policy(policy, parent_id, child["episode_id"])
            children.append(
                Result(
                    child["episode_id"],
                    child["task_id"],
                    None,
                    None,
                    parent.steps,
                    time.monotonic() - t0,
                    [],
                    forked_from=parent.episode_id,
                    fork_step=child["fork_step"],
                )
            )
            starts.append((children[-1], child["observation"]))
    finally:
        try:
            await client.close(parent_id)
        except ServiceError:
            pass

    async def branch(result: Result, first: Any) -> None:
        assert result.episode_id is not None  # a forked child's, from its fork's answer
        try:
            await play(client, policy, result, first)
        finally:
            try:
                await client.close(result.episode_id)
            except ServiceError:
                pass

    await asyncio.gather(*(branch(r, first) for r, first in starts))
    return _row(parent.episode_id, parent.task_id, parent.steps, children), children


def _row(
    prefix: str | None, task_id: str | None, fork_step: int | None, results: list[Result]
) -> dict:
    rewards = [r.reward for r in results if r.reward is not None]
    return {
        "prefix": prefix,
        "task_id": task_id,
        "fork_step": fork_step,
        "branches": len(results),
        "rewarded": len(rewards),
        "mean": statistics.fmean(rewards) if rewards else None,
        "min": min(rewards) if rewards else None,
        "max": max(rewards) if rewards else None,
        "spread": max(rewards) - min(rewards) if rewards else None,
    }


def spread_summary(rows: list[dict], fork_at: int, branches: int) -> dict:
    spreads = [r["spread"] for r in rows if r["spread"] is not None and r["branches"] > 1]
    return {
        "fork_at": fork_at,
        "branches": branches,
        "prefixes": len(rows),
        "prefixes_forked": sum(1 for r in rows if r["fork_step"] is not None),
        "prefix_spread_mean": statistics.fmean(spreads) if spreads else None,
        "prefix_spread_max": max(spreads) if spreads else None,
    }


async def fork_rollout(
    url: str,
    policy_name: str,
    prefixes: int,
    concurrency: int,
    task_ids: list[str] | None,
    out,
    progress: bool,
    *,
    fork_at: int,
    branches: int,
) -> dict:
    """The summary of the branches, the spread summary, and ``per_prefix``
    (one row per prefix, for ``print_prefixes``)."""
    async with AsyncClient(url, max_connections=max(4, concurrency * 2)) as client:
        policy = await make_policy(client, policy_name)
        rows: list[dict] = []
        results: list[Result] = []

        async def one(i: int) -> None:
            task_id = task_ids[i % len(task_ids)] if task_ids else None
            row, done = await run_prefix(
                client,
                policy,
                task_id=task_id,
                seed=None if task_ids else i,
                fork_at=fork_at,
                branches=branches,
            )
            rows.append(row)
            results.extend(done)
            if out is not None:
                for result in done:
                    out.write(json.dumps(result.line()) + "\n")
                out.flush()

        # a prefix holds its parent and its branches at once
        wall = await for_each_index(
            prefixes, concurrency // (branches + 1), one, progress=progress, unit="prefix"
        )
        body = summary(results, wall)
        body.update(spread_summary(rows, fork_at, branches))
        body["per_prefix"] = rows
        return body


def print_prefixes(rows: list[dict], stream=sys.stdout) -> None:
    """One line per prefix: its branches' reward mean, min, max and spread."""

    def fmt(v: object) -> str:
        return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))

    columns = ("prefix", "task_id", "fork_step", "branches", "mean", "min", "max", "spread")
    table = [columns] + [tuple(fmt(row[c]) for c in columns) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip(),
            file=stream,
        )
    print(file=stream)
