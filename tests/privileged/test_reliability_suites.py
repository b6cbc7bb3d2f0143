"""CI's short run of each reliability suite (tools/reliability; the full run
is ``python -m tools.reliability --full``, see packaging/README.md).

Each test runs one suite on its own rig, prints the table, and requires no
FAIL row and a row for every registered environment (run, or not run with
the reason).
"""

from __future__ import annotations

import pytest

from camg import plugins
from tools.reliability import __main__ as reliability
from tools.reliability.table import render


def _run(suite: str, **sizes):
    rows = reliability.run((suite,), None, dict(reliability.SHORT, **sizes))
    print("\n" + render(rows))
    failed = [r for r in rows if r.ok is False]
    assert not failed, render(failed)
    return rows


def test_escape_battery_blocks_every_probe():
    rows = _run("escape")
    [row] = [r for r in rows if r.suite == "escape"]
    blocked, total = row.counted.split(" ")[0].split("/")
    assert int(total) >= 30 and blocked == total


@pytest.mark.parametrize("suite", ["churn", "fuzz", "load"])
def test_suite_covers_every_environment_without_failures(suite):
    rows = _run(suite)
    covered = {r.environment for r in rows if r.suite == suite}
    assert {"sandbox", *plugins.all_plugins()} <= covered
    assert any(r.ok for r in rows if r.suite == suite and r.environment == "sandbox")
