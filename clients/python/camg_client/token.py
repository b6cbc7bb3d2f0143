"""Where a trainer's token comes from, the first of:

1. the ``token=`` a client is made with;
2. the ``CAMG_TOKEN`` environment variable;
3. the file ``CAMG_TOKEN_FILE`` names;
4. ``~/.config/camg/token`` (where ``packaging/demo.sh`` writes the local
   user's), if it exists.

None of them: requests go without one, and a service with authentication
on answers 401 ``unauthorized``.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_FILE = Path("~/.config/camg/token")


def resolve(token: str | None = None) -> str | None:
    if token:
        return token
    if os.environ.get("CAMG_TOKEN"):
        return os.environ["CAMG_TOKEN"].strip()
    named = os.environ.get("CAMG_TOKEN_FILE")
    path = Path(named) if named else DEFAULT_FILE.expanduser()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        if named:  # a file the user named must be there
            raise
        return None
    return text or None


def header(token: str | None) -> dict[str, str]:
    """The request header that carries ``token`` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}
