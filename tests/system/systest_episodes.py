"""One episode per served environment, driven over loopback HTTP from the
host as a trainer would: with ``camg_client`` (the oracle: maximum
reward) and with the stock OpenEnv client (do nothing: zero reward).

The prepared data the oracle needs is read from the guest's root directory
on the host (``root``). An environment without an oracle here still gets a
reset, a state and a close through both clients.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from pathlib import Path

from openenv.core import GenericEnvClient
from openenv.core import env_client as openenv_client

from camg import plugins
from camg_client import Client, ServiceError


def url(env: str) -> str:
    return f"http://127.0.0.1:{plugins.get(env).port}"


def wait_healthy(env: str, timeout: float, alive=lambda: True) -> dict:
    """Until GET /health answers healthy (what READY=1 promises)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if not alive():
            raise AssertionError(f"{env}: the runner exited before READY ({last})")
        try:
            health = Client(url(env), timeout=5).health()
            if health.get("status") == "healthy":
                return health
            last = health
        except (OSError, ServiceError) as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"{env}: not healthy after {timeout}s ({last})")


def _manifest(root: Path, env: str) -> dict:
    return json.loads((root / "srv/camg/data" / env / "manifest.json").read_text())


def coding_oracle(client: Client, root: Path) -> tuple[str, float]:
    task = _manifest(root, "coding")["tasks"][0]
    eid = client.create(task_id=task["task_id"])["episode_id"]
    fix = f"git apply -R - <<'CAMG_EOF'\n{task['data']['patch']}\nCAMG_EOF"
    step = client.step(eid, {"operation": "shell", "command": fix})
    assert step["observation"]["exit_code"] == 0, step
    done = client.step(eid, {"operation": "finish"})
    assert done["done"] is True, done
    return eid, done["reward"]


def shop_oracle(client: Client, root: Path) -> tuple[str, float]:
    task = _manifest(root, "shop")["tasks"][0]
    goal = task["data"]["goal"]
    eid = client.create(task_id=task["task_id"])["episode_id"]
    # a synthetic goal's name is its product's Title (goals.synthetic_goals)
    title = goal["name"].replace("[", " ").replace("]", " ")
    step = client.step(eid, {"action": f"search[{title}]"})
    for _ in range(50):
        if goal["asin"].lower() in step["observation"]["available_actions"]["clickables"]:
            break
        step = client.step(eid, {"action": "click[next >]"})
    client.step(eid, {"action": f"click[{goal['asin'].lower()}]"})
    for value in goal["goal_options"].values():
        client.step(eid, {"action": f"click[{value}]"})
    done = client.step(eid, {"action": "click[buy now]"})
    assert done["done"] is True, done
    return eid, done["reward"]


ORACLES = {"coding": coding_oracle, "shop": shop_oracle}
# A do-nothing action that ends an episode at once: zero reward (AutoResearch:
# no submission; General, Visual: finish without an answer or a page).
GIVE_UP = {"coding": {"operation": "finish"}, "general": {"operation": "finish"},
           "visual": {"operation": "finish"}, "autoresearch": {"operation": "submit"}}


def guest_token(root: Path) -> str:
    """The token install.sh gave the guest's root (~/.config/camg/token)."""
    return (root / "root/.config/camg/token").read_text().strip()


@contextlib.contextmanager
def openenv_headers(headers: dict):
    """The pinned openenv-core client opens its WebSocket with no extra
    headers; its connect call, given them (openenv 0.10 takes headers=)."""
    stock = openenv_client.ws_connect
    openenv_client.ws_connect = functools.partial(stock, additional_headers=headers)
    try:
        yield
    finally:
        openenv_client.ws_connect = stock


def drive(env: str, root: Path) -> dict:
    """Both clients, one episode each; returns what happened, for the report."""
    report: dict = {}
    token = guest_token(root)
    client = Client(url(env), timeout=900, token=token)
    if env in ORACLES:
        eid, reward = ORACLES[env](client, root)
        assert reward == 1.0, f"{env}: the oracle earned {reward}"
        report["oracle"] = (eid, reward)
    else:
        created = client.create()
        report["camg_client_reset"] = created["episode_id"]
        client.close(created["episode_id"])
    with openenv_headers({"Authorization": f"Bearer {token}"}), \
            GenericEnvClient(base_url=url(env), message_timeout_s=900).sync() as openenv:
        result = openenv.reset()
        assert result.done is False
        state = openenv.state()
        assert state.get("episode_id"), state
        if env in GIVE_UP:
            result = openenv.step(GIVE_UP[env])
            assert result.done is True and result.reward == 0.0, result
            report["openenv"] = (state["episode_id"], result.reward)
        else:
            report["openenv"] = (state["episode_id"], None)
    return report
