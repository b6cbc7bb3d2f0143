"""camg-autoresearch under real systemd (issue 12): killing the private
grader stops the service; systemd brings both back (new service pid, new
grader pid), the episode in flight ends with ``reward: null`` and a failure
class, and a new episode is graded by the new grader.

Installed as install.sh does it (units/camg-autoresearch-grader.conf as
camg-autoresearch.service.d/20-grader.conf, the camg-grader sysuser, the
--check-clean ExecStartPre). Set-up cost is kept small: one demo task
(scikit-learn's breast-cancer) built on the host, and the research image
the privileged tier materialized under $CAMG_CACHE/oci hard-linked into the
guest at the same path (no pull, no second materialization).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from systest_deploy import VENV_PYTHON, GuestDeployment, journal_tail, mirror, outcomes
from systest_guest import http, leftovers, show, wait_for

pytestmark = [pytest.mark.system, pytest.mark.privileged, pytest.mark.slow]

URL = "http://127.0.0.1:65133"
UNIT = "camg-autoresearch.service"
TASK = "breast-cancer"
WORK = "/var/lib/camg-systest/autoresearch"     # in the guest
DATA = "/srv/camg/data/autoresearch"
PACKAGES = "/var/lib/camg/autoresearch-tasks"
WORKSPACES = "/var/lib/camg/task-layers/autoresearch"
PRIVATE = "/var/lib/camg-grader/answers"


@pytest.fixture(scope="module")
def autoresearch(machine):
    from camg.oci.images import write_materialized
    from tools import oci_demo
    from tools.autoresearch import demo_tasks, image

    research = image.ensure_image(oci_demo.cache_root_from_env())
    mirror(machine.root, Path(research.image.rootfs).parent)
    work = machine.root / WORK.lstrip("/")
    shutil.rmtree(work, ignore_errors=True)
    demo_tasks.build_task(TASK, work / "bundles")
    reference = (work / "bundles" / TASK / "reference" / "solve.py").read_text()
    write_materialized(machine.root / DATA.lstrip("/") / "materialized-images.json",
                       (research.image,))
    deployment = GuestDeployment(machine)
    deployment.backup()
    try:
        machine.sh(f"{VENV_PYTHON} -m camg.prepare --environment autoresearch "
                   f"--source {WORK}/bundles --packages-root {PACKAGES} "
                   f"--workspaces-root {WORKSPACES} --private-root {PRIVATE} "
                   f"--images {DATA}/materialized-images.json --output {DATA}/manifest.json "
                   f"&& chmod -R a+rX {DATA}", timeout=300)
        oci_root = str(oci_demo.cache_root_from_env().resolve())

        def with_image_root(config: dict) -> dict:
            lowers = list(config.get("lower_roots", []))
            return {**config, "lower_roots": lowers + [oci_root] * (oci_root not in lowers)}

        deployment.serve({"autoresearch": {
            "manifest": f"{DATA}/manifest.json", "capacity": 2,
            "settings": {"packages_root": PACKAGES, "workspaces_root": WORKSPACES,
                         "private_root": PRIVATE, "images": f"{DATA}/materialized-images.json",
                         "memory_bytes": 1 << 30, "cpu_quota": 1.0, "pids_max": 512,
                         "disk_bytes": 512 << 20, "command_minutes": 5, "episode_minutes": 30}}},
            with_image_root)
        props = deployment.start(UNIT)
        yield {"reference": reference, "props": props}
    finally:
        deployment.restore()
        # Nothing of the service outlives its stop: no sandbox, no grader.
        assert leftovers(machine) == {}
        assert not _graders(machine)


def _graders(machine) -> list[str]:
    return machine.run(["ps", "-u", "camg-grader", "-o", "pid="], check=False).stdout.split()


def _shell(command: str) -> dict:
    return {"action": {"operation": "shell", "command": command}}


def test_the_grader_runs_under_its_own_uid_beside_the_service(machine, autoresearch):
    dropin = machine.run(["systemctl", "cat", UNIT]).stdout
    assert "20-grader.conf" in dropin and "10-environment.conf" in dropin, dropin
    graders = _graders(machine)
    assert len(graders) == 1, graders
    main = show(machine, UNIT, "MainPID")["MainPID"]
    service_user = machine.run(["ps", "-o", "user=", "-p", main]).stdout.strip()
    assert service_user == "camg"
    # The grader is the service's child (the worker's), in the unit's cgroup.
    unit_pids = machine.run(["systemctl", "show", "-p", "ControlGroup", "--value", UNIT]).stdout.strip()
    grader_cgroup = machine.run(["cat", f"/proc/{graders[0]}/cgroup"]).stdout
    assert unit_pids and unit_pids in grader_cgroup, (unit_pids, grader_cgroup)
    # The worker that serves episodes (the grader's parent) holds neither
    # CAP_SETUID nor CAP_SETGID once the grader runs, in any of its threads
    # (capabilities are per thread) and any set.
    worker = machine.run(["ps", "-o", "ppid=", "-p", graders[0]]).stdout.strip()
    caps = machine.run(["sh", "-c", f"grep -H '^Cap' /proc/{worker}/task/*/status"]).stdout
    setid = (1 << 6) | (1 << 7)
    held = [line for line in caps.splitlines()
            if line.split(":")[1] in ("CapInh", "CapPrm", "CapEff", "CapAmb")
            and int(line.split()[-1], 16) & setid]
    assert caps.count("CapPrm") >= 2 and not held, caps


def test_killing_the_grader_stops_the_service_and_systemd_brings_both_back(machine, autoresearch):
    props = show(machine, UNIT, "MainPID", "NRestarts")
    (grader,) = _graders(machine)
    status, created = http(machine, "POST", "/episodes", {"task_id": TASK}, base=URL, timeout=300)
    assert status == 201, f"{created}\n{journal_tail(machine, UNIT)}"
    eid = created["episode_id"]
    status, step = http(machine, "POST", f"/episodes/{eid}/step", _shell("id -u"), base=URL)
    assert status == 200 and step["observation"]["output"].strip().endswith("2000"), step

    machine.run(["kill", "-9", grader])
    killed = time.monotonic()

    def both_back():
        now = show(machine, UNIT, "ActiveState", "MainPID", "NRestarts")
        graders = _graders(machine)
        return (now["ActiveState"] == "active" and now["MainPID"] not in ("0", props["MainPID"])
                and int(now["NRestarts"]) > int(props["NRestarts"])
                and len(graders) == 1 and graders[0] != grader and graders)

    wait_for(both_back, 240, "systemd to bring the service and its grader back")
    print(f"service and grader back {time.monotonic() - killed:.1f} s after the kill")
    # The service stopped because its grader died (not for another reason).
    said = machine.run(["journalctl", "--no-pager", "-o", "cat", "-u", UNIT], check=False).stdout
    assert "grader" in said and "exited" in said, said[-3000:]
    # The episode in flight ends with a masked reward, never a fake 0.
    record = next((r for r in outcomes(machine, "autoresearch") if r["episode_id"] == eid), None)
    assert record is not None, journal_tail(machine, UNIT)
    assert record["reward"] is None and record["failure_class"], record
    print(f"\nin-flight episode after the grader's kill: {record}")
    # Its sandbox was released (ExecStopPost= release-all, --check-clean).
    assert leftovers(machine) == {}

    # A new episode works end to end: the new grader scores the reference.
    status, created = http(machine, "POST", "/episodes", {"task_id": TASK}, base=URL, timeout=300)
    assert status == 201, f"{created}\n{journal_tail(machine, UNIT)}"
    new = created["episode_id"]
    solve = autoresearch["reference"]
    for action in (_shell(f"cat > /workspace/solve.py <<'CAMG_EOF'\n{solve}\nCAMG_EOF"),
                   _shell("python /workspace/solve.py")):
        status, step = http(machine, "POST", f"/episodes/{new}/step", action, base=URL)
        assert status == 200 and step["observation"]["exit_code"] == 0, step
    status, done = http(machine, "POST", f"/episodes/{new}/step",
                        {"action": {"operation": "submit"}}, base=URL)
    assert status == 200 and done["done"] is True, done
    assert done["reward"] is not None and done["reward"] >= 0.9, done
