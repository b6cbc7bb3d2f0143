"""``python -m mimoagent.transport --root /opt/mimo-task``.

It listens on listener.SOCKET_PATH, a Unix socket only root can reach; it
has no TCP listener (who may reach it: listener.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def create(root: Path, prewarm: bool = True, path: str | None = None):
    """The transport's server for the task under ``root`` (not yet serving)."""
    from mimoagent.transport.checkpoint import STATE_DIR, Checkpoint
    from mimoagent.transport.listener import SOCKET_PATH
    from mimoagent.transport.wsserver import Server

    instance = json.loads((root / "instance.json").read_text())
    kind = instance.get("dataset_type")
    if kind == "opensource-code":
        from mimoagent.transport import software as module

        from mimoagent.transport.verifier_guard import GuardConfig

        env, action = module.bind(root, guard=GuardConfig(), checkpoint=STATE_DIR), module.ShellAction
    elif kind == "general_agent":
        from mimoagent.transport import general as module

        env, action = module.bind(root, checkpoint=STATE_DIR), module.GeneralAction
    else:
        raise SystemExit(f"unsupported dataset_type {kind!r}")
    # The container serves one episode: prepare it before anyone asks, unless
    # this filesystem is a fork's (its reset continues the parent's episode).
    if prewarm and not Checkpoint(STATE_DIR).resuming():
        env.prewarm()
    return Server(env, action, path or SOCKET_PATH, max_size=1 << 24)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="/opt/mimo-task", type=Path)
    ap.add_argument("--no-prewarm", action="store_true", help="prepare the task only at reset")
    args = ap.parse_args(argv)
    create(args.root, prewarm=not args.no_prewarm).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
