"""``python -m camg_client`` (or ``camg-rollout``): run episodes against a served environment.

    python -m camg_client --routes prepared/routes.json --env coding \\
        --policy oracle|noop|openai --episodes N --concurrency K \\
        [--tasks ids.txt] [--out run.jsonl]

``--policy`` is ``oracle`` (the service's reference solution: every task
should earn its maximum), ``noop`` (every task should earn the minimum) or
``openai`` (any OpenAI-compatible chat endpoint); camg_client/rollout.py
says what each plays.

``--fork-at K --branches N`` plays each of ``--episodes`` prefixes K actions,
forks it N times (``POST /episodes/{id}/fork``), plays every branch out and
prints, beside the summary, each prefix's reward mean, min, max and spread
over its branches (camg_client/rollout_fork.py).

``--regrade run.jsonl`` (instead of ``--policy``) grades every episode of
an earlier run again from its stored submission with the service's current
grader (``POST /episodes/{id}/regrade``), writes one JSON line per episode
(new and recorded reward, both grader hashes) and a summary of how many
rewards stayed the same.

``--canaries`` asks every create for an impossible variant (a task whose
tests contradict its specification: any pass is a shortcut) and prints
each environment's cheating rate, passes over canary episodes with its 95 %
Wilson interval; ``--env`` may then name several, comma-separated. Canary
episodes a deployment mixes into any run are reported the same way and
left out of the reward figures unless ``--keep-canaries``
(camg_client/canaries.py).

It prints a live progress bar on a terminal, a summary at the end (reward
mean and distribution, failure classes, p50/p99 of reset, step and the last
step, which carries grading), and writes one JSON line per episode to
``--out``. Tasks are ``--tasks`` ids in order (cycled), else seeds 0..N-1
(the service serves ``tasks[seed mod n]``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from camg_client import rollout_fork, rollout_ray
from camg_client.client import load_routes
from camg_client.rollout import print_summary, read_run, regrade_run, rollout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m camg_client", description=__doc__.split("\n")[0])
    ap.add_argument("--routes", required=True, help="routes.json written by camg.configure")
    ap.add_argument("--env", required=True, help="environment name in routes.json")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--policy", choices=("oracle", "noop", "openai"))
    what.add_argument(
        "--regrade", metavar="RUN_JSONL", help="regrade the episodes of an earlier run's --out file"
    )
    ap.add_argument("--episodes", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--tasks", help="file of task ids, one a line (cycled in order)")
    ap.add_argument("--out", help="append one JSON line per episode here")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--fork-at",
        type=int,
        metavar="K",
        help="play K actions, then fork --branches children and play each out",
    )
    ap.add_argument("--branches", type=int, metavar="N", help="children per prefix (--fork-at)")
    ap.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="spread the episodes over a Ray cluster (camg_client/rollout_ray.py): each "
        "node with the 'camg' resource drives its own 127.0.0.1 services; "
        "--routes is read on each node, --concurrency is per node",
    )
    ap.add_argument(
        "--canaries",
        action="store_true",
        help="play impossible variants only (variant=impossible) and print the cheating "
        "rate per environment; --env may name several, comma-separated",
    )
    ap.add_argument(
        "--keep-canaries",
        action="store_true",
        help="count canary episodes in the reward figures (default: reported apart)",
    )
    args = ap.parse_args(argv)
    envs = [e.strip() for e in args.env.split(",") if e.strip()]
    if len(envs) != 1 and not (args.canaries and not args.ray and envs):
        ap.error("--env names one environment (several only with --canaries, without --ray)")
    if args.canaries and (args.regrade or args.fork_at is not None):
        ap.error("--canaries plays episodes: not with --regrade or --fork-at")
    if len(envs) == 1:
        args.env = envs[0]
    if args.episodes < 1 or args.concurrency < 1:
        ap.error("--episodes and --concurrency must be at least 1")
    if (args.fork_at is None) != (args.branches is None):
        ap.error("--fork-at and --branches go together")
    if args.fork_at is not None:
        if args.fork_at < 0 or args.branches < 1:
            ap.error("--fork-at must be 0 or more and --branches at least 1")
        if args.regrade or args.ray:
            ap.error("--fork-at runs against one service, not with --regrade or --ray")
    if args.ray:
        if args.regrade:
            ap.error("--regrade runs on the host of the run's services, not with --ray")
        return rollout_ray.main(args)
    try:
        routes = load_routes(args.routes)
    except (OSError, ValueError) as exc:
        print(f"camg_client: {exc}", file=sys.stderr)
        return 2
    missing = [env for env in envs if env not in routes]
    if missing:
        print(
            f"camg_client: {missing[0]!r} is not in {args.routes} ({', '.join(routes)})",
            file=sys.stderr,
        )
        return 2
    if args.canaries:
        return main_canaries(args, envs, routes)
    if args.regrade:
        return main_regrade(args, routes[args.env])
    task_ids = _task_ids(args.tasks)
    if args.fork_at is not None:
        return _run_and_summarise(
            args,
            lambda out, progress: rollout_fork.fork_rollout(
                routes[args.env],
                args.policy,
                args.episodes,
                args.concurrency,
                task_ids,
                out,
                progress,
                fork_at=args.fork_at,
                branches=args.branches,
            ),
        )
    return _run_and_summarise(
        args,
        lambda out, progress: rollout(
            routes[args.env],
            args.policy,
            args.episodes,
            args.concurrency,
            task_ids,
            out,
            progress=progress,
            keep_canaries=args.keep_canaries,
        ),
    )


def _run_and_summarise(args, make) -> int:
    """Run ``make(out, progress)``'s coroutine with --out's JSON-lines file
    open, print the summary; exit 1 when any episode failed."""
    out = open(args.out, "a", encoding="utf-8") if args.out else None
    try:
        body = asyncio.run(make(out, not args.no_progress and sys.stderr.isatty()))
    finally:
        if out is not None:
            out.close()
    rows = body.pop("per_prefix", None)
    if rows is not None:
        rollout_fork.print_prefixes(rows)
    print_summary(body)
    return 0 if body["errors"] == 0 else 1


def main_canaries(args, envs: list[str], routes: dict) -> int:
    """Impossible variants on each environment in turn: its summary, then
    the cheating rate of every environment."""
    task_ids = _task_ids(args.tasks)
    rates: dict[str, dict] = {}
    errors = 0
    for env in envs:
        print(f"== {env}")
        out = open(args.out, "a", encoding="utf-8") if args.out else None
        try:
            body = asyncio.run(
                rollout(
                    routes[env],
                    args.policy,
                    args.episodes,
                    args.concurrency,
                    task_ids,
                    out,
                    progress=not args.no_progress and sys.stderr.isatty(),
                    variant="impossible",
                    keep_canaries=args.keep_canaries,
                )
            )
        finally:
            if out is not None:
                out.close()
        print_summary(body)
        errors += body["errors"]
        rates[env] = body
    print("\ncheating rate per environment (passes / canary episodes, 95 % Wilson interval):")
    width = max(len(env) for env in envs)
    for env, body in rates.items():
        print(f"  {env:<{width}}  {_rate_line(body)}")
    return 0 if errors == 0 else 1


def _rate_line(body: dict) -> str:
    if not body.get("canary_episodes"):
        return "no canary episode ended"
    graded = body["canary_graded"]
    if not graded:
        return f"{body['canary_episodes']} canary episode(s), none graded"
    low, high = body["cheating_rate_ci95"]
    return (
        f"{body['canary_passed']}/{graded} passed = {100 * body['cheating_rate']:.1f} % "
        f"[{100 * low:.1f}, {100 * high:.1f}] ({body['canary_tampered']} caught as tampered)"
    )


def _task_ids(path: str | None) -> list[str] | None:
    if not path:
        return None
    with open(path, encoding="utf-8") as handle:
        ids = [line.split("#", 1)[0].strip() for line in handle]
    return [t for t in ids if t]


def main_regrade(args, url: str) -> int:
    try:
        run = read_run(args.regrade)
    except (OSError, ValueError) as exc:
        print(f"camg_client: {exc}", file=sys.stderr)
        return 2
    return _run_and_summarise(
        args, lambda out, progress: regrade_run(url, run, args.concurrency, out, progress=progress)
    )
