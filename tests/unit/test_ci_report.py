"""packaging/ci_report.py: the end of a CI run names what broke (CI may keep
only the end of the output) and fails on any failure or error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ci_report", ROOT / "packaging" / "ci_report.py")
ci_report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ci_report)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_a" name="test_ok" time="1.5"/>
<testcase classname="tests.unit.test_a" name="test_bad" time="0.2">
  <failure message="AssertionError: 1 != 2&#10;second line">trace</failure></testcase>
<testcase classname="tests.privileged.test_b" name="test_leaky" time="3.0">
  <error message="failed on teardown with &quot;left behind: mount /x&quot;">trace</error></testcase>
<testcase classname="tests.unit.test_a" name="test_skip" time="0"><skipped message="no"/></testcase>
</testsuite></testsuites>
"""


def test_failures_and_errors_are_named_with_their_first_line(tmp_path, capsys):
    report = tmp_path / "lane.xml"
    report.write_text(JUNIT)
    assert ci_report.main([f"lane={report}:12"]) == 1
    out = capsys.readouterr().out
    assert "2 failed or errored" in out
    assert "[lane] FAILED tests.unit.test_a::test_bad: AssertionError: 1 != 2\n" in out
    assert '[lane] ERROR tests.privileged.test_b::test_leaky: failed on teardown with "left behind: mount /x"' in out
    assert out.rstrip().endswith("1 passed, 2 failed, 1 skipped")


def test_a_clean_run_passes_and_a_missing_report_fails(tmp_path, capsys):
    report = tmp_path / "lane.xml"
    report.write_text(JUNIT.split("<testcase classname=\"tests.unit.test_a\" name=\"test_bad\"")[0]
                      + "</testsuite></testsuites>")
    assert ci_report.main([f"lane={report}"]) == 0
    assert "failed or errored" not in capsys.readouterr().out
    assert ci_report.main([f"lane={report}", f"gone={tmp_path / 'none.xml'}"]) == 1
    assert f"[gone] {tmp_path / 'none.xml'}: no report" in capsys.readouterr().out
