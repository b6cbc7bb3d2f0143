"""Waiting on the event loop until something is true, for the async tests."""

from __future__ import annotations

import asyncio


async def until(predicate, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")
