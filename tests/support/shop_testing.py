"""The tests' import path of devtools/harness/shop.py (the harness the
benchmarks and the reliability suites share lives in shipped code, which
may not import tests/)."""

from devtools.harness.shop import *  # noqa: F401,F403
