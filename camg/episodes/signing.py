"""Ed25519 signatures over outcome records.

A deployment has one key pair, made by ``camg.configure`` beside the state
root (``<state_root>/signing/outcomes.key``, mode 0600, owned by the
services' user; ``outcomes.pub`` beside it). Its fingerprint is part of
every service config, so the config hash binds the key; ``/metadata``
publishes the public half, and ``python -m camg.verify`` checks a record
file offline against it.

Each record is signed over a canonical form: the sorted-key compact JSON of
``SIGNED_FIELDS`` (missing fields as null) and of those ``SIGNED_IF_PRESENT``
fields the record has. ``seq`` and ``prev`` (the
SHA-256 of the previous line) chain the records, so a removed, reordered or
inserted line is noticed, not just an edited one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pwd
import stat
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from camg import atomic
from camg.errors import ConfigError

ALGORITHM = "ed25519"
KEY_DIR, KEY_FILE, PUBLIC_FILE = "signing", "outcomes.key", "outcomes.pub"

#: What a signature covers: canonical name -> path in the record. The one
#: list ``sign`` and ``problem`` share.
SIGNED_FIELDS: dict[str, tuple[str, ...]] = {
    "seq": ("seq",),
    "prev": ("prev",),
    "environment": ("environment",),
    "episode_id": ("episode_id",),
    "status": ("status",),
    "task_id": ("task_id",),
    "seed": ("seed",),
    "reward": ("reward",),
    "failure_class": ("failure_class",),
    "integrity": ("integrity",),
    "task_selection_hash": ("task_selection_hash",),
    "image": ("image",),
    "grader_hash": ("grader_hash",),
    "config_hash": ("config_hash",),
    "submission_sha256": ("submission", "sha256"),
    "regrade_of": ("regrade_of",),
    "started_at": ("started_at",),
    "ended_at": ("ended_at",),
    "signing_key": ("signing_key",),
}

#: Signed only where a record has them (a fork's child: camg.episodes.forking; a
#: variant's episode, whose ``canary`` says so: camg.episodes.canaries), so
#: the canonical form, and every signature, of a record without them is
#: what it was before they existed; a record that has them loses its
#: signature when they are removed, and one that lacks them when they are added.
SIGNED_IF_PRESENT: dict[str, tuple[str, ...]] = {
    "forked_from": ("forked_from",),
    "fork_step": ("fork_step",),
    "canary": ("canary",),
}


def canonical(record: dict) -> bytes:
    values = {}
    for name, path in SIGNED_FIELDS.items():
        value: Any = record
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        values[name] = value
    for name, (key,) in SIGNED_IF_PRESENT.items():
        if key in record:
            values[name] = record[key]
    return json.dumps(
        values, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def line_hash(line: bytes) -> str:
    """``prev`` of the record after ``line`` (its bytes without the newline)."""
    return "sha256:" + hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(public: Ed25519PublicKey) -> str:
    return "sha256:" + hashlib.sha256(_raw(public)).hexdigest()


def _pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def describe(public: Ed25519PublicKey) -> dict:
    """The public half as ``/metadata`` and the service config carry it."""
    return {
        "algorithm": ALGORITHM,
        "public_key": base64.b64encode(_raw(public)).decode(),
        "fingerprint": fingerprint(public),
        "public_key_pem": _pem(public).decode(),
    }


def key_path(state_root: str | os.PathLike) -> Path:
    return Path(state_root) / KEY_DIR / KEY_FILE


def ensure_key(path: Path, owner: str | None = None) -> Ed25519PublicKey:
    """The key pair at ``path``, made (0600, chowned to ``owner``) if missing.

    An existing key is kept: records signed before a re-configure stay
    verifiable with the same public key.
    """
    if path.exists():
        _close_key_dir(path.parent)
        return Signer.load(path).public
    try:
        account = pwd.getpwnam(owner) if owner else None
    except KeyError:
        raise ConfigError(f"key owner {owner!r} is not a user on this host") from None
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    # Made closed: the key never sits in a directory others can list.
    path.parent.mkdir(mode=0o700, exist_ok=True)
    _close_key_dir(path.parent)
    key = Ed25519PrivateKey.generate()
    atomic.write_bytes(
        path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        mode=0o600,
    )
    os.chmod(path, 0o600)  # whatever the umask
    public_path = path.with_name(PUBLIC_FILE)
    atomic.write_bytes(public_path, _pem(key.public_key()), mode=0o644)
    if account is not None:
        for made in (path.parent, path, public_path):
            os.chown(made, account.pw_uid, account.pw_gid)
    return key.public_key()


def _close_key_dir(directory: Path) -> None:
    """Its owner's only (0700), whatever the umask or an earlier install
    made; the public half is published elsewhere (``/metadata``, each
    state directory's outcomes.pub)."""
    if stat.S_IMODE(os.lstat(directory).st_mode) & 0o077:
        os.chmod(directory, 0o700)


class Signer:
    def __init__(self, key: Ed25519PrivateKey) -> None:
        self.key = key
        self.public = key.public_key()
        self.fingerprint = fingerprint(self.public)

    @classmethod
    def load(cls, path: str | os.PathLike, expect: str | None = None) -> Signer:
        """The private key at ``path``; ConfigError if others can read it or
        it is not the key ``expect`` (a fingerprint) names."""
        try:
            with open(path, "rb") as handle:
                mode = os.fstat(handle.fileno()).st_mode
                data = handle.read()
        except OSError as exc:
            raise ConfigError(
                f"outcome signing key {path}: {exc.strerror}; re-run "
                "camg.configure as root to make it"
            ) from None
        if stat.S_IMODE(mode) & 0o077:
            raise ConfigError(
                f"outcome signing key {path} is readable by others "
                f"(mode {stat.S_IMODE(mode):04o}); chmod 0600 it"
            )
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except ValueError as exc:
            raise ConfigError(f"outcome signing key {path} is not a PEM key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigError(f"outcome signing key {path} is not an Ed25519 key")
        signer = cls(key)
        if expect is not None and signer.fingerprint != expect:
            raise ConfigError(
                f"outcome signing key {path} is {signer.fingerprint}, not the "
                f"{expect} camg.configure recorded; re-run camg.configure"
            )
        return signer

    def sign(self, record: dict) -> None:
        """Add ``signing_key`` and ``signature`` to ``record`` (its JSON form)."""
        record["signing_key"] = self.fingerprint
        signature = self.key.sign(canonical(record))
        record["signature"] = f"{ALGORITHM}:{base64.b64encode(signature).decode()}"


def load_public(path: str | os.PathLike) -> Ed25519PublicKey:
    """A public key file: PEM, or the base64 ``public_key`` of ``/metadata``."""
    data = Path(path).read_bytes().strip()
    try:
        if data.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = Ed25519PublicKey.from_public_bytes(base64.b64decode(data, validate=True))
    except ValueError as exc:
        raise ConfigError(f"{path} is not an Ed25519 public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{path} is not an Ed25519 public key")
    return key


def problem(record: dict, public: Ed25519PublicKey) -> str | None:
    """Why ``record``'s signature does not hold under ``public``, or None."""
    signature = record.get("signature")
    if not isinstance(signature, str) or not signature.startswith(f"{ALGORITHM}:"):
        return "unsigned"
    if record.get("signing_key") != fingerprint(public):
        return f"signed by another key ({record.get('signing_key')})"
    try:
        public.verify(
            base64.b64decode(signature.removeprefix(f"{ALGORITHM}:"), validate=True),
            canonical(record),
        )
    except (InvalidSignature, ValueError):
        return "signature does not match the signed fields (changed after signing)"
    return None
