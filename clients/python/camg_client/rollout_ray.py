"""``python -m camg_client --ray ADDRESS``: one rollout spread over a Ray
cluster, every node driving only its own camg suite on 127.0.0.1.

Seed 000 keeps trainers and services on one host, on loopback; this scales
by hosts without breaking that rule. Each Ray node that runs a camg suite
offers the custom resource ``camg`` (``ray start --resources '{"camg": 1}'``).
The driver pins one actor to each such node (node affinity, not soft); the
actor reads ``routes.json`` *on its node* — ``$CAMG_ROUTES`` from the node's
Ray environment when set, else the ``--routes`` path — and refuses any route
that is not a loopback address, so an episode's HTTP never leaves its host.
The driver hands out episode indices as actors free up (``--concurrency``
is per node: each suite has its own capacity) and gathers the results into
the same progress bar, JSON lines (plus ``node``) and summary table as the
local rollout, with ``episodes_by_node`` added.

Ray is imported only here, and only when ``--ray`` is given: the services
and a plain rollout never need it (``pip install 'camg-client[ray]'``).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import statistics
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable

from camg_client import token as tokens
from camg_client.client import AsyncClient, load_routes
from camg_client.rollout import (
    Noop,
    OpenAIPolicy,
    Oracle,
    Result,
    print_summary,
    run_episode,
    summary,
)

#: The per-node custom resource that marks a node running a camg suite.
RESOURCE = "camg"
#: A node's own routes.json, from the environment its raylet was started with.
ROUTES_ENV = "CAMG_ROUTES"
#: The policy endpoint settings a node lacks are taken from the driver.
POLICY_ENV = ("CAMG_POLICY_URL", "CAMG_POLICY_MODEL", "CAMG_POLICY_KEY")


class RayRolloutError(RuntimeError):
    """The cluster cannot run this rollout (no camg node, a node without the
    environment, a non-loopback route): said once, before any episode."""


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    # 3.11 does not call ::ffff:127.0.0.1 loopback; it is.
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


class NodeRunner:
    """The actor body: one per camg node, pinned there, driving that node's
    service with camg_client.rollout's own episode loop and policies."""

    def __init__(
        self,
        routes_path: str,
        env: str,
        policy_name: str,
        concurrency: int,
        policy_env: dict[str, str],
        token: str | None = None,
    ) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.routes_path = os.environ.get(ROUTES_ENV) or routes_path
        self.env, self.policy_name, self.concurrency = env, policy_name, concurrency
        for name, value in policy_env.items():
            os.environ.setdefault(name, value)
        # The node's own token first (its services' trainers file is its
        # own), else the driver's.
        self.token = tokens.resolve() or token
        self.client: AsyncClient | None = None
        self.policy: Noop | Oracle | OpenAIPolicy | None = None

    async def start(self) -> dict:
        """Find this node's service; answer who and where we are."""
        try:
            routes = load_routes(self.routes_path)
        except (OSError, ValueError) as exc:
            raise RayRolloutError(
                f"node {self.node_id[:8]} ({socket.gethostname()}): {exc}"
            ) from exc
        url = routes.get(self.env)
        if url is None:
            raise RayRolloutError(
                f"node {self.node_id[:8]} ({socket.gethostname()}): "
                f"{self.env!r} is not in {self.routes_path}"
            )
        if not is_loopback(url):
            raise RayRolloutError(
                f"node {self.node_id[:8]}: {self.routes_path} routes "
                f"{self.env} to {url}; a node drives only its own services "
                "on 127.0.0.1"
            )
        self.client = AsyncClient(
            url, max_connections=max(4, self.concurrency * 2), token=self.token
        )
        body = await self.client.schema()
        schema = body["action"]
        metadata = await self.client.metadata()
        makers: dict[str, Callable[[], Noop | Oracle | OpenAIPolicy]] = {
            "oracle": lambda: Oracle(),
            "noop": lambda: Noop(schema),
            "openai": lambda: OpenAIPolicy(schema, body.get("tools")),
        }
        self.policy = makers[self.policy_name]()
        return {
            "node": self.node_id,
            "host": socket.gethostname(),
            "url": url,
            "routes": self.routes_path,
            "config_hash": metadata.get("config_hash"),
            "task_selection_hash": metadata.get("task_selection_hash"),
        }

    async def episode(
        self, task_id: str | None, seed: int | None, variant: str | None = None
    ) -> dict:
        assert self.client is not None, "start() first"
        result = await run_episode(
            self.client, self.policy, task_id=task_id, seed=seed, wait=3600.0, variant=variant
        )
        return result.line()

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None


def _result(line: dict) -> Result:
    return Result(
        line["episode_id"],
        line["task_id"],
        line["reward"],
        line["failure_class"],
        line["steps"],
        line["reset_s"],
        list(line["step_s"]),
        line.get("error"),
        canary=line.get("canary"),
    )


class _Bar:
    """camg_client.rollout's live progress: the same tqdm bar and postfix."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="ep", dynamic_ncols=True)

    def update(self, results: list[Result]) -> None:
        if self.bar is None:
            return
        rewards = [r.reward for r in results if r.reward is not None]
        fails = Counter(r.failure_class or "error" for r in results if r.failure_class or r.error)
        self.bar.set_postfix(
            mean=f"{statistics.fmean(rewards):.3f}" if rewards else "-", failed=dict(fails) or 0
        )
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def check_same_tasks(infos: list[dict]) -> None:
    """One summary over nodes means one task set: seed i must be the same
    task on every node (the same prepared manifest everywhere)."""
    selections = {f"{i['host']}/{i['node'][:8]}": i.get("task_selection_hash") for i in infos}
    if len(set(selections.values())) > 1:
        raise RayRolloutError(
            "the nodes serve different task selections (prepare and "
            "configure every node from the same manifest): "
            + ", ".join(f"{k} {v}" for k, v in sorted(selections.items()))
        )


def _connect(address: str):
    # A loopback ADDRESS is a one-host cluster (the tests'): Ray would
    # otherwise swap 127.0.0.1 for the host's routable address and leave
    # loopback. Telemetry stays off everywhere.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    host = address.rsplit(":", 1)[0] if ":" in address else address
    if host in ("127.0.0.1", "localhost", "[::1]", "::1"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if ":" in address and not address.startswith("ray://"):
        # ray.init retries an unreachable GCS for minutes: say it at once.
        port = address.rsplit(":", 1)[1]
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        except (OSError, ValueError) as exc:
            raise RayRolloutError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    try:
        import ray
    except ImportError:
        raise RayRolloutError(
            "--ray needs the ray package (pip install 'camg-client[ray]')"
        ) from None
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayRolloutError(f"cannot join the Ray cluster at {address}: {exc}") from None
    return ray


def run(
    address: str,
    routes_path: str,
    env: str,
    policy_name: str,
    episodes: int,
    concurrency: int,
    task_ids: list[str] | None,
    out,
    progress: bool,
    variant: str | None = None,
    keep_canaries: bool = False,
) -> dict:
    """``variant`` and ``keep_canaries``: as camg_client.rollout.rollout's."""
    ray = _connect(address)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        nodes = sorted(
            n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(RESOURCE, 0) > 0
        )
        if not nodes:
            raise RayRolloutError(
                f"no live node of the cluster at {address} offers the "
                f"{RESOURCE!r} resource (ray start --resources "
                f"'{{\"{RESOURCE}\": 1}}' on every node running a camg suite)"
            )
        policy_env = {k: os.environ[k] for k in POLICY_ENV if os.environ.get(k)}
        actor_class = ray.remote(NodeRunner)
        actors = [
            actor_class.options(
                num_cpus=0,
                resources={RESOURCE: 0.001},
                max_concurrency=concurrency + 2,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(routes_path, env, policy_name, concurrency, policy_env, tokens.resolve())
            for node in nodes
        ]
        try:
            infos = ray.get([a.start.remote() for a in actors])
        except ray.exceptions.RayError as exc:
            # The actor's own RayRolloutError (or its death): its last line says why.
            raise RayRolloutError(str(exc).strip().splitlines()[-1]) from None
        check_same_tasks(infos)
        try:
            return _drive(
                ray,
                actors,
                infos,
                episodes,
                concurrency,
                task_ids,
                out,
                progress,
                variant=variant,
                keep_canaries=keep_canaries,
            )
        finally:
            try:
                ray.get([a.stop.remote() for a in actors], timeout=30)
            except ray.exceptions.RayError:
                pass  # a lost node's actor has nothing left to close
            for actor in actors:
                ray.kill(actor)
    finally:
        ray.shutdown()


def _drive(
    ray,
    actors,
    infos,
    episodes,
    concurrency,
    task_ids,
    out,
    progress,
    variant: str | None = None,
    keep_canaries: bool = False,
) -> dict:
    labels = [f"{info['host']}/{info['node'][:8]}" for info in infos]
    results: list[Result] = []
    per_node: Counter = Counter()
    bar = _Bar(episodes, progress)
    pending: dict = {}  # ObjectRef -> (actor index, episode index)
    dead: set[int] = set()
    next_index = 0

    def submit(k: int) -> None:
        nonlocal next_index
        i, next_index = next_index, next_index + 1
        task_id = task_ids[i % len(task_ids)] if task_ids else None
        ref = actors[k].episode.remote(task_id, None if task_ids else i, variant)
        pending[ref] = (k, i)

    started = time.monotonic()
    for k in range(len(actors)):
        for _ in range(concurrency):
            if next_index < episodes:
                submit(k)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        k, i = pending.pop(done[0])
        try:
            line = ray.get(done[0])
        except ray.exceptions.RayError as exc:
            # The node's actor is gone (node lost): its episode is an error of
            # this run, and the node gets no more work.
            dead.add(k)
            line = Result(
                None,
                task_ids[i % len(task_ids)] if task_ids else None,
                None,
                None,
                0,
                0.0,
                [],
                error=f"node {labels[k]}: {type(exc).__name__}",
            ).line()
        line["node"] = infos[k]["node"]
        results.append(_result(line))
        per_node[labels[k]] += 1
        if out is not None:
            out.write(json.dumps(line) + "\n")
            out.flush()
        bar.update(results)
        live = [j for j in range(len(actors)) if j not in dead]
        if next_index < episodes and live:
            load = Counter(j for j, _ in pending.values())
            submit(k if k not in dead else min(live, key=lambda j: load[j]))
    bar.close()
    # Work a lost node never got to is reported, not silently dropped.
    for _ in range(next_index, episodes):
        results.append(Result(None, None, None, None, 0, 0.0, [], error="no live camg node left"))
    body = summary(results, time.monotonic() - started, keep_canaries)
    body["nodes"] = len(actors)
    body["episodes_by_node"] = dict(sorted(per_node.items()))
    return body


def main(args: argparse.Namespace) -> int:
    """The ``--ray`` branch of ``python -m camg_client`` (parsed args)."""
    task_ids = None
    if args.tasks:
        with open(args.tasks, encoding="utf-8") as handle:
            task_ids = [t for t in (line.split("#", 1)[0].strip() for line in handle) if t]
    out = open(args.out, "a", encoding="utf-8") if args.out else None
    try:
        body = run(
            args.ray,
            args.routes,
            args.env,
            args.policy,
            args.episodes,
            args.concurrency,
            task_ids,
            out,
            progress=not args.no_progress and sys.stderr.isatty(),
            variant="impossible" if args.canaries else None,
            keep_canaries=args.keep_canaries,
        )
    except RayRolloutError as exc:
        print(f"camg_client: {exc}", file=sys.stderr)
        return 2
    finally:
        if out is not None:
            out.close()
    print_summary(body)
    return 0 if body["errors"] == 0 else 1
