"""The container mediator's start gate: camg/fifo_gate.py's FIFO gate, whose
late waiters are answered ``at_capacity`` (the client's errors.AtCapacity).
helper/containers.py holds it from create to running; why: camg/fifo_gate.py."""

from __future__ import annotations

from camg import fifo_gate
from camg.fifo_gate import Cancelled
from camg.helper_wire import WireError

__all__ = ["Cancelled", "Gate"]


class Gate(fifo_gate.Gate):
    def __init__(self, limit: int, what: str = "container start") -> None:
        super().__init__(limit, what)

    def late(self, message: str) -> Exception:
        return WireError("at_capacity", message)
