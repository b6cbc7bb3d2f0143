"""Register SWE-smith-style repositories on the installed swebench 4.1.0.

swebench grades a log through two tables keyed by the row's ``repo``:
``MAP_REPO_TO_PARSER`` (the log parser) and ``MAP_REPO_VERSION_TO_SPECS``
(whose ``test_cmd`` ``get_logs_eval`` looks up). SWE-smith repositories are
in neither, so this module adds them, in place: swebench's grading module
imported those dicts by name, and only mutating the same objects reaches it.
Nothing here re-implements grading; ``get_logs_eval``,
``get_eval_tests_report`` and ``get_resolution_status`` stay swebench's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

__all__ = ["register", "registered"]

_lock = threading.Lock()
_owned: dict[str, tuple[str, str]] = {}


def register(repo: str, version: str, test_cmd: str,
             parser: Callable[[str], dict[str, str]]) -> None:
    """Make ``repo``/``version`` gradable by swebench with ``parser``.

    ``parser`` takes the log text (SWE-smith's profile signature); swebench
    calls parsers with ``(log, test_spec)``, so it is adapted here. A repo
    swebench already knows natively is never overridden: that would silently
    change how an official SWE-bench instance is graded.
    """
    with _lock:
        if repo in MAP_REPO_TO_PARSER and repo not in _owned:
            raise ValueError(f"swebench already grades {repo!r}; refusing to override it")
        previous = _owned.get(repo)
        if previous is not None and previous != (version, test_cmd):
            # Same repo, another command: one caller is wrong about the profile.
            raise ValueError(f"{repo!r} is registered with version/test command {previous}")
        MAP_REPO_TO_PARSER[repo] = lambda log, test_spec=None: parser(log)
        MAP_REPO_VERSION_TO_SPECS.setdefault(repo, {})[version] = {"test_cmd": test_cmd}
        _owned[repo] = (version, test_cmd)


def registered() -> dict[str, tuple[str, str]]:
    """Repos this shim registered: repo -> (version, test_cmd)."""
    with _lock:
        return dict(_owned)
