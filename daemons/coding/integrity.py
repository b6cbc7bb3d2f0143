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

from daemons.coding import grading

GUARD_MODULE = "camg_guard"
GUARD_DIR = "/opt/camg-grader"
# Modules whose shadowing by a file in the repository would replace the runner.
_RUNNER_MODULES = {"pytest", "_pytest", "pluggy", "py", "camg_guard", "iniconfig",
                   "sitecustomize", "usercustomize", "site", "conftest", "xdist"}
_CONFIG_NAMES = {"pytest.toml", ".pytest.toml", ".env", "pytest.cfg"}
# Added lines in non-test code that reach into the runner. A real fix of a
# library has no business with any of these; validation at preparation
# refuses a task whose gold patch trips one.
_INTERNALS = re.compile(
    r"\b_pytest\b|\bpluggy\b|\bhookimpl\b|\bhookwrapper\b|\bpytest_plugins\b"
    r"|\bpytest_(?:runtest|collect|session|configure|unconfigure|report|terminal|make|pyfunc"
    r"|load|cmdline|addoption|addhooks|plugin|itemcollected|exception|keyboard|internalerror"
    r"|warning|assertrepr|fixture|generate|ignore|deselected|logreport|logstart|logfinish"
    r"|collection|enter_pdb|leave_pdb|markeval)\w*"
    r"|PYTEST_ADDOPTS|PYTEST_PLUGINS|PYTEST_DISABLE_PLUGIN_AUTOLOAD|PYTEST_CURRENT_TEST"
    r"|\bos\s*\.\s*_exit\b|\bmeta_path\b|\bpath_hooks\b|\bsettrace\b|\bsetprofile\b"
    r"|>>>>>|\bcamg\b|\bcamg_guard\b|/proc/|\bTestReport\b|\bCallInfo\b"
    r"|^\s*(?:import|from)\s+pytest\b|\bimport_module\(\s*['\"]pytest"
    r"|\bPASSED\b|\bXFAIL\b")


# In test and collection files (which the agent may legitimately edit, and
# which are reverted anyway): hook implementations and runner internals only.
_HOOKS = re.compile(
    r"\bdef\s+pytest_\w+|\b_pytest\b|\bpluggy\b|\bhookimpl\b|\bhookwrapper\b"
    r"|\bos\s*\.\s*_exit\b|\bmeta_path\b|\bsettrace\b|>>>>>|\bcamg_guard\b|pytest11"
    r"|\baddopts\b|PYTEST_ADDOPTS|PYTEST_PLUGINS")


@dataclasses.dataclass(frozen=True)
class Finding:
    rule: str
    path: str
    detail: str = ""

    def to_data(self) -> dict:
        return {"rule": self.rule, "path": self.path, "detail": self.detail[:300]}


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


def _path_rules(path: str, added: list[str]) -> list[Finding]:
    parts = [p for p in path.split("/") if p]
    if not parts:
        return []
    name = parts[-1]
    found = []
    if name.endswith(".pth") or name in ("sitecustomize.py", "usercustomize.py"):
        found.append(Finding("startup_hook", path, "runs when the interpreter starts"))
    if any(p.endswith((".dist-info", ".egg-info", ".egg-link")) for p in parts) \
            or name in ("entry_points.txt", "METADATA", "PKG-INFO"):
        found.append(Finding("package_metadata", path, "declares a distribution"))
    if any("pytest11" in line for line in added):
        found.append(Finding("package_metadata", path, "declares a pytest11 entry point"))
    module = name[:-3] if name.endswith(".py") else name
    top = [p[:-3] if p.endswith(".py") else p for p in parts]
    if (module in _RUNNER_MODULES and module != "conftest") or any(
            p in _RUNNER_MODULES - {"conftest", "site"} for p in top[:-1]):
        found.append(Finding("runner_shadowed", path, f"module name {module!r}"))
    if name in _CONFIG_NAMES:
        found.append(Finding("runner_config", path, "configures pytest outside the protected names"))
    return found


def _content_rules(path: str, added: list[str], pattern: re.Pattern, rule: str) -> list[Finding]:
    for line in added:
        match = pattern.search(line)
        if match:
            return [Finding(rule, path, f"{match.group(0)!r} in: {line.strip()}")]
    return []


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
