"""``python -m camg.prepare --environment NAME [ARGS...]``

A thin dispatcher: the named environment's own preparation (its plugin's
``prepare`` entry point) receives the remaining arguments. ``python -m
camg.prepare --list`` names the installed environments and their commands.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from camg import logs, plugins
from camg.errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logs.setup_command()
    if not args or args[0] in ("-h", "--help", "--list"):
        try:
            known = plugins.all_plugins()
        except ConfigError as exc:
            print(f"camg.prepare: {exc}", file=sys.stderr)
            return 2
        print(
            "usage: python -m camg.prepare --environment NAME [ARGS...]\n"
            "       (python -m camg.prepare --environment NAME --help for its arguments)\n"
        )
        for listed, plugin in known.items():
            print(f"  {listed:14s} {plugin.prepare_hint}")
        return 0 if args else 2
    name: str | None = None
    if args[0] == "--environment" and len(args) > 1:
        name, rest = args[1], args[2:]
    elif args[0].startswith("--environment="):
        name, rest = args[0].split("=", 1)[1], args[1:]
    if not name:
        print("camg.prepare: the first argument must be --environment NAME", file=sys.stderr)
        return 2
    try:
        plugin = plugins.get(name)
    except ConfigError as exc:
        print(f"camg.prepare: {exc}", file=sys.stderr)
        return 2
    return plugin.run_prepare(rest)


if __name__ == "__main__":
    sys.exit(main())
