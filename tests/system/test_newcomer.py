"""The README's first command, run as a newcomer runs it: `packaging/demo.sh`
on a fresh Debian bookworm root with nothing of camg in it (no /srv/camg,
/etc/camg, /var/lib/camg, no demo build caches; only downloaded package
caches — the Debian archive and pip's wheel cache — are kept). Under systemd
(a booted nspawn machine) and without it (the foreground runner). Every
served environment must come up, earn the oracle's reward through
camg/client.py and zero for doing nothing through the stock OpenEnv client,
and stop leaving nothing behind.

Everything happens in a throw-away copy of the cached Debian root, never on
this host's own /srv/camg, /etc/camg or /var/lib/camg. The guest shares the
host's network (pip and Debian must be reachable), so the services listen on
the host's loopback: the test refuses to start while anything else listens
on their ports.

The one concession to nspawn: `--helper-config` points the helper's
cgroup parents at the host's cgroup-v1 controllers bound into the guest
(nspawn mounts them read-only at their usual place).

Cost: each variant is a cold demo (venv from the wheel cache, demo image,
demo task set, Shop's index); the durations of install.sh's steps are
printed (`-s`) and in the log.
"""

from __future__ import annotations

import re
import shutil
import socket
import time
from pathlib import Path

import pytest

import systest_rootfs as rootfs
from systest_install import CHECKOUT, GUEST_CHECKOUT, GUEST_HELPER_CONFIG, GUEST_PIP_CACHE, \
    guest_root, host_binds, host_pip_env
from systest_episodes import drive, wait_healthy
from systest_guest import leftovers, show, wait_for
from systest_machine import Machine

from camg import plugins

pytestmark = [pytest.mark.system, pytest.mark.privileged, pytest.mark.slow]

NOTHING_OF_CAMG = ("srv/camg", "etc/camg", "var/lib/camg", "var/cache/camg", "run/camg")
DEMO = f"{GUEST_CHECKOUT}/packaging/demo.sh"


def demo_environments() -> list[str]:
    """What the demo serves: the registered environments with demo data
    (packaging/prepare_demo.py PREPARERS)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "prepare_demo", CHECKOUT / "packaging" / "prepare_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(n for n in plugins.all_plugins() if n in module.PREPARERS)


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def fresh_root(tmp_path):
    """A copy of the cached Debian root with the operator's checkout in it."""
    root = guest_root("newcomer")
    try:
        for path in NOTHING_OF_CAMG:
            assert not (root / path).exists(), f"the fresh root already has /{path}"
        busy = [p.port for p in plugins.all_plugins().values() if _port_busy(p.port)]
        if busy:
            pytest.fail(f"something on this host listens on {busy}: the demo needs those ports")
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _binds() -> list[str]:
    pip_cache = rootfs.cache_root() / "pip"
    pip_cache.mkdir(exist_ok=True)
    return [f"{pip_cache}:{GUEST_PIP_CACHE}", *host_binds()]


def served(root: Path) -> list[str]:
    prepared = root / "etc/camg/prepared"
    return sorted(p.stem for p in prepared.glob("*.json") if p.stem not in ("routes", "schedule"))


def step_times(log_text: str) -> list[str]:
    """install.sh's own timestamps: '[  42s] …' lines, for the report."""
    pattern = (r"^(install\.sh|run-foreground): \[ *\d+s\]|^prepare_demo: .*\(\d+s\)$"
               r"|, \d+s done$|: \d+s done$")
    return [line for line in log_text.splitlines() if re.search(pattern, line)]


def _drive_all(root: Path, names: list[str], alive=lambda: True) -> None:
    for env in names:
        started = time.monotonic()
        wait_healthy(env, 600, alive)
        report = drive(env, root)
        print(f"newcomer: {env}: ready+episodes {time.monotonic() - started:.0f}s {report}")


def _assert_clean(machine: Machine) -> None:
    left = leftovers(machine)
    assert left == {}, left
    procs = machine.run(["ps", "-u", "camg", "-o", "pid=,args="], check=False).stdout.strip()
    assert not procs, procs


def test_demo_under_systemd_from_nothing(fresh_root, tmp_path):
    machine = Machine(fresh_root, tmp_path / "console.log", binds=_binds(),
                      private_network=False, capabilities=("CAP_NET_ADMIN",))
    try:
        machine.boot()
        started = time.monotonic()
        result = machine.run([DEMO, "--helper-config", GUEST_HELPER_CONFIG],
                             env=host_pip_env(), timeout=3600, check=False)
        took = time.monotonic() - started
        (tmp_path / "demo.log").write_text(result.stdout + result.stderr)
        print(f"newcomer (systemd): demo.sh took {took:.0f}s")
        print("\n".join(step_times(result.stderr)))
        # demo.sh ends with `camg status`: its table, and exit 0 only when all is well.
        print(result.stdout)
        assert result.returncode == 0, f"demo.sh failed:\n{result.stdout}\n{result.stderr[-6000:]}"
        assert "all well" in result.stdout, result.stdout
        names = served(fresh_root)
        assert names == demo_environments(), names
        for env in names:
            # Type=notify: active means the service said READY=1.
            wait_for(lambda: show(machine, f"camg-{env}.service", "ActiveState")["ActiveState"]
                     == "active", 600, f"camg-{env} to be active")
        _drive_all(fresh_root, names)
        machine.run(["systemctl", "stop", "camg.target"], timeout=300)
        units = ["camg-helper.service", "camg-helper.socket"] + [f"camg-{e}.service" for e in names]
        machine.run(["systemctl", "stop", *units], timeout=300)
        for unit in units:
            assert show(machine, unit, "ActiveState")["ActiveState"] in ("inactive", "failed"), unit
            assert show(machine, unit, "Result")["Result"] == "success", unit
        _assert_clean(machine)
    finally:
        problems = machine.shutdown()
    assert not problems, "the machine left things behind:\n" + "\n".join(problems)


def test_demo_in_the_foreground_runner_from_nothing(fresh_root, tmp_path):
    # No systemd: nspawn's stub init is PID 1 and demo.sh runs as PID 2, so
    # demo.sh takes its foreground branch (packaging/run-foreground.sh).
    log = tmp_path / "console.log"
    # The shell stays (PID 2) after demo.sh ends, so the leftovers can be
    # looked at in a machine that still runs.
    script = (f"{DEMO} --helper-config {GUEST_HELPER_CONFIG} & echo $! > /run/demo.pid; "
              "wait $!; echo \"demo.sh exited $?\"; exec sleep infinity")
    machine = Machine(fresh_root, log, binds=_binds(), private_network=False,
                      capabilities=("CAP_NET_ADMIN",), payload=["/bin/sh", "-c", script],
                      env={**host_pip_env(), "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                           "/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    try:
        started = time.monotonic()
        machine.boot()

        def running() -> bool:
            return machine.proc.poll() is None and \
                "demo.sh exited" not in log.read_text(errors="replace")

        def installed() -> bool:
            if not running() or "demo.sh exited" in log.read_text(errors="replace"):
                raise AssertionError(f"demo.sh exited:\n{log.read_text(errors='replace')[-6000:]}")
            return "] all started" in log.read_text(errors="replace")

        wait_for(installed, 3600, "demo.sh to install and start the services", interval=2)
        print(f"newcomer (foreground): install took {time.monotonic() - started:.0f}s")
        print("\n".join(step_times(log.read_text(errors="replace"))))
        names = served(fresh_root)
        assert names == demo_environments(), names
        _drive_all(fresh_root, names, running)
        status = machine.run(["/srv/camg/service-venv/bin/camg", "status"], check=False)
        print(status.stdout)
        assert status.returncode == 0, status.stdout + status.stderr
        # As an operator's Ctrl-C would: the runner stops everything itself.
        machine.run(["sh", "-c", "kill -TERM $(cat /run/demo.pid)"])
        wait_for(lambda: "demo.sh exited" in log.read_text(errors="replace"), 300,
                 "the runner to stop everything")
        assert "demo.sh exited 0" in log.read_text(errors="replace"), \
            log.read_text(errors="replace")[-3000:]
        _assert_clean(machine)
    finally:
        problems = machine.shutdown()
    assert not problems, "the machine left things behind:\n" + "\n".join(problems)
