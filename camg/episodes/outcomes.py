"""Outcome records and trajectories in the service's state directory.

``outcomes.jsonl`` gets one line per finished episode, fsync'd before the
trainer sees the reply, so a reward a trainer received is never lost by a
crash. ``trajectories/<episode_id>.jsonl`` keeps every step beside it;
steps are appended as they happen (not fsync'd: the outcome record is the
durable fact) and the file is fsync'd when the episode ends.

While an episode runs, ``trajectories/<episode_id>.open`` marks it. A
service killed (or crashed) with episodes running cannot write their
records; the next start of the service does (``recover``): ``reward:
null``, ``failure_class: infra``, ``recovered: true``. Episodes live in the
process, so the restarted service answers 404 for them, and the record is
what a trainer finds.

With a ``camg.episodes.signing.Signer`` every record is numbered (``seq``), chained
to the line before it (``prev``) and signed; ``stamp`` fields (the task
selection hash) are added to each record that lacks them. The chain's tail
is read under an flock of the log, so two writers never fork it.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from camg import atomic
from camg.episodes import signing

# One encoder for every line: json.dumps with options builds a new one per
# call, and a trajectory line is written on every step's hot path.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def _line(record: Any) -> bytes:
    return (_ENCODE(record) + "\n").encode("utf-8")


class OutcomeLog:
    def __init__(
        self,
        state_dir: str | os.PathLike,
        *,
        signer: signing.Signer | None = None,
        stamp: dict | None = None,
    ) -> None:
        self.root = Path(state_dir)
        self.signer = signer
        self.stamp = dict(stamp or {})
        # (end offset, seq, line hash) of the last record this process wrote.
        self._tail: tuple[int, int, str] | None = None
        self.trajectories = self.root / "trajectories"
        self.trajectories.mkdir(parents=True, exist_ok=True)
        self.path = self.root / "outcomes.jsonl"
        self._lock = threading.Lock()
        # O_APPEND: concurrent writers (a restarted service, a second
        # process) never interleave inside one record.
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        self._cut_torn_tail()
        self._traj_fds: dict[str, int] = {}
        if signer is not None:  # for camg.verify beside the records it checks
            public = self.root / signing.PUBLIC_FILE
            pem = signing.describe(signer.public)["public_key_pem"].encode()
            if not public.exists() or public.read_bytes() != pem:
                atomic.write_bytes(public, pem, mode=0o644)

    def _cut_torn_tail(self) -> None:
        # kill -9 inside a write leaves a short write (a fatal signal stops
        # a regular-file write at a page boundary): a record never
        # acknowledged, since the reply waits for the fsync. Cut it, or the
        # next record would be appended onto the fragment and both be lost.
        size = os.fstat(self._fd).st_size
        if size == 0 or os.pread(self._fd, 1, size - 1) == b"\n":
            return
        start = max(0, size - (1 << 20))
        tail = os.pread(self._fd, size - start, start)
        if b"\n" in tail or start == 0:
            os.ftruncate(self._fd, start + tail.rfind(b"\n") + 1)
        else:  # no record is this long: end the fragment's line, keep the rest
            os.write(self._fd, b"\n")
        os.fsync(self._fd)

    def append(self, record: dict) -> None:
        """Write ``record`` durably; the fields the log adds (``seq``,
        ``prev``, stamp, signature) are added to ``record`` too."""
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                data = self._chained(record)
                view = memoryview(data)
                while view:  # a short write is finished, never left torn
                    view = view[os.write(self._fd, view) :]
                os.fsync(self._fd)
                if self.signer is not None:
                    self._tail = (
                        os.fstat(self._fd).st_size,
                        record["seq"],
                        signing.line_hash(data),
                    )
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        if isinstance(record.get("episode_id"), str):
            self._marker(record["episode_id"]).unlink(missing_ok=True)

    def _chained(self, record: dict) -> bytes:
        record.update({k: v for k, v in self.stamp.items() if k not in record})
        if self.signer is None:
            return _line(record)
        seq, prev = self._last()
        record.update(seq=seq + 1, prev=prev)
        # Signed as it will read back: JSON's form of every value.
        body = json.loads(_line(record))
        self.signer.sign(body)
        record.update(signing_key=body["signing_key"], signature=body["signature"])
        return _line(body)

    def _last(self) -> tuple[int, str | None]:
        """(seq, line hash) of the log's last record; (-1, None) if empty."""
        size = os.fstat(self._fd).st_size
        if self._tail is not None and self._tail[0] == size:
            return self._tail[1], self._tail[2]
        if size == 0:
            return -1, None
        end = start = size
        tail = b""
        while start > 0 and b"\n" not in tail[:-1]:
            start = max(0, start - (1 << 16))
            tail = os.pread(self._fd, end - start, start) + tail
            end = start
        line = tail[:-1].rsplit(b"\n", 1)[-1] + b"\n"
        try:
            seq = json.loads(line).get("seq")
        except (ValueError, AttributeError):
            seq = None
        # A line of an older, unchained log starts a new chain after it.
        return (seq if isinstance(seq, int) else -1), signing.line_hash(line)

    def _marker(self, episode_id: str) -> Path:
        return self.trajectories / f"{episode_id}.open"

    def recover(self, environment: str, config_hash: str) -> list[str]:
        """Record the end of every episode a killed predecessor left running
        (its marker is still there); returns their ids."""
        markers = sorted(self.trajectories.glob("*.open"))
        if not markers:
            return []
        # A kill between a record's fsync and its marker's unlink: recorded.
        wanted = {m.name.removesuffix(".open") for m in markers}
        recorded = set()
        with open(self.path, "rb") as handle:
            for line in handle:
                if any(eid.encode() in line for eid in wanted):
                    try:
                        recorded.add(json.loads(line)["episode_id"])
                    except (ValueError, KeyError, TypeError):
                        pass
        ended = []
        for marker in markers:
            eid = marker.name.removesuffix(".open")
            if eid not in recorded:
                entries = self._entries(eid)
                # a fork's child begins with its fork event (camg.episodes.forking)
                reset = next((e for e in entries if e.get("event") in ("reset", "fork")), {})
                reason = (
                    "the service process ended while the episode ran (killed or "
                    "crashed); recorded by its next start"
                )
                self.trajectory(
                    eid,
                    {"event": "end", "reward": None, "failure_class": "infra", "reason": reason},
                )
                self.finish_trajectory(eid)
                self.append(
                    {
                        "environment": environment,
                        "episode_id": eid,
                        "task_id": reset.get("task_id"),
                        "seed": reset.get("seed"),
                        "reward": None,
                        "failure_class": "infra",
                        "status": "closed",
                        "reason": reason,
                        "recovered": True,
                        # a fork's child counts on from its parent's steps
                        "steps": sum(1 for e in entries if e.get("event") == "step")
                        + int(reset.get("fork_step") or 0),
                        "started_at": marker.stat().st_mtime,
                        "ended_at": time.time(),
                        "timings": {},
                        "config_hash": config_hash,
                        # a variant's stays one: its canary part, without a grade
                        **{
                            k: reset[k]
                            for k in ("forked_from", "fork_step", "canary")
                            if k in reset
                        },
                    }
                )
                ended.append(eid)
            marker.unlink(missing_ok=True)
        return ended

    def _entries(self, episode_id: str) -> list[dict]:
        entries = []
        try:
            with open(self.trajectory_path(episode_id), "rb") as handle:
                for line in handle:
                    try:
                        entries.append(json.loads(line))
                    except ValueError:
                        pass  # the killed writer's last, torn line
        except FileNotFoundError:
            pass
        return entries

    def trajectory_path(self, episode_id: str) -> Path:
        return self.trajectories / f"{episode_id}.jsonl"

    def trajectory(self, episode_id: str, entry: dict) -> None:
        fd = self._traj_fds.get(episode_id)
        if fd is None:
            if not self._marker(episode_id).exists():
                os.close(
                    os.open(
                        self._marker(episode_id), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o640
                    )
                )
            fd = os.open(
                self.trajectory_path(episode_id),
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                0o640,
            )
            self._traj_fds[episode_id] = fd
        os.write(fd, _line(entry))

    def finish_trajectory(self, episode_id: str) -> None:
        fd = self._traj_fds.pop(episode_id, None)
        if fd is not None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        for episode_id in list(self._traj_fds):
            self.finish_trajectory(episode_id)
        os.close(self._fd)

    def find(self, episode_id: str) -> dict | None:
        """The episode's own outcome record (not a regrade of it), or None.

        A linear scan (the log is not indexed): only regrades of episodes
        older than the manager's in-memory table come here.
        """
        needle = json.dumps(episode_id).encode()
        with open(self.path, "rb") as handle:
            for line in handle:
                if needle not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("episode_id") == episode_id and "regrade_of" not in record:
                    return record
        return None

    def read(self) -> list[dict]:
        with open(self.path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
