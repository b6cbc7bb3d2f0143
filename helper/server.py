"""The helper's socket: peer checks, framing, one thread per connection.

A peer is admitted by SO_PEERCRED: root, or a member (primary or
supplementary, via SO_PEERGROUPS) of the configured group. Anything a
connection sends that cannot be parsed gets a named error; a frame that
cannot be skipped safely (oversized, torn) also ends that connection, never
the helper.
"""

from __future__ import annotations

import array
import grp
import logging
import re
import socket
import struct
import threading
import time
from typing import Any

from camg import helper_wire as wire
from helper import verbs
from helper.sandbox_table import Peer

log = logging.getLogger("camg.helper")
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_OWNER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def group_id(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None  # no such group: only root is served


def peer_credentials(conn: socket.socket) -> tuple[int, int, int, list[int]]:
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, 1024)
        groups = list(array.array("I", raw[: len(raw) - len(raw) % 4]))
    except OSError:
        groups = []
    return pid, uid, gid, groups


class Server:
    metrics = None

    def __init__(
        self,
        listener: socket.socket,
        ctx: verbs.Context,
        group: str,
        max_blob: int,
        max_connections: int = 1024,
        metrics=None,
    ) -> None:
        self.listener = listener
        # camg.metrics.HelperMetrics, or None: nothing is counted
        self.metrics = metrics
        self.ctx = ctx
        self.gid = group_id(group)
        self.max_blob = max_blob
        self.slots = threading.BoundedSemaphore(max_connections)
        # Connection threads mostly wait on a socket; a small stack keeps
        # hundreds of them cheap.
        threading.stack_size(512 * 1024)

    def serve_forever(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            if not self.slots.acquire(blocking=False):
                _send(
                    conn, {"ok": False, "error": "at_capacity", "message": "too many connections"}
                )
                conn.close()
                continue
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _admitted(self, uid: int, gid: int, groups: list[int]) -> bool:
        return uid == 0 or (self.gid is not None and (gid == self.gid or self.gid in groups))

    def _connection(self, conn: socket.socket) -> None:
        try:
            pid, uid, gid, groups = peer_credentials(conn)
            if not self._admitted(uid, gid, groups):
                log.warning(
                    "refused peer pid=%d uid=%d: not root and not in the helper's group", pid, uid
                )
                _send(
                    conn,
                    {
                        "ok": False,
                        "error": "permission_denied",
                        "message": f"uid {uid} is not allowed to use the helper",
                    },
                )
                return
            while self._one(conn, Peer(uid, gid, pid, "default")):
                pass
        except OSError:
            pass  # the peer went away mid-reply; nothing to tell it
        finally:
            conn.close()
            self.slots.release()

    def _one(self, conn: socket.socket, base: Peer) -> bool:
        """Serve one request; False when the connection must end."""
        try:
            request, blob = wire.read_frame(conn, self.max_blob)
        except EOFError:
            return False
        except wire.FrameError as exc:
            self._count("unknown", exc.name, 0.0)
            _send(conn, {"ok": False, "error": exc.name, "message": exc.message})
            return False
        started = time.monotonic()
        reply: dict[str, Any]  # the JSON reply frame
        try:
            extra = sorted(set(request) - {"verb", "params", "owner"})
            if extra:
                raise wire.WireError("bad_request", f"unknown envelope field(s) {', '.join(extra)}")
            owner = request.get("owner", "default")
            if not isinstance(owner, str) or not _OWNER.match(owner):
                raise wire.WireError("bad_request", "owner: 1-64 of [A-Za-z0-9._-]")
            peer = Peer(base.uid, base.gid, base.pid, owner)
            result, out = verbs.dispatch(
                self.ctx, peer, request.get("verb"), request.get("params"), blob
            )
            reply = {"ok": True, "result": result}
        except wire.WireError as exc:
            reply, out = {"ok": False, "error": exc.name, "message": exc.message}, b""
        except Exception as exc:  # a bug must cost one request, not the helper
            log.exception("verb %r failed", request.get("verb"))
            reply, out = (
                {"ok": False, "error": "internal", "message": f"{type(exc).__name__}: {exc}"},
                b"",
            )
        verb = request.get("verb")
        self._count(
            verb if isinstance(verb, str) and verb in verbs.VERBS else "unknown",
            reply.get("error"),
            time.monotonic() - started,
        )
        if not _send(conn, reply, out) and reply["ok"] and request.get("verb") == CREATE:
            # The requester died while its sandbox was made (kill -9 of a
            # service mid-reset): nobody holds the id, and the release its
            # unit or master ran may have come first. Roll the sandbox back.
            try:
                verbs.dispatch(
                    self.ctx, peer, DESTROY, {"sandbox_id": reply["result"]["sandbox_id"]}, b""
                )
            except Exception:
                log.exception("rolling back an unclaimed sandbox failed (the sweep reclaims it)")
            return False
        return True

    def _count(self, verb: str, error: str | None, seconds: float) -> None:
        if self.metrics is not None:
            try:
                self.metrics.request(verb, error, seconds)
            except Exception:  # a metric must never cost a request
                log.exception("counting a request failed")


CREATE, DESTROY = wire.PREFIX + "CreateSandbox", wire.PREFIX + "DestroySandbox"


def _send(conn: socket.socket, obj: dict, blob: bytes = b"") -> bool:
    """False when the peer is gone."""
    try:
        wire.send_frame(conn, obj, blob)  # closes a passed descriptor (ContainerConnect)
    except OSError:
        return False
    return True
