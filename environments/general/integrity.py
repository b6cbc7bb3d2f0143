"""Tamper screen of General's opensource-code grade (the service's half).

The transport (mimoagent.transport.verifier_guard, root in the container)
kills the agent's processes, restores the pristine ``.git``, gives the
verifier a clean HOME/TMP and records what the agent changed in the
repository -- walked against a setup-time snapshot, so nothing the agent did
to git hides a change -- in ``/logs/verifier/changes.json``. This module
reads that record and screens it with the rules Coding uses
(camg.grading.tamper_rules). The transport puts every test, test-support and
pytest configuration file back to the base before the run (Coding's
protected paths: verifier_guard.is_test_support), after taking this record,
so what the agent did to them still shows its intent and is screened as such:

* test-patch paths (reset before the run): hook implementations only;
* ``conftest.py`` anywhere: hooks, and payloads (exit, signals, exec, the
  import machinery) a fixture file has no use for;
* other test files: hooks;
* pytest configuration (pytest.ini, tox.ini, setup.cfg, pyproject.toml):
  lines that set what runs or what it reports, and a new pytest.ini anywhere;
* ``.gitattributes``: any rule (filters and conversions apply to the test
  patch as git writes it);
* everything else: the runner's internals;
* every path: start-up hooks, package metadata, shadowing of the runner or
  of the standard library, links out of the repository.

A content the transport withheld (too large, binary) of a file the runner
reads (conftest, configuration, a start-up hook) is a finding too: it
cannot be shown harmless.

The screen sees only what a line says; a payload that builds its names at
run time passes it. So the verifier's test command also runs under camg's
pytest guard (the one Coding's grader runs: camg/grading/guard/camg_guard.py), and
``guard_findings`` holds its signed channel (``/logs/verifier/guard.json``)
against the command's exit status and log with camg.grading.guard_verdict: a 0 exit
with a test the guard saw fail, a session that did not end or ended non-zero,
a pass line the guard never saw, an unsigned line, the guard's own evidence
(the reporting path patched, hooks from the agent's files). A command whose
runner never reported to the guard gives no grade (GraderError: reward
null), unless preparation marked the task as one the guard cannot cover
(``test_guard.covered: false``, listed in /metadata). Any finding: reward
0.0, ``tampered``, the rule and the evidence in the outcome record.

``suspicions`` runs the code screen Coding runs (camg.grading.code_screen) over the
added lines of the changed Python the verifier runs (not tests, conftest or
configuration, which the transport restores or the tamper rules cover):
capabilities a fix does not need. Its findings alone make the grade
``suspicious``, with the rule and line in the evidence; the reward is then
at most the deployment's ``suspicious_reward`` (0.0 by default).
"""

from __future__ import annotations

import fnmatch
import io
import json
import re
import tarfile
from collections.abc import Iterable, Sequence

from camg import errors
from camg.grading import code_screen, guard_verdict, tamper_rules
from camg.grading.tamper_rules import Finding

CHANGES = "/logs/verifier/changes.json"
GUARD = "/logs/verifier/guard.json"
#: the verifier's timeout exit (seed 001): a run cut short is 0.0, whatever it reported
TIMEOUT_EXIT = 124
_TEST_GLOBS = ("test_*.py", "*_test.py", "tests.py")
_TEST_DIRS = {"tests", "test", "testing"}


def _read_json(tar_bytes: bytes, name: str) -> dict | None:
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.rsplit("/", 1)[-1] == name:
                    handle = tar.extractfile(member)
                    record = json.loads(handle.read()) if handle else None
                    return record if isinstance(record, dict) else None
    except (tarfile.TarError, ValueError) as exc:
        raise errors.GraderError(f"the verifier's {name} is unreadable: {exc}") from None
    return None


def read_changes(tar_bytes: bytes) -> dict:
    """changes.json out of the tar of it; GraderError when absent or bad."""
    record = _read_json(tar_bytes, "changes.json")
    if record is None or not isinstance(record.get("changes"), list):
        raise errors.GraderError("the verifier left no change record (changes.json)")
    return record


def read_guard(tar_bytes: bytes) -> dict:
    """guard.json (the test guard's channel, keys, exit status, log)."""
    record = _read_json(tar_bytes, "guard.json")
    if (
        record is None
        or not isinstance(record.get("channel"), str)
        or not guard_keys(record)
        or not isinstance(record.get("exit_code"), int)
    ):
        raise errors.GraderError("the verifier left no test guard record (guard.json)")
    return record


def guard_keys(record: dict) -> list[bytes]:
    """The grade's guard keys: ``keys`` (one per session, a few spare), or
    the one ``key`` of a record stored before keys were per session (a
    regrade reads those as they were made). Empty when neither is well formed."""
    keys = record.get("keys")
    if keys is None and isinstance(record.get("key"), str):
        # Then every session of the grade signed with the one key: as many
        # copies as a command could have run sessions, so each hello finds one.
        keys = [record["key"]] * 64
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        return []
    return [k.encode() for k in keys]


def guard_findings(record: dict) -> tuple[list[Finding], dict]:
    """The cross-check of the guard's channel against the command's exit
    status and log: (findings, what the guard saw). GraderError when the
    runner never reported (no guard, not pytest, not started)."""
    channel = guard_verdict.read_channel(record["channel"], guard_keys(record))
    code, log = record["exit_code"], str(record.get("log") or "")
    seen = {
        "sessions": len(channel.hello),
        "ended": len(channel.ends),
        "tests": len(channel.outcomes),
        "failed": sum(1 for o in channel.outcomes.values() if o == "failed"),
    }
    if not channel.hello:
        if code == TIMEOUT_EXIT:
            return [], seen
        raise errors.GraderError(
            f"the test command's runner never reported to the test guard "
            f"(exit {code}): {log[-1500:]}"
        )
    statuses = guard_verdict.status_map(log)
    listed = sorted(set(channel.outcomes) | set(statuses))
    findings = guard_verdict.cross_check(channel, statuses, listed, code, code == TIMEOUT_EXIT, log)
    findings += guard_verdict.exit_findings(channel, code)
    if record.get("channel_truncated") and code == 0:
        findings.append(Finding("channel_overflow", "-", "the guard's channel exceeded its bound"))
    unique = {json.dumps(f.to_data(), sort_keys=True): f for f in findings}
    return list(unique.values()), seen


def _is_test_file(parts: list[str]) -> bool:
    return any(p in _TEST_DIRS for p in parts[:-1]) or any(
        fnmatch.fnmatchcase(parts[-1], g) for g in _TEST_GLOBS
    )


def screen_change(item: dict, test_paths: set[str]) -> list[Finding]:
    path = str(item.get("path", ""))
    parts = [p for p in path.split("/") if p]
    if not parts or item.get("status") == "deleted":
        return []
    name = parts[-1]
    added = str(item.get("added") or "").splitlines()
    found = tamper_rules.path_rules(path, added) + tamper_rules.compiled_shadow_rules(path)
    if any(p.endswith(".egg-info") for p in parts[:-1]):
        # An honest `pip install -e .` or `setup.py develop` leaves one
        # (Coding drops them from its diff); only a pytest11 entry point in
        # it reaches the runner.
        found = [f for f in found if f.detail != "declares a distribution"]
    if item.get("kind") == "link":
        found += tamper_rules.symlink_rules(path, str(item.get("target", "")))
    if name in ("pytest.ini", ".pytest.ini") and path not in test_paths:
        found.append(Finding("runner_config", path, "a pytest.ini outside the test patch"))
    runner_reads = (
        name == "conftest.py"
        or name in tamper_rules.PYTEST_CONFIG_FILES
        or name == ".gitattributes"
        or name.endswith(".pth")
        or tamper_rules.module_name(name) in tamper_rules.RUNNER_MODULES
    )
    if item.get("withheld") and runner_reads:
        found.append(
            Finding("unscreened_runner_file", path, f"content not screenable ({item['withheld']})")
        )
    if path in test_paths:
        found += tamper_rules.content_rules(path, added, tamper_rules.HOOKS, "runner_hook_in_tests")
    elif name == "conftest.py":
        found += tamper_rules.content_rules(
            path, added, tamper_rules.HOOKS, "runner_hook_in_tests"
        ) or tamper_rules.content_rules(path, added, tamper_rules.CONFTEST, "conftest_payload")
    elif name in tamper_rules.PYTEST_CONFIG_FILES:
        found += tamper_rules.content_rules(
            path, added, tamper_rules.PYTEST_CONFIG, "runner_config"
        ) or tamper_rules.content_rules(path, added, tamper_rules.HOOKS, "runner_config")
    elif name == ".gitattributes":
        rules = [line for line in added if line.strip() and not line.lstrip().startswith("#")]
        if rules:
            found.append(Finding("git_attributes", path, f"adds: {rules[0].strip()}"))
    elif _is_test_file(parts):
        found += tamper_rules.content_rules(path, added, tamper_rules.HOOKS, "runner_hook_in_tests")
    else:
        found += _internals(path, added) + tamper_rules.always_equal_rules(path, added)
    return found


_PLAIN_IMPORT = re.compile(r"^\s*(?:import|from)\s+pytest\b")


def _internals(path: str, added: list[str]) -> list[Finding]:
    """Coding's runner-internals rule, except a plain ``import pytest``: here
    the agent's scratch scripts stay in the tree (Coding keeps only the diff
    of its fix), and one importing pytest to run a test is no tampering."""
    for line in added:
        for match in tamper_rules.INTERNALS.finditer(line):
            if (
                match.start() == 0
                and _PLAIN_IMPORT.match(line)
                and match.group(0).strip() in ("import pytest", "from pytest")
            ):
                continue
            return [Finding("runner_internals", path, f"{match.group(0)!r} in: {line.strip()}")]
    return []


def screen(record: dict, test_paths: Iterable[str] = ()) -> list[Finding]:
    """Every way the recorded changes reach for the runner (empty when honest)."""
    wanted = set(test_paths) | set(record.get("test_patch_paths") or ())
    findings: list[Finding] = []
    for item in record.get("changes", []):
        if isinstance(item, dict):
            findings += screen_change(item, wanted)
    if record.get("omitted"):
        findings.append(
            Finding(
                "changes_unscreenable",
                "-",
                f"{record['omitted']} changed path(s) beyond the record's bound",
            )
        )
    unique = {json.dumps(f.to_data(), sort_keys=True): f for f in findings}
    return list(unique.values())


def suspicions(record: dict, test_paths: Iterable[str] = ()) -> list[Finding]:
    """The code screen's findings in the added lines of the changed Python
    that runs in the grade (empty for an honest change)."""
    wanted = set(test_paths) | set(record.get("test_patch_paths") or ())
    found: list[Finding] = []
    for item in record.get("changes", []):
        if (
            not isinstance(item, dict)
            or item.get("status") == "deleted"
            or item.get("kind", "file") != "file"
        ):
            continue
        path = str(item.get("path", ""))
        parts = [p for p in path.split("/") if p]
        if not parts or path in wanted or _restored(parts):
            continue
        found += code_screen.screen_added(path, str(item.get("added") or "").splitlines())
    return found


# What the transport puts back to the base (or removes) before the run
# (mimoagent.transport.verifier_guard.is_test_support): code that cannot
# run in the grade. Anything else the agent changed can, ``tests.py``
# beside a package's modules included.
_RESTORED_DIRS = ("test", "tests", "testing")
_RESTORED_NAMES = ("conftest.py", "noxfile.py")
_RESTORED_GLOBS = ("test_*.py", "*_test.py")


def _restored(parts: list[str]) -> bool:
    return (
        any(p in _RESTORED_DIRS for p in parts[:-1])
        or parts[-1] in _RESTORED_NAMES
        or any(fnmatch.fnmatchcase(parts[-1], g) for g in _RESTORED_GLOBS)
    )


def screened_reward(summary_part: dict, reward: float, suspicious_reward: float) -> float:
    """The reward an outcome's integrity leaves: 0.0 when tampered, at most
    ``suspicious_reward`` when suspicious."""
    if summary_part.get("integrity") == "tampered":
        return 0.0
    if summary_part.get("integrity") == "suspicious":
        return min(reward, suspicious_reward)
    return reward


def verdict(
    changes: dict, guard: dict, coverage: dict | None = None, suspicious_reward: float = 0.0
) -> tuple[float, dict]:
    """The grade the records decide (1.0 iff the command exited 0 and
    nothing was found; at most ``suspicious_reward`` when only the code
    screen found something) and the outcome record's part; the same at
    grading and at a regrade from the stored records (new rules, same run).
    ``coverage``: the task's ``test_guard`` mark from preparation; a task
    whose command the guard cannot cover (not pytest) is graded by the
    screen and exit status alone, and its record says so."""
    findings = screen(changes)
    suspects = suspicions(changes)
    if coverage is not None and not coverage.get("covered", True):
        reward = 1.0 if guard["exit_code"] == 0 and not findings else 0.0
        part = summary(changes, findings, dict(coverage), suspects)
        return screened_reward(part, reward, suspicious_reward), part
    try:
        found, seen = guard_findings(guard)
    except errors.GraderError:
        if not findings:
            raise
        # A start-up hook or a runner shadow the screen named ends the run
        # before the guard loads: that is the tampering, not a grader fault.
        found, seen = [], None
    findings += found
    reward = 1.0 if guard["exit_code"] == 0 and not findings else 0.0
    part = summary(changes, findings, seen, suspects)
    return screened_reward(part, reward, suspicious_reward), part


def summary(
    record: dict,
    findings: list[Finding],
    seen: dict | None = None,
    suspects: Sequence[Finding] = (),
) -> dict:
    """The outcome record's part: integrity (tampered wins over suspicious),
    evidence, what the guards did and saw."""
    verdict = "tampered" if findings else "suspicious" if suspects else "ok"
    body: dict = {
        "integrity": verdict,
        "grade_guard": dict(record.get("guard") or {}),
        "changed_paths": len(record.get("changes") or ()),
    }
    if seen is not None:
        body["test_guard"] = dict(seen)
    if findings:
        body["grade_reason"] = "tampered"
    if findings or suspects:
        body["integrity_evidence"] = [f.to_data() for f in [*findings, *suspects]]
    return body
