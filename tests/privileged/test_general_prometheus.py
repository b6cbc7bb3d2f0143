"""A real Prometheus server scrapes the session's General camg.serve (Docker
containers through the helper's mediator, the fake judge speaking the real
OpenAI protocol) every second while an oracle and a no-op general_agent
episode run: the ended counts per outcome, the judge's requests and latency
histogram move by what the episodes asked, read through Prometheus' query
API. The service is shared with the other General modules, so the test
reads increases over its own episodes. Each record's cost carries the
judge's reported tokens (camg.grading.judge.Verdict.usage), summed over its items.
"""

from __future__ import annotations

import json

import pytest

from camg_client import Client
from tests.support.fake_judge import Reply
from devtools.harness.prometheus import PrometheusServer

pytestmark = [pytest.mark.privileged, pytest.mark.slow]

ENV = 'environment="general"'


def totals(prom: PrometheusServer) -> dict:
    by_outcome = {labels.get("outcome"): v for labels, v in prom.query(
        f"sum by (outcome) (camg_episodes_ended_total{{{ENV},failure_class=\"none\"}})")}
    return {"done": by_outcome.get("done", 0.0),
            "judge_ok": prom.value(f'sum(camg_judge_requests_total{{{ENV},result="ok"}})') or 0.0,
            "judge_n": prom.value(f"sum(camg_judge_seconds_count{{{ENV}}})") or 0.0,
            "steps": prom.value(f"sum(camg_step_seconds_count{{{ENV}}})") or 0.0}


def test_general_episodes_and_the_judge_through_prometheus(general_service, general_demo,
                                                          general_prepared, fake_judge,
                                                          tmp_path):
    from general_fixtures import tasks_of
    prom = PrometheusServer(tmp_path / "prom",
                            {"general": general_service.url.removeprefix("http://")}).start()
    try:
        prom.wait_up()
        before = totals(prom)
        client = Client(general_service.url, timeout=600)
        task = tasks_of(general_prepared, "general_agent")[0]
        oracle = json.loads((general_demo["out"] / f"{task['task_id']}.oracle.json").read_text())
        records, steps = [], 0
        for actions, text, reward in ((oracle, '{"score": 1, "reason": "names it"}', 1.0),
                                      ([{"operation": "finish", "answer": "no idea"}],
                                       '{"score": 0, "reason": "no"}', 0.0)):
            fake_judge.default = Reply(text=text)
            eid = client.create(task_id=task["task_id"], wait=120)["episode_id"]
            for action in actions:
                reply = client.step(eid, action)
                steps += 1
                if reply["done"]:
                    break
            assert reply["done"] and reply["reward"] == reward, reply
            [record] = [o for o in general_service.outcomes() if o["episode_id"] == eid]
            records.append(record)
        fake_judge.default = Reply(text='{"score": 1, "reason": "ok"}')
        asked = sum(len(r["judge"]) for r in records)
        assert asked >= 2
        for record in records:
            # the tokens the judge reported for each rubric item, summed into the cost
            per_item = [j["judge_tokens"] for j in record["judge"]]
            assert all(t["total_tokens"] == t["prompt_tokens"] + t["completion_tokens"] > 0
                       for t in per_item), per_item
            assert record["cost"]["judge_tokens"] == {
                k: sum(t[k] for t in per_item) for k in per_item[0]}

        want = {"done": before["done"] + 2, "judge_ok": before["judge_ok"] + asked,
                "judge_n": before["judge_n"] + asked, "steps": before["steps"] + steps}
        prom.wait_for("vector(1)", lambda _: totals(prom) == want, timeout=30)
        prom.assert_plausible_histogram("camg_judge_seconds", ENV, want["judge_n"], upper_s=60)
        prom.assert_plausible_histogram("camg_step_seconds", ENV, want["steps"], upper_s=300)
        # General reaches the helper only through its container client: no helper_up
        # series (packaging/README.md); Coding's is checked in test_prometheus_coding
        assert prom.value(f"camg_helper_up{{{ENV}}}") is None
    finally:
        prom.stop()
