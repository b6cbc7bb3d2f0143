"""CI's short run of each reliability suite (devtools/reliability; the full run
is ``python -m devtools.reliability --full``, see packaging/README.md).

One run of the escape, fuzz, churn and load suites over every target (one
preparation and one helper each, shared by the suites: cheaper than a run
per suite), printed as the table; each test then requires no FAIL row of
its suite and a row for every registered environment (run, or not run with
the reason). The Docker-backed and AutoResearch targets run a few episodes
each (their recipe's Target.short). The run must leave no temporary directory of its
own behind (the fuzz suite once left /tmp/camg-rel-fuzz-* after every run).
"""

from __future__ import annotations

import os
import tempfile

import pytest

import conftest as pc
from camg import plugins
from devtools.reliability import __main__ as reliability
from devtools.reliability.rig import TMP_PREFIX
from devtools.reliability.table import render

SUITES = ("escape", "fuzz", "churn", "load")
#: every test reads the one run of the module's fixture: dealt test by test
#: to several lanes (packaging/split_tests.py), each lane would run it again
SPLIT_BY_TEST = False


def _ours() -> set[str]:
    """This run's temporaries in the temporary directory (TMP_PREFIX holds
    our pid: a parallel run's are not ours)."""
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(TMP_PREFIX)}


@pytest.fixture(scope="module")
def rows():
    """The run, with the privileged leak check around all of it (the
    autouse one sees only each test's body) and the temporaries."""
    before, temps = pc.WATCH.snapshot(), _ours()
    rows = reliability.run(SUITES, None, dict(reliability.SHORT))
    print("\n" + render(rows))
    left = pc.WATCH.settled_leaks(before, settle=10)
    return rows, left + sorted(_ours() - temps)


def test_runs_leave_nothing_behind(rows):
    _, left = rows
    assert not left, f"left behind (temporaries in {tempfile.gettempdir()}): {left}"


def test_census_of_every_helper_is_empty(rows):
    found, _ = rows
    census = [r for r in found if r.suite == "census"]
    assert census and all(r.ok for r in census), render(census)


def test_escape_batteries_block_every_probe(rows):
    found, _ = rows
    batteries = {r.environment: r for r in found if r.suite == "escape"}
    assert set(batteries) >= {"sandbox", "general"}, render(found)
    for row in batteries.values():
        blocked, total = row.counted.split(" ")[0].split("/")
        assert int(total) >= 30 and blocked == total, render([row])


@pytest.mark.parametrize("suite", ["churn", "fuzz", "load"])
def test_suite_covers_every_environment_without_failures(rows, suite):
    found, _ = rows
    mine = [r for r in found if r.suite == suite]
    failed = [r for r in mine if r.ok is False]
    assert not failed, render(failed)
    assert {"sandbox", *plugins.all_plugins()} <= {r.environment for r in mine}
    # every environment of this checkout has a recipe: none is "not run"
    assert all(r.ok for r in mine), render([r for r in mine if not r.ok])
    if suite == "fuzz":
        assert {r.environment for r in mine} >= {"helper", "files"}
