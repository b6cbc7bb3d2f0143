"""The private grader's wire: helper-style frames, each authenticated.

Frames are camg.helper_wire's (``u32 json_len | u32 blob_len | JSON | blob``)
on a socketpair the service creates before it starts the grader: neither end
has a name in any filesystem or network namespace, so no sandbox can reach
it. Every frame also carries ``mac`` = HMAC-SHA256 over a direction tag, a
sequence number, the JSON body and the blob's sha256, keyed by the fresh
random credential the service hands the grader through its stdin pipe at
start (never on disk, never in an environment). A frame with a wrong mac
or an out-of-order sequence number ends the conversation.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket

from camg.helper_wire import encode, read_frame

TO_GRADER = b"camg-autoresearch-grader-request-v1"
FROM_GRADER = b"camg-autoresearch-grader-reply-v1"
CREDENTIAL_BYTES = 32
MAX_BLOB = 16 << 20


class Tampered(Exception):
    """A frame failed authentication."""


def _mac(credential: bytes, tag: bytes, seq: int, body: dict, blob: bytes) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    message = b"\0".join([tag, str(seq).encode(), text, hashlib.sha256(blob).digest()])
    return hmac.new(credential, message, hashlib.sha256).hexdigest()


def send(
    sock: socket.socket, credential: bytes, tag: bytes, seq: int, body: dict, blob: bytes = b""
) -> None:
    frame = dict(body, seq=seq, mac=_mac(credential, tag, seq, body, blob))
    sock.sendall(encode(frame, blob))


def receive(sock: socket.socket, credential: bytes, tag: bytes, seq: int) -> tuple[dict, bytes]:
    frame, blob = read_frame(sock, MAX_BLOB)
    mac = frame.pop("mac", None)
    got_seq = frame.pop("seq", None)
    if (
        not isinstance(mac, str)
        or got_seq != seq
        or not hmac.compare_digest(mac, _mac(credential, tag, seq, frame, blob))
    ):
        raise Tampered("frame failed authentication")
    return frame, blob
