"""One episode's channel to the transport inside its container.

The container has no network; the helper connects, as root, to the
transport's Unix socket inside the container (camg.sandboxes.containers ``connect``
to ``ENDPOINT``: a root-only directory, and the transport serves only
root's connections) and hands the service the socket. Over it we speak the OpenEnv WebSocket
protocol of the transport's ``/ws`` endpoint, the only stateful one (its
HTTP /reset and /step build a fresh environment per request): send
``{"type": "reset"|"step"|"close", "data": ...}``, receive
``{"type": "observation", "data": {"observation", "reward", "done"}}`` or
``{"type": "error", "data": {"message", "code"}}``.

Error messages the transport raises on purpose start with a failure-class
tag (``[grader_error] ...``, ``[infra] ...``); they become the matching
camg error so the episode ends with reward null.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from typing import Any

from camg import errors

_TAG = re.compile(r"^\[(grader_error|infra|sandbox_died|timeout)\] ")
_CLASSES = {
    "grader_error": errors.GraderError,
    "infra": errors.InfraFailure,
    "sandbox_died": errors.SandboxDied,
    "timeout": errors.DeadlineExceeded,
}


class TransportChannel:
    def __init__(
        self, sock: socket.socket, *, open_timeout: float = 30.0, max_size: int = 1 << 24
    ) -> None:
        from websockets.sync.client import connect

        self._lock = threading.Lock()
        self._closed = False
        try:
            # Entered by hand: the connection outlives this call (one per episode).
            self._ws = connect(
                "ws://mimo-transport/ws",
                sock=sock,
                open_timeout=open_timeout,
                ping_interval=None,
                close_timeout=2,
                max_size=max_size,
                proxy=None,
                compression=None,
            ).__enter__()
        except Exception as exc:  # handshake failed: the transport is not healthy
            sock.close()
            raise errors.SandboxDied(
                f"transport handshake failed: {type(exc).__name__}: {exc}"
            ) from None

    def request(self, kind: str, data: dict | None, timeout: float) -> dict:
        """Send one message and return the observation payload (``data``)."""
        message = json.dumps({"type": kind, "data": data or {}})
        try:
            self._ws.send(message)
            raw = self._ws.recv(timeout=timeout)
        except TimeoutError:
            raise errors.DeadlineExceeded(
                f"transport gave no answer to {kind} within {timeout:.0f} s"
            ) from None
        except Exception as exc:  # connection closed / reset: the container went away
            if self._closed:
                raise errors.InfraFailure("episode closed while a request ran") from None
            raise errors.SandboxDied(
                f"transport connection lost during {kind}: {type(exc).__name__}"
            ) from None
        try:
            reply = json.loads(raw)
        except ValueError:
            raise errors.InfraFailure("transport answered non-JSON") from None
        if reply.get("type") == "error":
            raise error_of(reply.get("data") or {}, kind)
        if reply.get("type") != "observation" or not isinstance(reply.get("data"), dict):
            raise errors.InfraFailure(
                f"transport answered an unexpected {reply.get('type')!r} message"
            )
        return reply["data"]

    def state(self, timeout: float) -> dict:
        """The transport's episode state (openenv's ``state`` message:
        episode_id, step_count)."""
        try:
            self._ws.send(json.dumps({"type": "state"}))  # (openenv forbids any other field)
            raw = self._ws.recv(timeout=timeout)
            reply = json.loads(raw)
        except TimeoutError:
            raise errors.DeadlineExceeded(
                f"transport gave no state within {timeout:.0f} s"
            ) from None
        except ValueError:
            raise errors.InfraFailure("transport answered non-JSON") from None
        except Exception as exc:  # connection closed / reset: the container went away
            raise errors.SandboxDied(
                f"transport connection lost during state: {type(exc).__name__}"
            ) from None
        if reply.get("type") == "error":
            raise error_of(reply.get("data") or {}, "state")
        if reply.get("type") != "state" or not isinstance(reply.get("data"), dict):
            raise errors.InfraFailure(
                f"transport answered an unexpected {reply.get('type')!r} message"
            )
        return reply["data"]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._ws.close()
        except Exception:  # idempotent teardown
            pass


def error_of(data: dict, kind: str) -> errors.CamgError:
    message = str(data.get("message", ""))[:2000]
    tagged = _TAG.match(message)
    if tagged:
        return _CLASSES[tagged.group(1)](message[tagged.end() :])
    if data.get("code") == "VALIDATION_ERROR":
        return errors.InvalidAction(
            f"the transport refused the action: {message}", errors=data.get("errors")
        )
    return errors.InfraFailure(f"transport error during {kind}: {message}")


def observation_of(payload: dict) -> tuple[dict[str, Any], float | None, bool]:
    obs = payload.get("observation")
    if not isinstance(obs, dict):
        raise errors.InfraFailure("transport observation is not an object")
    reward = payload.get("reward")
    return obs, (None if reward is None else float(reward)), bool(payload.get("done"))
