"""Every registered environment's own benchmark, found from its descriptor
(camg.plugins: ``bench``), so a new environment's benchmark runs here the
moment its package is installed.

    .venv/bin/python -m bench.environment_bench --list
    .venv/bin/python -m bench.environment_bench [--json OUT] NAME [ARGS ...]

``--list``: 'NAME module:function' a line (``-``: its plugin names none).
Otherwise NAME's benchmark runs with ARGS (its own ``--help`` says which;
some need root and the privileged tier's caches) and ``--json OUT``
(default bench/results/NAME.json, which bench/table.py then renders into
docs/benchmarks.md). The exit status is the benchmark's, or 1 when it did
not leave one JSON object in OUT: a results file is what a benchmark is
for.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from camg import plugins  # noqa: E402
from camg.errors import ConfigError  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def benches() -> dict[str, str | None]:
    """Every registered environment's benchmark (``module:function``), None
    where its plugin names none."""
    return {name: plugin.bench for name, plugin in plugins.all_plugins().items()}


def run(name: str, argv: list[str], out: Path) -> int:
    """NAME's benchmark with ``argv`` and ``--json out``; its exit status,
    1 when it wrote no JSON object to ``out``."""
    spec = plugins.get(name).bench
    if spec is None:
        raise ConfigError(f"environment {name!r} names no benchmark (its plugin's bench)")
    out.parent.mkdir(parents=True, exist_ok=True)
    # A results file left by an earlier run must not pass for this one's.
    out.unlink(missing_ok=True)
    status = int(plugins.resolve(spec)([*argv, "--json", str(out)]) or 0)
    try:
        results = json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        print(f"bench: {name} left no results in {out}: {exc}", file=sys.stderr)
        return status or 1
    if not isinstance(results, dict):
        print(f"bench: {name}'s results in {out} are not one JSON object", file=sys.stderr)
        return status or 1
    print(f"bench: {name} wrote {out}", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.environment_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--list", action="store_true", help="each environment's benchmark")
    parser.add_argument("--json", type=Path, help="its results (default bench/results/NAME.json)")
    parser.add_argument("name", nargs="?", help="the environment")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    args = parser.parse_args(argv)
    try:
        if args.list:
            for name, spec in benches().items():
                print(name, spec or "-")
            return 0
        if not args.name:
            parser.error("name an environment (--list lists them)")
        return run(args.name, args.args, args.json or RESULTS / f"{args.name}.json")
    except ConfigError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
