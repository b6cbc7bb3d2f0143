"""Request/response plumbing shared by the HTTP resources."""

from __future__ import annotations

import json

import falcon
import falcon.asgi

from camg.errors import PayloadTooLarge


def dumps(body: object) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


async def read_body(req: falcon.asgi.Request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes (declared or sent)."""
    if req.content_length is not None and req.content_length > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    data = await req.stream.read(limit + 1) if req.content_length != 0 else b""
    if len(data) > limit:
        raise PayloadTooLarge(f"request body exceeds {limit} bytes")
    return data


def reply(resp: falcon.asgi.Response, body: object, status: int = 200) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.text = dumps(body)
