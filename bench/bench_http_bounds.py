#!/usr/bin/env python3
"""The per-request cost of the service's request bounds, with and without
them in the same run, in process (no sockets: a loopback round trip's noise
on a shared host is larger than what is measured here).

    .venv/bin/python bench/bench_http_bounds.py [--requests 5000] [--rounds 6] [--json OUT]

* ``protocol_us``: one keep-alive request (head and a step's body in one
  chunk) through uvicorn's httptools protocol to a minimal ASGI app and its
  answer, as uvicorn ships it (``base``) and with camg.serving.http_worker's read
  deadlines, head bound and connection bound (``bounded``); medians of
  ``--requests`` per round, rounds alternated.
* ``parse_us``: the depth bound (camg.web.http_wire.json_too_deep, which
  parse_json runs first) on a step body, beside json.loads of it.

The HTTP step overhead budget (bench/bench_http.py) is p50 <= 0.25 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvloop  # noqa: E402
from uvicorn.config import Config  # noqa: E402
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from camg.web import http_wire  # noqa: E402
from camg.serving.http_worker import bounded_protocol  # noqa: E402

BODY = b'{"action":{"operation":"guess","value":-1}}'
REQUEST = (b"POST /episodes/e1/step HTTP/1.1\r\nHost: 127.0.0.1:1\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
           % (len(BODY), BODY))


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


class Transport(asyncio.Transport):
    """Counts writes; the second of a request (head, then body) ends it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0
        self.closing = False
        self.answered: asyncio.Future | None = None

    def write(self, data) -> None:
        self.writes += 1
        if self.answered is not None and self.writes % 2 == 0:
            self.answered.set_result(None)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def one_round(protocol_class, requests: int) -> float:
    loop = asyncio.get_running_loop()
    config = Config(app=app, http=protocol_class, lifespan="off", access_log=False)
    config.load()
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={},
                              _loop=loop)
    transport = Transport()
    protocol.connection_made(transport)
    samples = []
    for _ in range(requests):
        transport.answered = loop.create_future()
        started = time.perf_counter()
        protocol.data_received(REQUEST)
        await transport.answered
        samples.append(time.perf_counter() - started)
    protocol.connection_lost(None)
    return statistics.median(samples) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    bounded = bounded_protocol(10.0, 30.0, 1024)

    async def protocols() -> dict:
        rounds: dict = {"base": [], "bounded": []}
        for _ in range(args.rounds):
            for name, cls in (("base", HttpToolsProtocol), ("bounded", bounded)):
                rounds[name].append(round(await one_round(cls, args.requests), 2))
        return rounds

    rounds = uvloop.run(protocols())
    body = json.dumps({"action": {"operation": "guess", "value": -1}, "request_id": "r-1"})
    raw = body.encode()
    n = 200_000
    parse = {"depth_check": timeit.timeit(lambda: http_wire.json_too_deep(raw), number=n)
             / n * 1e6,
             "json_loads": timeit.timeit(lambda: json.loads(raw), number=n) / n * 1e6}
    results = {
        "protocol_us": {name: {"rounds": v, "median": round(statistics.median(v), 2)}
                        for name, v in rounds.items()},
        "parse_us": {k: round(v, 2) for k, v in parse.items()},
    }
    results["bounds_cost_us"] = round(
        results["protocol_us"]["bounded"]["median"] - results["protocol_us"]["base"]["median"]
        + parse["depth_check"], 2)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
