"""packaging/split_tests.py: run-tests.sh's lanes hold every module of
every tier exactly once, balanced by recorded time, the same way every
time; the system tier's shared-guest modules stay together; an unknown
module still runs."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "packaging"))
import split_tests  # noqa: E402


def _lane(lanes: int, lane: int, tier: str) -> list[str]:
    return subprocess.run([sys.executable, str(REPO / "packaging" / "split_tests.py"),
                           "--lanes", str(lanes), "--lane", str(lane), "--tier", tier],
                          capture_output=True, text=True, check=True).stdout.split()


def test_every_module_of_every_tier_in_exactly_one_lane():
    for tier in split_tests.TIERS:
        names = split_tests.modules(REPO / "tests" / tier)
        dealt = [Path(p).name for i in range(4) for p in _lane(4, i, tier)]
        assert sorted(dealt) == names and len(dealt) == len(set(dealt)), tier
    lanes, loads = split_tests.plan(4)
    assert all(lanes) and len(loads) == 4


def test_the_system_modules_sharing_a_guest_stay_in_one_lane():
    lanes, _ = split_tests.plan(6)
    holding = {i for i, lane in enumerate(lanes) for tier, name in lane
               if tier == "system" and name not in split_tests.STANDALONE["system"]}
    assert len(holding) == 1


def test_deal_balances_by_time_and_weighs_the_unknown_as_the_median():
    known = {"test_a.py": 100.0, "test_b.py": 60.0, "test_c.py": 40.0, "test_d.py": 10.0}
    halves = split_tests.deal([*known, "test_new.py"], known, 2)
    assert halves == [["test_a.py", "test_c.py"], ["test_b.py", "test_d.py", "test_new.py"]]
    assert split_tests.deal(list(known), known, 2) == split_tests.deal(list(reversed(known)), known, 2)


def test_a_plan_over_tiers_groups_shared_fixtures_and_balances(tmp_path):
    for tier, names in (("system", {"test_newcomer.py": 600, "test_units.py": 100,
                                    "test_shop.py": 100}),
                        ("privileged", {"test_p.py": 500, "test_q.py": 50}),
                        ("unit", {"test_u.py": 300, "test_v.py": 10})):
        (tmp_path / tier).mkdir()
        for name in names:
            (tmp_path / tier / name).write_text("")
        (tmp_path / tier / split_tests.DURATIONS).write_text(json.dumps(names))
    lanes, loads = split_tests.plan(3, tmp_path)
    assert loads == [600, 550, 510]
    together = [lane for lane in lanes if ("system", "test_units.py") in lane]
    assert len(together) == 1 and ("system", "test_shop.py") in together[0]
    # within a lane the tiers run system, privileged, unit
    for lane in lanes:
        order = [split_tests.TIERS.index(t) for t, _ in lane]
        assert order == sorted(order)


def test_record_sums_seconds_per_module_per_tier(tmp_path):
    for tier in split_tests.TIERS:
        (tmp_path / tier).mkdir()
    (tmp_path / "unit" / "test_x.py").write_text("")
    (tmp_path / "unit" / "test_y.py").write_text("")
    (tmp_path / "privileged" / "test_p.py").write_text("")
    (tmp_path / "system" / split_tests.DURATIONS).write_text('{"test_s.py": 9}')
    junit = tmp_path / "u.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase classname="tests.unit.test_x" name="a" time="1.5"/>'
                     '<testcase classname="tests.unit.test_x.TestK" name="b" time="2"/>'
                     '<testcase classname="tests.unit.test_y" name="c" time="0.25"/>'
                     '<testcase classname="tests.privileged.test_p" name="d" time="7"/>'
                     '</testsuite></testsuites>')
    assert split_tests.main(["--record", str(junit), "--tests", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "unit" / split_tests.DURATIONS).read_text()) == {
        "test_x.py": 3.5, "test_y.py": 0.2}
    assert json.loads((tmp_path / "privileged" / split_tests.DURATIONS).read_text()) == {
        "test_p.py": 7.0}
    # a tier the files did not run keeps what it had
    assert json.loads((tmp_path / "system" / split_tests.DURATIONS).read_text()) == {
        "test_s.py": 9}
