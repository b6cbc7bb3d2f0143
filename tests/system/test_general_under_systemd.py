"""camg-general under real systemd with the guest's own Docker engine
(issue 15): ``kill -9`` of the service mid-episode, and after systemd's
restart no container, network or volume of that service remains.

Set-up (about a minute warm): one general_agent demo task's image (cached
under $CAMG_CACHE/general by the privileged tier) is pushed on the host to
a loopback registry whose storage lies in the guest root; inside the guest
(private network) a registry serves the same storage on the same loopback
port, so the service's helper pulls the image by digest into the guest's
dockerd exactly as in a deployment. The agent environment is hard-linked in
from the cache. The task is prepared by ``python -m camg.prepare
--environment general`` in the guest, configured by camg.configure and run
as camg-general.service with the helper's ``containers`` section.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import systest_docker as sd
from systest_deploy import VENV_PYTHON, GuestDeployment, journal_tail, mirror, outcomes
from systest_guest import http, show, wait_for

pytestmark = [pytest.mark.system, pytest.mark.privileged, pytest.mark.slow]

URL = "http://127.0.0.1:65139"
UNIT = "camg-general.service"
WORK = "/var/lib/camg-systest/general"       # in the guest
DATA = "/srv/camg/data/general"
SERVICE_LABEL = "camg.service=general"


def _cache() -> Path:
    return Path(os.environ.get("CAMG_CACHE") or "/var/cache/camg-test")


def _build_task(root: Path) -> tuple[dict, str]:
    """One general_agent task (rows, envs, image mapping) under the guest's
    WORK; returns (instance, image ref). Pushed to a host registry whose
    storage is the guest's."""
    from tools.general import agent_tasks, images
    from tools.general.demo import IMAGE_NAME
    from tools.loopback_registry import LocalRegistry

    work = root / WORK.lstrip("/")
    shutil.rmtree(work, ignore_errors=True)
    (work / "envs").mkdir(parents=True)
    task_dir = agent_tasks.build_all(_cache() / "general" / "tasks" / "general")[0]
    instance = json.loads((task_dir / "instance.json").read_text())
    layout_dir, tag, digest = images.build_task_image(_cache(), task_dir, "general_agent")
    registry = LocalRegistry(work / "registry")
    with registry:
        ref = images.publish(layout_dir, tag, digest, registry.address)
    instance["docker_image"] = f"{IMAGE_NAME}:{tag}"
    shutil.copytree(task_dir, work / "envs" / instance["instance_id"])
    (work / "envs" / instance["instance_id"] / "instance.json").write_text(json.dumps(instance))
    row = {"responses_create_params": {"input": [{"role": "user",
                                                  "content": instance["problem_statement"]}],
                                       "metadata": {"workdir": instance["cwd"]}},
           "instance": instance, "subset": "general"}
    (work / "general.jsonl").write_text(json.dumps(row) + "\n")
    (work / "image-mapping.jsonl").write_text(
        json.dumps({"dataset_image": instance["docker_image"], "dockerhub_image": ref}) + "\n")
    # The same storage, served inside the guest on the same loopback port.
    (work / "registry" / "guest.yml").write_text(
        (work / "registry" / "config.yml").read_text().replace(str(work), WORK))
    return instance, ref


@pytest.fixture(scope="module")
def general(machine):
    if not machine.docker:
        pytest.fail("the system tests' machine must be booted with docker=True (conftest)")
    from tools.general import agent_env

    sd.start_dockerd(machine)
    instance, ref = _build_task(machine.root)
    agent = mirror(machine.root, agent_env.cached(_cache()))
    deployment = GuestDeployment(machine)
    deployment.backup()
    try:
        machine.run(["systemd-run", "--unit=systest-general-registry", "--collect",
                     "docker-registry", "serve", f"{WORK}/registry/guest.yml"])
        port = ref.split("/", 1)[0].rsplit(":", 1)[1]
        wait_for(lambda: machine.run(["curl", "-sf", f"http://127.0.0.1:{port}/v2/"],
                                     check=False).returncode == 0, 30, "the guest's registry")
        machine.sh(f"{VENV_PYTHON} -m camg.prepare --environment general "
                   f"--general-rows {WORK}/general.jsonl --envs {WORK}/envs "
                   f"--images {WORK}/image-mapping.jsonl --output-dir {DATA} "
                   f"&& echo '{json.dumps({'images': [ref]})}' > {DATA}/container-images.json "
                   f"&& chmod -R a+rX {DATA}", timeout=300)
        # Never called (the episode is killed before any judging), but the
        # service refuses to start without them.
        machine.sh("install -d -m 0755 /etc/camg/credentials && umask 077 && printf '%s\\n' "
                   "GA_JUDGE_URL=http://127.0.0.1:9/v1 GA_JUDGE_MODEL=none GA_JUDGE_KEY=sk-systest "
                   "> /etc/camg/credentials/general-judge.env")

        def with_containers(config: dict) -> dict:
            return {**config, "containers": {"images_manifest": f"{DATA}/container-images.json",
                                             "agent_env_source": str(agent)}}

        deployment.serve({"general": {
            "manifest": f"{DATA}/manifest.json", "capacity": 2,
            "settings": {"pool_size": 1, "cpu": 0.5, "memory_bytes": 512 << 20, "pids_max": 256}}},
            with_containers)
        props = deployment.start(UNIT)
        yield {"instance": instance, "ref": ref, "props": props}
    finally:
        deployment.restore()
        machine.run(["systemctl", "stop", "systest-general-registry"], check=False)
        left = sd.labelled(machine, "container", SERVICE_LABEL)
        assert not left, f"General's containers outlived the stop of {UNIT}: {left}"


def _containers(machine) -> set[str]:
    return set(sd.labelled(machine, "container", SERVICE_LABEL))


def test_kill_9_mid_episode_leaves_no_container_network_or_volume(machine, general):
    health = wait_for(lambda: http(machine, "GET", "/health", base=URL, timeout=30)[0] == 200,
                      180, "camg-general /health 200 (the pool's first container)")
    assert health
    volumes_before = set(sd.all_volumes(machine))
    networks_before = set(machine.run(["docker", "network", "ls", "-q"]).stdout.split())
    pooled = _containers(machine)
    status, created = http(machine, "POST", "/episodes",
                           {"task_id": general["instance"]["instance_id"]}, base=URL, timeout=300)
    assert status == 201, f"{created}\n{journal_tail(machine, UNIT)}"
    eid = created["episode_id"]
    # The episode's container runs: a claimed pool container (labels are
    # fixed at creation, so it keeps the pool's) or, on a miss, one labelled
    # with the episode id; the pool refills beside it.
    before = _containers(machine)
    mine = set(sd.labelled(machine, "container", f"camg.episode={eid}")) or (pooled & before)
    assert len(mine) == 1, (pooled, before, mine)
    running = machine.run(["docker", "inspect", "-f", "{{.State.Running}}", *mine]).stdout.split()
    assert running == ["true"], running
    props = show(machine, UNIT, "MainPID", "NRestarts")

    machine.run(["kill", "-9", props["MainPID"]])

    def restarted():
        now = show(machine, UNIT, "ActiveState", "MainPID", "NRestarts")
        return (now["ActiveState"] == "active" and now["MainPID"] not in ("0", props["MainPID"])
                and int(now["NRestarts"]) > int(props["NRestarts"]))

    wait_for(restarted, 300, "systemd to restart camg-general")
    # ExecStopPost= (release-all) and the start's sweep removed every
    # container of the killed run: the episode's and the pool's.
    survivors = before & _containers(machine)
    assert not survivors, f"containers of the killed run remain: {survivors}\n" \
                          f"{journal_tail(machine, UNIT)}"
    assert not sd.labelled(machine, "network", SERVICE_LABEL)
    assert set(machine.run(["docker", "network", "ls", "-q"]).stdout.split()) == networks_before
    assert not set(sd.all_volumes(machine)) - volumes_before, "a volume outlived its container"
    # The episode in flight is recorded as the infrastructure's failure.
    record = wait_for(lambda: next((r for r in outcomes(machine, "general")
                                    if r["episode_id"] == eid), None), 60,
                      "the recovered outcome record")
    assert record["reward"] is None and record["failure_class"] == "infra", record
    assert record.get("recovered") is True, record
    # The new service is healthy and serves a new episode.
    wait_for(lambda: http(machine, "GET", "/health", base=URL, timeout=30)[0] == 200,
             180, "camg-general healthy after the restart")
    status, again = http(machine, "POST", "/episodes",
                         {"task_id": general["instance"]["instance_id"]}, base=URL, timeout=300)
    assert status == 201, again
    assert again["observation"], again
    assert _containers(machine), "the new episode has no container"
    status, _ = http(machine, "DELETE", f"/episodes/{again['episode_id']}", base=URL)
    assert status in (200, 204)
