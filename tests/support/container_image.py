"""The tests' import path of tools/harness/container_image.py (the harness the
benchmarks and the reliability suites share lives in shipped code, which
may not import tests/)."""

from tools.harness.container_image import *  # noqa: F401,F403
