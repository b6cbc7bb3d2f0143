"""``POST /episodes/{id}/step`` answered at the ASGI level, ahead of falcon.

A step is nearly every request a trainer sends, and falcon's ASGI request
and response objects cost about 45 us of each one on this 2-core host
(issue 25's HTTP step overhead: bench/bench_http.py). This answers the
plain form of the route -- POST, exactly ``/episodes/<id>/step``, one
Content-Length within the body limit, no Transfer-Encoding or Expect --
with what falcon's ``app.EpisodeStep`` does: the same body parse, the same
manager call, the same error mapping (camg/web/http.py) and the same headers
(uvicorn adds Date). Every other form (a trailing slash, a chunked or
oversized body, another method) goes to falcon, which answers it as before;
tests/unit/test_step_route.py holds the two answers side by side.
"""

from __future__ import annotations

import logging

from camg.errors import CamgError
from camg.web import http_wire as wire
from camg.web.http import INTERNAL_ERROR, dumps, error_headers

log = logging.getLogger("camg.http")

_PREFIX = "/episodes/"
_SUFFIX = "/step"
_JSON = (b"content-type", b"application/json")


class StepRoute:
    """The ASGI app ``app`` with the plain step route answered in front of
    it; anything else is ``app``'s, attributes included."""

    def __init__(self, app, service) -> None:
        self.app = app
        self.manager = service.manager
        self.limit = service.config.limits.max_body_bytes
        #: the service's bounds on slow peers, which the HTTP worker applies
        #: (camg.serving.http_worker.bounded_protocol)
        self.http_limits = service.config.limits

    def __getattr__(self, name: str):
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send) -> None:
        episode_id = _plain_step(scope, self.limit)
        if episode_id is None:
            return await self.app(scope, receive, send)
        body = await _body(receive)
        if body is None:  # the trainer hung up before its request was whole
            return
        try:
            request = wire.parse_body(body, wire.StepRequest, "body")
            status, headers, answer = 200, {}, await self.manager.step(episode_id, request)
        except CamgError as exc:
            status, headers, answer = exc.http_status, error_headers(exc), exc.to_dict()
        except Exception as exc:  # as falcon's handler of the unexpected (app.py)
            log.error("unhandled error on POST %s", scope["path"], exc_info=exc)
            status, headers, answer = 500, {}, INTERNAL_ERROR
        data = dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    _JSON,
                    (b"content-length", b"%d" % len(data)),
                    *((k.lower().encode(), v.encode()) for k, v in headers.items()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})


def _plain_step(scope, limit: int) -> str | None:
    """The episode id when ``scope`` is the plain form of the step route."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return None
    path = scope["path"]
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    episode_id = path[len(_PREFIX) : -len(_SUFFIX)]
    if not episode_id or "/" in episode_id:
        return None
    length = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            if length is not None or not value.isdigit():
                return None
            length = int(value)
        elif name in (b"transfer-encoding", b"expect"):
            return None
    if length is None or length > limit:
        return None
    return episode_id


async def _body(receive) -> bytes | None:
    """The request body (its length is the Content-Length the server
    framed it by), or None when the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)
