"""One Debian machine booted under systemd-nspawn, driven from the host.

systemd is not PID 1 on the host, so there is no machined: the container is
started with --register=no --keep-unit and commands run inside it through
``nsenter`` into its PID 1's namespaces. nspawn puts its payload cgroup
below its own, so the nspawn process is first moved into a cgroup of this
machine's own (name=systemd and unified hierarchies); two machines, or
another engineer's nspawn, never share one.

The host's cgroup-v1 controllers are mounted read-only inside nspawn; the
helper gets per-machine host directories bound at /run/hostcg/<controller>
instead (see helper_config_for_guest()).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from systest_cgroup import CGROOT, OwnCgroup, children, rmdir_tree

HELPER_CONTROLLERS = ("cpu", "memory", "pids", "freezer")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class MachineError(RuntimeError):
    pass


class Machine:
    def __init__(self, root: Path, log: Path, *, binds: list[str] = (),
                 private_network: bool = True, capabilities: tuple[str, ...] = (),
                 payload: list[str] | None = None, env: dict[str, str] | None = None,
                 docker: bool = False) -> None:
        # payload: run this command instead of booting systemd (nspawn's
        # stub init is PID 1, the payload PID 2): a machine without systemd.
        self.payload = payload
        self.env = dict(env or {})
        self.private_network = private_network
        self.capabilities = capabilities
        self.root = root
        self.log = log
        # CAMG_SYSTEST_CGROUP_PREFIX: a prefix without "camg" keeps the
        # privileged tier's leak check (it watches camg* cgroups) blind to a
        # system run beside it on a shared machine; CI runs the tiers in turn.
        self.cgroup = OwnCgroup(os.environ.get("CAMG_SYSTEST_CGROUP_PREFIX", "camg-systest"))
        self.token = self.cgroup.name
        self.binds = list(binds)
        # docker: the guest runs its own dockerd (systest_docker.py): nspawn
        # keeps the keyring syscalls runc needs, and the guest gets writable
        # cgroup-v1 controllers of this machine's own to mount over its
        # read-only ones.
        self.docker = docker
        self.proc: subprocess.Popen | None = None
        self.leader: int | None = None

    # -- cgroups owned by this machine -----------------------------------
    def helper_cgroups(self) -> dict[str, Path]:
        return {c: CGROOT / c / self.token for c in HELPER_CONTROLLERS}

    def docker_cgroups(self) -> dict[str, Path]:
        if not self.docker:
            return {}
        from systest_docker import docker_cgroup_dirs
        return docker_cgroup_dirs(f"{self.token}-docker")

    @staticmethod
    def helper_config_for_guest(base: dict) -> dict:
        """The helper config with its cgroup parents on the bound host dirs."""
        return {**base, "cgroup_parents": {c: f"/run/hostcg/{c}" for c in HELPER_CONTROLLERS}}

    # -- lifecycle --------------------------------------------------------
    def boot(self, timeout: float = 120.0) -> None:
        self.cgroup.create()
        for path in self.helper_cgroups().values():
            path.mkdir()
        docker_args: list[str] = []
        if self.docker:
            from systest_docker import nspawn_args, prepare_cgroups, prepare_root
            prepare_root(self.root)
            prepare_cgroups(self.docker_cgroups())
            docker_args = nspawn_args(self.docker_cgroups())
        argv = ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit",
                "--as-pid2" if self.payload else "--boot",
                "-D", str(self.root), f"--machine={self.token}", "--console=pipe"]
        argv += [f"--setenv={k}={v}" for k, v in self.env.items()]
        if self.private_network:
            argv.append("--private-network")
        if self.capabilities:
            argv.append("--capability=" + ",".join(self.capabilities))
        argv += [f"--bind={p}:/run/hostcg/{c}" for c, p in self.helper_cgroups().items()]
        argv += docker_args
        argv += [f"--bind-ro={b[:-3]}" if b.endswith(":ro") else f"--bind={b}" for b in self.binds]
        if self.payload:
            argv += ["--", *self.payload]
        out = open(self.log, "ab")
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, preexec_fn=self.cgroup.preexec)
        finally:
            out.close()
        deadline = time.monotonic() + timeout
        while self.leader is None:
            if self.proc.poll() is not None:
                raise MachineError(f"nspawn exited {self.proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise MachineError(f"no container init after {timeout}s: {self._log_tail()}")
            self.leader = self._find_leader()
            time.sleep(0.1)
        if self.payload:
            return
        # The leader exists before it execs systemd, and systemd needs a
        # moment before its private bus answers: retry until it does. Until
        # then systemctl says nothing or "offline" (no manager to ask), which
        # on a loaded machine lasts a while (CI's lanes run beside this).
        while True:
            state = self.run(["systemctl", "is-system-running", "--wait"],
                             timeout=max(5.0, deadline - time.monotonic()), check=False)
            if state.stdout.strip() not in ("", "offline") or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        if state.stdout.strip() not in ("running", "degraded"):
            failed = self.run(["systemctl", "--failed", "--no-pager"], check=False).stdout
            raise MachineError(f"boot ended {state.stdout.strip()!r} ({state.stderr.strip()}):\n"
                               f"{failed}\n{self._log_tail()}")

    def _find_leader(self) -> int | None:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            pids = children.read_text().split()
        except FileNotFoundError:
            return None
        for pid in pids:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except FileNotFoundError:
                continue
            nspid = next(l for l in status.splitlines() if l.startswith("NSpid:")).split()
            if nspid[-1] == "1" and len(nspid) > 2:
                return int(pid)
        return None

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def shutdown(self, timeout: float = 90.0) -> list[str]:
        """Power the machine off cleanly; returns leftovers (empty when none)."""
        problems: list[str] = []
        if self.proc is not None and self.proc.poll() is None:
            # For --boot nspawn turns SIGTERM into SIGRTMIN+3: a clean poweroff.
            self.proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                problems.append(f"container did not power off in {timeout}s; killed")
                self.proc.kill()
                self.proc.wait(30)
            took = time.monotonic() - started
            if took > 20:
                # What the poweroff waited for, from the guest's persistent journal.
                print(f"\nthe machine took {took:.0f} s to power off:\n" + self.journal_tail())
        for path in self.helper_cgroups().values():
            left = children(path)
            if left:
                problems.append(f"helper cgroups left in {path}: {left}")
        for path in self.helper_cgroups().values():
            problems += rmdir_tree(path)
        # The guest's dockerd's own cgroups (/docker below each): empty once
        # its containers are gone, so only processes keep them (a leak).
        for path in self.docker_cgroups().values():
            problems += rmdir_tree(path)
        problems += self.cgroup.remove()
        if self.leader is not None and Path(f"/proc/{self.leader}").exists():
            problems.append(f"container init {self.leader} still running")
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            if str(self.root) in line.split()[4]:
                problems.append(f"mount left on the host: {line}")
        return problems

    def journal_tail(self, lines: int = 80) -> str:
        journal = self.root / "var/log/journal"
        if not journal.is_dir():
            return "(no persistent journal)"
        out = subprocess.run(["journalctl", "-D", str(journal), "--no-pager", "-o",
                              "short-monotonic", "-n", str(lines)], capture_output=True, text=True)
        return out.stdout[-8000:]

    # -- commands inside --------------------------------------------------
    def _enter(self, argv: list[str], env: dict[str, str] | None) -> list[str]:
        if self.leader is None:
            raise MachineError("machine is not booted")
        return ["nsenter", "-t", str(self.leader), "-a", "--", "/usr/bin/env", "-i",
                f"PATH={_PATH}", "LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0",
                "HOME=/root"] + [f"{k}={v}" for k, v in (env or {}).items()] + argv

    def popen(self, argv: list[str], log: Path) -> subprocess.Popen:
        """Start a command inside, outside any unit (as without systemd)."""
        with open(log, "ab") as out:
            return subprocess.Popen(self._enter(argv, None), stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT)

    def run(self, argv: list[str], *, timeout: float = 120.0, check: bool = True,
            input: str | None = None, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
        full = self._enter(argv, env)
        proc = subprocess.run(full, input=input, capture_output=True, text=True,
                              timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise MachineError(f"{argv} exited {proc.returncode}\nstdout: {proc.stdout[-3000:]}"
                               f"\nstderr: {proc.stderr[-3000:]}")
        return proc

    def sh(self, script: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run(["/bin/sh", "-ec", script], **kwargs)
