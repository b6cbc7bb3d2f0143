"""General acceptance through the real service: per-episode Docker containers
(through the helper's mediator), the MiMo transport inside, a fake judge
speaking the real OpenAI protocol."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from camg_client import Client
from general_fixtures import KEY, tasks_of
from tests.support.fake_judge import Reply
# the general_agent hack canaries share this module's service and containers
from general_agent_canary_check import test_general_agent_canaries_all_lose  # noqa: F401,E402

pytestmark = [pytest.mark.privileged, pytest.mark.slow]


def shell(command):
    return {"operation": "shell", "command": command}


def apply_gold(patch: str) -> dict:
    data = base64.b64encode(patch.encode()).decode()
    return shell(f"echo {data} | base64 -d | git apply && echo GOLD-APPLIED")


def run(client, task_id, actions):
    episode = client.create(task_id=task_id, wait=120)
    outputs = [episode["observation"]]
    reply = None
    for action in actions:
        reply = client.step(episode["episode_id"], action)
        outputs.append(reply["observation"])
        if reply["done"]:
            break
    return episode, reply, outputs


def outcome(service, episode_id):
    return next(o for o in service.outcomes() if o["episode_id"] == episode_id)


def test_gold_earns_one_and_noop_zero_on_every_code_task(general_service, general_demo,
                                                        general_prepared):
    client = Client(general_service.url)
    tasks = tasks_of(general_prepared, "opensource-code")
    assert len(tasks) >= 3
    for task in tasks:
        gold = (general_demo["out"] / "gold" / f"{task['task_id']}.patch").read_text()
        first, reply, outputs = run(client, task["task_id"], [apply_gold(gold),
                                                              {"operation": "finish"}])
        assert first["observation"]["task_kind"] == "opensource-code"
        assert "Commands time out after 60 seconds" in first["observation"]["output"]
        assert "GOLD-APPLIED" in outputs[1]["output"], outputs[1]
        assert reply["done"] and reply["reward"] == 1.0, reply
        _, noop, _ = run(client, task["task_id"], [{"operation": "finish"}])
        if task is tasks[0]:
            # the container's cost, read by ContainerUsage at the terminal step
            # in the workspace: a 1 MiB file in /tmp did not show in SizeRw
            # (627904 bytes; a volume is not in SizeRw), cause not established
            blob = shell("head -c 1048576 /dev/urandom > cost-blob && echo WROTE")
            _, done, outputs = run(client, task["task_id"], [blob, {"operation": "finish"}])
            assert "WROTE" in outputs[1]["output"], outputs
            cost = outcome(general_service, done["episode_id"])["cost"]
            assert cost["cpu_s"] > 0 and cost["memory_peak_bytes"] > 0, cost
            assert cost["disk_written_bytes"] >= 1 << 20 and done["cost"] == cost, cost
        assert noop["done"] and noop["reward"] == 0.0 and noop["failure_class"] is None, noop


def test_history_stripped_and_agent_uid(general_service, general_prepared):
    client = Client(general_service.url)
    task = tasks_of(general_prepared, "opensource-code")[0]
    episode = client.create(task_id=task["task_id"])
    try:
        out = client.step(episode["episode_id"], shell(
            "id -u; git log --all --oneline | wc -l; git branch -a | grep -c upstream-fix; "
            "ls /opt/mimo-task 2>&1 | head -1"))["observation"]["output"].split("\n")
        assert out[0] == "2000" and out[1] == "1" and out[2] == "0" and "Permission denied" in out[3]
    finally:
        client.close(episode["episode_id"])


def test_a_verifier_crash_the_agent_caused_is_obstructed_not_null(general_service,
                                                                   general_prepared):
    """A tree too deep for the walk of the agent's changes fails the grade (grader_error);
    the control (the gold patch in a fresh container, through the same
    verifier) grades, so the crash was the submission's: 0.0, obstructed,
    with both named in the record. It used to end null: a mask the agent
    could choose for every episode it expected to lose."""
    client = Client(general_service.url)
    task = tasks_of(general_prepared, "opensource-code")[0]
    # (rm -rf .git and chmod 000 . no longer break it: the verifier runs in a
    # fresh container with only the changed files; a tree deeper than the
    # walk of the agent's changes can recurse still stops the collect)
    deep = "mkdir -p $(printf 'd/%.0s' $(seq 1 1200)) && echo deep"
    _, reply, _ = run(client, task["task_id"], [shell(deep), {"operation": "finish"}])
    assert reply["done"] and reply["reward"] == 0.0 and reply["failure_class"] is None, reply
    record = outcome(general_service, reply["episode_id"])
    assert record["integrity"] == "obstructed" and record["grade_reason"] == "obstructed", record
    evidence = record["integrity_evidence"]
    assert evidence[0].startswith("step failed (grader_error)"), evidence
    # (this service's manifest has no references: the control is the pristine tree's no-op
    # finish, which the verifier grades 0.0; with one, the gold patch, which must earn 1.0)
    assert "the no-op finish in a fresh container" in evidence[1], evidence
    assert "through the verifier, earned 0.0 (integrity ok)" in evidence[1], evidence
    assert record["timings"]["control_s"] > 0


def test_a_broken_grading_path_stays_null_with_its_class(general_demo, general_prepared,
                                                        fake_judge, lower_root, rootfs, tmp_path):
    """When the infrastructure itself is gone (the helper stopped before
    finish: its stop sweep removed the episode's container, no reap, no
    fresh container for the control), the control fails too and the null
    stands with its failure class; health says so."""
    import conftest as pc
    from general_fixtures import configure_general, helper_for, judge_env
    from tests.support.services import ServiceProcess

    with helper_for(general_demo, lower_root, rootfs) as helper:
        service = ServiceProcess(configure_general(tmp_path, general_prepared, helper),
                                 env=judge_env(fake_judge))
        try:
            service.wait_ready(timeout=300)
            client = Client(service.url)
            task = tasks_of(general_prepared, "opensource-code")[0]
            eid = client.create(task_id=task["task_id"], wait=300)["episode_id"]
            pc.stop_helper(helper)
            reply = client.step(eid, {"operation": "finish"})
            assert reply["done"] and reply["reward"] is None, reply
            assert reply["failure_class"] in ("infra", "sandbox_died"), reply
            record = outcome(service, eid)
            assert record["reward"] is None and record.get("integrity") != "obstructed", record
            health = client.health()
            assert health["status"] != "healthy" and any(
                "no control disproved it" in r for r in health["reasons"]), health
        finally:
            service.stop()


def test_software_tasks_refuse_tool_actions(general_service, general_prepared):
    client = Client(general_service.url)
    task = tasks_of(general_prepared, "opensource-code")[0]
    episode = client.create(task_id=task["task_id"])
    try:
        with pytest.raises(Exception) as info:
            client.step(episode["episode_id"], {"operation": "tool", "server": "crm", "name": "x"})
        assert getattr(info.value, "status", None) == 422
    finally:
        client.close(episode["episode_id"])


def oracle(general_demo, task_id):
    return json.loads((general_demo["out"] / f"{task_id}.oracle.json").read_text())


def test_general_agent_oracle_judged(general_service, general_demo, general_prepared, fake_judge):
    client = Client(general_service.url)
    fake_judge.default = Reply(text='{"score": 1, "reason": "names it"}')
    for task in tasks_of(general_prepared, "general_agent"):
        first, reply, outputs = run(client, task["task_id"], oracle(general_demo, task["task_id"]))
        assert first["observation"]["tools"], first
        assert all(o.get("exit_code") in (0, None) for o in outputs[1:]), outputs
        assert reply["done"] and reply["reward"] == 1.0, reply
        record = outcome(general_service, reply["episode_id"])
        judged = record["judge"]
        assert judged and all(j["judge_model"] == "fake-judge-1" and j["judge_score"] == 1.0
                              and j["judge_host"] == f"127.0.0.1:{fake_judge.port}"
                              and j["judge_prompt_hash"].startswith("sha256:")
                              and "names it" in j["judge_raw"] for j in judged)
        assert KEY not in json.dumps(record)
    assert fake_judge.requests[-1].headers["authorization"] == f"Bearer {KEY}"


def test_general_agent_noop_scores_low(general_service, general_prepared, fake_judge):
    client = Client(general_service.url)
    fake_judge.default = Reply(text='{"score": 0}')
    task = tasks_of(general_prepared, "general_agent")[0]
    _, reply, _ = run(client, task["task_id"], [{"operation": "finish", "answer": "no idea"}])
    assert reply["done"] and reply["reward"] == 0.0 and reply["failure_class"] is None


@pytest.mark.parametrize("bad", [Reply(status=500), Reply(delay=5.0), Reply(text="looks fine to me")],
                         ids=["http500", "timeout", "unparseable"])
def test_judge_failures_are_null_judge_error(general_service, general_demo, general_prepared,
                                             fake_judge, bad):
    client = Client(general_service.url)
    fake_judge.default = bad
    try:
        task = tasks_of(general_prepared, "general_agent")[1]
        _, reply, _ = run(client, task["task_id"], oracle(general_demo, task["task_id"]))
        assert reply["done"] and reply["reward"] is None and reply["failure_class"] == "judge_error"
        record = outcome(general_service, reply["episode_id"])
        assert record["judge_failure"]["host"] == f"127.0.0.1:{fake_judge.port}"
        assert KEY not in json.dumps(record)
    finally:
        fake_judge.default = Reply(text='{"score": 1}')


def test_metadata_and_schema(general_service):
    client = Client(general_service.url)
    meta = client.metadata()
    text = json.dumps(meta)
    assert KEY not in text and "fake-judge-1" in text
    schema = client.schema()
    branches = schema["action"]["anyOf"]
    assert {b["title"] for b in branches} == {"opensource-code action (seed 001)", "general_agent action"}


def test_stock_openenv_client_runs_an_episode(general_service, general_demo, general_prepared):
    from openenv.core import GenericEnvClient
    from tests.support.token_clients import with_token

    task = tasks_of(general_prepared, "opensource-code")[1]
    gold = (general_demo["out"] / "gold" / f"{task['task_id']}.patch").read_text()
    stock = with_token(GenericEnvClient)(base_url=general_service.url, message_timeout_s=600)
    with stock.sync() as env:
        result = env.reset(task_id=task["task_id"])
        assert result.done is False
        result = env.step(apply_gold(gold))
        assert "GOLD-APPLIED" in result.observation["output"]
        result = env.step({"operation": "finish"})
        assert result.done is True and result.reward == 1.0


def test_32_concurrent_episodes(general_service, general_demo, general_prepared):
    tasks = tasks_of(general_prepared, "opensource-code")

    def one(i):
        client = Client(general_service.url)
        task = tasks[i % len(tasks)]
        if i % 2:
            gold = (general_demo["out"] / "gold" / f"{task['task_id']}.patch").read_text()
            actions, want = [apply_gold(gold), {"operation": "finish"}], 1.0
        else:
            actions, want = [shell("echo hi"), {"operation": "finish"}], 0.0
        _, reply, _ = run(client, task["task_id"], actions)
        return reply["reward"], want

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    assert all(got == want for got, want in results), results


def test_warm_pool_serves_resets_and_everything_goes_at_stop(general_prepared, general_helper,
                                                            fake_judge, tmp_path):
    """A service with a warm pool; kill -9 mid-episode leaves containers that the
    next start removes; a clean stop leaves none."""
    import os
    import signal
    import time
    from pathlib import Path

    from camg.sandboxes.containers import ContainerClient
    from general_fixtures import configure_general, judge_env
    from tests.support.services import ServiceProcess

    config = configure_general(tmp_path, general_prepared, general_helper, pool_size=1)
    watcher = ContainerClient(general_helper.socket, owner="general")
    images = {t["data"]["image"] for t in tasks_of(general_prepared, "opensource-code")} | \
        {t["data"]["image"] for t in tasks_of(general_prepared, "general_agent")}
    service = ServiceProcess(config, env=judge_env(fake_judge)).wait_ready(timeout=300)
    try:
        deadline = time.monotonic() + 120
        while len(watcher.list()) < len(images) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(watcher.list()) == len(images)
        task = tasks_of(general_prepared, "opensource-code")[0]
        client = Client(service.url)
        episode = client.create(task_id=task["task_id"])
        assert "hits" in json.dumps(client.metadata())
        client.step(episode["episode_id"], shell("echo mid-episode"))
        # kill -9 of the service: the gunicorn master and its worker alike.
        children = Path(f"/proc/{service.proc.pid}/task/{service.proc.pid}/children").read_text().split()
        service.proc.send_signal(signal.SIGKILL)
        for pid in children:
            os.kill(int(pid), signal.SIGKILL)
        service.proc.wait()
        old = {c["container_id"] for c in watcher.list()}
        assert len(old) >= len(images), "the killed service's containers are there before restart"
    finally:
        service.stop()
    restarted = ServiceProcess(config, env=judge_env(fake_judge)).wait_ready(timeout=300)
    try:
        # Nothing of the killed run remains; the new run's pool does.
        assert not old & {c["container_id"] for c in watcher.list()}
        task = tasks_of(general_prepared, "opensource-code")[0]
        _, reply, _ = run(Client(restarted.url), task["task_id"], [{"operation": "finish"}])
        assert reply["reward"] == 0.0
    finally:
        assert restarted.stop() == 0
    assert watcher.list() == []
    watcher.close()


def test_code_task_view_leaks_nothing_of_the_fix(general_service, general_demo, general_helper,
                                                 general_prepared):
    """The agent-view leak check (environments.general.demo.code_tasks.container_leaks) in
    each code task's container after reset, as the agent: no bytecode, copy,
    archive or git object of the fixed sources (the fix's history is gone)."""
    from camg.sandboxes.containers import ContainerClient
    from environments.general.demo import code_tasks
    client = Client(general_service.url)
    containers = ContainerClient(general_helper.socket, owner="general")
    leaked = {}
    try:
        for task in tasks_of(general_prepared, "opensource-code"):
            episode = client.create(task_id=task["task_id"], wait=120)
            try:
                held = [c for c in containers.list() if c["episode_id"] == episode["episode_id"]]
                assert len(held) == 1, containers.list()
                leaked[task["task_id"]] = code_tasks.container_leaks(
                    containers, held[0]["container_id"], general_demo["code_tasks"][task["task_id"]])
            finally:
                client.close(episode["episode_id"])
    finally:
        containers.close()
    assert leaked and not any(leaked.values()), leaked


def test_with_references_the_control_is_the_gold_patch(general_demo, general_helper, fake_judge,
                                                       tmp_path):
    """A service prepared with references proves a null with the task's
    gold patch in a fresh container (it must earn 1.0 through the same
    verifier), not with a no-op."""
    from environments.general.prepare import prepare_general
    from general_fixtures import configure_general, judge_env
    from tests.support.services import ServiceProcess

    prepare_general(code_rows=str(general_demo["code_rows"]),
                    general_rows=str(general_demo["general_rows"]),
                    envs=str(general_demo["envs"]), images=str(general_demo["images"]),
                    output_dir=tmp_path / "data", references=str(general_demo["out"]))
    service = ServiceProcess(configure_general(tmp_path, tmp_path / "data", general_helper),
                             env=judge_env(fake_judge))
    try:
        service.wait_ready(timeout=300)
        client = Client(service.url)
        task = tasks_of(tmp_path / "data", "opensource-code")[0]
        deep = "mkdir -p $(printf 'd/%.0s' $(seq 1 1200)) && echo deep"
        _, reply, _ = run(client, task["task_id"], [shell(deep), {"operation": "finish"}])
        assert reply["reward"] == 0.0 and reply["failure_class"] is None, reply
        record = outcome(service, reply["episode_id"])
        assert record["integrity"] == "obstructed", record
        assert "the gold patch in a fresh container" in record["integrity_evidence"][1]
        assert "through the verifier, earned 1.0 (integrity ok)" in record["integrity_evidence"][1]
    finally:
        assert service.stop() == 0, service.output()[-3000:]
