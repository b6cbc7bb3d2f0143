"""Deprecated: the trainer client is ``camg_client`` (clients/python/, a
distribution a trainer installs alone). Kept only for the callers outside
the client's owners' reach (tools/general/canaries.py, tests/system/);
new code imports camg_client."""

from camg_client import *  # noqa: F401,F403
from camg_client import __all__  # noqa: F401
