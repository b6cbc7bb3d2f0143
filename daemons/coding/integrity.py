"""Tamper resistance of the Coding grade: the diff screen and the guard's channel.

A reward must depend only on whether the FAIL_TO_PASS and PASS_TO_PASS tests
really pass against the agent's non-test changes. The agent's code runs
inside the test process, so three independent checks decide together:

1. ``screen(diff)`` — before anything runs, the agent's diff is searched for
   ways to reach the runner rather than the code under test: interpreter
   start-up hooks (``*.pth``, ``sitecustomize``/``usercustomize``), package
   metadata that declares plugins (``*.dist-info``, ``entry_points.txt``,
   ``pytest11``), modules that shadow the runner, pytest configuration
   outside the protected names, and added lines that touch the runner's
   internals (``_pytest``, pluggy, hook implementations, ``os._exit``,
   import hooks, tracers, the log markers).
2. The grader's own pytest plugin (guard/camg_guard.py, loaded first from a
   root-owned path with autoloading off) checks at the end of the session
   that the reporting path is intact, and records each test's outcome from
   the raw call result on an HMAC-signed channel.
3. ``verdict()`` — the log parsed by swebench and the guard's channel must
   agree; a PASSED line the guard never saw pass is a forged line, a
   process that exits 0 before the session ends faked its success.

Any finding is ``tampered``: reward 0.0 whatever else the diff does, with
the rule and the evidence in the outcome record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
from collections.abc import Iterable

from camg import tamper_rules
from camg.tamper_rules import Finding
from daemons.coding import grading

GUARD_MODULE = "camg_guard"
GUARD_DIR = "/opt/camg-grader"
# The rules themselves are shared with General (camg.tamper_rules).
_RUNNER_MODULES = tamper_rules.RUNNER_MODULES
_CONFIG_NAMES = tamper_rules.CONFIG_NAMES
_INTERNALS = tamper_rules.INTERNALS
_HOOKS = tamper_rules.HOOKS
_path_rules = tamper_rules.path_rules
_content_rules = tamper_rules.content_rules


# --- 1. the diff screen ---------------------------------------------------------

def screen(diff: bytes) -> list[Finding]:
    """Every way the diff reaches for the runner (empty for an honest diff)."""
    findings: list[Finding] = []
    for section in grading.split_sections(diff):
        paths = grading.section_paths(section)
        added = _added_lines(section)
        for path in dict.fromkeys(paths):
            findings += _path_rules(path, added)
            if grading.is_protected(path):
                # Test and collection files are reverted before the run; one
                # that reaches into the runner still shows the intent.
                findings += _content_rules(path, added, _HOOKS, "runner_hook_in_tests")
            else:
                findings += _content_rules(path, added, _INTERNALS, "runner_internals")
    return findings


def _added_lines(section: bytes) -> list[str]:
    lines = []
    in_hunk = False
    for raw in section.split(b"\n"):
        if raw.startswith(b"@@"):
            in_hunk = True
        elif raw.startswith(b"GIT binary patch"):
            break
        elif in_hunk and raw.startswith(b"+") and not raw.startswith(b"+++ "):
            lines.append(raw[1:].decode("utf-8", "replace"))
    return lines


# --- 2. the guard's channel ---------------------------------------------------

@dataclasses.dataclass
class Channel:
    hello: list[dict] = dataclasses.field(default_factory=list)
    collected: set[str] | None = None
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
    runs: dict[str, int] = dataclasses.field(default_factory=dict)
    end: dict | None = None
    forged: int = 0

    def evidence(self) -> list[dict]:
        return list((self.end or {}).get("evidence") or [])


_LINE = re.compile(r"^camg-guard ([0-9a-f]{32}) (\{.*\})$", re.M)


def read_channel(log: str, key: bytes) -> Channel:
    channel = Channel()
    for match in _LINE.finditer(log):
        mac, payload = match.group(1), match.group(2)
        good = hmac.new(key, payload.encode("utf-8"), hashlib.sha256).hexdigest()[:32]
        if not hmac.compare_digest(mac, good):
            channel.forged += 1
            continue
        record = json.loads(payload)
        kind = record.get("t")
        if kind == "hello":
            channel.hello.append(record)
        elif kind == "collected":
            channel.collected = (channel.collected or set()) | set(record.get("ids") or ())
        elif kind == "test":
            channel.runs[record["id"]] = channel.runs.get(record["id"], 0) + 1
            previous = channel.outcomes.get(record["id"])
            # A test id run twice (reruns) counts only if every run passed.
            if previous is None or previous == "passed":
                channel.outcomes[record["id"]] = record["outcome"]
        elif kind == "end":
            channel.end = record
    return channel


def strip_channel(log: str) -> str:
    """The log without the channel's lines (what swebench parses)."""
    return _LINE.sub("", log)


# --- 3. the verdict -------------------------------------------------------------

_PASS = ("PASSED", "XFAIL")


_STATUS_LINE = re.compile(r"^(\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", re.M)


def status_lines(log: str, listed: Iterable[str]) -> dict[str, int]:
    """How many result lines the log has for each listed test."""
    wanted = set(listed)
    counts: dict[str, int] = {}
    for match in _STATUS_LINE.finditer(log):
        if match.group(1) in wanted:
            counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def cross_check(channel: Channel, status_map: dict[str, str], listed: Iterable[str],
                exit_code: int, timed_out: bool, log: str = "") -> list[Finding]:
    """Disagreements between the guard and the log, as findings."""
    findings = []
    if channel.forged:
        findings.append(Finding("forged_channel", "-", f"{channel.forged} unsigned guard line(s)"))
    for item in channel.evidence():
        findings.append(Finding(item.get("rule", "guard"), "-", item.get("detail", "")))
    if channel.end is None and exit_code == 0 and not timed_out:
        findings.append(Finding("early_exit", "-",
                                "the test process exited 0 before its session ended"))
    listed = list(listed)
    forged = [t for t in listed if status_map.get(t) in _PASS
              and channel.outcomes.get(t) not in ("passed", "xfailed")]
    # pytest prints one result line per run of a test: any extra line was
    # printed by something else, even when it tells the truth.
    extra = [t for t, n in status_lines(log, listed).items() if n > channel.runs.get(t, 0)]
    forged += [t for t in extra if t not in forged]
    if forged and channel.hello:
        findings.append(Finding("forged_log_line", "-",
                                "log reports pass, the guard did not see it pass: "
                                + ", ".join(forged[:5])))
    return findings


def all_passed(channel: Channel, listed: Iterable[str]) -> bool:
    return all(channel.outcomes.get(t) in ("passed", "xfailed") for t in listed)
