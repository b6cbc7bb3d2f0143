"""packaging/split_tests.py: the unit tier's two halves (run-tests.sh) hold
every module exactly once, balanced by recorded time, the same way every
time; an unknown module still runs."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "packaging"))
import split_tests  # noqa: E402


def test_every_module_in_exactly_one_shard():
    names = split_tests.modules(REPO / "tests" / "unit")
    shards = [subprocess.run([sys.executable, str(REPO / "packaging" / "split_tests.py"), "2", str(i),
                              str(REPO / "tests" / "unit")], capture_output=True, text=True, check=True)
              .stdout.split() for i in (0, 1)]
    dealt = [Path(p).name for shard in shards for p in shard]
    assert sorted(dealt) == names and len(dealt) == len(set(dealt))
    assert all(shards)


def test_deal_balances_by_time_and_weighs_the_unknown_as_the_median():
    known = {"test_a.py": 100.0, "test_b.py": 60.0, "test_c.py": 40.0, "test_d.py": 10.0}
    halves = split_tests.deal([*known, "test_new.py"], known, 2)
    assert halves == [["test_a.py", "test_c.py"], ["test_b.py", "test_d.py", "test_new.py"]]
    assert split_tests.deal(list(known), known, 2) == split_tests.deal(list(reversed(known)), known, 2)


def test_record_sums_seconds_per_module(tmp_path):
    (tmp_path / "test_x.py").write_text("")
    (tmp_path / "test_y.py").write_text("")
    junit = tmp_path / "u.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase classname="tests.unit.test_x" name="a" time="1.5"/>'
                     '<testcase classname="tests.unit.test_x.TestK" name="b" time="2"/>'
                     '<testcase classname="tests.unit.test_y" name="c" time="0.25"/>'
                     '</testsuite></testsuites>')
    assert split_tests.main(["--record", str(junit), str(tmp_path)]) == 0
    assert json.loads((tmp_path / split_tests.DURATIONS).read_text()) == {"test_x.py": 3.5, "test_y.py": 0.2}
