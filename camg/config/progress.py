"""Progress of long preparation steps (image layers, task layers, index
builds, the demo task set): a tqdm bar on a terminal, and plain lines at a
steady pace everywhere else (journald, CI logs), where a redrawn bar would
be noise.

    with progress.Progress("task layers", total=len(tasks), unit="task") as bar:
        for task in tasks:
            ...
            bar.update()

    with progress.ticking("building the Lucene index"):   # no count: elapsed time
        build()
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

# A plain line at most this often, plus one at the end.
INTERVAL = 15.0


def _tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    def __init__(
        self,
        what: str,
        total: int | None = None,
        unit: str = "item",
        *,
        stream: TextIO | None = None,
        interval: float = INTERVAL,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.stream = stream or sys.stderr
        self.interval = interval
        self.done = 0
        self.started = time.monotonic()
        self._last_line = self.started
        self._bar = None
        if _tty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc=what, unit=unit, file=self.stream, dynamic_ncols=True, leave=True
            )

    def update(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_line >= self.interval:
            self._last_line = now
            self._line()

    def _line(self, final: bool = False) -> None:
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        state = "done" if final else "…"
        print(
            f"{self.what}: {count} {self.unit}s, {time.monotonic() - self.started:.0f}s {state}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            self._line(final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def ticking(
    what: str, *, stream: TextIO | None = None, interval: float = INTERVAL
) -> Iterator[None]:
    """A step with no count (a subprocess, one library call): elapsed time
    every ``interval`` seconds, and when it ends."""
    stream = stream or sys.stderr
    started = time.monotonic()
    stop = threading.Event()
    tty = _tty(stream)

    def tick() -> None:
        while not stop.wait(1.0 if tty else interval):
            elapsed = time.monotonic() - started
            if tty:
                print(f"\r{what}: {elapsed:.0f}s …", end="", file=stream, flush=True)
            else:
                print(f"{what}: {elapsed:.0f}s …", file=stream, flush=True)

    thread = threading.Thread(target=tick, name="camg-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        print(
            f"{chr(13) if tty else ''}{what}: {time.monotonic() - started:.0f}s done",
            file=stream,
            flush=True,
        )
