"""The test session's trainer token: every deployment the harness and the
tests write names one trainers file that holds it, and ``CAMG_TOKEN`` (which
camg_client and the subprocesses it starts read) carries it, so the whole
suite runs with authentication on, as a deployment does by default.

The session's principal is an operator (tests read references and
regrade); tests of ownership add principals of their own.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from camg.web import auth

PRINCIPAL = "tests"


def session_token() -> str:
    """This test session's token (made once, kept in the environment)."""
    if not os.environ.get("CAMG_TOKEN"):
        os.environ["CAMG_TOKEN"] = auth.new_token()
    return os.environ["CAMG_TOKEN"]


def trainers_file() -> str:
    """The trainers file holding the session's token (written on first use)."""
    token = session_token()
    path = Path(tempfile.gettempdir()) / f"camg-tests-trainers-{auth.token_hash(token)[:16]}.json"
    if not path.exists():
        auth.grant(path, PRINCIPAL, token, role="operator")
    return str(path)


def deployment_auth() -> dict:
    """A deployment's ``auth`` entry for the test session."""
    return {"trainers": trainers_file()}


def headers() -> dict[str, str]:
    """The session's Authorization header, for raw HTTP in tests."""
    return {"Authorization": f"Bearer {session_token()}"}
