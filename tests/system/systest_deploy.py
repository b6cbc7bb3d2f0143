"""Adding an environment to the booted guest's deployment, and taking it
away again: what test_general_under_systemd and test_autoresearch_under_
systemd share.

The shared machine's install (conftest.installed_root) configures the demo
deployment. A module that serves one more environment backs up /etc/camg,
writes the extra data into the guest (built on the host from the test
caches; large trees hard-linked in at the same path they have on the host,
so materialized-image markers and the helper's lower roots stay valid),
reruns camg.configure as install.sh does and restarts the helper on its new
configuration. ``restore()`` puts /etc/camg back and stops what it started,
so later modules (the kill storm) see the deployment install.sh made.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from systest_guest import show, wait_for

VENV_PYTHON = "/srv/camg/service-venv/bin/python"
BACKUP = "/root/camg-systest-etc-backup"
DEFAULT_DEPLOYMENT = {"runtime_lock": "/srv/camg/src/requirements.lock",
                      "state_root": "/var/lib/camg", "helper_socket": "/run/camg/helper.sock",
                      "environments": {}}


def mirror(root: Path, host_path: Path) -> Path:
    """``host_path`` into the guest root at the same path: hard links where
    the two share a file system (the cache and the guest root both live
    under $CAMG_CACHE), a copy otherwise. Read-only use only: hard links
    share inodes with the host's cache."""
    host_path = Path(host_path).resolve()
    dest = root / str(host_path).lstrip("/")
    if dest.exists():
        return host_path
    dest.parent.mkdir(parents=True, exist_ok=True)
    linked = subprocess.run(["cp", "-al", str(host_path), str(dest)], capture_output=True)
    if linked.returncode != 0:
        shutil.rmtree(dest, ignore_errors=True)
        subprocess.run(["cp", "-a", str(host_path), str(dest)], check=True, timeout=600)
    return host_path


def guest_json(machine, path: str, default=None):
    got = machine.run(["cat", path], check=False)
    if got.returncode != 0:
        return default
    return json.loads(got.stdout)


class GuestDeployment:
    def __init__(self, machine) -> None:
        self.machine = machine
        self.units: list[str] = []

    def backup(self) -> None:
        self.machine.sh(f"rm -rf {BACKUP} && mkdir -p {BACKUP} && cp -a /etc/camg/. {BACKUP}/")

    def serve(self, entries: dict, helper_update) -> None:
        """Configure ``entries`` (name -> deployment entry) on top of the
        installed deployment; ``helper_update(config) -> config`` edits the
        helper configuration, which the helper reads at its next start."""
        m = self.machine
        deployment = guest_json(m, "/etc/camg/deployment.json", DEFAULT_DEPLOYMENT)
        deployment["environments"].update(entries)
        (m.root / "root/camg-systest-deployment.json").write_text(json.dumps(deployment, indent=1))
        helper = helper_update(guest_json(m, "/etc/camg/helper.json"))
        (m.root / "etc/camg/helper.json").write_text(json.dumps(helper, indent=1))
        m.sh(f"cd /srv/camg/src && {VENV_PYTHON} -m camg.configure "
             "--deployment /root/camg-systest-deployment.json --output /etc/camg/prepared.new "
             "&& rm -rf /etc/camg/prepared && mv /etc/camg/prepared.new /etc/camg/prepared "
             "&& chmod -R a+rX /etc/camg/prepared", timeout=300)
        self.restart_helper()

    def restart_helper(self) -> None:
        """Stop the helper; its socket starts it again (with the config on
        disk) at the next connection."""
        m = self.machine
        m.run(["systemctl", "stop", "camg-helper.service"], timeout=120)
        m.run(["systemctl", "reset-failed", "camg-helper.service"], check=False)
        m.run(["systemctl", "start", "camg-helper.socket"])

    def start(self, unit: str, timeout: float = 300) -> dict:
        m = self.machine
        self.units.append(unit)
        m.run(["systemctl", "start", "--no-block", unit])

        def active():
            state = show(m, unit, "ActiveState", "SubState", "MainPID", "NRestarts")
            if state["ActiveState"] == "failed":
                raise AssertionError(journal_tail(m, unit))
            return state if state["ActiveState"] == "active" else None

        return wait_for(active, timeout, f"{unit} to become active", interval=0.5)

    def restore(self) -> None:
        m = self.machine
        for unit in self.units:
            m.run(["systemctl", "stop", unit], check=False, timeout=180)
            m.run(["systemctl", "reset-failed", unit], check=False)
        m.sh(f"test -d {BACKUP} && rm -rf /etc/camg && mkdir /etc/camg "
             f"&& cp -a {BACKUP}/. /etc/camg/ && rm -rf {BACKUP}", check=False)
        self.restart_helper()


def journal_tail(machine, unit: str, lines: int = 60) -> str:
    return machine.run(["journalctl", "--no-pager", "-o", "short-monotonic", "-n", str(lines),
                        "-u", unit, "-u", "camg-helper.service"], check=False).stdout[-8000:]


def outcomes(machine, env: str) -> list[dict]:
    out = machine.run(["sh", "-c", f"cat /var/lib/camg/{env}/outcomes.jsonl 2>/dev/null || true"]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]
