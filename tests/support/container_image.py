"""The tests' import path of devtools/harness/container_image.py (the harness the
benchmarks and the reliability suites share lives in shipped code, which
may not import tests/)."""

from devtools.harness.container_image import *  # noqa: F401,F403
