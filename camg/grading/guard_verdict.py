"""The test guard both code environments run, and what its channel proves.

camg/grading/guard/camg_guard.py is a stdlib-only pytest plugin (Python 3.6+) that a
grader loads first, from a path the agent cannot write, with plugin
autoloading off: it loads the image's own plugins, records each test's
outcome from the raw call result and checks at the end of the session that
the reporting path is intact. Its records are lines ``camg-guard MAC JSON``
signed with a key made for that grade alone.

Coding runs it in a fresh grader sandbox (environments/coding/grader_scripts.py, whose
script sets the variables that load it), General inside the task container
(mimoagent.transport.verifier_guard.runner_env, the same variables); both read
the channel and hold it against what the runner reported with this module:
a pass the guard never saw, a runner that exited 0 before its session ended
or with a failed test behind it, evidence the guard raised, an unsigned line.

Every guard session takes a key of its own (the grader makes as many as it
knows sessions, General a few spare): a hello must verify with a key no
earlier hello used, and the session's chain continues with that key. A
session that found no key writes an unsigned ``camg-guard-unkeyed`` line,
which is a finding (``guard_unkeyed``): someone took the keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import re
from collections.abc import Iterable, Sequence

from camg.grading.tamper_rules import Finding

GUARD_MODULE = "camg_guard"
#: the directory holding camg_guard.py (what goes on the runner's PYTHONPATH)
GUARD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guard")
GUARD_FILE = os.path.join(GUARD_DIR, GUARD_MODULE + ".py")


# --- the channel ----------------------------------------------------------------


@dataclasses.dataclass
class Channel:
    hello: list[dict] = dataclasses.field(default_factory=list)
    collected: set[str] | None = None
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
    runs: dict[str, int] = dataclasses.field(default_factory=dict)
    #: the ``id WORD`` result lines pytest itself printed for each test, as
    #: the guard counted them (one a run for records that do not say)
    printed: dict[str, int] = dataclasses.field(default_factory=dict)
    end: dict | None = None
    forged: int = 0
    #: every session's end record, in order (a test command may run several)
    ends: list[dict] = dataclasses.field(default_factory=list)
    #: findings the guard wrote the moment it made them (not only in an end)
    findings: list[dict] = dataclasses.field(default_factory=list)
    #: records out of the guard's order (a test before its session's
    #: collected record, a record after an end before the next hello)
    misordered: list[str] = dataclasses.field(default_factory=list)
    #: sessions that found no key to sign with (their unsigned markers)
    unkeyed: int = 0

    def evidence(self) -> list[dict]:
        found = [e for e in self.findings]
        for end in self.ends or ([self.end] if self.end else []):
            found += [e for e in (end.get("evidence") or []) if e not in found]
        return found


_LINE = re.compile(r"^camg-guard ([0-9a-f]{32}) (\{.*\})$", re.M)
_UNKEYED = re.compile(r"^camg-guard-unkeyed (\{.*\})$", re.M)


def _mac(key: bytes, previous: str, payload: str) -> str:
    return hmac.new(key, (previous + payload).encode("utf-8"), hashlib.sha256).hexdigest()[:32]


def sign_records(records: Iterable[dict], key: bytes) -> str:
    """Channel lines as one guard process writes them (numbered, each MAC
    over the previous one's): what tests of the verdict feed it."""
    lines, previous = [], ""
    for n, record in enumerate(records):
        payload = json.dumps(dict(record, n=n), sort_keys=True, separators=(",", ":"))
        previous = _mac(key, previous, payload)
        lines.append(f"camg-guard {previous} {payload}\n")
    return "".join(lines)


def read_channel(log: str, keys: bytes | Sequence[bytes]) -> Channel:
    """The records of every guard process in ``log``. Each process's lines
    form one chain (numbered from its hello, each MAC over the previous
    line's) under one of ``keys`` that no earlier session used: a line that
    does not continue the chain is a forgery."""
    keys = [keys] if isinstance(keys, (bytes, bytearray)) else list(keys)
    channel = Channel(unkeyed=len(_UNKEYED.findall(log)))
    state = None  # None: no session; "hello", "collected", "ended"
    previous, expected, key = None, 0, None
    used: set[int] = set()
    for match in _LINE.finditer(log):
        mac, payload = match.group(1), match.group(2)
        try:
            record = json.loads(payload)
        except ValueError:
            channel.forged += 1
            continue
        number = record.get("n") if isinstance(record, dict) else None
        if (
            previous is not None
            and key is not None  # set before previous is: every chain starts at a hello
            and number == expected
            and hmac.compare_digest(mac, _mac(key, previous, payload))
        ):
            expected += 1
        elif (
            number == 0
            and record.get("t") == "hello"
            and (fresh := _hello_key(keys, used, mac, payload)) is not None
        ):
            used.add(fresh)
            key, expected = keys[fresh], 1
        else:
            channel.forged += 1
            continue
        previous = mac
        kind = record.get("t")
        if kind == "hello":
            channel.hello.append(record)
            state = "hello"
        elif kind == "finding":
            entry = {
                "rule": str(record.get("rule") or "guard"),
                "detail": str(record.get("detail") or ""),
            }
            if entry not in channel.findings:
                channel.findings.append(entry)
        elif state in (None, "ended"):
            channel.misordered.append(f"{kind} outside a session")
        elif kind == "collected":
            state = "collected"
            channel.collected = (channel.collected or set()) | set(record.get("ids") or ())
        elif kind == "test" and state != "collected":
            channel.misordered.append(f"test {record.get('id')} before its session's collected")
        elif kind == "test":
            channel.runs[record["id"]] = channel.runs.get(record["id"], 0) + 1
            lines = record.get("lines", 1)
            channel.printed[record["id"]] = channel.printed.get(record["id"], 0) + (
                lines if isinstance(lines, int) and lines >= 0 else 1
            )
            before = channel.outcomes.get(record["id"])
            # A test id run twice (reruns) counts only if every run passed.
            if before is None or before == "passed":
                channel.outcomes[record["id"]] = record["outcome"]
        elif kind == "end":
            state = "ended"
            channel.end = record
            channel.ends.append(record)
    return channel


def _hello_key(keys: list[bytes], used: set[int], mac: str, payload: str) -> int | None:
    """The index of the unused key a hello is signed with (None: forged)."""
    for index, key in enumerate(keys):
        if index not in used and hmac.compare_digest(mac, _mac(key, "", payload)):
            return index
    return None


def strip_channel(log: str) -> str:
    """The log without the channel's lines (what swebench parses)."""
    return _UNKEYED.sub("", _LINE.sub("", log))


# --- the cross-check --------------------------------------------------------------

_PASS = ("PASSED", "XFAIL")
# (not pytest's "____ ERROR collecting x ____" section titles)
_STATUS_LINE = re.compile(r"^(?!_+\s)(\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", re.M)


def status_lines(log: str, listed: Iterable[str] | None = None) -> dict[str, int]:
    """How many result lines the log has for each listed test (every test: None)."""
    wanted = None if listed is None else set(listed)
    counts: dict[str, int] = {}
    for match in _STATUS_LINE.finditer(log):
        if wanted is None or match.group(1) in wanted:
            counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def status_map(log: str) -> dict[str, str]:
    """The last status the log prints for each test id (``-v``/``-rA`` lines)."""
    return {m.group(1): m.group(2) for m in _STATUS_LINE.finditer(log)}


#: the rules of channel_findings (a reader that checks the whole log once
#: leaves them out of a cross-check of a part of it)
CHANNEL_RULES = ("forged_channel", "guard_unkeyed")


def channel_findings(channel: Channel) -> list[Finding]:
    """What the channel itself says was tampered with: unsigned lines, and
    sessions that found no key left."""
    findings = []
    if channel.forged:
        findings.append(Finding("forged_channel", "-", f"{channel.forged} unsigned guard line(s)"))
    if channel.unkeyed:
        findings.append(
            Finding(
                "guard_unkeyed",
                "-",
                f"{channel.unkeyed} guard session(s) found no key left (another process took them)",
            )
        )
    return findings


def cross_check(
    channel: Channel,
    status_map: dict[str, str],
    listed: Iterable[str],
    exit_code: int,
    timed_out: bool,
    log: str = "",
) -> list[Finding]:
    """Disagreements between the guard and the log, as findings."""
    findings = channel_findings(channel)
    for item in channel.evidence():
        findings.append(Finding(item.get("rule", "guard"), "-", item.get("detail", "")))
    if channel.misordered:
        findings.append(Finding("channel_out_of_order", "-", "; ".join(channel.misordered[:3])))
    if channel.end is None and exit_code == 0 and not timed_out:
        findings.append(
            Finding("early_exit", "-", "the test process exited 0 before its session ended")
        )
    listed = list(listed)
    forged = [
        t
        for t in listed
        if status_map.get(t) in _PASS and channel.outcomes.get(t) not in ("passed", "xfailed")
    ]
    # pytest prints a result line per report with a status word when it is
    # verbose, none otherwise (-rA's summary lines are ``WORD id``): any
    # extra line was printed by something else, even when it tells the truth.
    extra = [t for t, n in status_lines(log, listed).items() if n > channel.printed.get(t, 0)]
    forged += [t for t in extra if t not in forged]
    if forged and channel.hello:
        findings.append(
            Finding(
                "forged_log_line",
                "-",
                "log reports pass, the guard did not see it pass: " + ", ".join(forged[:5]),
            )
        )
    return findings


def exit_findings(channel: Channel, exit_code: int) -> list[Finding]:
    """A command that exited 0 must have run every session it started to its
    end, each ending 0, with no test the guard saw fail (pytest cannot exit
    0 otherwise; something between the tests and the exit status lied)."""
    if exit_code != 0:
        return []
    findings = []
    if channel.hello and len(channel.ends) < len(channel.hello):
        findings.append(
            Finding(
                "early_exit",
                "-",
                f"{len(channel.hello)} session(s) started, "
                f"{len(channel.ends)} ended, the command exited 0",
            )
        )
    failing = [e for e in channel.ends if int(e.get("exitstatus") or 0) != 0]
    if failing:
        findings.append(
            Finding(
                "exit_status_rewritten",
                "-",
                f"a session ended with status {failing[0].get('exitstatus')}, the command exited 0",
            )
        )
    failed = sorted(t for t, o in channel.outcomes.items() if o == "failed")
    if failed:
        findings.append(
            Finding(
                "outcome_rewritten",
                "-",
                "the command exited 0, the guard saw these fail: " + ", ".join(failed[:5]),
            )
        )
    # pytest runs every test it collected before a 0 exit: one the guard
    # never saw finish was taken out of the run after collection.
    unseen = sorted((channel.collected or set()) - set(channel.outcomes))
    if unseen:
        findings.append(
            Finding(
                "test_not_run",
                "-",
                "the command exited 0, collected and never run: " + ", ".join(unseen[:5]),
            )
        )
    return findings


def all_passed(channel: Channel, listed: Iterable[str]) -> bool:
    """Every listed test run and passed, as the guard saw it: an xfail or a
    skip says nothing about the fix (swebench's XFAIL-as-pass is not taken;
    a row whose gold run xfails a listed test fails --validate)."""
    return all(channel.outcomes.get(t) == "passed" for t in listed)
