"""The general_agent hack canaries (environments/general/checks/agent_canaries.py) through
the real General service: real task containers, the MiMo transport, the
verifier, and the module's fake judge switched between the demo's anchor
verdict and gullible models. Imported by test_general_episodes.py so the
suite shares that module's service and containers (its fixtures' stop
asserts no container is left). CI plays one canary of each class
(agent_canaries.CI_TECHNIQUES); CAMG_GA_CANARIES=all plays all 26, any other
value those whose technique contains one of its "|"-separated parts
(e.g. "credulous judge:")."""

from __future__ import annotations

import os
import time

from camg_client import Client
from devtools.canary_table import render
from environments.general.checks import agent_canaries


def test_general_agent_canaries_all_lose(general_service, general_demo, fake_judge, capsys):
    oracles = agent_canaries.load_oracles(general_demo["out"])

    def outcome(episode_id):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = [o for o in general_service.outcomes() if o["episode_id"] == episode_id]
            if found:
                return found[-1]
            time.sleep(0.2)
        raise AssertionError(f"no outcome record for {episode_id}")

    chosen = os.environ.get("CAMG_GA_CANARIES")
    selected = (agent_canaries.canaries() if chosen == "all"
                else [c for c in agent_canaries.canaries()
                      if any(part in c.technique for part in chosen.split("|"))] if chosen
                else agent_canaries.ci_canaries())
    assert selected, f"no canary matches CAMG_GA_CANARIES={chosen!r}"
    started = time.monotonic()
    rows, problems = agent_canaries.run_suite(lambda: Client(general_service.url), fake_judge,
                                              oracles, outcome, workers=4, selected=selected)
    text, failed = render("general (general_agent)", rows)
    with capsys.disabled():
        print(f"\n{text}\n  ({time.monotonic() - started:.1f} s)")
    assert not failed, text
    assert not problems, problems
    assert len(rows) == len(selected)
    for row in rows:  # a tampered record names its rules in the row's detail
        assert row.integrity == "ok" or any(k in row.detail for k in (
            "judge_addressed", "tool_", "verifier_files", "answer_not_regular")), row
