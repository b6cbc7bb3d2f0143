#!/usr/bin/env python3
"""The root helper under a flood of slow connections to its metrics port.

    sudo .venv/bin/python bench/bench_helper_flood.py [--connections 1000] [--creates 200]
                                                      [--json OUT]

Any local user can connect to the helper's loopback metrics port. This
keeps ``--connections`` connections open at once, each sending part of a
request head and then a byte a second, reconnecting as the helper drops
them (camg.metrics.ScrapeServer: a 5 s head deadline, the oldest of more
than 128 readers dropped). In the same run, without and then with the
flood, it measures what the helper is for: sandbox create+destroy latency
(p50/p99), Ping, a scrape, and the helper's thread count (/proc/PID/task).
Timings are reported, not judged: a loaded 2-core host moves both sides;
``ok`` says only that every create, Ping and scrape succeeded and the
thread count stayed within a few of the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.harness.helpers import minbase, start_private  # noqa: E402
from devtools.harness.services import free_port  # noqa: E402

LIMITS = {"memory_bytes": 256 << 20, "cpu_quota": 1.0, "pids_max": 128}
HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def note(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1e3, 3)


def summary(samples: list[float]) -> dict:
    return {"n": len(samples), "p50_ms": pct(samples, 0.5), "p99_ms": pct(samples, 0.99),
            "max_ms": pct(samples, 1.0)}


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


class Flood:
    """``count`` slow connections to 127.0.0.1:``port``, kept at that number
    from one thread of ours until ``stop()``."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.count = count
        self.opened = self.dropped = self.refused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sel = selectors.DefaultSelector()

    def start(self) -> "Flood":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self) -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            sock.sendall(HEAD)
            sock.setblocking(False)
        except OSError:
            self.refused += 1
            return
        self._sel.register(sock, selectors.EVENT_READ)
        self.opened += 1

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for _ in range(self.count - len(self._sel.get_map())):
                    self._open()
                for key, _ in self._sel.select(0.05):
                    try:
                        data = key.fileobj.recv(4096)
                    except OSError:
                        data = b""
                    if not data:  # the helper dropped it
                        self._sel.unregister(key.fileobj)
                        key.fileobj.close()
                        self.dropped += 1
                now = int(time.monotonic())
                if now != getattr(self, "_tick", None):  # a byte a second each
                    self._tick = now
                    for key in list(self._sel.get_map().values()):
                        try:
                            key.fileobj.send(b"a")
                        except OSError:
                            pass
        finally:
            for key in list(self._sel.get_map().values()):
                key.fileobj.close()
            self._sel.close()

    def report(self) -> dict:
        return {"target": self.count, "opened": self.opened, "dropped_by_helper": self.dropped,
                "connect_failures": self.refused}


def measure(helper, rootfs: Path, port: int, creates: int) -> dict:
    client = helper.client(pool_size=4)
    lowers = [str(rootfs)]
    create, ping, scrape, thread_counts, errors = [], [], [], [], []
    for i in range(creates):
        t = time.perf_counter()
        try:
            client.destroy(client.create_sandbox(lowers, **LIMITS))
            create.append(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001  counted, the run goes on
            errors.append(f"create: {exc!r}")
        if i % 10 == 0:
            t = time.perf_counter()
            try:
                client.ping()
                ping.append(time.perf_counter() - t)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"ping: {exc!r}")
            t = time.perf_counter()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    if b"camg_helper_probes_ok" not in r.read():
                        raise ValueError("no camg_helper_probes_ok in the scrape")
                scrape.append(time.perf_counter() - t)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"scrape: {exc!r}")
            thread_counts.append(threads(helper.proc.pid))
    client.close()
    return {"create_destroy": summary(create) if create else None,
            "ping": summary(ping) if ping else None,
            "scrape": summary(scrape) if scrape else None,
            "helper_threads_max": max(thread_counts), "errors": len(errors),
            "first_errors": errors[:5]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--creates", type=int, default=200)
    ap.add_argument("--settle", type=float, default=8.0,
                    help="seconds of flood before measuring (the helper's drops reach a "
                         "steady state)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_helper_flood needs root (it runs a real helper)", file=sys.stderr)
        return 2
    rootfs = minbase()
    port = free_port()
    helper = start_private("bench-flood", [str(rootfs.parent)], [str(rootfs)],
                           metrics_port=port)
    results: dict = {"connections": args.connections, "creates": args.creates,
                     "loadavg": os.getloadavg()}
    try:
        client = helper.client()
        for _ in range(10):  # warm caches, as bench_helper.py does
            client.destroy(client.create_sandbox([str(rootfs)], **LIMITS))
        client.close()
        results["helper_threads_idle"] = threads(helper.proc.pid)
        note("baseline (no flood)")
        results["baseline"] = measure(helper, rootfs, port, args.creates)
        note(f"flood of {args.connections} slow connections")
        flood = Flood(port, args.connections).start()
        try:
            time.sleep(args.settle)
            results["flood"] = measure(helper, rootfs, port, args.creates)
        finally:
            flood.stop()
        results["flood"]["flood"] = flood.report()
        time.sleep(6)  # the last readers reach their deadline
        note("after the flood")
        results["after"] = measure(helper, rootfs, port, max(20, args.creates // 5))
        results["helper_threads_after"] = threads(helper.proc.pid)
        results["helper_alive"] = helper.alive()
    finally:
        helper.stop()
    base, flood_, after = results["baseline"], results["flood"], results["after"]
    if base["create_destroy"] and flood_["create_destroy"]:
        results["create_p50_ratio_flood_vs_baseline"] = round(
            flood_["create_destroy"]["p50_ms"] / base["create_destroy"]["p50_ms"], 2)
    results["ok"] = (results["helper_alive"] and not (base["errors"] or flood_["errors"]
                                                      or after["errors"])
                     and flood_["helper_threads_max"] <= results["helper_threads_idle"] + 4)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
