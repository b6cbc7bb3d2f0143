"""The rig every suite runs on: a private camg-helper of this run and the
census of what it (and a service's state directory) holds, from the shared
harness (tools/harness) with this run's tag.

The helper has its own socket, state directory, upper root and cgroup
parents, tagged with this process's pid (the privileged tests' leak check
then knows they are someone else's), so a census counts only what this run
made: ledger entries, uppers, sandbox cgroups, processes in them, sandbox
inits, host mounts naming the rig, Docker containers carrying its label.
"""

from __future__ import annotations

import os

from tools.harness import census
from tools.harness.census import container_memory, rss_kib, state_strays  # noqa: F401
from tools.harness.helpers import (CACHE, ROOT, HelperProcess, helper_config,  # noqa: F401
                                   minbase, private_base)

NAME = "rel"
#: every temporary directory of a run starts with this (its pid: a
#: parallel run's are told apart, tests/privileged/test_reliability_suites.py)
TMP_PREFIX = f"camg-{NAME}-{os.getpid()}-"


class Helper(HelperProcess):
    """A camg-helper of this run, removed completely by ``stop()``."""

    def __init__(self, lower_roots: list[str], *, ceilings: dict | None = None,
                 probes: bool = True, extra: dict | None = None) -> None:
        """``extra``: more helper.json (private_roots, a ``containers``
        section whose scope, if any, the container census then counts)."""
        base = private_base(NAME)
        config = helper_config(base, lower_roots, [str(minbase())], name=NAME,
                               probe_on_start=probes, ceilings=ceilings or {}, **(extra or {}))
        super().__init__(base, config, owner="reliability", owns_base=True)
        self.launch()


def scope(name: str) -> str:
    """The container scope of a helper of this run (``camg.helper`` label);
    tagged with our pid like the privileged tests' scopes, so their leak
    checks and sweeps leave it to us."""
    return f"{NAME}-{os.getpid()}-{name}"


def containers(scope: str | None = None) -> int:
    """Docker containers, running or not, of the helper scope ``scope``, or
    of every helper of this run; 0 without Docker."""
    if scope:
        return census.containers(scope)
    return sum(1 for c in census.labelled_containers()
               if census.scope_of(c).startswith(f"{NAME}-{os.getpid()}-"))
