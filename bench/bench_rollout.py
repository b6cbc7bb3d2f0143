#!/usr/bin/env python3
"""Rollout throughput: episodes per second of ``camg_client`` (noop and
oracle) at several concurrencies, against the bare HTTP round trip of the
same service, measured in the same run.

    sudo .venv/bin/python bench/bench_rollout.py --routes /srv/camg/prepared/routes.json \\
        [--envs coding,shop] [--concurrency 1,16,64] [--episodes N] [--json OUT]
    sudo .venv/bin/python bench/bench_rollout.py          # no --routes: its own rig

With ``--routes`` it measures a running suite (the demo; the oracle needs the
deployment's ``references: true``, else its rows say permission_denied).
Without, it starts its own rig: a private camg-helper (devtools.reliability)
and Coding and Shop services prepared from the caches the privileged tests
build ($CAMG_CACHE), references enabled, capacity 64 — and removes all of
it at the end.

Per environment and concurrency K: the baseline is ``GET /health`` through
the same async client (K requests in flight), in requests/s; then each
policy runs ``--episodes`` episodes (default max(K, 8)) with K in flight
(camg_client.rollout.rollout: create, the policy's actions — oracle asks GET
/reference before each — and delete). Reported: episodes/s, mean reward,
failures, and ``round_trips_per_episode`` = baseline requests/s ÷
episodes/s (what one episode costs in bare HTTP round trips; its floor is
the episode's own request count: 3 for noop).

Measured 2026-11-30 (own rig, 2 cores shared with 7 other jobs; episodes =
max(K, 8); eps = episodes/s, rt = round trips per episode):

    env     policy  K=1: eps / rt    K=16: eps / rt   K=64: eps / rt   reward
    coding  noop    0.31 / 2614      0.29 / 2163      0.35 / 552       0.0
    coding  oracle  0.44 / 1865      0.33 / 1906      0.38 / 510       1.0
    shop    noop    6.1  / 55        3.6  / 160       3.2  / 118       0.0
    shop    oracle  22.2 / 15        31.8 / 18        15.8 / 24        1.0 (K=64: 0.995)

--envs autoresearch,general,visual --concurrency 1,16 (rigged demo tasks;
General's rig judge answers 1 to every LLM item, so its general_agent noop
earns the LLM items' weight, 0.29):

    env           policy  K=1: eps / rt    K=16: eps / rt   reward (min-max)
    autoresearch  noop    6.7  / 249       51.8 / 23        0.0
    autoresearch  oracle  0.86 / 1957      1.35 / 883       1.0 on all 4 tasks
    general       noop    0.23 / 8823      0.09 / 4219      0.0-0.29
    general       oracle  0.06 / 32163     0.22 / 1706      1.0 on all 5 tasks
    visual        noop    0.21 / 9830      1.01 / 980       0.0
    visual        oracle  0.18 / 11584     0.88 / 1123      0.8667 (the judge's max)

AutoResearch's oracle is its reference scripts' run time; General's the
MiMo verifier and cold containers (a warm pool of one per image); Visual's
the render (~4-6 s) and the judge call.

Coding is bound by grading (every finish runs the task's tests in its
sandbox, ~2-3 s of CPU): concurrency does not raise it on two cores. Shop's
noop walks to the step limit (many steps), its oracle buys in 4-6. Shop's
0.995 at K=64: seeds 0..63 reach three synthetic goals whose own target
product earns 0.83-0.86 under upstream's reward (webshop-synthetic-00020,
-00028, -00073), not an oracle failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from camg_client import AsyncClient, load_routes  # noqa: E402
from camg_client.rollout import rollout  # noqa: E402
from devtools.harness.auth import deployment_auth  # noqa: E402


def note(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def health_rate(url: str, concurrency: int, seconds: float = 3.0) -> float:
    """Bare round trips per second with ``concurrency`` requests in flight."""
    async with AsyncClient(url, max_connections=max(4, concurrency * 2)) as client:
        for _ in range(20):
            await client.health()
        done = 0
        stop = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                await client.health()
                done += 1

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.monotonic() - started)


def measure(url: str, env: str, policies: list[str], levels: list[int],
            episodes: int | None, out_dir: Path | None = None) -> list[dict]:
    rows = []
    for k in levels:
        base = asyncio.run(health_rate(url, k))
        for policy in policies:
            n = episodes or max(k, 8)
            note(f"{env}: {policy} x {n} at concurrency {k}")
            out = open(out_dir / f"{env}-{policy}-{k}.jsonl", "w") if out_dir else None
            try:
                s = asyncio.run(rollout(url, policy, n, k, None, out, progress=False))
            except Exception as exc:  # e.g. references not enabled: say so, go on
                rows.append({"env": env, "policy": policy, "concurrency": k,
                             "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            finally:
                if out is not None:
                    out.close()
            eps = s["episodes_per_s"]
            rows.append({
                "env": env, "policy": policy, "concurrency": k, "episodes": n,
                "episodes_per_s": round(eps, 3), "reward_mean": s["reward_mean"],
                "reward_min": s["reward_min"], "reward_max": s["reward_max"],
                "failures": s["failure_classes"], "errors": s["errors"],
                "reset_p50_ms": round(s["reset_p50_s"] * 1000, 1),
                "last_step_p50_ms": round(s["last_step_p50_s"] * 1000, 1),
                "health_rps": round(base, 1),
                "round_trips_per_episode": round(base / eps, 1) if eps else None})
            note(json.dumps(rows[-1]))
    return rows


def own_rig(stack: ExitStack, work: Path, envs: list[str]) -> dict[str, str]:
    """The services named in ``envs`` (references on), their routes, as
    their reliability recipes (their plugins' ``reliability``) prepare them:
    one whose recipe needs a helper of its own (its ``rig``: AutoResearch,
    General, Visual) as rigged_service makes it, the others (Coding, Shop)
    on one private helper."""
    from camg.configure import configure
    from devtools.harness.services import ServiceProcess, clean_git_tree, free_port
    from devtools.reliability.rig import Helper
    from devtools.reliability.targets import CODING as coding, recipes

    targets = recipes()
    for name in envs:
        if name not in targets or targets[name].missing:
            raise SystemExit(f"{name}: {targets[name].missing if name in targets else 'unknown'}")
    routes = {}
    for name in envs:
        if targets[name].rig is not None:
            routes[name] = rigged_service(stack, work / name, targets[name])
    shared = [targets[name] for name in envs if targets[name].rig is None]
    if not shared:
        return routes
    note("rig: helper")
    # Coding's roots whatever is asked: its demo set is made in sandboxes
    roots = {*coding.lower_roots(), *(root for t in shared for root in t.lower_roots())}
    helper = Helper(sorted(roots), probes=False)
    stack.callback(helper.stop)
    environments = {}
    for target in shared:
        note(f"rig: preparing {target.name} (cached)")
        manifest, settings, factory = target.prepare(work / f"{target.name}-data", helper.socket)
        environments[target.name] = {
            "manifest": str(manifest), "port": free_port(), "capacity": 64, "references": True,
            "limits": {"reset_timeout_s": 600, "action_timeout_s": 600},
            "settings": settings, **({"factory": factory} if factory else {})}
    (work / "requirements.lock").write_text("falcon==4.4.0\n")
    deployment = {"runtime_lock": str(work / "requirements.lock"), "state_root": str(work / "state"),
                  "helper_socket": helper.socket, "executables": {"python": sys.executable},
                  "auth": deployment_auth(), "environments": environments}
    (work / "deployment.json").write_text(json.dumps(deployment))
    configure(work / "deployment.json", work / "prepared", source_tree=clean_git_tree(work / "src"))
    for name in environments:
        note(f"rig: starting {name}")
        service = ServiceProcess(work / "prepared" / f"{name}.json")
        stack.callback(service.stop)
        service.wait_ready(timeout=300)
    return {**routes, **load_routes(str(work / "prepared" / "routes.json"))}


def rigged_service(stack: ExitStack, work: Path, target) -> str:
    """An environment whose recipe needs a helper of its own (AutoResearch,
    General, Visual) as its ``rig`` builds it (devtools.reliability.rigged: that
    helper, the demo tasks with their references, the scripted judges),
    references on; the service's URL."""
    from camg.configure import configure
    from devtools.harness.services import ServiceProcess, clean_git_tree, free_port
    from devtools.reliability.rig import Helper
    from devtools.reliability.targets import CODING

    name = target.name
    note(f"rig: preparing {name} (cached images, demo tasks)")
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o711)
    # The rig prepares through a helper over the Coding roots too (General's
    # demo builds on the Coding demo set, made in sandboxes), as
    # bench_fork.reliability_served does.
    bootstrap = Helper(sorted({*CODING.lower_roots(), *target.lower_roots()}), probes=False)
    stack.callback(bootstrap.stop)
    rig = target.rig(work / "data", bootstrap.socket)
    stack.callback(rig.close)
    extra = {k: v for k, v in rig.helper.items() if k != "lower_roots"}
    helper = Helper(rig.helper["lower_roots"], probes=False, extra=extra)
    stack.callback(helper.stop)
    manifest, settings, _ = rig.prepared
    (work / "requirements.lock").write_text("falcon==4.4.0\n")
    capacity = 16 if name == "autoresearch" else 64
    deployment = {"runtime_lock": str(work / "requirements.lock"), "state_root": str(work / "state"),
                  "helper_socket": helper.socket, "executables": {"python": sys.executable},
                  "auth": deployment_auth(), "environments": {name: {
                      "manifest": str(manifest), "port": free_port(), "capacity": capacity,
                      "references": True, "limits": {"reset_timeout_s": 600, **rig.limits},
                      "settings": settings}}}
    (work / "deployment.json").write_text(json.dumps(deployment))
    configure(work / "deployment.json", work / "prepared", source_tree=clean_git_tree(work / "src"))
    config = work / "prepared" / f"{name}.json"
    if rig.pre_serve is not None:
        rig.pre_serve(config)
    note(f"rig: starting {name}")
    service = ServiceProcess(config, env=rig.env)
    stack.callback(service.stop)
    service.wait_ready(timeout=600)
    return load_routes(str(work / "prepared" / "routes.json"))[name]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--routes", help="routes.json of a running suite (default: start a rig)")
    ap.add_argument("--envs", default="coding,shop")
    ap.add_argument("--policies", default="noop,oracle")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--episodes", type=int, help="per measurement (default max(K, 8))")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--out", type=Path, help="directory for each run's JSON lines (one per episode)")
    args = ap.parse_args()
    import logging
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    levels = [int(x) for x in args.concurrency.split(",")]
    policies = args.policies.split(",")
    rows: list[dict] = []
    with ExitStack() as stack:
        if args.routes:
            routes = load_routes(args.routes)
        else:
            if os.geteuid() != 0:
                raise SystemExit("the rig needs root (its helper builds sandboxes); or give --routes")
            work = Path(tempfile.mkdtemp(prefix="camg-bench-rollout-"))
            work.chmod(0o711)  # AutoResearch's grader uid reaches its private root below
            stack.callback(shutil.rmtree, work, True)
            routes = own_rig(stack, work, args.envs.split(","))
        for env in args.envs.split(","):
            if env not in routes:
                raise SystemExit(f"{env!r} is not in the routes ({', '.join(routes)})")
            rows += measure(routes[env], env, policies, levels, args.episodes, args.out)
    header = ("env", "policy", "concurrency", "episodes", "episodes_per_s", "health_rps",
              "round_trips_per_episode", "reward_mean", "reward_min", "errors", "failures")
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row.get(h, row.get("error", ""))) for h in header))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
