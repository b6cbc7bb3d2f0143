"""Run the reliability suites and print one table.

    sudo .venv/bin/python -m devtools.reliability [--full] [--suites churn,escape,fuzz,load]
        [--environments sandbox,coding,...] [--json OUT]

Short by default (what CI runs through tests/privileged/test_reliability_suites.py):
6 churn episodes per environment, the whole escape batteries (a sandbox, a
General container), 300 helper frames, 100 malformed files per kind,
schemathesis with 5 examples per operation, 8 concurrent episodes
stepping for 2 s; AutoResearch runs 3 episodes, 3 examples and 4 at once,
General and Visual 3, 2 and 2. ``--full``: 1000 churn episodes per
environment, 5000 frames, 1000 files per kind, 100 examples (General 20,
Visual 30: their recipes' Target.full), 256 concurrent episodes for 60 s
(at most Target.load_max), 20 kills per storm target. ``--list``: the
targets and the sizes each would run (no root needed).
A size given as an option holds for every target. Needs root (real
sandboxes). Every environment registered in camg.plugins gets a row, run
by the recipe its plugin names (``reliability``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from devtools.reliability import churn, escape, escape_container, fuzz, killstorm_report, load
from devtools.reliability.rig import CACHE, TMP_PREFIX, Helper, containers, fork_images
from devtools.reliability.service import Prepared
from devtools.reliability.table import Row, render
from devtools.reliability.targets import all_targets

# The run's sizes; a target's own (Target.short / Target.full: its plugin's
# recipe) replace them for it.
SHORT = {"churn": 6, "frames": 300, "files": 100, "examples": 5, "load": 8, "seconds": 2.0,
         "kills": 3, "budget": "short"}
FULL = {"churn": 1000, "frames": 5000, "files": 1000, "examples": 100, "load": 256,
        "seconds": 60.0, "kills": 20, "budget": "full"}
#: the sizes an option can set ("given": those set, which hold for every target)
SIZES = tuple(k for k in SHORT if k != "budget")


def target_sizes(target, sizes: dict) -> dict:
    """The run's sizes with the target's own for this run (its
    Target.short or Target.full), except where an option gave one."""
    own = getattr(target, sizes["budget"])
    return dict(sizes, **{k: v for k, v in own.items() if k not in sizes.get("given", ())})
# killstorm installs the demo under systemd in nspawn and storms it (tests/system/test_newcomer.py)
SUITES = ("escape", "fuzz", "churn", "load", "killstorm")


def note(text: str) -> None:
    print(f"[reliability {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run(suites: tuple[str, ...], names: set[str] | None, sizes: dict) -> list[Row]:
    targets = [t for t in all_targets() if names is None or t.name in names]
    roots = {str(CACHE / "helper")}
    for t in targets:
        if not t.missing:
            try:
                roots.update(t.lower_roots())
            except Exception as exc:  # its caches cannot even be located
                t.missing = f"lower roots unavailable: {exc}"
    rows: list[Row] = []
    work = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}work-"))
    work.chmod(0o755)
    note("starting the rig's helper (isolation probes)")
    helper = Helper(sorted(roots))
    try:
        if "escape" in suites:
            note("escape battery")
            row, detail = escape.run(helper)
            rows.append(row)
            print(escape.print_detail(detail), flush=True)
        if "fuzz" in suites:
            note("fuzz: helper socket, files")
            rows.append(_guard("fuzz", "helper", lambda: fuzz.helper_socket(helper, sizes["frames"])))
            rows.append(_guard("fuzz", "files", lambda: fuzz.files(sizes["files"])))
        for target in targets:
            rows += _target(target, helper, work, suites, sizes)
        if "killstorm" in suites:
            note("kill storms under systemd in nspawn")
            # its own machine and helpers; the shared machine's test lock is
            # held only while it runs (this runner does not hold it)
            rows += killstorm_report.rows(kills=sizes["kills"], lock=os.environ.get("CAMG_TEST_LOCK"))
        leftover = helper.census()
        rows.append(Row("census", "helper", "after every suite",
                        ", ".join(f"{k} {v}" for k, v in leftover.items()),
                        not any(leftover.values())))
    finally:
        helper.stop()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _target(target, helper: Helper, work: Path, suites, sizes) -> list[Row]:
    wanted = [s for s in ("churn", "fuzz", "load") if s in suites]
    if target.container_escape and "escape" in suites:
        wanted.insert(0, "escape")
    if not wanted:  # e.g. --suites killstorm: nothing to prepare
        return []
    if target.missing:
        return [Row(s, target.name, "-", target.missing, None) for s in wanted]
    note(f"{target.name}: preparing")
    rig = own = None
    try:
        if target.rig is not None:
            # Its own helper (private roots, containers), built from its rig.
            rig = target.rig(work / target.name / "rig", helper.socket)
            extra = dict(rig.helper)
            own = Helper(extra.pop("lower_roots"), extra=extra)
        prepared = Prepared(target, own or helper, work / target.name, rig)
    except Exception as exc:
        traceback.print_exc()
        if own is not None:
            own.stop()
        if rig is not None:
            rig.close()
        return [Row(s, target.name, "-", f"preparation failed: {type(exc).__name__}: {exc}"[:300],
                    None) for s in wanted]
    try:
        rows = _suites(prepared, wanted, sizes)
        if own is not None:
            rows.append(_census(own, target.name))
    finally:
        if own is not None:
            own.stop()
        if rig is not None:
            rig.close()
    return rows


def _census(own: Helper, name: str) -> Row:
    """A target's own helper, after its suites: nothing held; and once the
    helper stopped, no container or fork snapshot image of its scope left
    in dockerd."""
    left = own.census()
    own.stop()
    left["containers after stop"] = containers(own.scope) if own.scope else 0
    left["fork images after stop"] = fork_images(own.scope) if own.scope else 0
    return Row("census", name, "its own helper, after its suites",
               ", ".join(f"{k} {v}" for k, v in left.items()), not any(left.values()))


def _suites(prepared: Prepared, wanted: list[str], sizes: dict) -> list[Row]:
    target = prepared.target
    # CI's short run asks fewer episodes of the expensive targets
    sizes = target_sizes(target, sizes)
    rows = []
    if "escape" in wanted:
        note(f"{target.name}: escape battery inside one of its containers")

        def battery() -> Row:
            row, detail = escape_container.run(prepared.helper, prepared.rig.images[0])
            print(escape.print_detail(detail), flush=True)
            return row
        rows.append(_guard("escape", target.name, battery))
    if "churn" in wanted:
        note(f"{target.name}: churn x{sizes['churn']}")
        rows.append(_guard("churn", target.name, lambda: churn.run(prepared, sizes["churn"])))
    if "fuzz" in wanted:
        note(f"{target.name}: schemathesis")

        def http() -> Row:
            with prepared.serve(capacity=16, limits={"idle_ttl_s": 5, "max_steps": 8}) as svc:
                return fuzz.http(svc, target.name, sizes["examples"])
        rows.append(_guard("fuzz", target.name, http))
    if "load" in wanted:
        n = min(sizes["load"], target.load_max or sizes["load"])
        note(f"{target.name}: load {n} x {sizes['seconds']} s")
        rows.append(_guard("load", target.name,
                           lambda: load.run(prepared, n, sizes["seconds"], asked=sizes["load"])))
    return rows


def _guard(suite: str, env: str, fn) -> Row:
    try:
        return fn()
    except Exception as exc:
        traceback.print_exc()
        return Row(suite, env, "-", f"crashed: {type(exc).__name__}: {exc}"[:300], False)


def main(argv: list[str] | None = None) -> int:
    import logging
    logging.getLogger("httpx").setLevel(logging.WARNING)
    ap = argparse.ArgumentParser(prog="python -m devtools.reliability", description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the full sizes (long)")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--environments", help="comma-separated (default: sandbox + every plugin)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--list", action="store_true",
                    help="print the targets and the sizes each would run, and exit")
    for key in SIZES:
        ap.add_argument(f"--{key}", type=type(SHORT[key]), help=f"override the {key} size")
    args = ap.parse_args(argv)
    sizes = dict(FULL if args.full else SHORT)
    given = {k: getattr(args, k) for k in SIZES if getattr(args, k) is not None}
    # a size given on the command line holds for every target
    sizes.update(given, given=tuple(given))
    if args.list:
        for t in all_targets():
            own = target_sizes(t, sizes)
            own["load"] = min(own["load"], t.load_max or own["load"])
            print(t.name, t.missing or " ".join(f"{k}={own[k]}" for k in SIZES))
        return 0
    if os.geteuid() != 0:
        print("the reliability suites need root (real sandboxes)", file=sys.stderr)
        return 2
    suites = tuple(s for s in args.suites.split(",") if s)
    unknown = set(suites) - set(SUITES)
    if unknown:
        ap.error(f"unknown suite(s): {', '.join(sorted(unknown))}")
    names = set(args.environments.split(",")) if args.environments else None
    started = time.monotonic()
    rows = run(suites, names, sizes)
    print(render(rows))
    print(f"({'full' if args.full else 'short'} run, {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) | {"result": r.result} for r in rows],
                                        indent=1) + "\n")
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
