"""Trainer principals and their bearer tokens.

A deployment's trainers live in one file (``auth.trainers``, default
``/etc/camg/trainers.json``, the service user's, 0600) that holds each
principal's name, role and the SHA-256 of its token, never the token:
``camg trainer add NAME`` prints a token once. Tokens are 256 random bits,
so one hash round is as strong as a slow one and costs a microsecond of a
request.

The services re-read the file when it changes (checked at most once a
second), so an added or revoked trainer takes effect without a restart.

Roles: ``trainer`` sees and drives its own episodes only; ``operator`` also
lists every episode, reads references and regrades.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import os
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from camg import atomic
from camg.errors import ConfigError

FORMAT = "camg-trainers/1"
DEFAULT_TRAINERS = "/etc/camg/trainers.json"
ROLES = ("trainer", "operator")
NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
TOKEN_PREFIX = "camg_"
#: how long a service trusts its last read of the trainers file
RELOAD_S = 1.0


@dataclasses.dataclass(frozen=True)
class Principal:
    name: str
    role: str = "trainer"

    @property
    def operator(self) -> bool:
        return self.role == "operator"


#: the principal a request acts for, set by the HTTP gate (camg.web.http_auth)
#: for the request's task and everything it starts. None: authentication
#: is off, or the service itself acts (leases, shutdown): no owner check.
CALLER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "camg_caller", default=None
)


def caller() -> Principal | None:
    return CALLER.get()


def caller_name() -> str | None:
    principal = CALLER.get()
    return None if principal is None else principal.name


def may_see(owner: str | None) -> bool:
    """Whether the caller may see an episode ``owner`` created."""
    principal = CALLER.get()
    return principal is None or principal.operator or principal.name == owner


def is_operator() -> bool:
    principal = CALLER.get()
    return principal is None or principal.operator


@contextlib.contextmanager
def acting_as(principal: Principal | None):
    """Run a block as ``principal``: for work a request started that runs
    in a task of another's context (the MCP SDK's session tasks)."""
    token = CALLER.set(principal)
    try:
        yield
    finally:
        CALLER.reset(token)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of an ASGI scope's ``Authorization: Bearer`` header (None:
    absent, given twice or another scheme)."""
    found = None
    for name, value in headers:
        if name == b"authorization":
            if found is not None:
                return None
            found = value
    if found is None:
        return None
    scheme, _, token = found.decode("latin-1").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def read_trainers(path: str | os.PathLike) -> list[dict]:
    """The file's trainer entries, validated; a missing file has none."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ConfigError(f"trainers file {path} is unreadable: {exc}") from None
    if (
        not isinstance(body, dict)
        or body.get("format") != FORMAT
        or not isinstance(body.get("trainers"), list)
    ):
        raise ConfigError(f"trainers file {path}: not a {FORMAT} file")
    seen = set()
    for index, entry in enumerate(body["trainers"]):
        where = f"trainers file {path}: trainers[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} is not an object")
        name, role, digest = entry.get("name"), entry.get("role"), entry.get("token_sha256")
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in seen:
            raise ConfigError(f"{where}: name must be unique and match {NAME.pattern}")
        if role not in ROLES:
            raise ConfigError(f"{where}: role must be one of {', '.join(ROLES)}")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ConfigError(f"{where}: token_sha256 must be 64 hex digits")
        seen.add(name)
    return body["trainers"]


class TokenStore:
    """The principals a service accepts, from the trainers file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._by_hash: dict[str, Principal] = {}
        self._stamp: tuple | None = None
        self._checked = -RELOAD_S
        self.error: str | None = None  # why the last read failed (None: it did not)
        self._reload()

    def principal(self, token: str | None) -> Principal | None:
        if token is None:
            return None
        now = time.monotonic()
        if now - self._checked >= RELOAD_S:
            self._checked = now
            self._reload()
        return self._by_hash.get(token_hash(token))

    def count(self) -> int:
        return len(self._by_hash)

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
            stamp: tuple | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            self.error = f"trainers file {self.path}: {exc}"
            return
        if stamp == self._stamp:
            return
        with self._lock:
            try:
                entries = read_trainers(self.path) if stamp is not None else []
            except ConfigError as exc:
                # A broken file refuses everyone rather than keep a revoked
                # token alive; it is read again next time (a writer's chown
                # after its rename changes no stamp field).
                self._by_hash, self._stamp, self.error = {}, None, exc.message
                return
            self._by_hash = {e["token_sha256"]: Principal(e["name"], e["role"]) for e in entries}
            self._stamp, self.error = stamp, None


def describe(required: bool, trainers: str) -> str:
    """A deployment's authentication, as --check-config shows it."""
    if not required:
        return "OFF (the deployment says auth.required: false): any local user drives episodes"
    try:
        count = len(read_trainers(trainers))
    except ConfigError as exc:
        return f"on, but {exc.message}"
    return (
        f"on: {count} trainer(s) in {trainers}"
        if count
        else f"on, and no trainer in {trainers} yet (camg trainer add NAME)"
    )


# -- the file's writers (camg trainer …) ---------------------------------------


def _entry(name: str, role: str, token: str) -> dict:
    """A trainers-file entry: the token's hash only, never the token."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"trainer name must match {NAME.pattern}")
    if role not in ROLES:
        raise ConfigError(f"role must be one of {', '.join(ROLES)}")
    return {
        "name": name,
        "role": role,
        "token_sha256": token_hash(token),
        "created_at": round(time.time(), 3),
    }


def add_trainer(
    path: str | os.PathLike, name: str, role: str = "trainer", owner: str | None = None
) -> str:
    """Add ``name`` and return its token (the only time it is seen)."""
    token = new_token()
    entry = _entry(name, role, token)
    entries = read_trainers(path)
    if any(e["name"] == name for e in entries):
        raise ConfigError(f"trainer {name!r} exists (revoke it first to issue a new token)")
    _write(path, [*entries, entry], owner)
    return token


def grant(
    path: str | os.PathLike, name: str, token: str, role: str = "trainer", owner: str | None = None
) -> None:
    """Record a token made elsewhere for ``name`` (replacing its old one)."""
    entry = _entry(name, role, token)
    _write(path, [*(e for e in read_trainers(path) if e["name"] != name), entry], owner)


def revoke(path: str | os.PathLike, name: str, owner: str | None = None) -> bool:
    entries = read_trainers(path)
    kept = [e for e in entries if e["name"] != name]
    if len(kept) == len(entries):
        return False
    _write(path, kept, owner)
    return True


def _write(path: str | os.PathLike, entries: list[dict[str, Any]], owner: str | None) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, {"format": FORMAT, "trainers": entries}, mode=0o600)
    if owner is not None:
        import pwd

        try:
            user = pwd.getpwnam(owner)
        except KeyError:
            raise ConfigError(f"no user {owner!r} to own {path}") from None
        os.chown(path, user.pw_uid, user.pw_gid)
