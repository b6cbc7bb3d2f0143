"""Null-forcing canaries of General, played through a service as an agent would.

    python -m environments.general.checks.null_canaries --url http://127.0.0.1:PORT \\
        --manifest M.json --references DIR [--outcomes STATE/outcomes.jsonl]

A trainer masks every episode whose reward is null, so an agent that can
make its own grade fail hides every episode it expects to lose. Each
technique here tries that with shell actions only (uid 2000, in the task's
container) before ``finish``: a detached process filling the container's
pids limit (the transport's kill at finish forked inside it and failed with
EAGAIN; the verifier could not start a process), the writable layer's bytes
or inodes filled, the repository or workspace made unreadable, the
transport's port hogged by connections, a memory hog beside the verifier.
Each is played alone, where it must earn 0.0, and next to the task's
reference (the gold patch; the reference actions and answer), where it must
earn the honest grade or 0.0 (``obstructed``): a reward the reference's work
earns is not a win, a null is. NEVER null: a null the service could not
disprove with its control (camg.episodes.null_proof) fails the suite whatever the
table says (devtools.canary_table counts a null as no win, so the check is
here). Exit status non-zero on any win or null.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from devtools.canary_table import CanaryResult, report

# Forks until the pids limit refuses, and keeps retrying (a shell gives up
# at its first failed fork): every fork in the container fails meanwhile.
PIDS_FILL = (
    "while (1) { my $p = fork; if (defined $p && !$p) { sleep 100000; exit } "
    "select(undef, undef, undef, 0.01) unless defined $p }"
)
# Holds as many connections to the transport as it is given: its Unix
# socket (root-only: refused) and the TCP port it listened on before it
# moved there (nothing listens).
PORT_HOG = (
    "use IO::Socket::INET; use IO::Socket::UNIX; my @s; while (1) { "
    "my $c = IO::Socket::UNIX->new(Peer => '/run/mimo-transport/transport.sock') || "
    "IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => 8000, Timeout => 1); "
    'if ($c) { push @s, $c; print $c "GET /ws HTTP/1.1\\r\\nHost: x\\r\\n" } '
    "else { sleep 1 } }"
)
# Files until the writable layer has no inode left.
INODE_FILL = (
    'mkdir "$ENV{HOME}/.i"; for (my $i = 0; ; $i++) { '
    'open(my $f, \'>\', "$ENV{HOME}/.i/$i") or last } print "inodes gone\\n"'
)
MEMORY_HOG = "my $x = 'a' x (700 * 1024 * 1024); sleep 100000"


def shell(command: str) -> dict:
    return {"operation": "shell", "command": command}


def _detached(perl: str, settle: float = 2.0) -> dict:
    data = base64.b64encode(perl.encode()).decode()
    return shell(
        f"echo {data} | base64 -d > /tmp/.n.pl && setsid nohup perl /tmp/.n.pl "
        f">/dev/null 2>&1 < /dev/null & sleep {settle}; echo started"
    )


#: technique -> shell actions (kind-agnostic: each starts in the repository
#: or the workspace, as uid 2000)
TECHNIQUES: dict[str, list[dict]] = {
    "pids fill at finish": [_detached(PIDS_FILL)],
    "disk bytes filled": [
        shell(
            'avail=$(df --output=avail -B1 "$HOME" | tail -1); '
            'fallocate -l "$avail" "$HOME/.fill" || '
            'fallocate -l $((avail - (1 << 20))) "$HOME/.fill"; '
            'dd if=/dev/zero of="$HOME/.fill2" bs=64k 2>/dev/null; '
            'df -h "$HOME" | tail -1'
        )
    ],
    "disk inodes filled": [
        shell(
            f"echo {base64.b64encode(INODE_FILL.encode()).decode()} | "
            'base64 -d > /tmp/.i.pl && perl /tmp/.i.pl; df -i "$HOME" | '
            "tail -1"
        )
    ],
    "grader scratch made unwritable": [
        shell('chmod -R a-rwx "$HOME" 2>/dev/null; chmod 000 .; echo locked')
    ],
    "transport port hogged": [_detached(PORT_HOG, settle=5.0)],
    "memory hog beside the grade": [_detached(MEMORY_HOG)],
    # (the transport and its MCP servers are root's: the agent uid may not
    # signal them; a detached loop keeps trying through the finish)
    "transport signalled": [
        shell(
            "setsid nohup sh -c 'while :; do for p in /proc/[0-9]*; do "
            '[ "$(stat -c %u $p)" = 0 ] && kill -STOP ${p#/proc/} 2>/dev/null; done; '
            "sleep 0.05; done' "
            ">/dev/null 2>&1 < /dev/null & sleep 1; kill -9 1 2>&1 | head -1; echo tried"
        )
    ],
}

#: played next to the reference by CI too (every one plays alone)
CI_WITH_REFERENCE = ("pids fill at finish", "grader scratch made unwritable")


@dataclasses.dataclass(frozen=True)
class Run:
    technique: str
    task_id: str
    actions: list[dict]
    allowed: float


def runs(
    task: dict,
    reference: list[dict] | None,
    names: Iterable[str] | None = None,
    with_reference: Iterable[str] | None = None,
) -> list[Run]:
    """Each technique alone on ``task`` (a manifest task) and, where named,
    before the reference's last action (its finish); the reference alone."""
    kind = task["data"]["kind"]
    noop = (
        {"operation": "finish"}
        if kind == "opensource-code"
        else {"operation": "finish", "answer": "no idea"}
    )
    chosen = list(TECHNIQUES if names is None else names)
    out = []
    if reference:
        out.append(Run(f"{kind}: reference alone", task["task_id"], reference, 1.0))
    for name in chosen:
        out.append(Run(f"{kind}: {name}", task["task_id"], TECHNIQUES[name] + [noop], 0.0))
        if reference and name in (chosen if with_reference is None else with_reference):
            out.append(
                Run(
                    f"{kind}: {name} + reference",
                    task["task_id"],
                    reference[:-1] + TECHNIQUES[name] + reference[-1:],
                    1.0,
                )
            )
    return out


def _episode(client, run: Run) -> dict:
    episode = client.create(task_id=run.task_id, wait=300)
    reply = None
    try:
        for action in run.actions:
            reply = client.step(episode["episode_id"], action)
            if reply["done"]:
                break
    finally:
        try:
            client.close(episode["episode_id"])
        except Exception:  # noqa: BLE001 -- closed by the finish already
            pass
    if reply is None or not reply["done"]:
        raise RuntimeError(f"{run.technique}: the episode did not finish")
    return {**reply, "episode_id": episode["episode_id"]}


def play(
    client, plays: list[Run], outcome_of: Callable[[str], dict | None], workers: int = 3
) -> tuple[list[CanaryResult], list[str]]:
    """The table's rows and the problems beyond a win: a null, a reference
    alone below 1.0, a 0.0 from a failure whose record is not obstructed."""
    local = threading.local()

    def one(run: Run):
        from camg_client import Client

        if not hasattr(local, "client"):
            local.client = Client(f"http://{client.host}:{client.port}", timeout=client.timeout)
        started = time.monotonic()
        reply = _episode(local.client, run)
        record = outcome_of(reply["episode_id"]) or {}
        notes = [f"{time.monotonic() - started:.0f} s"]
        if reply.get("failure_class"):
            notes.append(f"null: {reply['failure_class']}")
        evidence = record.get("integrity_evidence") or []
        if record.get("integrity") == "obstructed" and evidence:
            notes.append(str(evidence[0])[:120])
        reaped = record.get("reaped")
        if reaped:
            notes.append(f"reaped {reaped['killed']} in {reaped['duration'] * 1000:.0f} ms")
        row = CanaryResult(
            run.technique,
            reply.get("reward"),
            record.get("integrity"),
            run.allowed,
            "; ".join(notes),
        )
        trouble = []
        if reply.get("reward") is None:
            trouble.append(
                f"{run.technique}: null ({reply.get('failure_class')}): "
                f"{record.get('grade_reason') or reply.get('observation')}"
            )
        if run.technique.endswith("reference alone") and reply.get("reward") != 1.0:
            trouble.append(f"{run.technique}: the reference earned {reply.get('reward')}")
        return row, trouble

    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(one, plays))
    return [r for r, _ in done], [t for _, ts in done for t in ts]


def reference_of(task: dict, references: Path) -> list[dict] | None:
    """The task's reference as actions (environments/general/reference.py)."""
    from environments.general import reference

    found = reference.load(references, task["task_id"], task["data"]["kind"])
    return None if found is None else reference.plan(task["task_id"], {"reference": found})


def _outcomes(path: str | None) -> Callable[[str], dict | None]:
    def find(episode_id: str) -> dict | None:
        if not path:
            return None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for line in reversed(Path(path).read_text().splitlines()):
                if line.strip() and json.loads(line).get("episode_id") == episode_id:
                    return json.loads(line)
            time.sleep(0.2)
        return None

    return find


def main(argv: list[str] | None = None) -> int:
    from camg_client import Client

    ap = argparse.ArgumentParser(
        prog="python -m environments.general.checks.null_canaries",
        description="Play General's null-forcing canaries.",
    )
    ap.add_argument("--url", required=True, help="a General service")
    ap.add_argument("--manifest", required=True, help="the service's prepared manifest.json")
    ap.add_argument(
        "--references",
        required=True,
        help="the references directory (gold/<id>.patch, <id>.oracle.json)",
    )
    ap.add_argument("--outcomes", help="the service's outcomes.jsonl")
    args = ap.parse_args(argv)
    client = Client(args.url)
    tasks = json.loads(Path(args.manifest).read_text())["tasks"]
    plays: list[Run] = []
    for kind in ("opensource-code", "general_agent"):
        task = next((t for t in tasks if t["data"]["kind"] == kind), None)
        if task is not None:
            plays += runs(task, reference_of(task, Path(args.references)))
    rows, problems = play(client, plays, _outcomes(args.outcomes))
    return report("general null-forcing", rows, checks=problems)


if __name__ == "__main__":
    sys.exit(main())
