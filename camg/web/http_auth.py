"""The bearer-token gate in front of a service's every route.

It is the outermost ASGI layer, so no route -- falcon's, the plain step
route, ``/mcp`` or OpenEnv's ``/ws`` -- is reached without it. ``/health``
and ``/metrics`` stay open: a supervisor and a scraper hold no token and
learn nothing about anyone's episodes there. A request without a token the
trainers file knows is answered 401 ``unauthorized`` (a WebSocket before
its handshake is accepted); one with a token runs as its principal
(``camg.web.auth.CALLER``), which is what the episode manager checks ownership
against.
"""

from __future__ import annotations

from camg.errors import Unauthorized
from camg.web import auth
from camg.web.http import dumps

#: routes that answer without a token
OPEN_PATHS = frozenset({"/health", "/metrics"})
_CHALLENGE = (b"www-authenticate", b'Bearer realm="camg"')


class AuthGate:
    """``app`` behind the token check; anything else is ``app``'s."""

    def __init__(self, app, store: auth.TokenStore) -> None:
        self.app = app
        self.store = store

    def __getattr__(self, name: str):
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or scope["path"].rstrip("/") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        token = auth.bearer(scope["headers"])
        principal = self.store.principal(token)
        if principal is None:
            message = (
                "this service requires a trainer's token: send 'Authorization: Bearer "
                "<token>' (camg trainer add NAME prints one)"
                if token is None
                else "the token is not a trainer's (revoked, or never issued here)"
            )
            return await _refuse(scope, receive, send, Unauthorized(message))
        with auth.acting_as(principal):
            await self.app(scope, receive, send)


async def _refuse(scope, receive, send, exc: Unauthorized) -> None:
    body = dumps(exc.to_dict()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        _CHALLENGE,
    ]
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        # The handshake is answered with a plain 401 where the server can
        # (ASGI's websocket.http.response); else it is closed unaccepted (403).
        if "websocket.http.response" not in (scope.get("extensions") or {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})
