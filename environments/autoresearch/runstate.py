"""Fresh state per invocation: the run ledger and ``--check-clean``.

An AutoResearch service starts only on a state directory that
``python -m camg.serve --config … --check-clean`` has checked: the check
writes ``clean.json``; a starting service consumes it and writes
``run.json``, the ledger of what this run holds (its pid, the grader's pid,
every live sandbox and its helper owner label), rewritten atomically as
that changes. The next check reads the ledger, refuses while the run is
still alive, waits for its grader to be gone, releases every sandbox the
ledger names through the helper (their disk uppers go with them), verifies
none is left, removes the ledger and marks the directory clean.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from camg import atomic, errors

CLEAN = "clean.json"
RUN = "run.json"
STOP_FAILED = "stop-failed"


def _read(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            body = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unreadable": True}
    return body if isinstance(body, dict) else {"unreadable": True}


def refusal(state_dir: str, config_hint: str) -> str:
    return (
        f"state directory {state_dir} was not checked since the previous run; run "
        f"`python -m camg.serve --config {config_hint} --check-clean` first (the unit's "
        "ExecStartPre does)"
    )


class RunLedger:
    """The current run's holdings, on disk before each is acquired."""

    def __init__(self, state_dir: str, owner: str, helper_socket: str) -> None:
        self.state_dir = state_dir
        self.path = os.path.join(state_dir, RUN)
        self.body: dict[str, Any] = {
            "pid": os.getpid(),
            "started": time.time(),
            "owner": owner,
            "helper_socket": helper_socket,
            "grader_pid": None,
            "sandboxes": [],
        }
        self._lock = threading.Lock()

    def claim(self, config_hint: str) -> None:
        """Consume the clean mark; refuse an unchecked directory."""
        os.makedirs(self.state_dir, exist_ok=True)
        clean = os.path.join(self.state_dir, CLEAN)
        if _read(clean) is None or os.path.exists(self.path):
            raise errors.ConfigError(refusal(self.state_dir, config_hint))
        # Ledger first, then the mark goes: a crash in between leaves a
        # ledger, which the next check handles like any other.
        self._write()
        os.unlink(clean)

    def _write(self) -> None:
        atomic.write_json(self.path, self.body)

    def set(self, **fields: Any) -> None:
        with self._lock:
            self.body.update(fields)
            self._write()

    def add_sandbox(self, sandbox_id: str) -> None:
        with self._lock:
            self.body["sandboxes"].append(sandbox_id)
            self._write()

    def remove_sandbox(self, sandbox_id: str) -> None:
        with self._lock:
            if sandbox_id in self.body["sandboxes"]:
                self.body["sandboxes"].remove(sandbox_id)
                self._write()


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != b"Z"


def check_clean(
    state_dir: str, *, helper_socket: str, owner: str, grace: float = 15.0
) -> tuple[bool, list[str]]:
    """(clean, what was done or what is wrong). Idempotent."""
    from camg.helper_client import HelperClient

    notes: list[str] = []
    os.makedirs(state_dir, exist_ok=True)
    run = _read(os.path.join(state_dir, RUN))
    if run is not None:
        if run.get("unreadable"):
            return False, [f"{RUN} is unreadable: inspect {state_dir} by hand"]
        if run.get("pid") != os.getpid() and _alive(run.get("pid")):
            return False, [f"the previous run (pid {run['pid']}) is still running"]
        deadline = time.monotonic() + grace
        while _alive(run.get("grader_pid")) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(run.get("grader_pid")):
            return False, [f"the previous run's grader (pid {run['grader_pid']}) is still alive"]
        sandboxes = [s for s in run.get("sandboxes", []) if isinstance(s, str)]
        if sandboxes:
            label = run.get("owner") or owner
            client = HelperClient(run.get("helper_socket") or helper_socket, owner=label)
            try:
                for sid in sandboxes:
                    gone = not client.destroy(sid)
                    notes.append(f"sandbox {sid} {'was already gone' if gone else 'released'}")
                left = set(sandboxes) & {e.get("sandbox_id") for e in client.list_sandboxes()}
            except errors.CamgError as exc:
                return False, [f"cannot release sandboxes {', '.join(sandboxes)}: {exc}"]
            finally:
                client.close()
            if left:
                return False, [f"sandboxes still held after release: {', '.join(sorted(left))}"]
        # A sandbox created in the instant before its ledger entry was
        # written still carries this service's owner label: release those too.
        client = HelperClient(
            run.get("helper_socket") or helper_socket, owner=run.get("owner") or owner
        )
        try:
            stray = [e.get("sandbox_id") for e in client.list_sandboxes()]
            if stray:
                client.release_all()
                notes.append(
                    f"released {len(stray)} unledgered sandbox(es) of owner "
                    f"{run.get('owner') or owner}: {', '.join(map(str, stray))}"
                )
        except errors.Unavailable:
            pass  # no helper running: it holds no sandbox (its start-up sweep reclaims)
        except errors.CamgError as exc:
            return False, notes + [f"cannot list the owner's sandboxes: {exc}"]
        finally:
            client.close()
        os.unlink(os.path.join(state_dir, RUN))
        notes.append("previous run's ledger released")
    try:
        os.unlink(os.path.join(state_dir, STOP_FAILED))
    except FileNotFoundError:
        pass
    atomic.write_json(
        os.path.join(state_dir, CLEAN),
        {"checked_at": time.time(), "by_pid": os.getpid(), "notes": notes},
    )
    return True, notes or ["nothing of a previous run remained"]
