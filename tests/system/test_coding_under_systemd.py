"""camg-coding under real systemd: activation, an episode over loopback
HTTP, the journal, kill -9 of the service and of the helper, and a stop of
camg.target that leaves nothing behind.

The tests share one booted machine and run in file order; each starts from
the state the previous one left (that order is the operator's story).
"""

from __future__ import annotations

import json
import signal

import pytest

from systest_guest import diagnose, http, journal, leftovers, sandbox_inits, show, wait_for

pytestmark = [pytest.mark.system, pytest.mark.privileged, pytest.mark.slow]

OUTCOMES = "/var/lib/camg/coding/outcomes.jsonl"


@pytest.fixture(scope="module")
def tasks(machine):
    manifest = json.loads(machine.run(["cat", "/srv/camg/data/coding/manifest.json"]).stdout)
    return manifest["tasks"]


def gold_fix(task: dict) -> dict:
    return {"operation": "shell",
            "command": f"git apply -R - <<'CAMG_EOF'\n{task['data']['patch']}\nCAMG_EOF"}


FINISH = {"operation": "finish"}


def outcomes(machine) -> list[dict]:
    out = machine.run(["sh", "-c", f"cat {OUTCOMES} 2>/dev/null || true"]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_start_coding_pulls_in_the_helper_socket_and_is_active_only_after_ready(machine):
    # From nothing: install.sh left the socket listening; stop it first.
    machine.run(["systemctl", "stop", "camg-helper.socket", "camg-helper.service"])
    assert show(machine, "camg-helper.socket", "ActiveState")["ActiveState"] == "inactive"

    machine.run(["systemctl", "start", "--no-block", "camg-coding"])
    seen = []

    def active():
        state = show(machine, "camg-coding.service", "ActiveState", "SubState")
        seen.append((state["ActiveState"], state["SubState"]))
        if state["ActiveState"] == "failed":
            raise AssertionError(machine.run(["journalctl", "-u", "camg-coding", "--no-pager",
                                              "-n", "60"]).stdout)
        return state["ActiveState"] == "active"

    wait_for(active, 300, "camg-coding to become active", interval=0.1)
    # Type=notify: systemd held the unit in activating/start until READY=1,
    # which the worker sends once the app is loaded and the port is bound.
    assert ("activating", "start") in seen, seen
    status, health = http(machine, "GET", "/health")
    assert status == 200, f"{health}\n{diagnose(machine)}"
    assert show(machine, "camg-helper.socket", "ActiveState")["ActiveState"] == "active"
    props = show(machine, "camg-coding.service", "StatusText", "MainPID", "User")
    assert props["StatusText"], "the service reports no STATUS="
    ready = [e for e in journal(machine, unit="camg-coding.service")
             if e.get("MESSAGE", "").startswith("Started ")]
    assert ready, "systemd logged no 'Started' for camg-coding"
    # The daemon runs as camg, not root.
    user = machine.run(["ps", "-o", "user=", "-p", props["MainPID"]]).stdout.strip()
    assert user == "camg"


def helper_ready(machine) -> None:
    """Wait for the helper's READY=1 (its isolation probes passed)."""
    wait_for(lambda: show(machine, "camg-helper.service", "ActiveState")["ActiveState"] == "active",
             120, "camg-helper to send READY=1")


def test_a_coding_episode_over_loopback_http_earns_the_right_reward(machine, tasks):
    task = tasks[0]
    # No wait for the helper: it was socket-activated moments ago by /health
    # and may still be probing; a create then waits for the probes' verdict.
    status, created = http(machine, "POST", "/episodes", {"task_id": task["task_id"]})
    assert status == 201, f"{created}\n{diagnose(machine)}"
    eid = created["episode_id"]
    status, step = http(machine, "POST", f"/episodes/{eid}/step", {"action": gold_fix(task)})
    assert status == 200 and step["observation"]["exit_code"] == 0, step
    status, done = http(machine, "POST", f"/episodes/{eid}/step", {"action": FINISH})
    assert status == 200, done
    assert done["done"] is True and done["reward"] == 1.0, done

    status, noop = http(machine, "POST", "/episodes", {"task_id": task["task_id"]})
    assert status == 201, noop
    status, done = http(machine, "POST", f"/episodes/{noop['episode_id']}/step",
                        {"action": FINISH})
    assert done["reward"] == 0.0 and done.get("failure_class") is None, done

    records = {r["episode_id"]: r for r in outcomes(machine)}
    assert records[eid]["reward"] == 1.0
    assert records[noop["episode_id"]]["reward"] == 0.0
    machine.episode_ids = [eid, noop["episode_id"]]


def test_the_journal_shows_the_episode_by_unit_and_by_episode_id(machine):
    eid = machine.episode_ids[0]
    by_unit = journal(machine, unit="camg-coding.service")
    assert any(e.get("EPISODE_ID") == eid for e in by_unit), \
        "journalctl -u camg-coding has no entry with this EPISODE_ID"
    by_episode = journal(machine, f"EPISODE_ID={eid}")
    assert by_episode, "journalctl EPISODE_ID=<id> found nothing"
    for entry in by_episode:
        assert entry["_SYSTEMD_UNIT"] == "camg-coding.service"
        assert entry["CAMG_ENV"] == "coding"
        assert entry.get("TASK_ID")


def test_kill_9_of_the_service_mid_episode_restarts_it_and_reclaims_the_sandbox(machine, tasks):
    before = outcomes(machine)
    assert before, "no outcome records to protect"
    props = show(machine, "camg-coding.service", "MainPID", "NRestarts")
    status, created = http(machine, "POST", "/episodes", {"task_id": tasks[0]["task_id"]})
    assert status == 201, f"{created}\n{diagnose(machine)}"
    assert sandbox_inits(machine), "the episode has no sandbox"
    assert leftovers(machine).get("ledger records")

    machine.run(["kill", "-9", props["MainPID"]])

    def restarted():
        now = show(machine, "camg-coding.service", "ActiveState", "MainPID", "NRestarts")
        return (now["ActiveState"] == "active" and now["MainPID"] != props["MainPID"]
                and int(now["NRestarts"]) > int(props["NRestarts"]))

    wait_for(restarted, 300, "systemd to restart camg-coding")
    # ExecStopPost= asked the helper to release the dead service's sandbox.
    assert leftovers(machine) == {}
    # Records already written are intact (and none was torn).
    assert outcomes(machine)[:len(before)] == before
    status, health = http(machine, "GET", "/health")
    assert status == 200, health


def test_kill_9_of_the_helper_is_reclaimed_by_sweep_and_socket_activation(machine, tasks):
    helper_ready(machine)
    status, created = http(machine, "POST", "/episodes", {"task_id": tasks[0]["task_id"]})
    assert status == 201, f"{created}\n{diagnose(machine)}"
    assert sandbox_inits(machine)
    helper = show(machine, "camg-helper.service", "MainPID")["MainPID"]

    machine.run(["kill", "-9", helper])
    # Control-group kill of the sandboxes, ExecStopPost= sweep; the socket
    # stays, so the next connection (or Restart=) brings the helper back.
    wait_for(lambda: show(machine, "camg-helper.service", "MainPID")["MainPID"] not in ("0", helper)
             or show(machine, "camg-helper.service", "ActiveState")["ActiveState"] == "inactive",
             60, "the helper to be restarted or stopped")
    assert show(machine, "camg-helper.socket", "ActiveState")["ActiveState"] == "active"
    wait_for(lambda: not leftovers(machine), 60, "the sweep to reclaim the sandbox")

    # The episode whose sandbox died ends with a masked reward, not a fake 0.
    status, step = http(machine, "POST", f"/episodes/{created['episode_id']}/step",
                        {"action": {"operation": "shell", "command": "echo hi"}})
    assert status == 200 and step["done"] is True and step["reward"] is None, step
    assert step["failure_class"] in ("sandbox_died", "infra"), step
    # A new episode works: socket activation brought a helper back.
    http(machine, "GET", "/health")
    helper_ready(machine)
    status, again = http(machine, "POST", "/episodes", {"task_id": tasks[0]["task_id"]})
    assert status == 201, f"{again}\n{diagnose(machine)}"
    machine.open_episode = again["episode_id"]


def test_stopping_camg_target_leaves_nothing_behind(machine):
    assert sandbox_inits(machine), "an episode should still hold a sandbox"
    machine.run(["systemctl", "stop", "camg.target"], timeout=240)
    # The target's own stop job finishes first (it is ordered after its
    # units), so the command returns while the units are still stopping.
    units = ("camg-coding.service", "camg-helper.service", "camg-helper.socket")
    wait_for(lambda: all(show(machine, u, "ActiveState")["ActiveState"] == "inactive"
                         for u in units), 180, "every camg unit to stop")
    assert leftovers(machine) == {}
    procs = machine.run(["ps", "-u", "camg", "-o", "pid=,args="], check=False).stdout.strip()
    assert not procs, procs
    assert machine.run(["test", "-e", "/run/camg/helper.sock"], check=False).returncode != 0
