"""The one harness: a private camg-helper, a service process, the census of
what they leave and the fixtures' building blocks, shared by the tests
(tests/support re-exports what the tests import), the benchmarks (bench/)
and the reliability suites (devtools/reliability).

It lives in tools/ because tools/ ships in the wheel and the reliability
suites an operator runs on an installation are its callers: a shipped package
may not import tests/ (pyproject's import-linter contract), and a place inside
the already-shipped tools/ adds no top-level name to site-packages. It
imports camg, camg_client and environments like any tool; nothing of tests/ or
bench/.

    helpers   a camg-helper of this process (socket, state, cgroup parents of its own)
    census    what a run left: a helper's holdings, Docker containers, a state directory
    leaks     the privileged tests' before/after snapshot of mounts, cgroups, processes
    services  ``python -m camg.serve`` on a free loopback port, the counter service
"""
