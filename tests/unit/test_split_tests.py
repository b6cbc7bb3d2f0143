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
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "packaging" / "split_tests.py"),
            "--lanes",
            str(lanes),
            "--lane",
            str(lane),
            "--tier",
            tier,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_every_module_of_every_tier_in_exactly_one_lane():
    for tier in split_tests.TIERS:
        names = split_tests.modules(REPO / "tests" / tier)
        dealt = [Path(p).name for i in range(4) for p in _lane(4, i, tier)]
        assert len(dealt) == len(set(dealt)), tier
        whole = {d for d in dealt if "::" not in d}
        by_test = {d.split("::")[0] for d in dealt if "::" in d}
        assert not whole & by_test and sorted(whole | by_test) == names, tier
        for name in by_test:  # a module dealt by test is dealt whole, test by test
            tests = {d.split("::")[1] for d in dealt if d.startswith(f"{name}::")}
            assert tests == set(split_tests.test_names(REPO / "tests" / tier / name))
    lanes, loads = split_tests.plan(4)
    assert all(lanes) and len(loads) == 4


def test_the_system_modules_sharing_a_guest_stay_in_one_lane():
    lanes, _ = split_tests.plan(6)
    holding = {
        i
        for i, lane in enumerate(lanes)
        for tier, name in lane
        if tier == "system" and name not in split_tests.STANDALONE["system"]
    }
    assert len(holding) == 1


def test_deal_balances_by_time_and_weighs_the_unknown_as_the_median():
    known = {"test_a.py": 100.0, "test_b.py": 60.0, "test_c.py": 40.0, "test_d.py": 10.0}
    halves = split_tests.deal([*known, "test_new.py"], known, 2)
    assert halves == [["test_a.py", "test_c.py"], ["test_b.py", "test_d.py", "test_new.py"]]
    again = split_tests.deal(list(reversed(known)), known, 2)
    assert split_tests.deal(list(known), known, 2) == again


def test_a_plan_over_tiers_groups_shared_fixtures_and_balances(tmp_path):
    for tier, names in (
        ("system", {"test_newcomer.py": 600, "test_units.py": 100, "test_shop.py": 100}),
        ("privileged", {"test_p.py": 500, "test_q.py": 50}),
        ("unit", {"test_u.py": 300, "test_v.py": 10}),
    ):
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
    junit.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.unit.test_x" name="a" time="1.5"/>'
        '<testcase classname="tests.unit.test_x.TestK" name="b" time="2"/>'
        '<testcase classname="tests.unit.test_y" name="c" time="0.25"/>'
        '<testcase classname="tests.privileged.test_p" name="d" time="7"/>'
        "</testsuite></testsuites>"
    )
    assert split_tests.main(["--record", str(junit), "--tests", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "unit" / split_tests.DURATIONS).read_text()) == {
        "test_x.py": 3.5,
        "test_y.py": 0.2,
    }
    assert json.loads((tmp_path / "privileged" / split_tests.DURATIONS).read_text()) == {
        "test_p.py": 7.0
    }
    # a tier the files did not run keeps what it had
    assert json.loads((tmp_path / "system" / split_tests.DURATIONS).read_text()) == {"test_s.py": 9}


def test_light_modules_are_those_under_the_bound(tmp_path):
    for name in ("test_a.py", "test_b.py", "test_c.py", "test_new.py"):
        (tmp_path / name).write_text("")
    (tmp_path / split_tests.DURATIONS).write_text(
        json.dumps({"test_a.py": 100.0, "test_b.py": 3.0, "test_c.py": 5.0})
    )
    # the unknown module weighs the median (5.0): under 6, not under 5
    assert split_tests.light(tmp_path, 6) == ["test_b.py", "test_c.py", "test_new.py"]
    assert split_tests.light(tmp_path, 5) == ["test_b.py"]


def test_a_long_module_is_dealt_by_test_and_every_test_is_dealt(tmp_path):
    for tier in split_tests.TIERS:
        (tmp_path / tier).mkdir()
    (tmp_path / "privileged" / "test_long.py").write_text(
        "import pytest\n\n\ndef test_a():\n    pass\n\n\n@pytest.mark.parametrize('x', [1, 2])\n"
        "def test_b(x):\n    pass\n\n\ndef test_new():\n    pass\n\n\nclass TestC:\n"
        "    def test_d(self):\n        pass\n\n\ndef helper():\n    pass\n"
    )
    (tmp_path / "privileged" / "test_short.py").write_text("def test_e():\n    pass\n")
    (tmp_path / "privileged" / split_tests.DURATIONS).write_text(
        json.dumps(
            {
                "test_long.py": 400.0,
                "test_long.py::test_a": 250.0,
                "test_long.py::test_b": 100.0,
                "test_long.py::TestC": 50.0,
                "test_short.py": 30.0,
            }
        )
    )
    lanes, loads = split_tests.plan(2, tmp_path)
    dealt = sorted(name for lane in lanes for _, name in lane)
    assert dealt == [
        "test_long.py::TestC",
        "test_long.py::test_a",
        "test_long.py::test_b",
        "test_long.py::test_new",
        "test_short.py",
    ]
    # the unrecorded test weighs the module's mean per test (400 / 4)
    assert sorted(loads) == [250.0, 280.0]


def test_record_keeps_per_test_times_of_long_modules_only(tmp_path):
    for tier in split_tests.TIERS:
        (tmp_path / tier).mkdir()
    (tmp_path / "privileged" / "test_long.py").write_text("")
    (tmp_path / "privileged" / "test_short.py").write_text("")
    over = split_tests.SPLIT_OVER
    junit = tmp_path / "p.xml"
    long = 'classname="tests.privileged.test_long"'
    junit.write_text(
        "<testsuites><testsuite>"
        f'<testcase {long} name="test_a[1]" time="{over}"/>'
        '<testcase classname="tests.privileged.test_long" name="test_a[2]" time="1"/>'
        '<testcase classname="tests.privileged.test_short" name="test_b" time="2"/>'
        "</testsuite></testsuites>"
    )
    got = split_tests.record([junit], tmp_path)["privileged"]
    assert got == {"test_long.py": over + 1, "test_long.py::test_a": over + 1, "test_short.py": 2.0}


def test_a_module_whose_time_is_its_fixture_stays_whole(tmp_path):
    for tier in split_tests.TIERS:
        (tmp_path / tier).mkdir()
    tests = "def test_a():\n    pass\n\n\ndef test_b():\n    pass\n"
    (tmp_path / "privileged" / "test_split.py").write_text(tests)
    (tmp_path / "privileged" / "test_whole.py").write_text("SPLIT_BY_TEST = False\n" + tests)
    over = split_tests.SPLIT_OVER * 2
    (tmp_path / "privileged" / split_tests.DURATIONS).write_text(
        json.dumps({"test_split.py": over, "test_whole.py": over})
    )
    lanes, _ = split_tests.plan(3, tmp_path)
    dealt = sorted(name for lane in lanes for _, name in lane)
    assert dealt == ["test_split.py::test_a", "test_split.py::test_b", "test_whole.py"]
