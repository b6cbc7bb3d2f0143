"""What the root transport does before the software verifier runs.

The verifier runs the test command as the agent's uid (seed 001's
``VerifierExecution`` default), in the agent's container, in the agent's
repository. Whatever the agent left behind could reach that run, so before
it starts (after the agent's last action, as root):

1. **Bounded processes**: every process of the agent uid is killed and none
   may remain (``reap``); a survivor is an infrastructure failure, never a
   grade. A background process can no longer rewrite files under the
   running verifier or signal it.
2. **Nothing planted outside the repository**: the agent's entries in the
   world-writable directories are removed, and the verifier gets a fresh
   HOME and TMPDIR under a root-owned directory the agent never saw, with
   the user site off (``clean_env``).
3. **The repository's git control files are the pristine ones**: ``.git``
   is replaced by the copy taken at setup (``Pristine.restore_git``), so no
   hook, filter driver, fsmonitor, replace ref or rewritten object of the
   agent's runs inside the verifier's git commands; bytecode the agent
   wrote is removed (a ``.pyc`` is trusted by mtime and size alone).
4. **What the agent changed is recorded** (``Pristine.changes``): the tree
   walked against the setup-time snapshot -- no git involved, so nothing the
   agent did to git hides a change -- with the added lines of each changed
   text file, written to ``/logs/verifier/changes.json`` for the General
   service to screen for runner tampering (environments/general/integrity.py).
5. **The test runner reports to a guard of ours** (``arm``/``seal``): the
   test command gets camg's pytest guard (camg/grading/guard/camg_guard.py, the one
   Coding's grader runs; a root-owned copy in the read-only agent
   environment) loaded first with plugin autoloading off, keys made for
   this grade alone and a channel in the grade's root-owned directory.
   The keys are files in a 0700 directory of the agent uid's, one per guard
   session (each session claims one and removes it, then makes its process
   undumpable): never an environment, which every process of the uid can
   read in /proc. The channel is a FIFO only root reads, drained into a
   bounded buffer while the tests run: a process of the uid may write to it
   (unsigned lines are forgeries) but cannot truncate or rewrite it.
   After the run every process of the agent uid is killed again and the
   channel, the keys, the exit status and the log go to
   ``/logs/verifier/guard.json`` (root only) for the service's cross-check
   (camg.grading.guard_verdict): what the tests really did decides, not what the
   runner reported.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

AGENT_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
#: root-owned; per-grade homes and the pristine .git live below it
STATE_ROOT = "/var/lib/mimo-verifier"
CHANGES_FILE = "/logs/verifier/changes.json"
GUARD_RECORD = "/logs/verifier/guard.json"
#: tools/general/agent_env.py puts camg's guard there (a read-only mount in the container)
TEST_GUARD_DIR = os.path.join(sys.prefix, "camg-guard")


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    """Where the guard acts. The defaults are the task container's; the
    in-process tests pass their own (a reap of the agent uid on a host would
    reach that uid's processes in every container there)."""

    tmp_dirs: tuple[str, ...] = AGENT_TMP_DIRS
    state_root: str = STATE_ROOT
    changes_file: str = CHANGES_FILE
    reap_deadline_s: float = 10.0
    test_guard_dir: str = TEST_GUARD_DIR
    guard_record: str = GUARD_RECORD
#: bounds of changes.json: the added text sent per file and in all, entries
FILE_TEXT_LIMIT = 256 << 10
TEXT_BUDGET = 4 << 20
ENTRY_LIMIT = 50000
_BYTECODE = (".pyc", ".pyo")
# What pytest reads as tests, their support (helpers, fixtures, data under a
# test directory) and its configuration: put back to the base before the run,
# as Coding's grader reverts its protected paths (environments/coding/grading.py's
# list; tests/unit/test_general_integrity.py holds the two equal).
TEST_SUPPORT_DIRS = ("test", "tests", "testing")
TEST_SUPPORT_NAMES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
                      ".pytest.ini", "pytest.toml", ".pytest.toml", "noxfile.py")
TEST_SUPPORT_GLOBS = ("test_*.py", "*_test.py")


def is_test_support(rel: str) -> bool:
    import fnmatch

    parts = [p for p in rel.split("/") if p]
    if not parts:
        return False
    if any(p in TEST_SUPPORT_DIRS for p in parts[:-1]):
        return True
    return parts[-1] in TEST_SUPPORT_NAMES or any(
        fnmatch.fnmatchcase(parts[-1], g) for g in TEST_SUPPORT_GLOBS)


# --- 1. processes -----------------------------------------------------------

def agent_processes(uid: int, proc: str = "/proc") -> list[int]:
    """Live (not zombie) processes with ``uid`` among their real, effective,
    saved or filesystem uids."""
    found = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/status", encoding="ascii", errors="replace") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue  # gone meanwhile
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if str(uid) in fields.get("Uid", "").split():
            found.append(int(name))
    return found


def _kill_all_as(uid: int) -> None:
    """kill(-1, SIGKILL) as ``uid``: one atomic sweep of everything the uid
    may signal (a fork in flight is refused under the same lock). No fork
    to be had (the agent filled the container's pids limit: EAGAIN): the
    caller's kill of each pid from root does the work, round after round,
    while the full table refuses the agent's forks too. The service has
    the helper kill them from outside before finish (ContainerReap), so
    this is the second line."""
    try:
        pid = os.fork()
    except OSError:
        return
    if pid == 0:  # child: only system calls until _exit
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        except BaseException:  # noqa: BLE001 -- nothing to report from here
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def reap(uid: int, deadline_s: float = 10.0) -> int:
    """Kill every process of ``uid``; return how many there were. Raises
    RuntimeError if some survive ``deadline_s`` (the grade must not run)."""
    first = agent_processes(uid)
    end = time.monotonic() + deadline_s
    left = first
    while left:
        if time.monotonic() > end:
            raise RuntimeError(f"{len(left)} process(es) of uid {uid} survive SIGKILL: {left[:10]}")
        _kill_all_as(uid)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
        left = agent_processes(uid)
    return len(first)


# --- 2. what the agent planted outside the repository ------------------------

def purge_agent_entries(uid: int, dirs=AGENT_TMP_DIRS) -> int:
    removed = 0
    for top in dirs:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    return removed


def clean_env(uid: int, state_root: str = STATE_ROOT) -> tuple[str, dict]:
    """A fresh directory (root-owned parent) with ``home`` and ``tmp`` for
    the verifier, and the environment that points there."""
    os.makedirs(state_root, mode=0o711, exist_ok=True)
    os.chmod(state_root, 0o711)
    base = tempfile.mkdtemp(prefix="grade-", dir=state_root)
    for name in ("home", "tmp"):
        os.mkdir(os.path.join(base, name), 0o700)
        os.chown(os.path.join(base, name), uid, uid)
    os.chmod(base, 0o711)
    home, tmp = os.path.join(base, "home"), os.path.join(base, "tmp")
    return base, {"HOME": home, "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp, "PYTHONNOUSERSITE": "1"}


# --- 3 and 4. the repository ---------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Entry:
    kind: str          # file, link, dir, other
    size: int
    ino: int
    ctime_ns: int
    mode: int
    target: str = ""   # links


def walk(repo: str) -> dict[str, Entry]:
    """Every path under ``repo`` except the top-level ``.git``, unfollowed."""
    out: dict[str, Entry] = {}
    for dirpath, dirnames, filenames in os.walk(repo, followlinks=False):
        rel_dir = os.path.relpath(dirpath, repo)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != ".git"]
            filenames = [f for f in filenames if f != ".git"]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            try:
                st = os.lstat(path)
            except OSError:
                continue
            kind = ("link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode)
                    else "file" if stat.S_ISREG(st.st_mode) else "other")
            target = os.readlink(path) if kind == "link" else ""
            out[rel] = Entry(kind, st.st_size, st.st_ino, st.st_ctime_ns, st.st_mode & 0o7777, target)
    return out


def _added(new: bytes, old: bytes | None) -> str:
    """The lines of ``new`` that ``old`` does not have (as many times as they
    are new), in order: what a screen of added lines needs, without a diff's cost."""
    lines = new.decode("utf-8", "replace").splitlines()
    if old is None:
        return "\n".join(lines)
    have = collections.Counter(old.decode("utf-8", "replace").splitlines())
    added = []
    for line in lines:
        if have[line] > 0:
            have[line] -= 1
        else:
            added.append(line)
    return "\n".join(added)


class Pristine:
    """The repository as the agent got it: a tree snapshot and a root-only
    copy of its ``.git``, taken at setup; the base content comes from the
    task's workspace.tar (root-only, the agent never wrote it)."""

    def __init__(self, repo: str, workspace_tar: str, uid: int, state_root: str = STATE_ROOT) -> None:
        self.repo = repo
        self.tar = workspace_tar
        self.uid = uid
        self.entries: dict[str, Entry] = {}
        self.state_root = state_root
        self.git_copy = os.path.join(state_root, "pristine-git")

    def snapshot(self) -> None:
        self.entries = walk(self.repo)
        os.makedirs(self.state_root, mode=0o711, exist_ok=True)
        shutil.rmtree(self.git_copy, ignore_errors=True)
        subprocess.run(["cp", "-a", os.path.join(self.repo, ".git"), self.git_copy], check=True)
        os.chmod(self.git_copy, 0o700)

    def restore_git(self) -> None:
        target = os.path.join(self.repo, ".git")
        if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
            os.unlink(target)
        elif os.path.isdir(target):
            shutil.rmtree(target)
        subprocess.run(["cp", "-a", self.git_copy, target], check=True)
        os.chmod(target, 0o755)
        subprocess.run(["chown", "-R", f"{self.uid}:{self.uid}", target], check=True)

    def purge_bytecode(self) -> int:
        """Remove every .pyc/.pyo the agent wrote or changed (Python and
        pytest's rewrite cache trust one whose header matches the source's
        mtime and size; they rebuild a missing one)."""
        removed = 0
        for rel, entry in walk(self.repo).items():
            if entry.kind == "file" and rel.endswith(_BYTECODE) and self.entries.get(rel) != entry:
                try:
                    os.unlink(os.path.join(self.repo, rel))
                    removed += 1
                except OSError:
                    pass
        return removed

    def _base_members(self) -> tuple[tarfile.TarFile, dict[str, tarfile.TarInfo]]:
        archive = tarfile.open(self.tar)
        members = {}
        for member in archive.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) == 2 and member.isfile():
                members[parts[1]] = member
        return archive, members

    def _real_parent(self, rel: str) -> str:
        """``rel``'s directory under the repository, every component a real
        directory (a link or file the agent put in the way is removed)."""
        current = self.repo
        for part in [p for p in rel.split("/") if p][:-1]:
            current = os.path.join(current, part)
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                st = None
            if st is not None and not stat.S_ISDIR(st.st_mode):
                os.unlink(current)
                st = None
            if st is None:
                os.mkdir(current, 0o755)
                os.chown(current, self.uid, self.uid)
        return current

    def restore_test_support(self) -> list[str]:
        """Every test and test-support path (``is_test_support``) that differs
        from the base is rewritten from workspace.tar, one the base lacks is
        removed: a helper, fixture or configuration the hidden tests use is
        the base's, whatever the agent did to it. The paths put back."""
        now = walk(self.repo)
        archive, members = self._base_members()
        restored = []
        try:
            for rel in sorted(set(now) | set(members)):
                entry = now.get(rel)
                if not is_test_support(rel) or (entry is not None and entry.kind == "dir"):
                    continue
                path = os.path.join(self.repo, rel)
                member = members.get(rel)
                if member is None:
                    os.unlink(path)
                    restored.append(rel)
                    continue
                handle = archive.extractfile(member)
                data = handle.read() if handle else b""
                if entry is not None and entry.kind == "file" and entry.mode == member.mode & 0o7777:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                    with os.fdopen(fd, "rb") as current:
                        if current.read(len(data) + 1) == data:
                            continue
                parent = self._real_parent(rel)
                target = os.path.join(parent, os.path.basename(rel))
                if entry is not None or os.path.lexists(target):
                    if os.path.isdir(target) and not os.path.islink(target):
                        shutil.rmtree(target)
                    else:
                        os.unlink(target)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.chmod(target, member.mode & 0o7777)
                os.chown(target, self.uid, self.uid)
                restored.append(rel)
        finally:
            archive.close()
        return restored

    def changes(self) -> dict:
        """Changed, added and deleted paths, with the added text of text files."""
        now = walk(self.repo)
        paths = sorted(set(self.entries) | set(now), key=lambda p: (p.count("/"), p))
        out: list[dict] = []
        omitted = 0
        budget = TEXT_BUDGET
        archive, members = self._base_members()
        try:
            for rel in paths:
                before, after = self.entries.get(rel), now.get(rel)
                if after is not None and after.kind == "dir":
                    continue
                if before is not None and after is not None and before.kind == after.kind and (
                        before.size, before.ino, before.ctime_ns, before.mode, before.target) == (
                        after.size, after.ino, after.ctime_ns, after.mode, after.target):
                    continue  # not even a metadata change: same content
                if after is None:
                    if before.kind != "dir":
                        item = {"path": rel, "status": "deleted", "kind": before.kind}
                    else:
                        continue
                else:
                    item = self._changed(rel, before, after, members, archive, budget)
                    if item is None:
                        continue
                    budget -= len(item.get("added") or "")
                if len(out) >= ENTRY_LIMIT:
                    omitted += 1
                    continue
                out.append(item)
        finally:
            archive.close()
        return {"changes": out, "omitted": omitted, "text_limit": FILE_TEXT_LIMIT}

    def _changed(self, rel, before, after, members, archive, budget) -> dict | None:
        status = "added" if before is None or before.kind == "dir" else (
            "type_changed" if before.kind != after.kind else "modified")
        item: dict = {"path": rel, "status": status, "kind": after.kind, "size": after.size}
        if after.kind == "link":
            item["target"] = after.target
            return item
        if after.kind != "file":
            return item
        if after.size > FILE_TEXT_LIMIT or after.size > budget:
            item["withheld"] = "too large" if after.size > FILE_TEXT_LIMIT else "budget"
            return item
        base = None
        if rel in members and before is not None and before.kind == "file":
            handle = archive.extractfile(members[rel])
            base = handle.read() if handle else None
        try:
            fd = os.open(os.path.join(self.repo, rel), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                data = handle.read(FILE_TEXT_LIMIT + 1)
        except OSError as exc:
            item["withheld"] = f"unreadable: {exc.strerror}"
            return item
        if base is not None and data == base and status == "modified":
            return None if (before.mode == after.mode) else item
        if b"\0" in data:
            item["withheld"] = "binary"
            return item
        item["added"] = _added(data, base)
        return item


def write_changes(record: dict, path: str = CHANGES_FILE) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def before_grade(config: GuardConfig, pristine: Pristine,
                 test_paths: list[str]) -> tuple[dict, dict, TestGuard]:
    """Steps 1-5 in order; returns (the verifier's environment, the guard's
    record as written to changes.json, the armed test guard). Raises on any
    failure: the caller gives no reward then."""
    uid = pristine.uid
    killed = reap(uid, config.reap_deadline_s)
    removed = purge_agent_entries(uid, config.tmp_dirs)
    pristine.restore_git()
    bytecode = pristine.purge_bytecode()
    record = pristine.changes()
    # After the record: the screen still sees what the agent did to them.
    restored = pristine.restore_test_support()
    base, env = clean_env(uid, config.state_root)
    record["test_patch_paths"] = list(test_paths)
    guard, guard_env = arm(config, base, record, pristine.repo,
                           reset=set(restored) | set(test_paths), uid=uid)
    record["guard"] = {"processes_killed": killed, "tmp_entries_removed": removed,
                       "bytecode_removed": bytecode, "test_support_restored": len(restored),
                       "git_restored": True,
                       "clean_home": True, "user_site": False, "test_guard": True}
    write_changes(record, config.changes_file)
    return {**env, **guard_env}, record, guard


# --- 5. the test guard ----------------------------------------------------------

GUARD_MODULE = "camg_guard"
CHANNEL_LIMIT = 8 << 20
#: keys per grade: the test command may run several pytest sessions, each
#: takes one (a session that finds none left is a finding, guard_unkeyed)
KEY_COUNT = 8
_UNSET = "camg:unset"


class ChannelReader:
    """Root's end of the channel FIFO: opened read-write and non-blocking
    (so it never sees an end of file while no writer is open), drained by a
    thread into a buffer of ``limit`` bytes; what comes past it is dropped
    and marked truncated (the writers never block on a full pipe)."""

    def __init__(self, path: str, limit: int = CHANNEL_LIMIT) -> None:
        self.limit = limit
        self.data = bytearray()
        self.truncated = False
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guard-channel", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            room = self.limit - len(self.data)
            if len(chunk) > room:
                self.truncated = True
                chunk = chunk[:max(room, 0)]
            self.data += chunk

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                self._drain()

    def close(self) -> tuple[bytes, bool]:
        """Stop the thread, take what is left; (channel, truncated). Twice is fine."""
        if self._fd >= 0:
            self._stop.set()
            self._thread.join()
            self._drain()
            os.close(self._fd)
            self._fd = -1
        return bytes(self.data), self.truncated


@dataclasses.dataclass(frozen=True)
class TestGuard:
    keys: tuple[str, ...]
    channel: str       # the FIFO the guard writes its signed lines to
    record: str        # where seal() leaves them for the service
    keys_dir: str = ""
    reader: ChannelReader | None = None


def runner_env(environ: dict, *, guard_dir: str, keys_dir: str, out: str, workdir: str,
               changed: str) -> dict:
    """What the test command gets so that pytest loads the guard first
    (``-p camg_guard`` from ``guard_dir``, autoloading off); the guard hands
    the original values back to any child process (the variables of Coding's
    grader script, environments/coding/grading.py)."""
    def orig(name):
        return environ[name] if name in environ else _UNSET

    addopts, path = environ.get("PYTEST_ADDOPTS", ""), environ.get("PYTHONPATH", "")
    return {"CAMG_GUARD_ORIG_PYTEST_ADDOPTS": orig("PYTEST_ADDOPTS"),
            "CAMG_GUARD_ORIG_PYTEST_DISABLE_PLUGIN_AUTOLOAD": orig("PYTEST_DISABLE_PLUGIN_AUTOLOAD"),
            "CAMG_GUARD_ORIG_PYTHONPATH": orig("PYTHONPATH"),
            "PYTEST_ADDOPTS": f"-p {GUARD_MODULE}" + (f" {addopts}" if addopts else ""),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONPATH": guard_dir + (f":{path}" if path else ""),
            "CAMG_GUARD_KEYS": keys_dir, "CAMG_GUARD_OUT": out, "CAMG_GUARD_WORKDIR": workdir,
            "CAMG_GUARD_CHANGED": changed}


def _root_only(path: str) -> None:
    st = os.lstat(path)
    if st.st_uid != 0 or st.st_mode & 0o022 or stat.S_ISLNK(st.st_mode):
        raise RuntimeError(f"{path} is not root-owned and read-only to others")


def write_keys(directory: str, uid: int, count: int = KEY_COUNT) -> list[str]:
    """``count`` fresh keys, one 0600 file each, in a new 0700 directory of
    ``uid``'s (the guard, running as ``uid``, claims and removes them)."""
    os.mkdir(directory, 0o700)
    os.chown(directory, uid, uid)
    keys = [secrets.token_hex(32) for _ in range(count)]
    for index, key in enumerate(keys):
        fd = os.open(os.path.join(directory, str(index)),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (key + "\n").encode())
            os.fchown(fd, uid, uid)
        finally:
            os.close(fd)
    return keys


def arm(config: GuardConfig, base: str, record: dict, repo: str,
        reset: set[str] = frozenset(), uid: int | None = None) -> tuple[TestGuard, dict]:
    """Keys, a channel and the list of changed files for this grade (in
    ``base``: root-owned, unlisted; ``reset`` paths are the base's again
    when the tests run, so not the agent's); the test command's environment.
    ``uid``: the test command's (it owns the keys directory)."""
    guard_dir = os.path.realpath(config.test_guard_dir)
    for path in (guard_dir, os.path.join(guard_dir, GUARD_MODULE + ".py")):
        _root_only(path)
    keys_dir = os.path.join(base, "keys")
    keys = write_keys(keys_dir, os.getuid() if uid is None else uid)
    channel = os.path.join(base, "guard.fifo")
    os.mkfifo(channel, 0o600)
    # Root's FIFO: the test process may write to it, never read, remove or
    # replace it; only root's reader drains it.
    os.chmod(channel, 0o622)
    reader = ChannelReader(channel)
    changed = os.path.join(base, "changed")
    paths = [str(c["path"]) for c in record.get("changes", [])
             if c.get("status") != "deleted" and str(c["path"]) not in reset]
    with open(changed, "wb") as handle:
        handle.write(b"\0".join(p.encode() for p in paths))
    os.chmod(changed, 0o644)
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env = runner_env(environ, guard_dir=guard_dir, keys_dir=keys_dir, out=channel, workdir=repo,
                     changed=changed)
    return TestGuard(tuple(keys), channel, config.guard_record, keys_dir, reader), env


def seal(guard: TestGuard, uid: int, exit_code: int, log: str, deadline_s: float = 10.0) -> dict:
    """After the test command: nothing it started may still write; the
    channel (bounded), the keys, the exit status and the log, root-only."""
    try:
        left = reap(uid, deadline_s)
    finally:
        data, truncated = guard.reader.close() if guard.reader else (b"", False)
        if guard.keys_dir:
            shutil.rmtree(guard.keys_dir, ignore_errors=True)
    record = {"keys": list(guard.keys), "channel": data.decode("utf-8", "replace"),
              "channel_truncated": truncated, "exit_code": exit_code,
              "log": log, "processes_after_run": left}
    os.makedirs(os.path.dirname(guard.record), mode=0o755, exist_ok=True)
    tmp = guard.record + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(tmp, guard.record)
    return record
