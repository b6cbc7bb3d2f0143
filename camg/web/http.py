"""Request/response plumbing shared by the HTTP resources."""

from __future__ import annotations

import json

import falcon
import falcon.asgi

from camg.errors import AtCapacity, CamgError, PayloadTooLarge

# json.dumps with options builds an encoder per call; replies are a hot path.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def dumps(body: object) -> str:
    return _ENCODE(body)


# At most this much of a refused body is read and dropped (see _drain).
DRAIN_MAX = 64 << 20


async def read_body(req: falcon.asgi.Request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes (declared or sent)."""
    if req.content_length is not None and req.content_length > limit:
        await _drain(req)
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    data = await req.stream.read(limit + 1) if req.content_length != 0 else b""
    if len(data) > limit:
        await _drain(req)
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    return data


async def _drain(req: falcon.asgi.Request) -> None:
    """Read and drop what the client is still sending (up to DRAIN_MAX), so
    the 413 reaches it: uvicorn closes a ``Connection: close`` request's
    socket right after the reply, and closing with unread input resets the
    connection, which can destroy the reply before the client reads it."""
    if req.content_length is not None and req.content_length > DRAIN_MAX:
        return
    left = DRAIN_MAX
    while left > 0:
        chunk = await req.stream.read(min(left, 1 << 16))
        if not chunk:
            return
        left -= len(chunk)


#: the body of a 500: nothing of the internals (the service log has the traceback)
INTERNAL_ERROR = {"error": "internal", "message": "internal error; see the service log"}


def error_headers(exc: CamgError) -> dict[str, str]:
    """The headers a deliberate error's answer carries besides its JSON body
    (``exc.http_status``, ``exc.to_dict()``): the one mapping, for falcon's
    error handler and the step route (camg/web/step_route.py) alike."""
    return {"Retry-After": str(exc.retry_after)} if isinstance(exc, AtCapacity) else {}


def reply(resp: falcon.asgi.Response, body: object, status: int = 200) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.text = dumps(body)
