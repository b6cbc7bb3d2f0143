"""``python -m camg_client``: the rollout CLI (cli.py)."""

import sys

from camg_client.cli import main

sys.exit(main())
