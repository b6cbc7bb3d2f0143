"""What the system tests ask of a booted guest: unit state, loopback HTTP,
journal entries, and the inventory of everything the suite could leak.
"""

from __future__ import annotations

import json
import time

from systest_cgroup import children
from systest_machine import Machine
# The trainer's side of the guest's loopback (Debian's python3, the
# standard library, root's token): the kill storm's own.
from devtools.reliability.killstorm_guest import GUEST_HTTP

SERVICE_URL = "http://127.0.0.1:65134"
HELPER_LEDGER = "/run/camg-helper/ledger"
UPPERS = "/var/lib/camg/uppers"


def http(machine: Machine, method: str, path: str, body: dict | None = None,
         *, timeout: float = 600.0, base: str = SERVICE_URL) -> tuple[int, dict | str]:
    result = machine.run(["python3", "-c", GUEST_HTTP, method, base + path,
                          json.dumps(body) if body is not None else "", str(timeout)],
                         timeout=timeout + 30)
    reply = json.loads(result.stdout)
    try:
        return reply["status"], json.loads(reply["body"])
    except ValueError:
        return reply["status"], reply["body"]


def show(machine: Machine, unit: str, *props: str) -> dict[str, str]:
    argv = ["systemctl", "show", unit]
    for prop in props:
        argv += ["-p", prop]
    out = machine.run(argv).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def journal(machine: Machine, *matches: str, unit: str | None = None) -> list[dict]:
    argv = ["journalctl", "--no-pager", "-o", "json", "--all"]
    if unit:
        argv += ["-u", unit]
    argv += list(matches)
    out = machine.run(argv, check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def leftovers(machine: Machine) -> dict[str, list[str]]:
    """Everything of the suite's sandboxes still present, by kind."""
    found: dict[str, list[str]] = {}
    ledger = machine.run(["sh", "-c", f"ls -A {HELPER_LEDGER} 2>/dev/null || true"]).stdout.split()
    if ledger:
        found["ledger records"] = ledger
    agent = machine.run(["ps", "-u", "2000", "-o", "pid=,args="], check=False).stdout.strip()
    if agent:
        found["agent processes"] = agent.splitlines()
    uppers = machine.run(["sh", "-c", f"ls -A {UPPERS} 2>/dev/null || true"]).stdout.split()
    if uppers:
        found["uppers"] = uppers
    mounts = [line for line in machine.run(["cat", "/proc/1/mountinfo"]).stdout.splitlines()
              if _suite_mount(line)]
    if mounts:
        found["mounts"] = mounts
    for controller, path in machine.helper_cgroups().items():
        left = children(path)
        if left:
            found[f"{controller} cgroups"] = left
    return found


def _suite_mount(line: str) -> bool:
    """An overlay, or anything mounted where the helper keeps sandboxes."""
    fields = line.split()
    mountpoint = fields[4]
    fstype = fields[fields.index("-") + 1]
    return fstype == "overlay" or mountpoint.startswith(_SANDBOX_PATHS)


_SANDBOX_PATHS = ("/var/lib/camg/", "/run/camg-helper/", "/run/camg/")


def sandbox_inits(machine: Machine) -> set[int]:
    """Pids (in the guest) of running sandbox inits: the helper's children."""
    helper = show(machine, "camg-helper.service", "MainPID")["MainPID"]
    if helper == "0":
        return set()
    out = machine.run(["ps", "--ppid", helper, "-o", "pid="], check=False).stdout
    return {int(p) for p in out.split()}


def diagnose(machine: Machine, lines: int = 40) -> str:
    """The recent journal of the suite's units, for assertion messages."""
    out = machine.run(["journalctl", "--no-pager", "-o", "short-monotonic", "-n", str(lines),
                       "-u", "camg-helper.service", "-u", "camg-helper.socket",
                       "-u", "camg-coding.service", "-u", "camg-shop.service"], check=False)
    return out.stdout[-6000:]
