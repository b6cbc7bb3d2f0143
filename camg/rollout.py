"""Deprecated: ``python -m camg.rollout`` is ``python -m camg_client``
(clients/python/camg_client/cli.py). Kept for the operator docs that still
name it (daemons/*/README.md, the environments' prepare.py help)."""

import sys

from camg_client.cli import main

if __name__ == "__main__":
    sys.exit(main())
