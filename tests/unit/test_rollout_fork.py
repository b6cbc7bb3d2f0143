"""python -m camg_client --fork-at K --branches N (camg_client/rollout_fork.py)
against a real camg.serve of the counter environment, whose episodes fork."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from camg_client import AsyncClient, Client
from camg_client.rollout import Result
from camg_client.rollout_fork import print_prefixes, run_prefix, spread_summary, _row
from tests.support.services import REPO


def run_rollout(routes, *args):
    return subprocess.run([sys.executable, "-m", "camg_client", "--routes", str(routes),
                           "--env", "counter", "--no-progress", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def summary_of(stdout: str) -> dict:
    body = stdout.split("\n\n", 1)[-1]  # after the per-prefix table
    return dict(line.split(None, 1) for line in body.splitlines() if line.strip())


def table_of(stdout: str) -> list[dict]:
    head, *rows = stdout.split("\n\n", 1)[0].splitlines()
    return [dict(zip(head.split(), row.split())) for row in rows]


def test_oracle_branches_all_earn_one_and_the_table_says_so(counter_service, tmp_path):
    svc = counter_service(references=True, capacity=8)
    routes = svc.config_path.parent / "routes.json"
    out = tmp_path / "run.jsonl"
    proc = run_rollout(routes, "--policy", "oracle", "--episodes", "4", "--concurrency", "8",
                       "--fork-at", "0", "--branches", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    body = summary_of(proc.stdout)
    assert body["episodes"] == "12" and body["rewarded"] == "12" and body["reward_min"] == "1"
    assert body["fork_at"] == "0" and body["branches"] == "3" and body["prefixes"] == "4"
    assert body["prefixes_forked"] == "4" and body["prefix_spread_mean"] == "0"
    rows = table_of(proc.stdout)
    assert len(rows) == 4 and all(r["branches"] == "3" and r["mean"] == r["min"] == r["max"]
                                  == "1" and r["spread"] == "0" for r in rows)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12 and {line["forked_from"] for line in lines} == {
        r["prefix"] for r in rows}
    assert all(line["fork_step"] == 0 and line["reward"] == 1.0 for line in lines)
    # the prefixes were closed once forked, their branches recorded as forks
    records = {r["episode_id"]: r for r in svc.outcomes()}
    assert all(records[r["prefix"]]["status"] == "closed" for r in rows)
    assert all(records[line["episode_id"]]["forked_from"] == line["forked_from"]
               for line in lines)
    assert Client(svc.url).list()["active"] == 0


def test_a_prefix_that_ends_before_k_is_an_episode_of_its_own(counter_service):
    svc = counter_service(references=True)
    routes = svc.config_path.parent / "routes.json"
    proc = run_rollout(routes, "--policy", "noop", "--episodes", "3", "--fork-at", "2",
                       "--branches", "2")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    body = summary_of(proc.stdout)
    assert body["episodes"] == "3" and body["reward_max"] == "0"
    assert body["prefixes_forked"] == "0" and body["prefix_spread_mean"] == "None"
    assert all(r["branches"] == "0" and r["fork_step"] == "-" for r in table_of(proc.stdout))


def test_arguments_are_checked(tmp_path):
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"counter": "http://127.0.0.1:1"}))
    for args, why in ((("--fork-at", "1"), "go together"),
                      (("--fork-at", "-1", "--branches", "2"), "0 or more"),
                      (("--fork-at", "1", "--branches", "0"), "at least 1")):
        proc = run_rollout(routes, "--policy", "noop", *args)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr


class Alternating:
    """Two wrong guesses as the prefix, then the target on even branches and
    finish on odd ones (a spread of 1 per prefix); the fork hook numbers them."""

    def __init__(self) -> None:
        self.branch: dict[str, int] = {}

    def fork(self, parent: str, child: str) -> None:
        self.branch[child] = sum(1 for c in self.branch)

    async def act(self, client, episode_id, observation):
        if episode_id not in self.branch:
            return {"operation": "guess", "value": 1}
        if self.branch[episode_id] % 2:
            return {"operation": "finish"}
        return (await client.reference(episode_id))["action"]


def test_branches_that_differ_give_the_prefix_its_spread(counter_service):
    svc = counter_service(references=True, capacity=8)

    async def scenario():
        async with AsyncClient(svc.url) as client:
            return await run_prefix(client, Alternating(), task_id="task-02", seed=None,
                                    fork_at=2, branches=4)
    row, results = asyncio.run(scenario())
    assert row["fork_step"] == 2 and row["branches"] == 4
    assert (row["mean"], row["min"], row["max"], row["spread"]) == (0.5, 0.0, 1.0, 1.0)
    assert sorted(r.reward for r in results) == [0.0, 0.0, 1.0, 1.0]
    assert all(r.forked_from == row["prefix"] and r.steps == 3 for r in results)
    records = {r["episode_id"]: r for r in svc.outcomes()}
    assert all(records[r.episode_id]["steps"] == 3 for r in results)  # 2 of the prefix + 1


def test_spread_summary_and_table():
    def result(reward):
        return Result("e", "t", reward, None if reward is not None else "infra", 1, 0.0, [])
    rows = [_row("p1", "t", 2, [result(0.0), result(1.0), result(0.5)]),
            _row("p2", "t", 2, [result(0.25), result(None)]),
            _row("p3", "t", None, [result(1.0)]) | {"branches": 0}]
    assert (rows[0]["mean"], rows[0]["spread"]) == (0.5, 1.0)
    assert (rows[1]["rewarded"], rows[1]["spread"]) == (1, 0.0)
    body = spread_summary(rows, 2, 3)
    assert body["prefixes"] == 3 and body["prefixes_forked"] == 2
    assert body["prefix_spread_mean"] == 0.5 and body["prefix_spread_max"] == 1.0
    import io
    stream = io.StringIO()
    print_prefixes(rows, stream)
    lines = stream.getvalue().splitlines()
    assert lines[0].split() == ["prefix", "task_id", "fork_step", "branches", "mean", "min",
                                "max", "spread"]
    assert lines[1].split() == ["p1", "t", "2", "3", "0.5", "0", "1", "1"]
