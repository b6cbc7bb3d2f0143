"""Test command and log parser per repository.

Real SWE-smith rows take theirs from SWE-smith's profile registry (swesmith
0.0.9, imported lazily: it is slow to import and pulls docker/ghapi). The
demo task set this project builds from apispec's sdist has a profile of its
own, registered here, because its image is not a SWE-smith image (no conda;
the test environment is the venv /opt/testbed-venv). Rows of owner
``camg-built`` (a repository whose image tools.prepare_image built, laid
out like SWE-smith's) and ``camg-demo-swesmith`` run SWE-smith's own Python
test command.

Every profile is registered on the installed swebench through
third_party/swebench_shim, so log_evaluation.py parses logs with swebench itself.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

from camg.errors import DatasetError

DEMO_OWNER = "camg-demo"
#: rows of the demo project served from the SWE-smith-shaped demo image
DEMO_SWESMITH_OWNER = "camg-demo-swesmith"
#: rows of any repository served from an image the image builder made
#: (``python -m tools.prepare_image``, laid out like SWE-smith's): graded with
#: SWE-smith's own Python test command, which the image spec must name
BUILT_OWNER = "camg-built"
# SWE-smith's PythonProfile.test_cmd (swesmith 0.0.9), verbatim: the
# SWE-smith-shaped demo image is graded with it unmodified.
SWESMITH_PYTHON_TEST_CMD = (
    "source /opt/miniconda3/bin/activate; conda activate testbed; "
    "pytest --disable-warnings --color=no --tb=no --verbose"
)
DEMO_VENV = "/opt/testbed-venv"
# Same flags as SWE-smith's Python profiles, so the verbose per-test lines the
# parser reads look the same. No cache provider: the grader's repo must not
# grow files the next run could read.
# The package is importable without PYTHONPATH (the plain image's venv has a
# testbed.pth for /testbed/src; the SWE-smith-shaped image installs it
# editable), so the command leaves PYTHONPATH to the grader.
DEMO_TEST_CMD = (
    ". {venv}/bin/activate; "
    "pytest --disable-warnings --color=no --tb=no --verbose "
    "-p no:cacheprovider"
)
SWEBENCH_VERSION = "camg"
WORKDIR = "/testbed"

_STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL")


@dataclasses.dataclass(frozen=True)
class Profile:
    key: str  # SWE-smith repo name, e.g. owner__repo.commit8
    test_cmd: str
    parser: Callable[[str], dict[str, str]]
    timeout: float  # seconds the test command may run
    source: str  # "demo" or "swesmith"
    workdir: str = WORKDIR


def parse_pytest_verbose(log: str) -> dict[str, str]:
    """SWE-smith's PythonProfile.log_parser rule: ``<test id> <STATUS>`` lines.

    Kept identical (first whitespace-free token, then a status) so F2P/P2P
    found at build time and the grade agree on every test id.
    """
    result: dict[str, str] = {}
    for line in log.split("\n"):
        for status in _STATUSES:
            match = re.match(rf"^(\S+)(\s+){status}", line)
            if match:
                result[match.group(1)] = status
    return result


def demo_profile(key: str) -> Profile:
    """The demo project's profile, as the grader runs it in the demo image."""
    return Profile(
        key=key,
        test_cmd=DEMO_TEST_CMD.format(venv=DEMO_VENV),
        parser=parse_pytest_verbose,
        timeout=300.0,
        source="demo",
    )


def local_profile(key: str, python: str, workdir: str) -> Profile:
    """The demo profile run by a local interpreter (task builder and unit
    tests without the image): same flags, so the same parser applies."""
    import shlex

    cmd = (
        f"PYTHONPATH=src${{PYTHONPATH:+:$PYTHONPATH}} {shlex.quote(python)} -m pytest "
        "--disable-warnings --color=no "
        "--tb=no --verbose -p no:cacheprovider"
    )
    return Profile(
        key=key,
        test_cmd=cmd,
        parser=parse_pytest_verbose,
        timeout=300.0,
        source="demo",
        workdir=workdir,
    )


def for_repo(repo: str) -> Profile:
    """The profile of a row's ``repo`` (``owner/name``); DatasetError if none."""
    owner, _, name = repo.partition("/")
    if owner == DEMO_OWNER:
        profile = demo_profile(name)
    elif owner in (DEMO_SWESMITH_OWNER, BUILT_OWNER):
        profile = Profile(
            key=name,
            test_cmd=SWESMITH_PYTHON_TEST_CMD,
            parser=parse_pytest_verbose,
            timeout=300.0,
            source="demo-swesmith" if owner == DEMO_SWESMITH_OWNER else "built",
        )
    else:
        registry = _swesmith_registry()
        if registry is None:
            raise DatasetError(f"repo {repo!r}: no profile (swesmith 0.0.9 is not importable)")
        try:
            upstream = registry.get(name)
        except KeyError:
            raise DatasetError(f"repo {repo!r}: SWE-smith has no profile {name!r}") from None
        profile = Profile(
            key=name,
            test_cmd=upstream.test_cmd,
            parser=upstream.log_parser,
            timeout=float(upstream.timeout),
            source="swesmith",
        )
    _register(repo, profile)
    return profile


def _register(repo: str, profile: Profile) -> None:
    shim = import_shim()
    shim.register(repo, SWEBENCH_VERSION, profile.test_cmd, profile.parser)


@functools.cache
def _swesmith_registry():
    try:
        from swesmith.profiles import registry
    except Exception:  # any import failure means "no registry"
        return None
    return registry


def import_shim():
    """third_party/swebench_shim, installed or straight from the checkout."""
    try:
        import swebench_shim
    except ImportError:
        here = Path(__file__).resolve().parents[2] / "third_party" / "swebench_shim"
        if not (here / "swebench_shim" / "__init__.py").is_file():
            raise
        sys.path.append(str(here))
        import swebench_shim
    return swebench_shim
