"""The tests' import path of devtools/harness/counter_env.py (the harness the
benchmarks and the reliability suites share lives in shipped code, which
may not import tests/)."""

from devtools.harness.counter_env import *  # noqa: F401,F403
