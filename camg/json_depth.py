"""How deep a JSON text nests, counted before any parser recurses into it.

Python's json recurses once per level, and so does everything that walks
what it returns; a 2 KB body of brackets reaches the recursion limit. A
leaf (standard library only): the services' parsers and the root helper's
frame reader share it.
"""

from __future__ import annotations

import re

# A JSON string (escapes included), whose brackets are text, not nesting;
# possessive, so a long string is one pass with no backtracking.
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def too_deep(raw: bytes | str, limit: int) -> bool:
    """Whether ``raw`` (JSON text, parsed or not) nests deeper than ``limit``
    (objects and arrays, the outermost counting 1).

    Counting brackets is C-speed and settles nearly every body; only a body
    with more brackets than ``limit`` is scanned, strings left out."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for byte in _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS):
        if byte in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False
