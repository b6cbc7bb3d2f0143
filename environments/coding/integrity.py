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
2. The grader's own pytest plugin (camg/grading/guard/camg_guard.py, loaded first from a
   root-owned path with autoloading off) checks at the end of the session
   that the reporting path is intact, and records each test's outcome from
   the raw call result on an HMAC-signed channel.
3. The verdict (camg.grading.guard_verdict, shared with General, whose verifier runs
   the same guard; environments.coding.log_evaluation applies it) — the log
   parsed by swebench and the guard's channel must agree; a PASSED line the
   guard never saw pass is a forged line, a process that exits 0 before the
   session ends faked its success.

Any finding is ``tampered``: reward 0.0 whatever else the diff does, with
the rule and the evidence in the outcome record.

``screen`` also runs the code screen (camg.grading.code_screen, shared with
General) over the non-test Python the diff adds or changes: capabilities a
bug fix does not need (frames, code objects, ``gc`` walks, the import
system, native code, exit hooks, builtins, foreign dunder writes). Its
findings carry the code screen's rule names; log_evaluation grades them
``suspicious`` (reward: the deployment's ``suspicious_reward``) unless a
tamper finding makes the grade ``tampered``.
"""

from __future__ import annotations

# The rules themselves are shared with General (camg.grading.tamper_rules).
from camg.grading import code_screen, tamper_rules
from camg.grading.tamper_rules import HOOKS, INTERNALS, Finding, content_rules, path_rules
from environments.coding import diff_paths

# --- 1. the diff screen ---------------------------------------------------------


def screen(diff: bytes) -> list[Finding]:
    """Every way the diff reaches for the runner, and the code screen's
    findings (empty for an honest diff)."""
    findings: list[Finding] = []
    for section in diff_paths.split_sections(diff):
        paths = diff_paths.section_paths(section)
        added = _added_lines(section)
        for path in dict.fromkeys(paths):
            findings += path_rules(path, added)
            if diff_paths.is_protected(path):
                # Test and collection files are reverted before the run; one
                # that reaches into the runner still shows the intent.
                findings += content_rules(path, added, HOOKS, "runner_hook_in_tests")
            else:
                findings += content_rules(path, added, INTERNALS, "runner_internals")
                findings += tamper_rules.always_equal_rules(path, added)
    # What runs in the grade is the non-test code: test and collection
    # files are reverted before the run.
    findings += code_screen.screen_diff(diff, include=lambda p: not diff_paths.is_protected(p))
    return findings


def suspicious(findings) -> bool:
    """Whether ``findings`` hold the code screen's and no tamper finding."""
    return bool(findings) and all(f.rule in code_screen.RULES for f in findings)


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
