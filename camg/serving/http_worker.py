"""Which gunicorn worker class serves the falcon ASGI app, and its options.

gunicorn stays the process manager (the arbiter systemd supervises, socket
activation, the pre_fork release hook, graceful_timeout); only the worker
inside it changes. ``uvicorn`` (the default) parses HTTP with httptools (C,
llhttp) on uvloop; ``gunicorn-asgi`` is gunicorn's own ASGI worker with its
pure-Python parser on asyncio, as before issue 25, kept so bench/bench_http.py
can measure one against the other in the same run. (gunicorn's own worker
on uvloop with gunicorn_h1c's C parser measured the same as uvicorn here,
and gunicorn_h1c is on PyPI as an sdist only: a compiler at install.)

CAMG_HTTP_WORKER selects one; anything else is refused before the arbiter
starts (serve.main), never silently replaced by the default.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from camg.errors import ConfigError

ENV = "CAMG_HTTP_WORKER"
DEFAULT = "uvicorn"

_UVICORN_CLASS = "camg.serving.http_worker.UvicornWorker"


def selected() -> str:
    name = os.environ.get(ENV, "").strip() or DEFAULT
    if name not in WORKERS:
        raise ConfigError(f"{ENV}={name!r}: not one of {sorted(WORKERS)}")
    return name


def options(name: str) -> dict:
    """gunicorn settings that differ by worker class."""
    return dict(WORKERS[name])


WORKERS: dict[str, dict] = {
    "uvicorn": {"worker_class": _UVICORN_CLASS},
    # gunicorn's own ASGI worker as camg first ran it: asyncio and
    # the pure-Python parser, named (its "auto" picks uvloop, which the
    # lock now has, and gunicorn_h1c where installed), so the baseline
    # stays the same.
    # lifespan "on": an environment that fails to start stops the arbiter.
    "gunicorn-asgi": {
        "worker_class": "asgi",
        "asgi_lifespan": "on",
        "asgi_loop": "asyncio",
        "http_parser": "python",
    },
}


def _uvicorn_worker_class():
    # Imported only in the worker process that uses it: uvicorn_worker
    # imports uvicorn, which the gunicorn-asgi path never needs.
    from uvicorn_worker import UvicornWorker as Base

    class Worker(Base):
        CONFIG_KWARGS = {
            # Both C: llhttp through httptools, libuv through uvloop. Named,
            # not "auto", so a missing wheel fails the boot instead of
            # quietly falling back to h11 on asyncio.
            "loop": "uvloop",
            "http": "httptools",
            # websockets' sans-I/O protocol: the /ws route's (OpenEnv's)
            # frames; the legacy "websockets" implementation is deprecated.
            "ws": "websockets-sansio",
            # An environment that fails to start must stop the service
            # (uvicorn's "auto" would log it and serve anyway).
            "lifespan": "on",
            # No per-request access log (gunicorn's accesslog is off too)
            # and no Server: header naming the implementation.
            "access_log": False,
            "server_header": False,
            # Every peer is on loopback: no X-Forwarded-* rewriting (and
            # no middleware on every request).
            "proxy_headers": False,
        }

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            # Half of gunicorn's graceful_timeout for in-flight requests,
            # so the lifespan shutdown (closing every episode) still runs
            # before the arbiter's SIGKILL at graceful_timeout.
            self.config.timeout_graceful_shutdown = max(1, self.cfg.graceful_timeout // 2)
            logging.getLogger("uvicorn.error").addFilter(_not_a_quick_stop)

        async def _serve(self) -> None:
            # uvicorn_worker's _serve, plus two things gunicorn's own ASGI
            # worker does and uvicorn_worker's does not. SIGQUIT (the
            # arbiter's quick stop, on its SIGINT) stops at once: uvicorn_
            # worker's handler only clears gunicorn's ``alive``, which
            # uvicorn never reads, so the worker served on until SIGKILL.
            # And leave when the arbiter is gone (a kill -9 of the master
            # outside systemd) rather than linger holding the port.
            from gunicorn.arbiter import Arbiter
            from uvicorn.server import Server

            self.config.app = self.wsgi
            # The service's own bounds on slow peers (camg.web.step_route
            # carries its config's limits); uvicorn itself has no header or
            # body read timeout and no connection bound by default.
            limits = getattr(self.wsgi, "http_limits", None)
            if limits is not None:
                self.config.http = bounded_protocol(
                    limits.header_timeout_s, limits.body_timeout_s, limits.max_connections
                )
            server = Server(config=self.config)
            asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, _quick_stop, server)
            watch = asyncio.create_task(self._watch_parent(server))
            try:
                await server.serve(sockets=self.sockets)
            finally:
                watch.cancel()
            if not server.started:
                sys.exit(Arbiter.WORKER_BOOT_ERROR)

        async def _watch_parent(self, server) -> None:
            while not server.should_exit:
                if os.getppid() != self.ppid:
                    self.log.warning("the arbiter (pid %s) is gone: stopping", self.ppid)
                    server.should_exit = True
                    return
                await asyncio.sleep(1.0)

    Worker.__name__ = Worker.__qualname__ = "UvicornWorker"
    return Worker


def bounded_protocol(header_timeout_s: float, body_timeout_s: float, max_connections: int):
    """uvicorn's httptools protocol with read deadlines and a connection
    bound. Any local user can open connections to a loopback port, and one
    that trickles a byte a minute otherwise holds its socket, buffers and a
    place among the connections for ever.

    * A request's head must arrive within ``header_timeout_s`` of the
      connection's start (or of the request's first byte on a kept-alive
      connection), else 408 and close; its body within ``body_timeout_s`` of
      the head, else close. A request being answered (a step may take
      minutes) has no deadline here: the service's own limits bound it.
    * A request's head is at most ``HEAD_MAX`` bytes, else 431 and close:
      httptools buffers a header of any length, which a peer could grow
      for as long as the head deadline lets it.
    * Beyond ``max_connections`` open, a new connection drops the oldest one
      still reading its request, head or body, or kept alive waiting for
      one (a client sends a request at once, so the oldest reader is the
      stalled one; an idle kept-alive connection is one a client must be
      ready to find closed, as it does after the keep-alive timeout): slow
      or idle peers never fill the table. Only with every connection
      answering a request is one more a 503 in the contract's JSON form
      (uvicorn's own limit_concurrency answers text, which a trainer's
      client cannot parse).

    A deadline is a number on the connection, checked by one sweep every
    ``SWEEP_S`` over the open connections: a timer armed and cancelled per
    request cost more than the rest of the bound together."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    live: set = set()
    # reading a request (head or body) or kept alive waiting for one, the
    # oldest first: the connections a new one may displace
    readers: dict = {}
    sweeping: list[asyncio.TimerHandle] = []

    def sweep(loop) -> None:
        now = loop.time()
        for protocol in [p for p in live if p._expires is not None and p._expires <= now]:
            protocol._expired()
        if live:
            loop.call_later(SWEEP_S, sweep, loop)
        else:
            sweeping.clear()

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        _expires: float | None = None
        #: bytes received while reading a head (None: not reading one)
        _head_bytes: int | None = None

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.limit_concurrency = None  # ours, in on_headers_complete

        def _head_deadline(self) -> None:
            self._expires = self.loop.time() + header_timeout_s
            self._expired = self._head_expired
            self._head_bytes = 0
            readers.pop(self, None)  # now the newest
            readers[self] = None

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # counted after parsing: a chunk that completes the head may
            # carry a body of any allowed size
            if self._head_bytes is not None:
                self._head_bytes += len(data)
                if self._head_bytes > HEAD_MAX and not self.transport.is_closing():
                    self._not_reading()
                    live.discard(self)
                    self.transport.write(_TOO_LARGE)
                    self.transport.close()

        def _not_reading(self) -> None:
            readers.pop(self, None)
            self._expires = self._head_bytes = None

        def _head_expired(self) -> None:
            self._not_reading()
            live.discard(self)  # closing: no longer one of the open
            if not self.transport.is_closing():
                self.transport.write(_TIMED_OUT)
                self.transport.close()

        def _idle_dropped(self) -> None:
            self._not_reading()
            live.discard(self)
            if not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # kept alive with nothing more to read yet: displaceable
            if (
                self._expires is None
                and not self.pipeline
                and not self.transport.is_closing()
                and self in live
            ):
                readers[self] = None
                self._expired = self._idle_dropped

        def _body_expired(self) -> None:
            # the app sees a disconnect, as if the client had hung up
            self._not_reading()
            live.discard(self)
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            live.add(self)
            self._head_deadline()
            # ``live``, not uvicorn's ``connections``: a connection closed
            # here stays in those until the loop reports it lost
            if len(live) > max_connections and len(readers) > 1:
                next(iter(readers))._expired()
            if not sweeping:
                sweeping.append(self.loop.call_later(SWEEP_S, sweep, self.loop))

        def connection_lost(self, exc) -> None:
            live.discard(self)
            self._not_reading()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._expires is None:
                self._head_deadline()

        def on_headers_complete(self) -> None:
            self._expires = self.loop.time() + body_timeout_s
            self._expired = self._body_expired
            self._head_bytes = None
            # not uvicorn's count of running requests too: a dropped
            # reader's request runs until it sees the disconnect
            if len(live) <= max_connections:
                return super().on_headers_complete()
            app, self.app = self.app, _overloaded
            try:
                super().on_headers_complete()
            finally:
                self.app = app

        def on_message_complete(self) -> None:
            self._not_reading()
            super().on_message_complete()

        def handle_websocket_upgrade(self) -> None:
            # the WebSocket protocol (and its pings) takes the connection over
            live.discard(self)
            self._not_reading()
            super().handle_websocket_upgrade()

    return BoundedHttpToolsProtocol


async def _overloaded(scope, receive, send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(_OVERLOADED)),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _OVERLOADED})


_OVERLOADED = (
    b'{"error":"overloaded","message":"the service has as many connections '
    b'open as limits.max_connections allows; retry"}'
)

#: the longest request head (request line and headers) a service reads
HEAD_MAX = 64 << 10
_TOO_LARGE_BODY = b'{"error":"headers_too_large","message":"request head exceeds 65536 bytes"}'
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TOO_LARGE_BODY), _TOO_LARGE_BODY)
)

#: how often the open connections' read deadlines are checked: a slow peer
#: is closed within its timeout plus this
SWEEP_S = 0.5

_TIMED_OUT_BODY = b'{"error":"request_timeout","message":"request head not received in time"}'
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TIMED_OUT_BODY), _TIMED_OUT_BODY)
)


def _quick_stop(server) -> None:
    # As gunicorn's ASGI worker's quick shutdown: no wait for connections,
    # no lifespan shutdown (the unit's ExecStopPost= and the next start's
    # recovery account for the episodes).
    server.should_exit = server.force_exit = True


def _not_a_quick_stop(record: logging.LogRecord) -> bool:
    # A quick stop leaves the lifespan task waiting for its shutdown event;
    # the loop's end cancels it, which uvicorn logs as an error.
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, asyncio.CancelledError)


def __getattr__(name: str):
    # gunicorn resolves worker_class by import path in the arbiter and the
    # worker; building the class lazily keeps ``import camg.serving.http_worker``
    # free of uvicorn.
    if name == "UvicornWorker":
        worker = _uvicorn_worker_class()
        globals()[name] = worker
        return worker
    raise AttributeError(name)
