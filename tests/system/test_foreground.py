"""packaging/run-foreground.sh: the same installation without systemd as
its supervisor (started outside any unit, on the booted machine whose camg
units are stopped by the tests before this one)."""

from __future__ import annotations

import json
import pytest

from systest_guest import http, leftovers, show, wait_for

pytestmark = [pytest.mark.system, pytest.mark.privileged, pytest.mark.slow]


def test_foreground_runner_serves_an_episode_and_cleans_up_on_sigterm(machine, tmp_path):
    for unit in ("camg-coding.service", "camg-helper.service", "camg-helper.socket"):
        assert show(machine, unit, "ActiveState")["ActiveState"] == "inactive", unit
    log = tmp_path / "run-foreground.log"
    runner = machine.popen(["/bin/sh", "-c", "echo $$ > /run/run-foreground.pid; exec "
                            "/root/camg-checkout/packaging/run-foreground.sh --skip-install"], log)
    try:
        def healthy():
            if runner.poll() is not None:
                raise AssertionError(f"run-foreground.sh exited:\n{log.read_text()[-4000:]}")
            try:
                status, body = http(machine, "GET", "/health", timeout=5)
            except Exception:  # noqa: BLE001 - not listening yet
                return False
            return status == 200 and body["status"] == "healthy"

        wait_for(healthy, 180, "the foreground service to be healthy", interval=0.3)
        manifest = json.loads(machine.run(["cat", "/srv/camg/data/coding/manifest.json"]).stdout)
        status, created = http(machine, "POST", "/episodes",
                               {"task_id": manifest["tasks"][0]["task_id"]})
        assert status == 201, f"{created}\n{log.read_text()[-3000:]}"
        assert leftovers(machine).get("ledger records")
    finally:
        # As an operator's Ctrl-C would: the runner stops everything itself.
        machine.run(["sh", "-c", "kill -TERM $(cat /run/run-foreground.pid)"], check=False)
        runner.wait(180)
    assert leftovers(machine) == {}, log.read_text()[-3000:]
    procs = machine.run(["ps", "-u", "camg", "-o", "pid=,args="], check=False).stdout.strip()
    assert not procs, procs
