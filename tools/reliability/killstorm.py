"""Kill storms: ``kill -9`` of the helper, of each environment service
(gunicorn's master, the unit's MainPID, and its one worker, where the
episodes live) and of Coding's grader sandbox, at random points of an
episode, on an installation booted under real systemd (tests/system's
nspawn machine).

Each kill: one episode (its id chosen by us, so it is known before the
kill) is driven to the kill point, the target is killed, and then

* every unit that was active is active again (Restart=; the helper by
  Restart= or socket activation), the killed one with a new MainPID, and
  every service answers /health healthy;
* every sandbox is reclaimed within ``RECLAIM_S`` of the kill (helper
  ledger, uppers, overlay mounts, sandbox cgroups, uid-2000 processes);
* every service's outcomes.jsonl parses line by line (no torn line) and
  still begins with what it held before the kill; every episode that got a
  terminal answer has its record, with the same reward;
* the in-flight episode is ended as the product promises
  (packaging/README.md "Kill storms"):
  - helper or grader killed: the service lives on, so the episode ends with
    ``reward: null`` and a failure class, in its answer and its record;
  - service (master or worker) killed: episodes live in the worker's
    memory; the trainer sees a dropped connection, then 404 from the
    restarted service, and the restarted service has recorded the episode
    ``reward: null``, ``failure_class: infra`` (camg/outcomes.py
    ``recover``). A reset the kill cut short made no episode and no record.

Kill points: ``reset`` (POST /episodes outstanding), ``step`` (a step
outstanding), ``grading`` (Coding's finish: the grader sandbox running),
``idle`` (an episode with no request outstanding).

``storm(guest, ...)`` needs only a way to run commands in the booted guest
and a census of its sandboxes; tests/system/test_kill_storms.py provides
both. ``rows(kills)`` runs that test and returns its rows, for the
reliability runner.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

from tools.reliability.killstorm_guest import POINTS, Answer, Background, Env, Guest
from tools.reliability.rig import TMP_PREFIX
from tools.reliability.table import Row

RECLAIM_S = 5.0
ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Kill:
    target: str
    point: str
    env: str = ""
    in_flight: bool = False     # the request was still outstanding at the kill
    back_s: float = 0.0
    reclaim_s: float = 0.0
    ended: str = ""             # how the in-flight episode ended
    missed: int = 0             # tries whose target had exited before the kill
    problems: list[str] = dataclasses.field(default_factory=list)


def _wait(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


class Storm:
    def __init__(self, guest: Guest, envs: list[Env], rng: random.Random,
                 log: Callable[[str], None] = lambda s: None) -> None:
        self.guest = guest
        self.envs = {e.name: e for e in envs}
        self.rng = rng
        self.log = log
        self.terminal: dict[str, dict[str, dict]] = {e.name: {} for e in envs}
        self.grader: set[str] = set()

    # -- state of the machine ------------------------------------------
    def units(self) -> list[str]:
        return ["camg-helper.service"] + [e.unit for e in self.envs.values()]

    def main_pid(self, unit: str) -> str:
        return self.guest.show(unit, "MainPID")["MainPID"]

    def active(self, unit: str) -> bool:
        return self.guest.show(unit, "ActiveState")["ActiveState"] == "active"

    def records(self) -> dict[str, list[str]]:
        return {name: self.guest.lines(f"/var/lib/camg/{name}/outcomes.jsonl")
                for name in self.envs}

    def healthy(self, env: Env) -> bool:
        answer = self.guest.http(env.port, "GET", "/health", timeout=10)
        return answer.status == 200 and answer.json.get("status") == "healthy"

    def settle(self) -> None:
        """Every unit up and every service healthy; then one episode each
        measures how long a reset and the slow step take (HTTP included),
        so the kills aim inside them."""
        for env in self.envs.values():
            if not _wait(lambda: self.active(env.unit) and self.healthy(env), 300, 1.0):
                raise AssertionError(f"{env.unit} is not healthy")
            started = time.monotonic()
            created = self.guest.http(env.port, "POST", "/episodes", env.create)
            env.reset_s = time.monotonic() - started
            if created.status != 201:
                raise AssertionError(f"{env.name}: create answered {created.status}: "
                                     f"{str(created.body)[:300]}")
            eid = created.json["episode_id"]
            if env.slow_step:
                started = time.monotonic()
                self.guest.http(env.port, "POST", f"/episodes/{eid}/step", {"action": env.slow_step})
                env.step_s = time.monotonic() - started
            self.guest.http(env.port, "DELETE", f"/episodes/{eid}")
            self.log(f"{env.name}: reset {env.reset_s:.2f}s, slow step {env.step_s:.2f}s")

    # -- one kill --------------------------------------------------------
    def kill(self, target: str, env: Env, point: str) -> Kill:
        kill = Kill(target, point, env.name)
        self.grader = set()
        before = self.records()
        units = {u: self.main_pid(u) for u in self.units() if self.active(u)}
        eid = uuid.uuid4().hex
        create = {**env.create, "episode_id": eid}
        pending: Background | None = None
        if point == "reset":
            pending = Background(self.guest, env.port, "POST", "/episodes", create)
            time.sleep(self.rng.uniform(0.0, env.reset_s * 0.9))
        else:
            created = self.guest.http(env.port, "POST", "/episodes", create)
            if created.status != 201:
                kill.problems.append(f"create answered {created.status}: {str(created.body)[:300]}")
                return kill
            if point == "step":
                pending = Background(self.guest, env.port, "POST", f"/episodes/{eid}/step",
                                     {"action": env.slow_step})
                time.sleep(self.rng.uniform(0.0, env.step_s * 0.9))
            elif point == "grading":
                for action in env.to_grading:
                    self.guest.http(env.port, "POST", f"/episodes/{eid}/step", {"action": action})
                helper = self.main_pid("camg-helper.service")
                agent = self.guest.children(helper)
                pending = Background(self.guest, env.port, "POST", f"/episodes/{eid}/step",
                                     {"action": env.finish})
                # The grader sandbox is the helper's child the finish made.
                self.grader = _wait(lambda: self.guest.children(helper) - agent, 120, 0.05)
                if not self.grader:
                    kill.problems.append("no grader sandbox appeared")
                    return kill
                # Grading the demo task takes about a second: aim early.
                time.sleep(self.rng.uniform(0.0, 0.2))
        pid = self._pid(target, env, kill)
        if pid is None:
            return kill
        kill.in_flight = pending is not None and pending.is_alive()
        sent = self.guest.run(["kill", "-9", pid], timeout=60, check=False)
        if sent.returncode != 0:
            # The grader finished first: no kill happened; the storm retries.
            kill.missed = 1
            if pending is not None:
                pending.result(600)
            return kill
        killed_at = time.monotonic()
        self.log(f"kill -9 {target} (pid {pid}) at {point}"
                 f"{' (request in flight)' if kill.in_flight else ''}")
        self._reclaimed(kill, killed_at, env, eid)
        self._back(kill, killed_at, target, env, units, pid)
        answer = pending.result(600) if pending is not None else None
        self._ended(kill, target, env, eid, answer)
        self._records(kill, before)
        return kill

    def _pid(self, target: str, env: Env, kill: Kill) -> str | None:
        if target == "helper":
            pid = self.main_pid("camg-helper.service")
        elif target == "service":  # gunicorn's master: the unit's MainPID
            pid = self.main_pid(env.unit)
        elif target == "worker":  # its one worker, where the episodes live
            workers = self.guest.children(self.main_pid(env.unit))
            pid = max(workers, key=int) if workers else "0"
        else:  # grader: the sandbox init the finish started (its whole tree dies)
            pid = max(self.grader, key=int) if self.grader else "0"
        if pid in ("", "0"):
            kill.problems.append(f"no {target} process to kill")
            return None
        return pid

    def _reclaimed(self, kill: Kill, killed_at: float, env: Env, eid: str) -> None:
        left = _wait(lambda: not self.guest.census(), RECLAIM_S, 0.1)
        kill.reclaim_s = time.monotonic() - killed_at
        if left:
            return
        # Not clean yet. Only a live episode may still hold a sandbox: a
        # helper kill that came before the reset reached it leaves the new
        # helper to serve it. Anything else is a leak.
        state = self.guest.http(env.port, "GET", f"/episodes/{eid}", timeout=30)
        if state.status == 200 and state.json.get("status") == "running" \
                and kill.target == "helper" and kill.point == "reset":
            kill.reclaim_s = 0.0
            return
        kill.problems.append(f"not reclaimed {RECLAIM_S:.0f}s after the kill: "
                             f"{json.dumps(self.guest.census())[:600]}")

    def _back(self, kill: Kill, killed_at: float, target: str, env: Env,
              units: dict[str, str], pid: str) -> None:
        def up() -> bool:
            for unit, old in units.items():
                now = self.guest.show(unit, "ActiveState", "MainPID")
                if now["ActiveState"] != "active" or now["MainPID"] in ("0", ""):
                    return False
                if now["MainPID"] == pid:
                    return False
            return True

        if not _wait(up, 300, 0.3):
            states = {u: self.guest.show(u, "ActiveState")["ActiveState"] for u in units}
            kill.problems.append(f"units not back in 300s: {states}")
            return
        # Back means serving: every service healthy again (the helper's
        # return included, which a service's /health reports).
        for other in self.envs.values():
            if not _wait(lambda: self.healthy(other), 300, 0.3):
                kill.problems.append(f"{other.unit} active but not healthy")
        kill.back_s = time.monotonic() - killed_at

    def _ended(self, kill: Kill, target: str, env: Env, eid: str, answer: Answer | None) -> None:
        if answer is not None and answer.status is not None and answer.status >= 500 \
                and target not in ("service", "worker"):
            # A reset the kill broke: a typed error naming the failure class.
            kill.ended = f"reset answered {answer.status} {answer.json.get('error')}"
            if not answer.json.get("error"):
                kill.problems.append(f"untyped error answer: {str(answer.body)[:300]}")
        elif answer is not None and answer.json.get("done"):
            self.terminal[env.name][eid] = answer.json
        if target in ("service", "worker"):
            # 404: a step still queued on the master's listening socket when
            # the worker died is answered by the replacement, which never
            # knew the episode.
            if answer is not None and answer.status is not None and answer.status >= 300 \
                    and answer.json.get("error") != "episode_not_found":
                kill.problems.append(f"in-flight request answered {answer.status}: "
                                     f"{str(answer.body)[:200]}")
            state = self.guest.http(env.port, "GET", f"/episodes/{eid}", timeout=30)
            if kill.point == "reset" and state.status == 200 and answer is not None \
                    and answer.status == 201 and state.json.get("status") == "running":
                # The reset reached the listening socket (the master's) before
                # the killed worker took it: the replacement served it.
                kill.ended = "unaffected (closed)"
                self.guest.http(env.port, "DELETE", f"/episodes/{eid}")
                return
            if state.status != 404:
                kill.problems.append(f"GET /episodes/{eid} after a restart answered "
                                     f"{state.status}: {str(state.body)[:200]}")
            # The restarted service records what its predecessor left
            # running (camg/outcomes.py recover): reward null, a class. A
            # reset the kill cut short made no episode, hence no record.
            finished = answer is not None and bool(answer.json.get("done"))
            created = point_created(kill.point, answer)
            found = self._found(env, eid)
            how = ("answered before the kill" if answer is not None and answer.status
                   else "connection lost" if answer is not None else "idle")
            if finished:
                kill.ended = f"{how}, then 404"
            elif found:
                last = found[-1]
                kill.ended = f"{how}, then 404; recorded {last['reward']} {last['failure_class']}"
                if last["reward"] is not None or not last["failure_class"]:
                    kill.problems.append(f"record of {eid}: reward {last['reward']}, "
                                         f"class {last['failure_class']}")
            elif created:
                kill.problems.append(f"episode {eid} was running, and the restarted service "
                                     "wrote no record of it")
            else:
                kill.ended = "reset cut short: no episode, no record"
            return
        if not kill.ended:
            terminal = answer.json if answer is not None and answer.json.get("done") else None
            if terminal is None:
                step = self.guest.http(env.port, "POST", f"/episodes/{eid}/step",
                                       {"action": env.slow_step or env.finish or {}})
                terminal = step.json if step.json.get("done") else None
                if terminal is None and step.status == 200:
                    # The kill never touched it (a helper kill before the
                    # reset reached the helper): it simply lives on.
                    kill.ended = "unaffected (closed)"
                    self.guest.http(env.port, "DELETE", f"/episodes/{eid}")
                    return
                if terminal is None and step.status == 409:
                    terminal = step.json.get("terminal") or step.json
            if terminal is None:
                kill.problems.append(f"episode {eid} did not end: {answer}")
                return
            self.terminal[env.name][eid] = terminal
            kill.ended = f"reward {terminal.get('reward')} {terminal.get('failure_class')}"
            if terminal.get("reward") is not None or not terminal.get("failure_class"):
                kill.problems.append(f"in-flight episode ended {kill.ended}, "
                                     "not reward null with a failure class")
        if env.sandboxes or target == "grader":
            # The service wrote the outcome: it must be there, masked.
            found = self._found(env, eid)
            if not found:
                kill.problems.append(f"no outcome record for ended episode {eid}")
            elif found[-1]["reward"] is not None or not found[-1]["failure_class"]:
                kill.problems.append(f"record of {eid}: reward {found[-1]['reward']}, "
                                     f"class {found[-1]['failure_class']}")

    def _found(self, env: Env, eid: str) -> list[dict]:
        return [json.loads(line) for line in self.guest.lines(
            f"/var/lib/camg/{env.name}/outcomes.jsonl") if eid in line]

    def _records(self, kill: Kill, before: dict[str, list[str]]) -> None:
        after = self.records()
        for name, lines in after.items():
            if lines[:len(before[name])] != before[name]:
                kill.problems.append(f"{name}: outcomes.jsonl lost or changed earlier lines")
            parsed = {}
            for n, line in enumerate(lines, 1):
                try:
                    record = json.loads(line)
                    parsed[record["episode_id"]] = record
                except (ValueError, KeyError, TypeError):
                    kill.problems.append(f"{name}: outcomes.jsonl line {n} is torn: {line[:200]}")
            for eid, terminal in self.terminal[name].items():
                record = parsed.get(eid)
                if record is None:
                    kill.problems.append(f"{name}: episode {eid} answered done, no record")
                elif record["reward"] != terminal.get("reward"):
                    kill.problems.append(f"{name}: {eid} answered reward {terminal.get('reward')}"
                                         f", recorded {record['reward']}")


def point_created(point: str, answer: Answer | None) -> bool:
    """Whether the episode surely existed when its service was killed."""
    return point != "reset" or (answer is not None and answer.status == 201)


def plan(envs: list[Env], kills: int, rng: random.Random) -> list[tuple[str, Env, str]]:
    """(target, environment, point) for every kill: the points of each
    target cycle in a shuffled order, so a short storm still spreads."""
    work: list[tuple[str, Env, str]] = []
    sandboxed = [e for e in envs if e.sandboxes]
    targets: list[tuple[str, list[Env]]] = [("helper", sandboxed or envs)]
    targets += [("service", [e]) for e in envs]
    targets += [("worker", [e]) for e in envs]
    targets += [("grader", [e]) for e in envs if e.finish and e.sandboxes]
    for target, choices in targets:
        orders = {}
        for env in choices:
            orders[env.name] = list(("grading",) if target == "grader" else env.points)
            rng.shuffle(orders[env.name])
        for i in range(kills):
            env = choices[i % len(choices)]
            order = orders[env.name]
            work.append((target, env, order[(i // len(choices)) % len(order)]))
    return work


def storm(guest: Guest, envs: list[Env], kills: int, seed: int = 0,
          log: Callable[[str], None] = lambda s: None) -> tuple[list[Row], list[Kill]]:
    rng = random.Random(seed)
    s = Storm(guest, envs, rng, log)
    s.settle()
    done: list[Kill] = []
    for target, env, point in plan(envs, kills, rng):
        missed = 0
        while True:
            try:
                kill = s.kill(target, env, point)
            except Exception as exc:  # one broken kill is a failed row, not a lost table
                kill = Kill(target, point, env.name, problems=[f"{type(exc).__name__}: {exc}"[:600]])
            if not kill.missed or missed >= 5:
                break
            missed += 1
            log(f"  {target} had exited before the kill; again")
        kill.missed = missed
        if kill.missed and missed >= 5 and not kill.problems:
            kill.problems.append(f"{target} exited before the kill {missed} times")
        done.append(kill)
        for problem in done[-1].problems:
            log(f"  problem: {problem}")
    return summarize(done, kills), done


def summarize(done: list[Kill], kills: int) -> list[Row]:
    rows = []
    groups: dict[tuple[str, str], list[Kill]] = {}
    for k in done:
        key = ("helper", "all") if k.target == "helper" else (k.target, k.env)
        groups.setdefault(key, []).append(k)
    for (target, env), ks in groups.items():
        what = {"helper": "camg-helper", "service": f"camg-{env}",
                "worker": f"camg-{env}'s worker",
                "grader": f"camg-{env}'s grader sandbox"}[target]
        points = ", ".join(f"{p} {sum(1 for k in ks if k.point == p)}" for p in POINTS
                           if any(k.point == p for k in ks))
        problems = [p for k in ks for p in k.problems]
        missed = sum(k.missed for k in ks)
        ends: dict[str, int] = {}
        for k in ks:
            label = k.ended.split(" (")[0] if k.ended else "-"
            ends[label] = ends.get(label, 0) + 1
        counted = (f"back max {max(k.back_s for k in ks):.1f}s; reclaimed max "
                   f"{max(k.reclaim_s for k in ks):.1f}s (<= {RECLAIM_S:.0f}s); records parse; "
                   f"{sum(k.in_flight for k in ks)} with a request in flight, the episode: "
                   + ", ".join(f"{n}x {e}" for e, n in sorted(ends.items())))
        if missed:
            counted += f"; {missed} tries repeated (the target finished before the kill)"
        if problems:
            counted += f"; {len(problems)} problem(s), first: {problems[0][:200]}"
        rows.append(Row("kill storm", env, f"kill -9 {what} x{len(ks)} ({points})", counted,
                        not problems and len(ks) == kills))
    return rows


def rows(kills: int = 3, seed: int = 0, lock: str | None = None) -> list[Row]:
    """Run tests/system/test_kill_storms.py (it boots the machine) and return
    its rows: what the reliability runner calls. ``lock``: a flock file to
    hold while it runs (the shared machine's /tmp/camg-privileged.lock);
    never one the caller already holds."""
    with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}killstorm-") as tmp:
        report = Path(tmp) / "rows.json"
        env = {**os.environ, "CAMG_KILLSTORM_KILLS": str(kills), "CAMG_KILLSTORM_SEED": str(seed),
               "CAMG_KILLSTORM_REPORT": str(report)}
        argv = [sys.executable, "-m", "pytest", "tests/system/test_kill_storms.py", "-q", "-s",
                "-p", "no:cacheprovider"]
        result = subprocess.run((["flock", lock] if lock else []) + argv, cwd=ROOT, env=env)
        if not report.exists():
            return [Row("kill storm", "-", f"{kills} kills per target",
                        f"the system test did not report (pytest exit {result.returncode})", False)]
        return [Row(**r) for r in json.loads(report.read_text())]
