"""The kill storm's plan and its verdicts on how an in-flight episode ended
(devtools/reliability/killstorm*.py), against a scripted guest: a storm that
cannot fail proves nothing."""

from __future__ import annotations

import dataclasses
import json
import random

from devtools.reliability.killstorm import Storm, loses_episodes, restarts_unit
from devtools.reliability.killstorm_guest import Answer, Env, Guest
from devtools.reliability.killstorm_report import Kill, plan, summarize

CODING = Env("coding", 1, {}, slow_step={"operation": "shell"}, finish={"operation": "finish"},
             sandboxes=True, grader="sandbox")
SHOP = Env("shop", 2, {}, slow_step={"action": "search[x]"})
RESEARCH = Env("autoresearch", 3, {}, slow_step={"operation": "shell"}, reference=True,
               finish={"operation": "submit"}, sandboxes=True, grader="process",
               grader_user="camg-grader")
GENERAL = Env("general", 4, {}, slow_step={"operation": "shell"}, reference=True,
              finish={"operation": "finish"}, containers=True, grader="container")


def test_each_plugin_describes_its_drive():
    """describe(): the plugin's unit and substrate, completed by the drive it
    names; the Envs above are what it gives (less the first task)."""
    import subprocess

    from camg import plugins
    from devtools.reliability.killstorm_guest import describe

    def run(argv, timeout=None, check=False):
        body = {"tasks": [{"task_id": "t0", "data": {"patch": "THE-PATCH"}}]}
        return subprocess.CompletedProcess(argv, 0, json.dumps(body), "")

    guest = Guest(run, dict)
    found = plugins.all_plugins()
    envs = {n: describe(guest, n, p.port) for n, p in found.items()}
    # every registered environment: its unit and substrate, its first task
    # where its plugin names a drive
    for n, e in envs.items():
        assert (e.sandboxes, e.containers) == (found[n].substrate == "sandbox",
                                               found[n].substrate == "container"), n
        assert e.unit == found[n].unit, n
        assert e.create == ({"task_id": "t0"} if found[n].storm else {}), n
    # the products' own drives
    products = {"coding": ("sandbox", "grader sandbox"),
                "autoresearch": ("sandbox", "private grader"),
                "shop": ("process", ""),
                "general": ("container", "task container (verifier running)"),
                "visual": ("container", "renderer sandbox")}
    assert {"coding", "shop"} <= set(envs)
    for n, (substrate, grader) in products.items():
        if n in envs:
            assert (found[n].substrate, envs[n].grader_name, envs[n].unit) == (
                substrate, grader, f"camg-{n}.service"), n
    assert "THE-PATCH" in envs["coding"].to_grading[0]["command"]
    fields = ("sandboxes", "containers", "grader", "grader_user", "reference", "finish")
    for mine in (m for m in (CODING, SHOP, RESEARCH, GENERAL) if m.name in envs):
        assert [getattr(mine, f) for f in fields] == [getattr(envs[mine.name], f) for f in fields]
        assert mine.points == envs[mine.name].points


def test_plan_covers_every_target_and_the_helper_once_per_environment_that_needs_it():
    envs = [CODING, SHOP, RESEARCH, GENERAL]
    work = plan(envs, 1, random.Random(0))
    targets = [(t, e.name) for t, e, _ in work]
    assert sorted(e for t, e in targets if t == "helper") == ["autoresearch", "coding", "general"]
    for env in envs:
        assert ("service", env.name) in targets and ("worker", env.name) in targets
    assert {e for t, e in targets if t == "grader"} == {"coding", "autoresearch", "general"}
    # A grading child exists only while grading; a standing grader any time.
    assert all(p == "grading" for t, e, p in work if t == "grader" and e.grader != "process")
    full = plan([CODING, RESEARCH], 20, random.Random(0))
    research = {p for t, e, p in full if t == "grader" and e.name == "autoresearch"}
    assert research == {"reset", "step", "grading", "idle"}


def test_which_kills_restart_the_unit_and_which_lose_the_episodes():
    assert restarts_unit("service", GENERAL) and loses_episodes("service", GENERAL)
    assert not restarts_unit("worker", GENERAL) and loses_episodes("worker", GENERAL)
    assert restarts_unit("grader", RESEARCH) and loses_episodes("grader", RESEARCH)
    assert not loses_episodes("grader", CODING) and not loses_episodes("helper", CODING)


class ScriptedGuest(Guest):
    """Answers the storm's HTTP calls from a table; records are lines."""

    def __init__(self, answers: dict[tuple[str, str], Answer], records: list[dict]) -> None:
        super().__init__(self._run, lambda: {})
        self.answers = answers
        self.records = records

    def _run(self, argv, timeout=None, check=False):
        raise AssertionError(f"unexpected command {argv}")

    def http(self, port, method, path, body=None, timeout=600.0):
        return self.answers.get((method, path), Answer(404, {"error": "episode_not_found"}))

    def lines(self, path):
        return [json.dumps(r) for r in self.records]


def _ended(env: Env, target: str, answer: Answer, records: list[dict],
           answers: dict | None = None, point: str = "grading") -> Kill:
    env = dataclasses.replace(env, graded=1.0)
    storm = Storm(ScriptedGuest(answers or {}, records), [env], random.Random(0))
    kill = Kill(target, point, env.name)
    storm._ended(kill, target, env, "e1", answer)
    return kill


def test_a_kill_after_the_last_use_may_end_with_the_undisturbed_reward_never_a_zero():
    record = {"episode_id": "e1", "reward": 1.0, "failure_class": None}
    kill = _ended(GENERAL, "helper", Answer(200, {"done": True, "reward": 1.0}), [record])
    assert kill.ended == "graded as undisturbed" and not kill.problems
    zero = {"episode_id": "e1", "reward": 0.0, "failure_class": None}
    kill = _ended(GENERAL, "helper", Answer(200, {"done": True, "reward": 0.0}), [zero])
    assert kill.problems and "not reward null" in kill.problems[0]


def test_a_masked_end_needs_a_class_and_a_record():
    masked = {"done": True, "reward": None, "failure_class": "grader_error"}
    kill = _ended(CODING, "grader", Answer(200, masked), [{"episode_id": "e1", **masked}])
    assert kill.ended == "reward null grader_error" and not kill.problems
    kill = _ended(CODING, "grader", Answer(200, masked), [])
    assert any("no outcome record" in p for p in kill.problems)
    bare = {"done": True, "reward": None, "failure_class": None}
    kill = _ended(CODING, "grader", Answer(200, bare), [{"episode_id": "e1", **bare}])
    assert kill.problems


def test_a_stopping_service_may_answer_a_typed_5xx_a_killed_one_only_404():
    recovered = {"episode_id": "e1", "reward": None, "failure_class": "infra", "recovered": True}
    stopping = Answer(503, {"error": "service_unavailable"})
    kill = _ended(RESEARCH, "grader", stopping, [recovered], point="step")
    assert not kill.problems, kill.problems
    assert kill.ended.endswith("recorded None infra")
    kill = _ended(RESEARCH, "service", stopping, [recovered], point="step")
    assert kill.problems and "answered 503" in kill.problems[0]
    # A running episode the restarted service forgot to record.
    kill = _ended(RESEARCH, "service", Answer(None, "RemoteDisconnected"), [], point="step")
    assert kill.problems and "wrote no record" in kill.problems[0]


def test_summary_rows_fail_on_any_problem_or_a_missing_kill():
    ok = Kill("service", "step", "general", ended="connection lost, then 404")
    bad = Kill("service", "idle", "general", problems=["leak"])
    rows = summarize([ok], 1, [GENERAL])
    assert rows[0].ok and rows[0].done.startswith("kill -9 camg-general x1")
    assert not summarize([ok, bad], 2, [GENERAL])[0].ok
    assert not summarize([ok], 2, [GENERAL])[0].ok
    grader = summarize([Kill("grader", "grading", "general")], 1, [GENERAL])[0]
    assert "task container" in grader.done



def test_a_finish_recorded_before_its_reply_was_cut_keeps_the_graded_reward_only():
    # Found by the full storm: camg-general's master killed while the finish's
    # reply was on its way; the record (fsync'd before the reply) says 1.0.
    graded = {"episode_id": "e1", "reward": 1.0, "failure_class": None}
    kill = _ended(GENERAL, "service", Answer(None, "RemoteDisconnected"), [graded])
    assert not kill.problems and kill.ended.endswith("recorded as graded undisturbed")
    zero = {"episode_id": "e1", "reward": 0.0, "failure_class": None}
    kill = _ended(GENERAL, "service", Answer(None, "RemoteDisconnected"), [zero])
    assert kill.problems and "reward 0.0" in kill.problems[0]
    kill = _ended(GENERAL, "service", Answer(None, "RemoteDisconnected"), [graded], point="step")
    assert kill.problems


def test_a_kill_that_lands_after_repeats_is_no_problem_one_that_never_lands_is(monkeypatch):
    # Found by the full storm: a grader killed on the sixth try was reported
    # as "exited before the kill 5 times".
    from devtools.reliability import killstorm

    def run(misses: int) -> Kill:
        tries = iter([1] * misses + [0])
        monkeypatch.setattr(killstorm.Storm, "settle", lambda self: None)
        monkeypatch.setattr(killstorm.Storm, "kill", lambda self, target, env, point: Kill(
            target, point, env.name, missed=next(tries, 1)))
        _rows, kills = killstorm.storm(ScriptedGuest({}, []), [CODING], 1, only={("grader", "coding")})
        return kills[0]

    landed = run(5)
    assert landed.missed == 5 and not landed.problems
    never = run(killstorm.MAX_REPEATS + 5)
    assert never.missed == killstorm.MAX_REPEATS and never.problems


class ForkGuest(ScriptedGuest):
    """A scripted guest whose dockerd holds the images ``left``."""

    def __init__(self, answers, records, left=()) -> None:
        super().__init__(answers, records)
        self.left = set(left)

    def images(self, *labels):
        return set(self.left)


def test_forks_live_at_a_service_kill_are_recorded_and_their_images_gone(monkeypatch):
    from devtools.reliability import killstorm_forks
    monkeypatch.setattr(killstorm_forks, "RECLAIM_S", 0.0)
    chain = {("POST", "/episodes/e1/fork"): Answer(201, {"episode_id": "c1", "forked_from": "e1"}),
             ("POST", "/episodes/c1/fork"): Answer(201, {"episode_id": "c2", "forked_from": "c1"})}
    recovered = [{"episode_id": c, "reward": None, "failure_class": "infra", "recovered": True,
                  "forked_from": p} for c, p in (("c1", "e1"), ("c2", "c1"))]
    storm = Storm(ForkGuest(chain, recovered), [GENERAL], random.Random(0))
    kill = Kill("service", "idle", "general")
    made = killstorm_forks.fork_chain(storm, GENERAL, "e1", kill)
    assert made == [("c1", "e1"), ("c2", "c1")] and kill.forked == 2
    killstorm_forks.check_lost(storm, GENERAL, kill, made)
    assert not kill.problems, kill.problems
    # a fork the recovery forgot, or whose snapshot image stayed, is a problem
    storm = Storm(ForkGuest(chain, recovered[:1], left={"sha256:abc"}), [GENERAL], random.Random(0))
    kill = Kill("service", "idle", "general")
    killstorm_forks.check_lost(storm, GENERAL, kill, made)
    assert any("no record" in p for p in kill.problems)
    assert any("snapshot images" in p for p in kill.problems)


def test_a_full_service_ends_the_fork_chain_without_a_problem():
    # the demo's capacity 2 holds the parent and one child; the grandchild's 429 is right
    from devtools.reliability import killstorm_forks
    chain = {("POST", "/episodes/e1/fork"): Answer(201, {"episode_id": "c1", "forked_from": "e1"}),
             ("POST", "/episodes/c1/fork"): Answer(429, {"error": "at_capacity",
                                                         "details": {"retry_after": 5}})}
    storm = Storm(ScriptedGuest(chain, []), [SHOP], random.Random(0))
    kill = Kill("service", "idle", "shop", ended="idle, then 404; recorded None infra")
    assert killstorm_forks.fork_chain(storm, SHOP, "e1", kill) == [("c1", "e1")]
    assert not kill.problems and kill.forked == 1 and kill.fork_full
    row = summarize([kill], 1, [SHOP])[0]
    assert row.ok and "reached capacity (429) at 1 kill(s)" in row.counted
    # any other 429 (a queue bound, a rate limit) is still a problem
    storm = Storm(ScriptedGuest({("POST", "/episodes/e1/fork"): Answer(429, {"error": "x"})}, []),
                  [SHOP], random.Random(0))
    kill = Kill("service", "idle", "shop")
    assert killstorm_forks.fork_chain(storm, SHOP, "e1", kill) == []
    assert kill.problems and "429" in kill.problems[0]


def test_an_environment_refusing_forks_is_skipped_by_name_a_503_is_a_problem():
    from devtools.reliability import killstorm_forks
    refused = Answer(409, {"error": "not_forkable", "details": {"what": "environment"}})
    storm = Storm(ScriptedGuest({("POST", "/episodes/e1/fork"): refused}, []), [SHOP],
                  random.Random(0))
    kill = Kill("service", "idle", "shop", ended="idle, then 404; recorded None infra")
    assert killstorm_forks.fork_chain(storm, SHOP, "e1", kill) == []
    assert not kill.problems and kill.unforkable == "environment"
    row = summarize([kill], 1, [SHOP])[0]
    assert row.ok and "forks skipped: not_forkable (environment)" in row.counted
    infra = Answer(503, {"error": "infra_failure", "failure_class": "infra"})
    storm = Storm(ScriptedGuest({("POST", "/episodes/e1/fork"): infra}, []), [SHOP],
                  random.Random(0))
    kill = Kill("service", "idle", "shop")
    assert killstorm_forks.fork_chain(storm, SHOP, "e1", kill) == []
    assert kill.problems and "503" in kill.problems[0]
    assert not summarize([kill], 1, [SHOP])[0].ok


def test_a_services_first_kill_comes_past_its_reset_so_forks_are_live():
    for seed in range(20):
        work = plan([CODING, SHOP, GENERAL], 1, random.Random(seed))
        assert all(p != "reset" for t, _, p in work if t == "service")
