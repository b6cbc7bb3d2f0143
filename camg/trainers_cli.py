"""``camg trainer add|list|revoke``: the principals of a deployment (camg.web.auth).

    camg trainer add NAME [--role trainer|operator] [--replace] [--token-file PATH]
                          [--file PATH]
    camg trainer list [--file PATH]
    camg trainer revoke NAME [--file PATH]

``add`` prints the new token once, on standard output and nowhere else (or
writes it to ``--token-file``, 0600); the trainers file keeps only its hash.
Run as root: the file is written 0600 and given to the service user
(``--owner``, default camg where it exists), so the services read it and
nobody else does. Services pick changes up within a second, without a
restart.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
import time

from camg.errors import CamgError
from camg.web import auth

SERVICE_USER = "camg"


def _default_owner() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        return None
    return SERVICE_USER


def _write_token(path: str, token: str) -> None:
    """The token in a file only its owner reads (camg_client looks in
    ~/.config/camg/token by default)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(token + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="camg trainer", description="the trainers a deployment accepts"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="add a trainer and print its token once")
    add.add_argument("name")
    add.add_argument("--role", choices=auth.ROLES, default="trainer")
    add.add_argument(
        "--replace", action="store_true", help="revoke a trainer of that name first (a new token)"
    )
    add.add_argument(
        "--token-file",
        metavar="PATH",
        help="write the token to PATH (0600) instead of standard output",
    )
    listing = sub.add_parser("list", help="the trainers, their roles and when they were added")
    revoke = sub.add_parser("revoke", help="remove a trainer; its token stops working")
    revoke.add_argument("name")
    for command in (add, listing, revoke):
        command.add_argument(
            "--file", default=auth.DEFAULT_TRAINERS, help="the trainers file (default %(default)s)"
        )
        command.add_argument(
            "--owner",
            default=None,
            help="the user the file belongs to (default: camg when run as "
            "root and that user exists)",
        )
    args = parser.parse_args(argv)
    owner = args.owner or _default_owner()
    try:
        if args.command == "add":
            if args.replace:
                auth.revoke(args.file, args.name, owner=owner)
            token = auth.add_trainer(args.file, args.name, args.role, owner=owner)
            if args.token_file:
                _write_token(args.token_file, token)
                print(
                    f"camg trainer: added {args.name} ({args.role}) to {args.file}; its "
                    f"token is in {args.token_file}",
                    file=sys.stderr,
                )
            else:
                print(token)
                print(
                    f"camg trainer: added {args.name} ({args.role}) to {args.file}; the "
                    "token above is shown only now",
                    file=sys.stderr,
                )
        elif args.command == "list":
            for entry in auth.read_trainers(args.file):
                added = entry.get("created_at")
                when = (
                    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(added))
                    if isinstance(added, (int, float))
                    else "-"
                )
                print(f"{entry['name']:<24} {entry['role']:<9} added {when} UTC")
        elif not auth.revoke(args.file, args.name, owner=owner):
            print(f"camg trainer: no trainer {args.name!r} in {args.file}", file=sys.stderr)
            return 1
        else:
            print(f"camg trainer: revoked {args.name}", file=sys.stderr)
    except CamgError as exc:
        print(f"camg trainer: {exc}", file=sys.stderr)
        return 2
    except PermissionError as exc:
        print(f"camg trainer: {exc} (run it as root)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
