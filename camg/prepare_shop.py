"""``python -m camg.prepare_shop ARGS...`` — the command seed 000 names for
Shop's preparation; the same as ``python -m camg.prepare --environment shop``."""

from __future__ import annotations

import sys

from camg import plugins


def main(argv: list[str] | None = None) -> int:
    return plugins.get("shop").run_prepare(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
