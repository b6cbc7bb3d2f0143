"""Kill storms: ``kill -9`` of the helper, of each environment service
(gunicorn's master, the unit's MainPID, and its one worker, where the
episodes live) and of each environment's grading child (Coding's grader
sandbox, Visual's renderer sandbox, AutoResearch's private grader,
General's task container while its verifier runs), at random points of an
episode, on an installation booted under real systemd (the demo, installed
by packaging/demo.sh in tests/system's nspawn machine).

Each kill: one episode (its id chosen by us, so it is known before the
kill) is driven to the kill point, the target is killed, and then

* every unit that was active is active again (Restart=; the helper by
  Restart= or socket activation), the killed one with a new MainPID, and
  every service answers /health healthy;
* every sandbox is reclaimed within ``RECLAIM_S`` of the kill (helper
  ledger, uppers, overlay mounts, sandbox cgroups, uid-2000 processes), and
  so is every task container the kill ended (the episode's; after a
  service's kill, every container of the killed run, warm pool included);
* every service's outcomes.jsonl parses line by line (no torn line) and
  still begins with what it held before the kill; every episode that got a
  terminal answer has its record, with the same reward;
* the in-flight episode is ended as the product promises
  (packaging/README.md "Kill storms"):
  - helper or a grading child killed: the service lives on, so the episode
    ends with ``reward: null`` and a failure class, in its answer and its
    record -- or, where the kill came after the episode's last use of what
    was killed, with exactly the reward an undisturbed run earns (measured
    first, on the reference solution: never 0);
  - service (master or worker) killed, or AutoResearch's grader (whose
    death stops the service): episodes live in the worker's memory; the
    trainer sees a dropped connection (or the episode's masked end), then
    404 from the restarted service, and the restarted service has recorded
    the episode ``reward: null``, ``failure_class: infra`` (camg/episodes/outcomes.py
    ``recover``). A reset the kill cut short made no episode and no record.

Kill points: ``reset`` (POST /episodes outstanding), ``step`` (a step
outstanding), ``grading`` (the finish outstanding, grading running),
``idle`` (an episode with no request outstanding). A kill of a service or
its worker past ``reset`` has a fork chain of the episode live as well
(devtools/reliability/killstorm_forks.py).

``storm(guest, ...)`` needs only a way to run commands in the booted guest
and a census of its sandboxes; tests/system/test_newcomer.py provides both.
The plan and the table are devtools/reliability/killstorm_report.py.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Callable

from devtools.reliability import killstorm_forks
from devtools.reliability.killstorm_guest import Answer, Background, Env, Guest
from devtools.reliability.killstorm_report import RECLAIM_S, Kill, plan, summarize
from devtools.reliability.table import Row


def _wait(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def restarts_unit(target: str, env: Env) -> bool:
    """Whether the kill makes systemd restart the environment's unit (a new
    MainPID): its master, or AutoResearch's grader, whose exit stops the
    service on purpose."""
    return target == "service" or (target == "grader" and env.grader == "process")


def loses_episodes(target: str, env: Env) -> bool:
    """Whether the kill takes the episodes' worker with it (they live in its
    memory): the restarted or replacement worker answers 404 and the
    service's recovery records them."""
    return target == "worker" or restarts_unit(target, env)


# Tries of one kill whose short-lived target was gone first: Coding's grader
# sandbox lives a few tenths of a second once the runner is probed, and
# about 6 in 10 tries come too late (measured: 33 repeats for 20 kills).
MAX_REPEATS = 20


# A caller's own checks after every kill: (storm, kill, env, episode id) ->
# problems; e.g. tests/system checks the guest's docker networks and volumes.
Check = Callable[["Storm", Kill, Env, str], list[str]]


class Storm:
    def __init__(self, guest: Guest, envs: list[Env], rng: random.Random,
                 log: Callable[[str], None] = lambda s: None,
                 check: Check | None = None) -> None:
        self.guest = guest
        self.envs = {e.name: e for e in envs}
        self.rng = rng
        self.log = log
        self.check = check
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

    def serving(self, env: Env) -> bool:
        """Takes episodes: healthy, or degraded only by the nulls a kill
        caused (camg.episodes.null_proof keeps those in /health for minutes)."""
        answer = self.guest.http(env.port, "GET", "/health", timeout=10)
        return answer.json.get("serving") is True

    def step(self, env: Env, eid: str, action: dict) -> Answer:
        return self.guest.http(env.port, "POST", f"/episodes/{eid}/step", {"action": action})

    def to_grading(self, env: Env, eid: str) -> dict:
        """The actions before the finish: ``env.to_grading``, or the
        deployment's reference solution up to its finish (which may carry
        an answer); returns the finish to send."""
        if not env.reference:
            for action in env.to_grading:
                self.step(env, eid, action)
            return env.finish
        for _ in range(200):
            got = self.guest.http(env.port, "GET", f"/episodes/{eid}/reference", timeout=60)
            if got.status != 200:
                raise AssertionError(f"{env.name}: reference answered {got.status}: "
                                     f"{str(got.body)[:300]}")
            action = got.json.get("action") or {}
            if action.get("operation") == env.finish["operation"]:
                return action
            answer = self.step(env, eid, action)
            if answer.status != 200 or answer.json.get("done"):
                raise AssertionError(f"{env.name}: a reference step answered {answer.status}: "
                                     f"{str(answer.body)[:300]}")
        raise AssertionError(f"{env.name}: the reference never reached {env.finish}")

    def episode_containers(self, env: Env, eid: str) -> set[str]:
        """The episode's task container: labelled with its id when made for
        it, or a warm-pool container it claimed (its state names it)."""
        found = self.guest.containers(f"camg.service={env.name}", f"camg.episode={eid}")
        state = self.guest.http(env.port, "GET", f"/episodes/{eid}", timeout=30)
        short = (state.json.get("environment_state") or {}).get("container") or ""
        if short:
            found |= {c for c in self.guest.containers(f"camg.service={env.name}")
                      if c.startswith(short)}
        return found

    def create(self, env: Env) -> str:
        created = self.guest.http(env.port, "POST", "/episodes", env.create)
        if created.status != 201:
            raise AssertionError(f"{env.name}: create answered {created.status}: "
                                 f"{str(created.body)[:300]}")
        return created.json["episode_id"]

    def settle(self) -> None:
        """Every unit up and every service healthy; then one episode each
        measures how long a reset, the slow step and the finish take (HTTP
        included), so the kills aim inside them, and what an undisturbed
        finish earns."""
        for env in self.envs.values():
            if not _wait(lambda: self.active(env.unit) and self.healthy(env), 300, 1.0):
                raise AssertionError(f"{env.unit} is not healthy")
            started = time.monotonic()
            eid = self.create(env)
            env.reset_s = time.monotonic() - started
            if env.slow_step:
                started = time.monotonic()
                self.step(env, eid, env.slow_step)
                env.step_s = time.monotonic() - started
            self.guest.http(env.port, "DELETE", f"/episodes/{eid}")
            if env.finish:
                # A fresh episode: a reference solution counts its steps.
                eid = self.create(env)
                finish = self.to_grading(env, eid)
                started = time.monotonic()
                done = self.step(env, eid, finish)
                env.grade_s = time.monotonic() - started
                env.graded = done.json.get("reward")
                if not done.json.get("done") or not env.graded:
                    raise AssertionError(f"{env.name}: the undisturbed finish answered "
                                         f"{done.status}: {str(done.body)[:300]}")
                self.guest.http(env.port, "DELETE", f"/episodes/{eid}")
            self.log(f"{env.name}: reset {env.reset_s:.2f}s, slow step {env.step_s:.2f}s, "
                     f"finish {env.grade_s:.2f}s earning {env.graded}")

    # -- one kill --------------------------------------------------------
    def kill(self, target: str, env: Env, point: str) -> Kill:
        kill = Kill(target, point, env.name)
        self.grader = set()
        before = self.records()
        units = {u: self.main_pid(u) for u in self.units() if self.active(u)}
        eid = uuid.uuid4().hex
        create = {**env.create, "episode_id": eid}
        pending: Background | None = None
        mine: set[str] = set()
        forks: list[tuple[str, str]] = []
        if point == "reset":
            pending = Background(self.guest, env.port, "POST", "/episodes", create)
            time.sleep(self.rng.uniform(0.0, env.reset_s * 0.9))
        else:
            created = self.guest.http(env.port, "POST", "/episodes", create)
            if created.status != 201:
                kill.problems.append(f"create answered {created.status}: {str(created.body)[:300]}")
                return kill
            if env.containers:
                mine = self.episode_containers(env, eid)
            if loses_episodes(target, env):
                # forks live at the kill (devtools/reliability/killstorm_forks.py)
                forks = killstorm_forks.fork_chain(self, env, eid, kill)
            if point == "step":
                pending = Background(self.guest, env.port, "POST", f"/episodes/{eid}/step",
                                     {"action": env.slow_step})
                time.sleep(self.rng.uniform(0.0, env.step_s * 0.9))
            elif point == "grading":
                finish = self.to_grading(env, eid)
                helper = self.main_pid("camg-helper.service")
                agent = self.guest.sandbox_inits(helper)
                victim = ""
                if target == "grader" and env.grader == "container":
                    # Its init, looked up before the finish removes it.
                    victim = self.guest.container_pid(max(mine)) if mine else ""
                pending = Background(self.guest, env.port, "POST", f"/episodes/{eid}/step",
                                     {"action": finish})
                if env.grader == "sandbox":
                    # The grading sandbox is the helper's child the finish made.
                    self.grader = _wait(lambda: self.guest.sandbox_inits(helper) - agent,
                                        max(120.0, env.grade_s * 3), 0.05)
                    if not self.grader:
                        kill.problems.append(f"no {env.grader_name} appeared")
                        return kill
                    # Grading the demo tasks takes a second or a few: aim early.
                    time.sleep(self.rng.uniform(0.0, 0.2))
                else:
                    self.grader = {victim} if victim else set()
                    time.sleep(self.rng.uniform(0.0, env.grade_s * 0.9))
        if env.containers:
            held = self.guest.containers(f"camg.service={env.name}")
            mine = mine or self.episode_containers(env, eid)
        pid = self._pid(target, env, kill)
        if pid is not None:
            kill.in_flight = pending is not None and pending.is_alive()
            if self.guest.run(["kill", "-9", pid], timeout=60, check=False).returncode != 0:
                kill.missed = 1
        if pid is None or kill.missed:
            # The grading child was gone before the kill (the finish was
            # done): no kill happened; this episode ends, the storm retries.
            if pending is not None:
                pending.result(600)
            for each in [eid, *(child for child, _ in forks)]:
                self.guest.http(env.port, "DELETE", f"/episodes/{each}")
            return kill
        killed_at = time.monotonic()
        self.log(f"kill -9 {target} (pid {pid}) at {point}"
                 f"{' (request in flight)' if kill.in_flight else ''}")
        self._reclaimed(kill, killed_at, env, eid)
        if env.containers and loses_episodes(target, env):
            # The whole killed run's containers, warm pool included.
            self._containers_gone(kill, killed_at, held, "of the killed run")
        self._back(kill, killed_at, target, env, units, pid)
        answer = pending.result(600) if pending is not None else None
        ended_at = time.monotonic()
        self._ended(kill, target, env, eid, answer)
        if forks:
            killstorm_forks.check_lost(self, env, kill, forks)
        if env.containers and not loses_episodes(target, env):
            self._containers_gone(kill, ended_at, mine, f"of episode {eid}")
        self._records(kill, before)
        if self.check is not None:
            kill.problems += self.check(self, kill, env, eid)
        return kill

    def _pid(self, target: str, env: Env, kill: Kill) -> str | None:
        if target == "helper":
            pid = self.main_pid("camg-helper.service")
        elif target == "service":  # gunicorn's master: the unit's MainPID
            pid = self.main_pid(env.unit)
        elif target == "worker":  # its one worker, where the episodes live
            workers = self.guest.children(self.main_pid(env.unit))
            if env.grader == "process":
                workers -= self.guest.users_processes(env.grader_user)
            pid = max(workers, key=int) if workers else "0"
        elif env.grader == "process":  # the standing grader: the eldest of its uid
            graders = self.guest.users_processes(env.grader_user)
            pid = min(graders, key=int) if graders else "0"
        else:  # the grading sandbox's init (its whole tree dies) or the container's
            pid = max(self.grader, key=int) if self.grader else "0"
        if pid in ("", "0"):
            if target == "grader" and env.grader == "container":
                kill.missed = 1  # the finish removed the container before the kill
                return None
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
                and kill.target == "helper" and kill.point in ("reset", "idle"):
            kill.reclaim_s = 0.0
            return
        kill.problems.append(f"not reclaimed {RECLAIM_S:.0f}s after the kill: "
                             f"{json.dumps(self.guest.census())[:600]}")

    def _containers_gone(self, kill: Kill, since: float, ids: set[str], whose: str) -> None:
        if not ids:
            return
        left = _wait(lambda: not (ids & self.guest.containers()), RECLAIM_S, 0.2)
        kill.reclaim_s = max(kill.reclaim_s, time.monotonic() - since)
        if not left:
            kill.problems.append(f"containers {whose} not removed within {RECLAIM_S:.0f}s: "
                                 f"{sorted(c[:12] for c in ids & self.guest.containers())}")

    def _back(self, kill: Kill, killed_at: float, target: str, env: Env,
              units: dict[str, str], pid: str) -> None:
        def up() -> bool:
            for unit, old in units.items():
                now = self.guest.show(unit, "ActiveState", "MainPID")
                if now["ActiveState"] != "active" or now["MainPID"] in ("0", ""):
                    return False
                if now["MainPID"] == pid:
                    return False
                if unit == env.unit and restarts_unit(target, env) and now["MainPID"] == old:
                    return False  # the grader's death has not stopped it yet
            if env.grader == "process":
                graders = self.guest.users_processes(env.grader_user)
                if not graders or pid in graders:
                    return False
            return True

        if not _wait(up, 300, 0.3):
            states = {u: self.guest.show(u, "ActiveState")["ActiveState"] for u in units}
            kill.problems.append(f"units not back in 300s: {states}")
            return
        # Back means serving: every service takes episodes again (the
        # helper's return included, which a service's /health reports).
        for other in self.envs.values():
            if not _wait(lambda: self.serving(other), 300, 0.3):
                kill.problems.append(f"{other.unit} active but not serving")
        kill.back_s = time.monotonic() - killed_at

    def _ended(self, kill: Kill, target: str, env: Env, eid: str, answer: Answer | None) -> None:
        if loses_episodes(target, env):
            self._lost(kill, env, eid, answer)
            return
        if answer is not None and answer.status is not None and answer.status >= 500:
            # A reset the kill broke: a typed error naming the failure class.
            kill.ended = f"reset answered {answer.status} {answer.json.get('error')}"
            if not answer.json.get("error"):
                kill.problems.append(f"untyped error answer: {str(answer.body)[:300]}")
        else:
            terminal = answer.json if answer is not None and answer.json.get("done") else None
            if terminal is None:
                step = self.step(env, eid, env.slow_step or env.finish or {})
                terminal = step.json if step.json.get("done") else None
                if terminal is None and step.status == 200:
                    # The kill never touched it (e.g. a helper kill while it
                    # needed nothing of the helper): it simply lives on.
                    kill.ended = "unaffected (closed)"
                    self.guest.http(env.port, "DELETE", f"/episodes/{eid}")
                    return
                if terminal is None and step.status == 409:
                    terminal = step.json.get("terminal") or step.json
            if terminal is None:
                kill.problems.append(f"episode {eid} did not end: {answer}")
                return
            self.terminal[env.name][eid] = terminal
            reward, failure = terminal.get("reward"), terminal.get("failure_class")
            if reward is None and failure:
                kill.ended = f"reward null {failure}"
            elif kill.point == "grading" and not failure and reward == env.graded:
                # Graded after its last use of what was killed: the reward
                # of an undisturbed run (never 0: settle() refuses that).
                kill.ended = "graded as undisturbed"
            else:
                kill.ended = f"reward {reward} {failure}"
                kill.problems.append(f"in-flight episode ended {kill.ended}, not reward null "
                                     f"with a failure class (undisturbed: {env.graded})")
        if env.sandboxes or env.containers or target == "grader":
            # The service wrote the outcome: it must be there, as answered.
            found = self._found(env, eid)
            terminal = self.terminal[env.name].get(eid)
            if terminal is not None and not found:
                kill.problems.append(f"no outcome record for ended episode {eid}")
            elif found and found[-1]["reward"] is None and not found[-1]["failure_class"]:
                kill.problems.append(f"record of {eid}: reward null without a class")

    def _lost(self, kill: Kill, env: Env, eid: str, answer: Answer | None) -> None:
        """The episode's worker died: what the trainer saw, and the record
        the restarted (or replacement) worker's recovery wrote."""
        masked = bool(answer is not None and answer.json.get("done")
                      and answer.json.get("reward") is None and answer.json.get("failure_class"))
        if answer is not None and answer.status is not None and answer.status >= 300:
            error = answer.json.get("error")
            # 404: a request still queued on the master's listening socket
            # when the worker died is answered by the replacement. A stop
            # the service began itself (AutoResearch's grader died) may
            # still answer, with a typed 5xx.
            stopping = kill.target == "grader" and restarts_unit(kill.target, env) \
                and answer.status >= 500
            if error is None or (error != "episode_not_found" and not stopping):
                kill.problems.append(f"in-flight request answered {answer.status}: "
                                     f"{str(answer.body)[:200]}")
        if answer is not None and answer.json.get("done"):
            # Ended before the worker died: its record must say the same.
            self.terminal[env.name][eid] = answer.json
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
        finished = answer is not None and bool(answer.json.get("done")) and not masked
        created = point_created(kill.point, answer)
        found = self._found(env, eid)
        how = ("answered before the kill" if finished
               else "ended reward null" if masked
               else "connection lost" if answer is not None else "idle")
        if finished:
            kill.ended = f"{how}, then 404"
        elif found:
            last = found[-1]
            kill.ended = f"{how}, then 404; recorded {last['reward']} {last['failure_class']}"
            graded = kill.point == "grading" and last["reward"] is not None \
                and last["reward"] == env.graded and not last["failure_class"]
            if graded:
                # Graded and recorded (fsync'd before the reply), then the
                # kill cut the reply: the reward of an undisturbed run.
                kill.ended = f"{how}, then 404; recorded as graded undisturbed"
            elif last["reward"] is not None or not last["failure_class"]:
                kill.problems.append(f"record of {eid}: reward {last['reward']}, "
                                     f"class {last['failure_class']}")
        elif created:
            kill.problems.append(f"episode {eid} was running, and the restarted service "
                                 "wrote no record of it")
        else:
            kill.ended = "reset cut short: no episode, no record"

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


def storm(guest: Guest, envs: list[Env], kills: int, seed: int = 0,
          log: Callable[[str], None] = lambda s: None,
          only: set[tuple[str, str]] | None = None,
          check: Check | None = None) -> tuple[list[Row], list[Kill]]:
    """``only``: (target, environment) pairs to run, the rest of the plan
    skipped (to repeat one row; the helper's environment is "all").
    ``check``: the caller's own checks after every kill that landed."""
    rng = random.Random(seed)
    s = Storm(guest, envs, rng, log, check)
    s.settle()
    done: list[Kill] = []
    for target, env, point in plan(envs, kills, rng):
        if only is not None and (target, "all" if target == "helper" else env.name) not in only:
            continue
        repeated = 0
        while True:
            try:
                kill = s.kill(target, env, point)
            except Exception as exc:  # one broken kill is a failed row, not a lost table
                kill = Kill(target, point, env.name, problems=[f"{type(exc).__name__}: {exc}"[:600]])
            if not kill.missed or repeated >= MAX_REPEATS:
                break
            repeated += 1
            log(f"  {target} had exited before the kill; again")
        if kill.missed and not kill.problems:  # the last try missed too
            kill.problems.append(f"{target} exited before the kill {repeated + 1} times")
        kill.missed = repeated
        done.append(kill)
        for problem in done[-1].problems:
            log(f"  problem: {problem}")
    return summarize(done, kills, envs), done


