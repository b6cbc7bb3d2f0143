"""Every registered environment's canary suite, found from its descriptor
(camg.plugins: ``canaries``), so a new environment's suite runs here the
moment its package is installed.

    python -m devtools.canaries --list            # 'NAME module:function' a line
    python -m devtools.canaries NAME [ARGS ...]   # NAME's suite, given ARGS

A suite is its package's command line: it plays its canaries against what
ARGS name (a service's ``--url``, a helper's socket, prepared roots: each
suite's own ``--help`` says) and prints devtools.canary_table's table; the
exit status is the suite's (1 on any win). An environment without a suite
is listed ``-`` and running it exits 2 naming it: none is skipped in silence.
"""

from __future__ import annotations

import sys

from camg import plugins
from camg.errors import ConfigError

USAGE = "usage: python -m devtools.canaries --list | NAME [ARGS ...]"


def suites() -> dict[str, str | None]:
    """Every registered environment's suite (``module:function``), None
    where its plugin names none."""
    return {name: plugin.canaries for name, plugin in plugins.all_plugins().items()}


def run(name: str, argv: list[str]) -> int:
    """NAME's suite with ``argv``; its exit status."""
    spec = plugins.get(name).canaries
    if spec is None:
        raise ConfigError(f"environment {name!r} names no canary suite (its plugin's canaries)")
    return int(plugins.resolve(spec)(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        if argv[0] == "--list":
            for name, spec in suites().items():
                print(name, spec or "-")
            return 0
        if argv[0].startswith("-"):
            print(USAGE, file=sys.stderr)
            return 2
        return run(argv[0], argv[1:])
    except ConfigError as exc:
        print(f"devtools.canaries: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
