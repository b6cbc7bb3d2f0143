"""Stock third-party clients that carry the test session's token
(devtools/harness/auth.py), for tests that drive a service with them rather
than camg_client.

- openenv-core 0.3.0 (the services' lock) opens its ``/ws`` and its HTTP
  ``/mcp`` session without any way to add a header (later releases take
  ``headers=``): ``with_token(GenericEnvClient)`` is the same client whose
  connection and HTTP client send the token, every message still its own.
- the ``mcp`` SDK's client takes headers only through an httpx2 client it
  is handed (and then does not close): ``mcp_client(url)`` makes and closes
  one around the SDK's own ``Client``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from devtools.harness.auth import headers


def with_token(cls):
    """A subclass of openenv-core 0.3.0's ``cls`` (an EnvClient) that sends the token."""

    class WithToken(cls):
        async def connect(self):
            if self._ws is None:
                from websockets.asyncio.client import connect

                # what 0.3.0's connect does (its NO_PROXY juggling is proxy=None
                # here), and the header it cannot add
                self._ws = await connect(self._ws_url, open_timeout=self._connect_timeout,
                                         max_size=self._max_message_size, proxy=None,
                                         additional_headers=headers())
            return self

        async def _get_http_client(self):
            # MCPToolClient's production mode (HTTP /mcp), made lazily as 0.3.0's
            if getattr(self, "_http_client", None) is None:
                import httpx

                self._http_client = httpx.AsyncClient(headers=headers())
            return self._http_client

    WithToken.__name__ = WithToken.__qualname__ = cls.__name__
    return WithToken


@contextlib.asynccontextmanager
async def mcp_client(url: str, *, terminate_on_close: bool = True,
                     **options) -> AsyncIterator:
    """The ``mcp`` SDK's ``Client`` over streamable HTTP to ``url`` with the
    token; ``terminate_on_close`` is the transport's, ``options`` the
    Client's (``read_timeout_seconds`` …)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    # the SDK's own client's timeouts (30 s, 300 s to read a held stream)
    async with httpx2.AsyncClient(headers=headers(), timeout=httpx2.Timeout(30, read=300)) as http:
        transport = streamable_http_client(url, http_client=http,
                                           terminate_on_close=terminate_on_close)
        async with Client(transport, **options) as client:
            yield client
