"""``python -m camg.rollout``: run episodes against a served environment.

    python -m camg.rollout --routes prepared/routes.json --env coding \\
        --policy oracle|noop|openai --episodes N --concurrency K \\
        [--tasks ids.txt] [--out run.jsonl]

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
  environment): the system message carries the action schema, each user
  message the observation as JSON, and the reply must be one JSON action
  (the first ``{…}`` block of the text is taken).

``--regrade run.jsonl`` (instead of ``--policy``) grades every episode of
an earlier run again from its stored submission with the service's current
grader (``POST /episodes/{id}/regrade``), writes one JSON line per episode
(new and recorded reward, both grader hashes) and a summary of how many
rewards stayed the same.

It prints a live progress bar on a terminal, a summary at the end (reward
mean and distribution, failure classes, p50/p99 of reset, step and the last
step, which carries grading), and writes one JSON line per episode to
``--out``. Tasks are ``--tasks`` ids in order (cycled), else seeds 0..N-1
(the service serves ``tasks[seed mod n]``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import statistics
import sys
import time
from collections import Counter
from typing import Any

from camg.client import AsyncClient, ServiceError, load_routes

MAX_ACTIONS = 1000     # a policy that never ends its episode is cut here


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

    def line(self) -> dict:
        return {"episode_id": self.episode_id, "task_id": self.task_id, "reward": self.reward,
                "failure_class": self.failure_class, "steps": self.steps,
                "reset_s": round(self.reset_s, 6), "step_s": [round(s, 6) for s in self.step_s],
                "error": self.error}


class Noop:
    """``finish`` where the schema has it, else a schema-fitting action that
    changes nothing (e.g. Shop's ``{"action": "noop"}``)."""

    def __init__(self, schema: dict) -> None:
        props = schema.get("properties", {})
        # General's schema is one branch per task kind (anyOf); AutoResearch ends with submit
        ends = [op for branch in schema.get("anyOf") or [schema]
                for op in branch.get("properties", {}).get("operation", {}).get("enum") or []
                if op in ("finish", "submit")]
        if ends:
            self.action = {"operation": ends[0]}
        else:
            self.action = {name: "noop" for name in schema.get("required", [])
                           if props.get(name, {}).get("type") == "string"}

    async def act(self, client: AsyncClient, episode_id: str, observation: Any) -> dict | None:
        return dict(self.action)


class Oracle:
    async def act(self, client: AsyncClient, episode_id: str, observation: Any) -> dict | None:
        return (await client.reference(episode_id))["action"]


class OpenAIPolicy:
    def __init__(self, schema: dict) -> None:
        from openai import AsyncOpenAI

        missing = [v for v in ("CAMG_POLICY_URL", "CAMG_POLICY_MODEL") if not os.environ.get(v)]
        if missing:
            raise SystemExit(f"camg.rollout: --policy openai needs {', '.join(missing)}")
        self.model = os.environ["CAMG_POLICY_MODEL"]
        self.client = AsyncOpenAI(base_url=os.environ["CAMG_POLICY_URL"],
                                  api_key=os.environ.get("CAMG_POLICY_KEY") or "none",
                                  timeout=300, max_retries=2)
        self.system = ("You act in an environment. Reply with exactly one JSON object, the "
                       "next action, matching this JSON Schema:\n" + json.dumps(schema))
        self.history: dict[str, list[dict]] = {}

    async def act(self, client: AsyncClient, episode_id: str, observation: Any) -> dict | None:
        messages = self.history.setdefault(episode_id, [{"role": "system", "content": self.system}])
        messages.append({"role": "user", "content": json.dumps(observation)})
        reply = await self.client.chat.completions.create(model=self.model, messages=messages,
                                                          temperature=0.0)
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        match = re.search(r"\{.*\}", text, re.S)
        if not match:
            raise ValueError(f"policy reply holds no JSON action: {text[:200]!r}")
        return json.loads(match.group(0))


async def run_episode(client: AsyncClient, policy, *, task_id: str | None, seed: int | None,
                      wait: float) -> Result:
    started = time.monotonic()
    try:
        created = await client.create(task_id=task_id, seed=seed, wait=wait)
    except ServiceError as exc:
        return Result(None, task_id, None, exc.failure_class or exc.name, 0,
                      time.monotonic() - started, [], error=str(exc))
    episode_id, observation = created["episode_id"], created["observation"]
    result = Result(episode_id, created["task_id"], None, None, 0, time.monotonic() - started, [])
    try:
        for _ in range(MAX_ACTIONS):
            action = await policy.act(client, episode_id, observation)
            if action is None:
                break
            t0 = time.monotonic()
            answer = await client.step(episode_id, action)
            result.step_s.append(time.monotonic() - t0)
            result.steps += 1
            observation = answer["observation"]
            if answer["done"]:
                result.reward = answer["reward"]
                result.failure_class = answer.get("failure_class")
                break
        else:
            result.error = f"no terminal step after {MAX_ACTIONS} actions"
        if result.reward is None and result.failure_class is None and result.error is None:
            result.error = "the policy stopped before the episode ended"
    except ServiceError as exc:
        result.error = str(exc)
        result.failure_class = exc.failure_class
    except Exception as exc:  # a policy bug ends its episode, not the run
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            await client.close(episode_id)
        except ServiceError:
            pass
    return result


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(results: list[Result], wall: float) -> dict:
    rewards = [r.reward for r in results if r.reward is not None]
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
        "reset_p50_s": percentile([r.reset_s for r in results], 0.5),
        "reset_p99_s": percentile([r.reset_s for r in results], 0.99),
        "step_p50_s": percentile(steps, 0.5),
        "step_p99_s": percentile(steps, 0.99),
        "last_step_p50_s": percentile(last, 0.5),
        "last_step_p99_s": percentile(last, 0.99),
        "wall_s": wall,
        "episodes_per_s": len(results) / wall if wall > 0 else 0.0,
    }


def print_summary(body: dict, stream=sys.stdout) -> None:
    rows = [(k, v if not isinstance(v, float) else f"{v:.4g}") for k, v in body.items()]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}", file=stream)


async def rollout(url: str, policy_name: str, episodes: int, concurrency: int,
                  task_ids: list[str] | None, out, progress: bool) -> dict:
    async with AsyncClient(url, max_connections=max(4, concurrency * 2)) as client:
        schema = (await client.schema())["action"]
        policy = {"oracle": lambda: Oracle(), "noop": lambda: Noop(schema),
                  "openai": lambda: OpenAIPolicy(schema)}[policy_name]()
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(episodes):
            queue.put_nowait(i)
        results: list[Result] = []
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=episodes, unit="ep", dynamic_ncols=True)

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                task_id = task_ids[i % len(task_ids)] if task_ids else None
                result = await run_episode(client, policy, task_id=task_id,
                                           seed=None if task_ids else i, wait=3600.0)
                results.append(result)
                if out is not None:
                    out.write(json.dumps(result.line()) + "\n")
                    out.flush()
                if bar is not None:
                    rewards = [r.reward for r in results if r.reward is not None]
                    fails = Counter(r.failure_class or "error" for r in results
                                    if r.failure_class or r.error)
                    bar.set_postfix(mean=f"{statistics.fmean(rewards):.3f}" if rewards else "-",
                                    failed=dict(fails) or 0)
                    bar.update(1)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, episodes)))))
        if bar is not None:
            bar.close()
        return summary(results, time.monotonic() - started)


def regrade_line(episode_id: str, run_reward: float | None, record: dict | None,
                 error: str | None) -> dict:
    record = record or {}
    was = (record.get("regrade_of") or {}).get("reward")
    return {"episode_id": episode_id, "task_id": record.get("task_id"),
            "reward": record.get("reward"), "failure_class": record.get("failure_class"),
            "recorded_reward": was, "run_reward": run_reward,
            "same_reward": bool(record) and record.get("reward") == was,
            "same_grader": record.get("same_grader"), "grader_hash": record.get("grader_hash"),
            "grade_s": (record.get("timings") or {}).get("grade_s"), "error": error}


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
                    bar.set_postfix(same=sum(x["same_reward"] for x in lines),
                                    errors=sum(1 for x in lines if x["error"]))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m camg.rollout", description=__doc__.split("\n")[0])
    ap.add_argument("--routes", required=True, help="routes.json written by camg.configure")
    ap.add_argument("--env", required=True, help="environment name in routes.json")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--policy", choices=("oracle", "noop", "openai"))
    what.add_argument("--regrade", metavar="RUN_JSONL",
                      help="regrade the episodes of an earlier run's --out file")
    ap.add_argument("--episodes", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--tasks", help="file of task ids, one a line (cycled in order)")
    ap.add_argument("--out", help="append one JSON line per episode here")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--ray", metavar="ADDRESS",
                    help="spread the episodes over a Ray cluster (camg/rollout_ray.py): each "
                         "node with the 'camg' resource drives its own 127.0.0.1 services; "
                         "--routes is read on each node, --concurrency is per node")
    args = ap.parse_args(argv)
    if args.episodes < 1 or args.concurrency < 1:
        ap.error("--episodes and --concurrency must be at least 1")
    if args.ray:
        if args.regrade:
            ap.error("--regrade runs on the host of the run's services, not with --ray")
        from camg import rollout_ray
        return rollout_ray.main(args)
    try:
        routes = load_routes(args.routes)
    except (OSError, ValueError) as exc:
        print(f"camg.rollout: {exc}", file=sys.stderr)
        return 2
    if args.env not in routes:
        print(f"camg.rollout: {args.env!r} is not in {args.routes} ({', '.join(routes)})",
              file=sys.stderr)
        return 2
    if args.regrade:
        return main_regrade(args, routes[args.env])
    task_ids = None
    if args.tasks:
        with open(args.tasks, encoding="utf-8") as handle:
            task_ids = [line.split("#", 1)[0].strip() for line in handle]
        task_ids = [t for t in task_ids if t]
    return _run_and_summarise(args, lambda out, progress: rollout(
        routes[args.env], args.policy, args.episodes, args.concurrency, task_ids, out,
        progress=progress))


def _run_and_summarise(args, make) -> int:
    """Run ``make(out, progress)``'s coroutine with --out's JSON-lines file
    open, print the summary; exit 1 when any episode failed."""
    out = open(args.out, "a", encoding="utf-8") if args.out else None
    try:
        body = asyncio.run(make(out, not args.no_progress and sys.stderr.isatty()))
    finally:
        if out is not None:
            out.close()
    print_summary(body)
    return 0 if body["errors"] == 0 else 1


def main_regrade(args, url: str) -> int:
    try:
        run = read_run(args.regrade)
    except (OSError, ValueError) as exc:
        print(f"camg.rollout: {exc}", file=sys.stderr)
        return 2
    return _run_and_summarise(args, lambda out, progress: regrade_run(
        url, run, args.concurrency, out, progress=progress))


if __name__ == "__main__":
    sys.exit(main())
