"""Forks live at a kill storm's kills of a service or its worker (issue 26).

Before such a kill drives its episode to the kill point, the episode is
forked and the child forked again (a chain: parent, child, grandchild).
The kill takes all three with the worker; afterwards the restarted service
answers 404 for each child and has recorded it as it records its parent
(``reward: null``, ``failure_class: infra``), naming the episode it was
forked from; the children's sandboxes and containers are in the storm's
census and container checks like every other, and no fork snapshot image
of the service (``camg.fork=1``) is left in the guest's dockerd within
``RECLAIM_S``.

An environment that refuses (409 ``not_forkable``) is named in the row and
the kill goes on without forks. A full service (429 ``at_capacity``: a
child takes a slot like any episode, and the demo serves three
environments with capacity 2) ends the chain where it is, and the row says
so. Any other answer to a fork (a 503 infra among them) is a problem of the
kill.
"""

from __future__ import annotations

import time

from devtools.reliability.killstorm_guest import Env
from devtools.reliability.killstorm_report import RECLAIM_S, Kill

#: parent -> child -> grandchild
CHAIN = 2


def fork_chain(storm, env: Env, eid: str, kill: Kill) -> list[tuple[str, str]]:
    """(child, parent) for each fork made of ``eid`` and then of its child."""
    made: list[tuple[str, str]] = []
    parent = eid
    for _ in range(CHAIN):
        got = storm.guest.http(env.port, "POST", f"/episodes/{parent}/fork", {})
        if got.status == 409 and got.json.get("error") == "not_forkable":
            kill.unforkable = (got.json.get("details") or {}).get("what") or "-"
            break
        if got.status == 429 and got.json.get("error") == "at_capacity":
            kill.fork_full = True
            break
        if got.status != 201 or got.json.get("forked_from") != parent:
            kill.problems.append(f"fork of {parent} answered {got.status}: {str(got.body)[:300]}")
            break
        made.append((got.json["episode_id"], parent))
        parent = got.json["episode_id"]
    kill.forked = len(made)
    return made


def check_lost(storm, env: Env, kill: Kill, made: list[tuple[str, str]]) -> None:
    """After the kill and the service's return: each fork forgotten by the
    service and recorded by its recovery; no snapshot image of it left."""
    for child, parent in made:
        state = storm.guest.http(env.port, "GET", f"/episodes/{child}", timeout=30)
        if state.status != 404:
            kill.problems.append(f"fork {child} after the restart: GET answered {state.status}")
        # its own record (a grandchild's names it as forked_from)
        found = [r for r in storm._found(env, child) if r["episode_id"] == child]
        if not found:
            kill.problems.append(f"fork {child}: the restarted service wrote no record of it")
            continue
        last = found[-1]
        if last["reward"] is not None or last["failure_class"] != "infra" \
                or last.get("forked_from") != parent:
            kill.problems.append(f"record of fork {child}: reward {last['reward']}, class "
                                 f"{last['failure_class']}, forked_from {last.get('forked_from')}")
    if made and env.containers:
        labels = ("camg.fork=1", f"camg.service={env.name}")
        deadline = time.monotonic() + RECLAIM_S
        while storm.guest.images(*labels) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = storm.guest.images(*labels)
        if left:
            kill.problems.append(f"fork snapshot images of {env.name} not removed within "
                                 f"{RECLAIM_S:.0f}s: {sorted(i[:19] for i in left)}")
