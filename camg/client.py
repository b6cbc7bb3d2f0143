"""A small trainer-side client for the camg HTTP contract.

Standard library only, one persistent keep-alive connection per client
(use one client per thread). Errors come back as ``ServiceError`` with the
service's error name, so a trainer can tell ``at_capacity`` (retry later)
from ``invalid_action`` (its own bug).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
import uuid
from typing import Any


# Below the service's keep-alive (5 s, camg.serve): reconnect before reusing
# a connection the server may already have closed.
_IDLE_RECONNECT = 4.0


class ServiceError(Exception):
    def __init__(self, status: int, body: Any, retry_after: float | None = None) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after
        name = body.get("error") if isinstance(body, dict) else None
        self.name = name or f"http_{status}"
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{status} {self.name}: {message}")


class Client:
    def __init__(self, base_url: str, timeout: float = 3600.0) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self.host, self.port = url.hostname, url.port or 80
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self._last_used = 0.0

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        # A request is resent after a dropped connection only when running it
        # twice is harmless: reads, closes, and steps carrying a request_id.
        retry_safe = method in ("GET", "DELETE") or (isinstance(body, dict) and "request_id" in body)
        if self._conn is not None and time.monotonic() - self._last_used > _IDLE_RECONNECT:
            # The service drops idle keep-alive connections; don't find out
            # by losing a non-idempotent request on one.
            self.close_connection()
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.request(method, path, body=payload, headers=headers)
                response = self._conn.getresponse()
                raw = response.read()
                break
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                self.close_connection()
                if attempt == 2 or not retry_safe:
                    raise
        self._last_used = time.monotonic()
        data = json.loads(raw) if raw else None
        if response.status >= 400:
            retry = response.getheader("Retry-After")
            raise ServiceError(response.status, data, float(retry) if retry else None)
        return response.status, data

    def close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the contract ----------------------------------------------------
    def health(self) -> dict:
        try:
            return self.request("GET", "/health")[1]
        except ServiceError as exc:
            if exc.status == 503:
                return exc.body
            raise

    def metadata(self) -> dict:
        return self.request("GET", "/metadata")[1]

    def schema(self) -> dict:
        return self.request("GET", "/schema")[1]

    def create(self, task_id: str | None = None, seed: int | None = None,
               episode_id: str | None = None, wait: float = 0.0) -> dict:
        """Start an episode; with ``wait`` > 0, retry at capacity until then."""
        body = {k: v for k, v in (("task_id", task_id), ("seed", seed),
                                  ("episode_id", episode_id)) if v is not None}
        deadline = time.monotonic() + wait
        while True:
            try:
                return self.request("POST", "/episodes", body)[1]
            except ServiceError as exc:
                if exc.status != 429 or time.monotonic() >= deadline:
                    raise
                time.sleep(min(exc.retry_after or 1.0, max(0.0, deadline - time.monotonic())))

    def step(self, episode_id: str, action: dict, request_id: str | None = None) -> dict:
        # Always de-duplicated server-side, so a resend after a dropped
        # connection can never run the action twice.
        body = {"action": action, "request_id": request_id or uuid.uuid4().hex}
        return self.request("POST", f"/episodes/{episode_id}/step", body)[1]

    def get(self, episode_id: str) -> dict:
        return self.request("GET", f"/episodes/{episode_id}")[1]

    def list(self) -> dict:
        return self.request("GET", "/episodes")[1]

    def close(self, episode_id: str) -> dict:
        return self.request("DELETE", f"/episodes/{episode_id}")[1]
