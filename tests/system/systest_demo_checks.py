"""What the single-environment systemd tests checked (AutoResearch's
private grader; General's docker networks and volumes; issue 23), run on the
demo machine test_newcomer's systemd variant boots, so no second machine and
deployment is set up for them:

* before the storm (``private_grader``): AutoResearch's grader runs as its
  own uid beside the service, in the unit's cgroup, and the worker that
  spawned it holds no CAP_SETUID/CAP_SETGID in any thread;
* after the episodes (``trainer_quickstart``): the README's trainer
  quickstart as another local user, and its refusals;
* after the episodes (``host_private``): ``camg audit`` finds every private
  path of the demo closed to others (state directories with records in
  them, task layers, task packages, prepared data, the build cache, the
  signing key), and a user outside group camg reads none of them;
* after every kill (``KillChecks``, the storm's ``check``):
  - an environment with task containers: the guest dockerd's networks are
    those before the storm, and no volume is new (nothing outlived its
    container);
  - a kill that restarts the unit (the master's, AutoResearch's grader's):
    systemd counts the restart (NRestarts);
  - General's master killed: the in-flight episode the restarted service
    recorded is ``reward: null``, ``failure_class: infra``, ``recovered:
    true``, and it then serves a new episode in one running container;
  - AutoResearch's grader killed: the service said its grader exited, one
    new grader runs, and it grades a new episode's reference solution (its
    commands run as uid 2000) at least 0.9;
* after the stop (test_newcomer ``_assert_clean``): no camg-grader process.
"""

from __future__ import annotations

import json
import time

from systest_guest import http, show
from systest_machine import Machine
from camg import plugins
from devtools.reliability.killstorm import Storm, restarts_unit
from devtools.reliability.killstorm_guest import Env
from devtools.reliability.killstorm_report import Kill

AUTORESEARCH = "camg-autoresearch.service"
GRADER_USER = "camg-grader"
# CAP_SETGID (6) and CAP_SETUID (7).
SETID = (1 << 6) | (1 << 7)
# environments/autoresearch/supervisor.py: "the private grader (pid N) exited ..."
GRADER_EXITED = "private grader.*exited"


def graders(machine: Machine) -> list[str]:
    return machine.run(["ps", "-u", GRADER_USER, "-o", "pid="], check=False).stdout.split()


def private_grader(machine: Machine) -> None:
    """AutoResearch's grader: its own uid, the service's child, in the
    unit's cgroup; the worker keeps no set-id capability in any thread."""
    dropins = machine.run(["systemctl", "cat", AUTORESEARCH]).stdout
    assert "20-grader.conf" in dropins and "10-environment.conf" in dropins, dropins
    running = graders(machine)
    assert len(running) == 1, running
    main = show(machine, AUTORESEARCH, "MainPID")["MainPID"]
    assert machine.run(["ps", "-o", "user=", "-p", main]).stdout.strip() == "camg"
    unit_cgroup = show(machine, AUTORESEARCH, "ControlGroup")["ControlGroup"]
    grader_cgroup = machine.run(["cat", f"/proc/{running[0]}/cgroup"]).stdout
    assert unit_cgroup and unit_cgroup in grader_cgroup, (unit_cgroup, grader_cgroup)
    # Capabilities are per thread: every thread of the grader's parent (the
    # worker that serves episodes), every set.
    worker = machine.run(["ps", "-o", "ppid=", "-p", running[0]]).stdout.strip()
    caps = machine.run(["sh", "-c", f"grep -H '^Cap' /proc/{worker}/task/*/status"]).stdout
    held = [line for line in caps.splitlines()
            if line.split(":")[1] in ("CapInh", "CapPrm", "CapEff", "CapAmb")
            and int(line.split()[-1], 16) & SETID]
    assert caps.count("CapPrm") >= 2 and not held, caps


# The demo's trees no configuration names (packaging/install.sh).
DEMO_TREES = ("/srv/camg/data", "/var/cache/camg")


def host_private(machine: Machine, names: list[str]) -> None:
    """What is private in the sandbox is private on the host: the audit's
    verdict, its paths, and a read by a user who is neither root nor camg."""
    argv = ["/srv/camg/service-venv/bin/camg", "audit", "--json"]
    for tree in DEMO_TREES:
        argv += ["--path", tree]
    result = machine.run(argv, check=False)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["findings"] == [], result.stdout[-6000:]
    paths = {p["path"]: p for p in report["paths"]}
    expected = ["/var/lib/camg", "/var/lib/camg/signing/outcomes.key", *DEMO_TREES,
                *(f"/var/lib/camg/{env}" for env in names)]
    if "coding" in names:
        expected.append("/var/lib/camg/task-layers/coding")
    if "autoresearch" in names:
        expected += ["/var/lib/camg/autoresearch-tasks", "/var/lib/camg-grader/answers"]
    for path in expected:
        assert paths.get(path, {}).get("verdict") == "private", (path, paths.get(path))
    # Belt and braces: nobody (no camg group) reads the key or lists a tree.
    for read in (["head", "-c", "1", "/var/lib/camg/signing/outcomes.key"],
                 ["ls", "/srv/camg/data/general/gold"], ["ls", "/var/lib/camg/task-layers/coding"],
                 ["ls", "/var/cache/camg/autoresearch"]):
        if machine.run(["test", "-e", read[-1]], check=False).returncode != 0:
            continue
        probe = machine.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                             *read], check=False)
        assert probe.returncode != 0, f"nobody reads {read[-1]}: {probe.stdout[:500]}"


CAMG = "/srv/camg/service-venv/bin/camg"
PYTHON = "/srv/camg/service-venv/bin/python"
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def trainer_quickstart(machine: Machine, names: list[str]) -> None:
    """The README's trainer quickstart, as another local user: a token from
    ``camg trainer add``, then an episode; without it, 401; with it,
    another trainer's episode is absent; revoked, refused again."""
    env = "shop" if "shop" in names else names[0]
    token = machine.run([CAMG, "trainer", "add", "quickstart"]).stdout.strip()
    assert token.startswith("camg_"), token
    rollout = ["env", f"CAMG_TOKEN={token}", "HOME=/nonexistent", PYTHON, "-m", "camg_client", "--routes",
               "/etc/camg/prepared/routes.json", "--env", env, "--policy", "noop",
               "--episodes", "1", "--no-progress"]
    ran = machine.run([*NOBODY, *rollout], check=False, timeout=900)
    assert ran.returncode == 0, f"the quickstart failed:\n{ran.stdout}\n{ran.stderr[-3000:]}"
    refused = machine.run([*NOBODY, *rollout[:1], "CAMG_TOKEN=", *rollout[2:]], check=False,
                          timeout=300)
    assert refused.returncode != 0 and "unauthorized" in refused.stdout + refused.stderr, \
        refused.stderr[-3000:]
    # root's own episode (install.sh's token) is absent to the quickstart trainer
    url = json.loads(machine.run(["cat", "/etc/camg/prepared/routes.json"]).stdout)[env]
    status, created = http(machine, "POST", "/episodes", {}, base=url)
    assert status == 201, created
    eid = created["episode_id"]
    probe = (f"import urllib.request as u, urllib.error as e\n"
             f"r = u.Request('{url}/episodes/{eid}', headers={{'Authorization': "
             f"'Bearer {token}'}})\n"
             "try:\n    print(u.urlopen(r).status)\nexcept e.HTTPError as x:\n    print(x.code)")
    assert machine.run([*NOBODY, "python3", "-c", probe]).stdout.strip() == "404"
    assert http(machine, "DELETE", f"/episodes/{eid}", base=url)[0] == 200
    machine.run([CAMG, "trainer", "revoke", "quickstart"])
    time.sleep(1.5)  # the services re-read the trainers file within a second
    again = machine.run([*NOBODY, *rollout], check=False, timeout=300)
    assert again.returncode != 0 and "unauthorized" in again.stdout + again.stderr


class KillChecks:
    """The storm's ``check``: made before the storm (the docker baseline)."""

    def __init__(self, machine: Machine, names: list[str]) -> None:
        self.machine = machine
        # task containers: the guest's dockerd must end the storm as it began
        self.docker = any(plugins.get(n).substrate == "container" for n in names)
        self.networks, self.volumes = self._docker() if self.docker else (set(), set())
        labelled = self._run("docker network ls -q --filter label=camg.helper") if self.docker else ""
        assert not labelled.split(), f"camg networks before the storm: {labelled}"
        self.grader_exits = self._grader_exits() if "autoresearch" in names else 0
        self.restarts = {name: self._restarts(name) for name in names}
        self.seconds = 0.0

    def _run(self, command: str) -> str:
        return self.machine.run(["sh", "-c", command], timeout=120).stdout

    def _docker(self) -> tuple[set[str], set[str]]:
        out = self._run("docker network ls -q && echo -- && docker volume ls -q").split()
        return set(out[:out.index("--")]), set(out[out.index("--") + 1:])

    def _restarts(self, name: str) -> int:
        return int(show(self.machine, f"camg-{name}.service", "NRestarts")["NRestarts"])

    def _grader_exits(self) -> int:
        out = self.machine.run(["journalctl", "--no-pager", "-o", "cat", "-u", AUTORESEARCH,
                                "-g", GRADER_EXITED], check=False).stdout
        return len([line for line in out.splitlines() if line.strip()])

    def __call__(self, storm: Storm, kill: Kill, env: Env, eid: str) -> list[str]:
        started = time.monotonic()
        try:
            return self._check(storm, kill, env, eid)
        finally:
            self.seconds += time.monotonic() - started

    def _check(self, storm: Storm, kill: Kill, env: Env, eid: str) -> list[str]:
        problems: list[str] = []
        if env.containers:
            networks, volumes = self._docker()
            if networks != self.networks:
                problems.append(f"docker networks changed: {sorted(networks ^ self.networks)}")
            if volumes - self.volumes:
                problems.append(f"a volume outlived its container: {sorted(volumes - self.volumes)}")
        restarts, before = self._restarts(env.name), self.restarts[env.name]
        self.restarts[env.name] = restarts
        if restarts_unit(kill.target, env) and restarts <= before:
            problems.append(f"{env.unit} came back, but systemd counts no restart ({restarts})")
        # General only, as test_general_under_systemd checked it: another
        # environment's worker may close its episode itself when its master
        # dies (a record without ``recovered``), which is no defect.
        if kill.target == "service" and env.name == "general":
            problems += self._recovered(storm, env, eid)
            # its state names the episode's container
            problems += self._serves_a_container(storm, env)
        if env.grader == "process":
            exits, before = self._grader_exits(), self.grader_exits
            self.grader_exits = exits
            if kill.target == "grader" and restarts_unit(kill.target, env):
                if exits <= before:
                    problems.append(f"{env.unit} logged no '{GRADER_EXITED}' for the grader's kill")
                problems += self._new_grader_grades(storm, env)
        return problems

    def _recovered(self, storm: Storm, env: Env, eid: str) -> list[str]:
        """An episode the killed run left running is recorded by the next
        start as the infrastructure's failure (camg/episodes/outcomes.py recover)."""
        found = storm._found(env, eid)
        if not found or found[-1]["reward"] is not None:
            return []  # no episode (a reset cut short), or graded before the kill
        last = found[-1]
        if last.get("failure_class") != "infra" or last.get("recovered") is not True:
            return [f"record of {eid} after the service's kill: {last}"]
        return []

    def _serves_a_container(self, storm: Storm, env: Env) -> list[str]:
        created = storm.guest.http(env.port, "POST", "/episodes", env.create)
        if created.status != 201:
            return [f"after the restart, create answered {created.status}: {str(created.body)[:300]}"]
        new = created.json["episode_id"]
        problems = []
        if not created.json.get("observation"):
            problems.append(f"the new episode has no observation: {str(created.body)[:300]}")
        mine = storm.episode_containers(env, new)
        running = self._run(f"docker inspect -f '{{{{.State.Running}}}}' {' '.join(mine)}").split() \
            if mine else []
        if running != ["true"]:
            problems.append(f"the new episode after the restart has not one running container: "
                            f"{sorted(mine)} {running}")
        closed = storm.guest.http(env.port, "DELETE", f"/episodes/{new}")
        if closed.status not in (200, 204):
            problems.append(f"DELETE of {new} answered {closed.status}")
        return problems

    def _new_grader_grades(self, storm: Storm, env: Env) -> list[str]:
        running = graders(self.machine)
        if len(running) != 1:
            return [f"{len(running)} graders run after the restart: {running}"]
        eid = storm.create(env)
        # The reference is planned from step 0 (environments/autoresearch/episode.py
        # reference_action), so it runs first; the uid probe goes between its
        # last command and the submit it returned.
        finish = storm.to_grading(env, eid)
        who = storm.step(env, eid, {"operation": "shell", "command": "id -u"})
        output = (who.json.get("observation") or {}).get("output", "")
        if who.status != 200 or not output.strip().endswith("2000"):
            storm.guest.http(env.port, "DELETE", f"/episodes/{eid}")
            return [f"an episode's command ran as {output.strip()!r} ({who.status}), not uid 2000"]
        done = storm.step(env, eid, finish)
        reward = done.json.get("reward")
        if not done.json.get("done") or reward is None or reward < 0.9:
            return [f"the new grader's grade: {done.status} {str(done.body)[:300]}"]
        return []
