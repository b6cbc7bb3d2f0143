"""camg-shop under real systemd: its JVM (pyserini/Lucene through pyjnius)
starts under the unit's hardening, the service says READY=1, an oracle
episode over loopback HTTP earns 1.0 and doing nothing earns 0, the journal
carries no third-party start-up noise, and a stop leaves nothing behind.

Runs after the Coding and foreground tests on the same machine (file order).
"""

from __future__ import annotations

import json

import pytest

from systest_guest import diagnose, http, journal, leftovers, show, wait_for

pytestmark = [pytest.mark.system, pytest.mark.privileged, pytest.mark.slow]

SHOP = "http://127.0.0.1:65131"
# Start-up chatter of pyjnius and faiss that must stay out of the journal.
NOISE = ("Please report your system information", "Loading faiss", "Successfully loaded faiss")


def shop(machine, method, path, body=None):
    return http(machine, method, path, body, base=SHOP)


def test_shop_starts_under_its_unit_and_says_ready(machine):
    machine.run(["systemctl", "start", "--no-block", "camg-shop"])

    def active():
        state = show(machine, "camg-shop.service", "ActiveState")["ActiveState"]
        if state == "failed":
            raise AssertionError(diagnose(machine, 80))
        return state == "active"

    wait_for(active, 300, "camg-shop to become active", interval=0.5)
    status, health = shop(machine, "GET", "/health")
    assert status == 200 and health["status"] == "healthy", f"{health}\n{diagnose(machine)}"
    pid = show(machine, "camg-shop.service", "MainPID")["MainPID"]
    assert machine.run(["ps", "-o", "user=", "-p", pid]).stdout.strip() == "camg"


def test_a_shop_oracle_episode_earns_one_and_doing_nothing_zero(machine):
    manifest = json.loads(machine.run(["cat", "/srv/camg/data/shop/manifest.json"]).stdout)
    task = manifest["tasks"][0]
    goal = task["data"]["goal"]
    status, created = shop(machine, "POST", "/episodes", {"task_id": task["task_id"]})
    assert status == 201, f"{created}\n{diagnose(machine)}"
    eid = created["episode_id"]

    def step(action: str) -> dict:
        status, body = shop(machine, "POST", f"/episodes/{eid}/step", {"action": {"action": action}})
        assert status == 200, body
        return body

    # a synthetic goal's name is its product's Title (goals.synthetic_goals)
    title = goal["name"].replace("[", " ").replace("]", " ")
    result = step(f"search[{title}]")
    for _ in range(20):
        if goal["asin"].lower() in result["observation"]["available_actions"]["clickables"]:
            break
        result = step("click[next >]")
    step(f"click[{goal['asin'].lower()}]")
    for value in goal["goal_options"].values():
        step(f"click[{value}]")
    done = step("click[buy now]")
    assert done["done"] is True and done["reward"] == 1.0, done

    status, other = shop(machine, "POST", "/episodes", {"task_id": task["task_id"]})
    assert status == 201, other
    status, closed = shop(machine, "DELETE", f"/episodes/{other['episode_id']}")
    assert status == 200, closed


def test_the_shop_journal_has_no_third_party_start_up_noise(machine):
    messages = [e.get("MESSAGE", "") for e in journal(machine, unit="camg-shop.service")]
    assert messages, "camg-shop logged nothing"
    noisy = [m for m in messages if isinstance(m, str) and any(n in m for n in NOISE)]
    assert not noisy, noisy


def test_stopping_shop_leaves_nothing_behind(machine):
    import time

    started = time.monotonic()
    machine.run(["systemctl", "stop", "camg-shop.service"], timeout=180)
    took = time.monotonic() - started
    print(f"camg-shop stopped in {took:.1f}s")
    result = show(machine, "camg-shop.service", "Result")["Result"]
    assert result == "success", machine.run(
        ["journalctl", "--no-pager", "-o", "short-monotonic", "-n", "80", "-u",
         "camg-shop.service"], check=False).stdout[-8000:]
    machine.run(["systemctl", "stop", "camg-helper.service", "camg-helper.socket"], timeout=120)
    assert leftovers(machine) == {}
