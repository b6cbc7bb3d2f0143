"""python -m camg.verify outcomes.jsonl [--public-key FILE]

Checks an outcome record file offline: every line's Ed25519 signature
(camg.episodes.signing) and the chain (``seq`` one more than the line before,
``prev`` the SHA-256 of the line before). Names each line that fails and
exits 1; 0 when every line holds. Without ``--public-key`` it uses
``outcomes.pub`` beside the file, which proves the file is intact but not
whose it is: pass the key ``/metadata`` published (``public_key_pem``, or
the base64 ``public_key``) to prove it came from that deployment.

A record of an impossible variant's episode carries ``canary`` in its
signed part (camg.episodes.canaries): the signature covers it, and its verdict
must agree with the record's own reward and integrity. The summary counts
those records and their cheating rate.

A removed last line leaves no gap in the chain; it is caught against the
trainer's receipts: every terminal reply carries its record's ``outcome_seq``,
and ``--through SEQ`` (the highest the trainer received) fails a file that
ends before it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from camg.episodes import canaries, signing
from camg.errors import ConfigError


def check(lines: list[bytes], public, through: int | None = None) -> list[tuple[int, str]]:
    """(line number, problem) for every failing line, numbered from 1; with
    ``through``, a file whose last seq is below it fails at its end."""
    failures = []
    before: tuple[int | None, bytes] | None = None  # (seq, bytes) of the line before
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            failures.append((number, f"not a JSON record ({exc})"))
            before = (None, line)
            continue
        found = []
        wrong = signing.problem(record, public)
        if wrong:
            found.append(wrong)
        disagrees = canaries.problem(record)
        if disagrees:
            found.append(disagrees)
        seq = record.get("seq")
        if before is None:
            if seq != 0:
                found.append(f"the file starts at seq {seq!r}, not 0 (lines before it missing)")
        else:
            if isinstance(before[0], int) and isinstance(seq, int) and seq != before[0] + 1:
                gap = seq - before[0] - 1
                found.append(
                    f"seq {seq} follows {before[0]}"
                    + (f": {gap} line(s) missing before it" if gap > 0 else "")
                )
            if record.get("prev") != signing.line_hash(before[1]):
                found.append(
                    f"prev does not match line {number - 1} (a line removed, "
                    "inserted or changed before it)"
                )
        if found:
            eid = record.get("episode_id")
            failures.append((number, (f"episode {eid}: " if eid else "") + "; ".join(found)))
        before = (seq if isinstance(seq, int) else None, line)
    if through is not None:
        last = before[0] if before is not None else -1
        if last is None or last < through:
            failures.append(
                (
                    len(lines) + 1,
                    f"the file ends at seq {last!r} but the trainer "
                    f"received seq {through}: the records after it are missing",
                )
            )
    return failures


def _records(lines: list[bytes]) -> list[dict]:
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m camg.verify", description=__doc__.split("\n")[2]
    )
    parser.add_argument("outcomes", type=Path)
    parser.add_argument(
        "--public-key",
        type=Path,
        metavar="FILE",
        help=f"the deployment's public key (default: {signing.PUBLIC_FILE} beside the file)",
    )
    parser.add_argument(
        "--through",
        type=int,
        metavar="SEQ",
        help="the highest outcome_seq the trainer received: fail if the file "
        "ends before it (a removed last line)",
    )
    args = parser.parse_args(argv)
    key_file = args.public_key or args.outcomes.with_name(signing.PUBLIC_FILE)
    try:
        public = signing.load_public(key_file)
        lines = args.outcomes.read_bytes().splitlines(keepends=True)
    except (OSError, ConfigError) as exc:
        print(f"camg.verify: {exc}", file=sys.stderr)
        return 2
    failures = check(lines, public, args.through)
    for number, why in failures:
        print(f"{args.outcomes}:{number}: {why}")
    records = sum(1 for line in lines if line.strip())
    print(
        f"camg.verify: {records - len(failures)} of {records} records verified "
        f"with {signing.fingerprint(public)} ({key_file})",
        file=sys.stderr,
    )
    counts = canaries.tally(_records(lines))
    if counts["episodes"] or counts["ungraded"]:
        print(f"camg.verify: canary episodes: {canaries.describe(counts)}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
