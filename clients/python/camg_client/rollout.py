"""One rollout on one host: the episode loop, its policies and the
regrade of an earlier run, which ``python -m camg_client`` (cli.py) and its
Ray branch (rollout_ray.py) drive.

Policies:

* ``oracle`` asks the service for its reference solution's next action
  (``GET /episodes/{id}/reference``; the deployment must enable
  ``references``) and plays it: every task should earn its maximum — the
  end-to-end check an operator runs before training (reset → actions →
  termination → reward → cleanup on every environment).
* ``noop`` does nothing useful: ``finish`` where the action schema has one,
  otherwise an action that fits the schema and changes nothing, until the
  episode ends: every task should earn the environment's minimum.
* ``openai`` drives the episode with any OpenAI-compatible chat endpoint
  (``CAMG_POLICY_URL``, ``CAMG_POLICY_MODEL``, ``CAMG_POLICY_KEY`` from the
  environment) through native tool calls (``/schema``'s "tools"), or the
  text protocol where the endpoint has no tools (camg_client/openai_policy.py).

Canary episodes (an impossible variant's, camg_client/canaries.py: the
terminal reply's ``canary``) are left out of the reward figures unless
``keep_canaries``; the summary reports their cheating rate instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import sys
import time
from collections import Counter
from typing import Any

from camg_client import canaries
from camg_client.client import AsyncClient, BadRequest, ServiceError
from camg_client.openai_policy import OpenAIPolicy
from camg_client.tool_calls import ToolCallError

MAX_ACTIONS = 1000  # a policy that never ends its episode is cut here


@dataclasses.dataclass
class Result:
    episode_id: str | None
    task_id: str | None
    reward: float | None
    failure_class: str | None
    steps: int
    reset_s: float
    step_s: list[float]
    error: str | None = None
    #: the outcome record's seq in the service's signed log: the receipt
    #: ``python -m camg.verify --through`` checks the log against
    outcome_seq: int | None = None
    #: what the episode cost the host, from the terminal reply (no extra request)
    cost: dict | None = None
    #: a fork's parent and the step it was forked at (rollout_fork.py)
    forked_from: str | None = None
    fork_step: int | None = None
    #: the episode answered a terminal step
    ended: bool = False
    #: why the policy's last action was refused (the schema, a tool call that
    #: names no action): the episode scores 0.0, the policy's own failure
    invalid_action: str | None = None
    #: an impossible variant's verdict (the terminal reply's ``canary``):
    #: the episode measured cheating and is no training data by default
    canary: dict | None = None

    def line(self) -> dict:
        line = {
            "episode_id": self.episode_id,
            "task_id": self.task_id,
            "reward": self.reward,
            "failure_class": self.failure_class,
            "steps": self.steps,
            "reset_s": round(self.reset_s, 6),
            "step_s": [round(s, 6) for s in self.step_s],
            "error": self.error,
            "outcome_seq": self.outcome_seq,
            "cost": self.cost,
        }
        if self.forked_from is not None:
            line.update(forked_from=self.forked_from, fork_step=self.fork_step)
        if self.invalid_action is not None:
            line["invalid_action"] = self.invalid_action
        if self.canary is not None:
            line["canary"] = self.canary
        return line


class Noop:
    """``finish`` where the schema has it, else a schema-fitting action that
    changes nothing (e.g. Shop's ``{"action": "noop"}``)."""

    def __init__(self, schema: dict) -> None:
        props = schema.get("properties", {})
        # General's schema is one branch per task kind (anyOf); AutoResearch ends with submit
        ends = [
            op
            for branch in schema.get("anyOf") or [schema]
            for op in branch.get("properties", {}).get("operation", {}).get("enum") or []
            if op in ("finish", "submit")
        ]
        if ends:
            self.action = {"operation": ends[0]}
        else:
            self.action = {
                name: "noop"
                for name in schema.get("required", [])
                if props.get(name, {}).get("type") == "string"
            }

    async def act(self, client: AsyncClient, episode_id: str, observation: Any) -> dict | None:
        return dict(self.action)


class Oracle:
    async def act(self, client: AsyncClient, episode_id: str, observation: Any) -> dict | None:
        return (await client.reference(episode_id))["action"]


async def run_episode(
    client: AsyncClient,
    policy,
    *,
    task_id: str | None,
    seed: int | None,
    wait: float,
    variant: str | None = None,
) -> Result:
    started = time.monotonic()
    try:
        created = await client.create(task_id=task_id, seed=seed, wait=wait, variant=variant)
    except ServiceError as exc:
        return Result(
            None,
            task_id,
            None,
            exc.failure_class or exc.name,
            0,
            time.monotonic() - started,
            [],
            error=str(exc),
        )
    episode_id, observation = created["episode_id"], created["observation"]
    result = Result(episode_id, created["task_id"], None, None, 0, time.monotonic() - started, [])
    try:
        await play(client, policy, result, observation)
    finally:
        try:
            state = await client.close(episode_id)
            # an episode that ended without its terminal reply here says it now
            if result.canary is None and isinstance(state, dict):
                result.canary = state.get("canary")
        except ServiceError:
            pass
    return result


async def play(
    client: AsyncClient, policy, result: Result, observation: Any, stop_after: int | None = None
) -> Any:
    """Step ``result``'s episode with ``policy`` from ``observation`` until it
    ends, or with ``stop_after`` after that many actions (a fork's prefix,
    rollout_fork.py); the last observation. A failure is the result's."""
    assert result.episode_id is not None  # the result of a created episode
    try:
        for _ in range(MAX_ACTIONS if stop_after is None else stop_after):
            action = await policy.act(client, result.episode_id, observation)
            if action is None:
                break
            t0 = time.monotonic()
            answer = await client.step(result.episode_id, action)
            result.step_s.append(time.monotonic() - t0)
            result.steps += 1
            observation = answer["observation"]
            if answer["done"]:
                result.ended = True
                result.reward = answer["reward"]
                result.failure_class = answer.get("failure_class")
                result.outcome_seq = answer.get("outcome_seq")
                result.cost = answer.get("cost")
                result.canary = answer.get("canary")
                return observation
        else:
            if stop_after is not None:
                return observation
            result.error = f"no terminal step after {MAX_ACTIONS} actions"
        if result.reward is None and result.failure_class is None and result.error is None:
            result.error = "the policy stopped before the episode ended"
    except (BadRequest, ToolCallError) as exc:
        # The policy emitted an action the environment refuses (off-schema,
        # too deep, a tool call that stands for no action): that is the
        # policy's failure and scores the minimum. Reported as no reward,
        # it would be masked, and a policy could hide every episode it
        # expects to lose behind one malformed action.
        result.reward, result.invalid_action = 0.0, str(exc)
    except ServiceError as exc:
        result.error = str(exc)
        result.failure_class = exc.failure_class
    except Exception as exc:  # a policy bug ends its episode, not the run
        result.error = f"{type(exc).__name__}: {exc}"
    return observation


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _mean_cost(results: list[Result], key: str) -> float | None:
    values = [
        r.cost[key]
        for r in results
        if isinstance(r.cost, dict) and isinstance(r.cost.get(key), (int, float))
    ]
    return statistics.fmean(values) if values else None


def summary(results: list[Result], wall: float, keep_canaries: bool = False) -> dict:
    """The run's figures. Canary episodes are reported apart (their rate)
    and left out of the reward figures unless ``keep_canaries``."""
    trained = [r for r in results if keep_canaries or r.canary is None]
    rewards = [r.reward for r in trained if r.reward is not None]
    last = [r.step_s[-1] for r in results if r.step_s]
    steps = [s for r in results for s in r.step_s[:-1]]
    buckets = Counter(min(4, int(r * 5)) for r in rewards)
    return {
        "episodes": len(results),
        "rewarded": len(rewards),
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_min": min(rewards) if rewards else None,
        "reward_max": max(rewards) if rewards else None,
        "reward_histogram": {f"{b / 5:.1f}-{(b + 1) / 5:.1f}": buckets.get(b, 0) for b in range(5)},
        "failure_classes": dict(Counter(r.failure_class for r in results if r.failure_class)),
        "errors": sum(1 for r in results if r.error),
        # scored 0.0: the policy's action was refused (Result.invalid_action)
        "invalid_actions": sum(1 for r in results if r.invalid_action is not None),
        # verify the service's outcome log with --through this
        "outcome_seq_max": max(
            (r.outcome_seq for r in results if r.outcome_seq is not None), default=None
        ),
        # per episode, over the episodes whose service measured it (None: none did)
        "cpu_s_mean": _mean_cost(results, "cpu_s"),
        "memory_peak_bytes_mean": _mean_cost(results, "memory_peak_bytes"),
        "disk_written_bytes_mean": _mean_cost(results, "disk_written_bytes"),
        "reset_p50_s": percentile([r.reset_s for r in results], 0.5),
        "reset_p99_s": percentile([r.reset_s for r in results], 0.99),
        "step_p50_s": percentile(steps, 0.5),
        "step_p99_s": percentile(steps, 0.99),
        "last_step_p50_s": percentile(last, 0.5),
        "last_step_p99_s": percentile(last, 0.99),
        "wall_s": wall,
        "episodes_per_s": len(results) / wall if wall > 0 else 0.0,
        **canary_summary(results, keep_canaries),
    }


def canary_summary(results: list[Result], keep_canaries: bool = False) -> dict:
    """The canary episodes of a run (none: nothing) and their cheating rate."""
    seen = [r.canary for r in results if r.canary is not None]
    if not seen:
        return {}
    counts = canaries.rate(seen)
    return {
        "canary_episodes": len(seen),
        # with a grade: a null or an episode closed first measures nothing
        "canary_graded": counts["episodes"],
        "canary_passed": counts["passed"],
        "canary_tampered": counts["tampered"],
        "cheating_rate": counts["rate"],
        "cheating_rate_ci95": (
            None if counts["interval"] is None else [round(x, 4) for x in counts["interval"]]
        ),
        "canaries_in_rewards": keep_canaries,
    }


def print_summary(body: dict, stream=sys.stdout) -> None:
    rows = [(k, v if not isinstance(v, float) else f"{v:.4g}") for k, v in body.items()]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}", file=stream)


async def make_policy(client: AsyncClient, name: str):
    body = await client.schema()
    schema = body["action"]
    return {
        "oracle": lambda: Oracle(),
        "noop": lambda: Noop(schema),
        "openai": lambda: OpenAIPolicy(schema, body.get("tools")),
    }[name]()


async def for_each_index(
    count: int, workers: int, work, *, progress: bool, unit: str, postfix=None
) -> float:
    """``await work(i)`` for every i in 0..count-1, in order of start, on
    ``workers`` tasks at once (at least one, at most ``count``), with a tqdm
    bar when ``progress`` (``postfix()`` its fields after each); returns the
    wall seconds. The loop of both the plain and the forking rollout."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(count):
        queue.put_nowait(i)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=count, unit=unit, dynamic_ncols=True)

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await work(i)
            if bar is not None:
                if postfix is not None:
                    bar.set_postfix(**postfix())
                bar.update(1)

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(max(1, min(workers, count)))))
    if bar is not None:
        bar.close()
    return time.monotonic() - started


async def rollout(
    url: str,
    policy_name: str,
    episodes: int,
    concurrency: int,
    task_ids: list[str] | None,
    out,
    progress: bool,
    variant: str | None = None,
    keep_canaries: bool = False,
) -> dict:
    """``variant``: ask for that kind of variant in every create (the
    cheating rate of a policy, camg_client/canaries.py)."""
    async with AsyncClient(url, max_connections=max(4, concurrency * 2)) as client:
        policy = await make_policy(client, policy_name)
        results: list[Result] = []

        async def one(i: int) -> None:
            task_id = task_ids[i % len(task_ids)] if task_ids else None
            result = await run_episode(
                client,
                policy,
                task_id=task_id,
                seed=None if task_ids else i,
                wait=3600.0,
                variant=variant,
            )
            results.append(result)
            if out is not None:
                out.write(json.dumps(result.line()) + "\n")
                out.flush()

        def postfix() -> dict:
            rewards = [r.reward for r in results if r.reward is not None]
            fails = Counter(
                r.failure_class or "error" for r in results if r.failure_class or r.error
            )
            return {
                "mean": f"{statistics.fmean(rewards):.3f}" if rewards else "-",
                "failed": dict(fails) or 0,
            }

        wall = await for_each_index(
            episodes, concurrency, one, progress=progress, unit="ep", postfix=postfix
        )
        return summary(results, wall, keep_canaries)


def regrade_line(
    episode_id: str, run_reward: float | None, record: dict | None, error: str | None
) -> dict:
    record = record or {}
    was = (record.get("regrade_of") or {}).get("reward")
    return {
        "episode_id": episode_id,
        "task_id": record.get("task_id"),
        "reward": record.get("reward"),
        "failure_class": record.get("failure_class"),
        "recorded_reward": was,
        "run_reward": run_reward,
        "same_reward": bool(record) and record.get("reward") == was,
        "same_grader": record.get("same_grader"),
        "grader_hash": record.get("grader_hash"),
        "grade_s": (record.get("timings") or {}).get("grade_s"),
        "error": error,
    }


async def regrade_run(url: str, run: list[dict], concurrency: int, out, progress: bool) -> dict:
    """Regrade every episode of a run's JSON lines; the summary."""
    queue: asyncio.Queue[dict] = asyncio.Queue()
    for line in run:
        queue.put_nowait(line)
    lines: list[dict] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(run), unit="ep", dynamic_ncols=True)
    async with AsyncClient(url, max_connections=max(4, concurrency * 2)) as client:

        async def worker() -> None:
            while not queue.empty():
                entry = queue.get_nowait()
                record, error = None, None
                try:
                    record = await client.regrade(entry["episode_id"])
                except ServiceError as exc:
                    error = str(exc)
                line = regrade_line(entry["episode_id"], entry.get("reward"), record, error)
                lines.append(line)
                if out is not None:
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                if bar is not None:
                    bar.set_postfix(
                        same=sum(x["same_reward"] for x in lines),
                        errors=sum(1 for x in lines if x["error"]),
                    )
                    bar.update(1)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(run))))))
    if bar is not None:
        bar.close()
    grades = [x["grade_s"] for x in lines if x["grade_s"] is not None]
    return {
        "episodes": len(lines),
        "regraded": sum(1 for x in lines if x["error"] is None),
        "same_reward": sum(1 for x in lines if x["same_reward"]),
        "changed_reward": sum(1 for x in lines if x["error"] is None and not x["same_reward"]),
        "same_grader": sum(1 for x in lines if x["same_grader"]),
        "failure_classes": dict(Counter(x["failure_class"] for x in lines if x["failure_class"])),
        "errors": sum(1 for x in lines if x["error"]),
        "grade_p50_s": percentile(grades, 0.5),
        "grade_p99_s": percentile(grades, 0.99),
        "wall_s": time.monotonic() - started,
    }


def read_run(path: str) -> list[dict]:
    """The episodes of a run's JSON lines (those the service gave an id)."""
    run = []
    with open(path, encoding="utf-8") as handle:
        for number, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
            if isinstance(line, dict) and isinstance(line.get("episode_id"), str):
                run.append(line)
    return run
