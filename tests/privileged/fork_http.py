"""The fork scenario of test_general_fork_http.py and test_visual_fork_http.py
(issue 26), played over a real service's HTTP API only, so it holds
whatever the environment does inside (transport, containers, renderer).

A parent is reset and plays a prefix: the reference's first action (a
chunk of the reference's payload into a file, so the fork must carry the
parent's files for the child's reference to apply). ``POST
/episodes/{id}/fork`` makes the child, which then plays the rest of the
reference (``GET /episodes/{id}/reference`` continues from the child's step
count, which starts at the fork's) and earns the maximum; the parent, the
no-op branch, finishes and earns 0. Before the finishes each branch writes
a file in /tmp and looks for the other's: absent both ways. Each branch has
its own outcome record; the child's carries ``forked_from`` and
``fork_step``. The reference's finishing action is the last one
(camg.sandboxes.shell_reference), so the isolation checks wait until only it is
left: a step played earlier would move the reference's cursor."""

from __future__ import annotations

from camg_client import Client
from devtools.harness import container_image as ci
from devtools.reliability.rig import fork_images


def snapshot_images(name: str) -> int:
    """Fork snapshot images left by this run's helper for ``name``'s scope
    (ci.scope_for: tagged with pytest's pid, so parallel runs are not counted)."""
    return fork_images(ci.scope_for(name))


def shell(command: str) -> dict:
    return {"operation": "shell", "command": command}


def output(client: Client, episode_id: str, command: str) -> str:
    reply = client.step(episode_id, shell(command))
    assert not reply["done"], reply
    assert reply["observation"]["exit_code"] == 0, reply["observation"]
    return reply["observation"]["output"]


def oracle_and_noop_branches(service, task_id: str, maximum: float) -> tuple[dict, dict]:
    """Play the scenario on ``service`` (a devtools.harness ServiceProcess with
    references enabled); the (child, parent) outcome records."""
    client = Client(service.url, timeout=900)
    parent = client.create(task_id=task_id)["episode_id"]
    opened = [parent]
    try:
        prefix = client.reference(parent)["action"]
        assert prefix["operation"] == "shell" and prefix["command"].startswith("printf"), prefix
        output(client, parent, prefix["command"])

        forked = client.fork(parent)
        child = forked["episode_id"]
        opened.append(child)
        assert child != parent and forked["task_id"] == task_id
        assert (forked["forked_from"], forked["fork_step"]) == (parent, 1), forked
        state = client.get(child)
        assert (state["step_count"], state["forked_from"], state["fork_step"]) == (1, parent, 1), state

        while (action := client.reference(child)["action"])["operation"] != "finish":
            output(client, child, action["command"])
        output(client, child, "echo child > /tmp/child-only.txt")
        output(client, parent, "echo parent > /tmp/parent-only.txt")
        assert output(client, parent, "test -e /tmp/child-only.txt || echo absent") == "absent\n"
        assert output(client, child, "test -e /tmp/parent-only.txt || echo absent") == "absent\n"
        assert output(client, child, "cat /tmp/child-only.txt") == "child\n"

        oracle = client.step(child, client.reference(child)["action"])
        assert oracle["done"] and oracle["failure_class"] is None, oracle
        assert oracle["reward"] == maximum, oracle
        noop = client.step(parent, {"operation": "finish"})
        assert noop["done"] and noop["failure_class"] is None, noop
        assert noop["reward"] == 0.0, noop

        records = {r["episode_id"]: r for r in service.outcomes() if r["episode_id"] in (child, parent)}
        child_rec, parent_rec = records[child], records[parent]
        assert child_rec["reward"] == maximum and child_rec["failure_class"] is None, child_rec
        assert (child_rec["forked_from"], child_rec["fork_step"]) == (parent, 1), child_rec
        assert parent_rec["reward"] == 0.0 and parent_rec["failure_class"] is None, parent_rec
        assert "forked_from" not in parent_rec and "fork_step" not in parent_rec, parent_rec
    except BaseException:
        # A failed assertion still closes both (the containers go now, not at
        # the lease reaper, and the leak check finds nothing of this test);
        # the assertion is what gets reported.
        for episode_id in opened:
            try:
                client.close(episode_id)
            except Exception:  # noqa: BLE001  the service may be what failed
                pass
        raise
    for episode_id in opened:
        client.close(episode_id)
    return child_rec, parent_rec
