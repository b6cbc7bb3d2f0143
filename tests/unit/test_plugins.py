"""Environments are plugins: one package plus one entry point, no other edit.

A toy environment is "installed" the way pip installs one — a package on
the path and a ``*.dist-info/entry_points.txt`` naming its descriptor in the
``camg.environments`` group — and must then appear in the service list,
in ``camg.prepare``'s dispatch, in ``camg.configure`` (port, factory,
refusal hint) and in routes.json, and serve; and in the demo (its
preparer, its deployment entry), the reliability suites' table, the kill
storm's plan, its generated unit, ``camg status``, the canary runner (its
suite played against it, every canary lost), the benchmark runner (its
results file) and the fork and session benchmarks' subjects, from its
descriptor alone. The last test counts what that
took: its package and its entry point, no file of the checkout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from camg import plugins
from camg.errors import ConfigError
from tests.support.services import REPO, ServiceProcess, clean_git_tree, free_port
from devtools.harness.auth import deployment_auth

TOY_PORT = 65000 + (os.getpid() % 400)

PLUGIN_PY = '''
from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="toy", port={port}, title="a toy for the plugin test",
    factory="toyenv.environment:ToyEnvironment", settings="toyenv.environment:Settings",
    prepare="toyenv.prepare:main", prepare_hint="python -m camg.prepare --environment toy",
    unit="camg-toy-env.service", substrate="process",
    demo={{"manifest": "/srv/camg/data/toy/manifest.json", "capacity": 3, "references": False}},
    demo_prepare="toyenv.demo:prepare", demo_rank=15,
    reliability="toyenv.reliability:TARGET", storm="toyenv.storm:drive",
    canaries="toyenv.canaries:main", bench="toyenv.bench:main",
)
'''

# Its demo data, reliability recipe and storm drive: what the tools read.
DEMO_PY = '''
from toyenv import prepare as toy


def prepare(data, cache, helper_socket):
    out = data / "toy"
    out.mkdir(parents=True, exist_ok=True)
    toy.main(["--output", str(out / "manifest.json")])
    return out / "manifest.json"
'''

RELIABILITY_PY = '''
from devtools.reliability.targets import Target
from toyenv import prepare


def _prepare(work, socket):
    work.mkdir(parents=True, exist_ok=True)
    prepare.main(["--output", str(work / "toy-manifest.json")])
    return work / "toy-manifest.json", {}, None


TARGET = Target("toy", {"operation": "guess", "value": 50}, prepare=_prepare,
                short={"churn": 2, "load": 3}, full={"churn": 40})
'''

STORM_PY = '''
import dataclasses
from devtools.reliability.killstorm_guest import first_task


def drive(guest, env):
    return dataclasses.replace(env, create={"task_id": first_task(guest, env)["task_id"]},
                               slow_step={"operation": "sleep", "seconds": 3},
                               finish={"operation": "finish"}, grader="process",
                               grader_user="toy")
'''

# Its canary suite, played against the served toy: claiming the reward
# without the work must lose; the honest bisection is the control, allowed
# its 1.0, and must earn it (a suite whose honest path earns nothing proves
# nothing).
CANARIES_PY = '''
import argparse
from camg_client import Client, InvalidAction
from devtools.canary_table import CanaryResult, report


class Bisect:
    def __init__(self):
        self.low, self.high, self.guess = 0, 100, None

    def __call__(self, observation):
        if observation.get("text") == "higher":
            self.low = self.guess + 1
        elif observation.get("text") == "lower":
            self.high = self.guess - 1
        self.guess = (self.low + self.high) // 2
        return {"operation": "guess", "value": self.guess}


def play(client, actions):
    episode_id = client.create(task_id="toy-3")["episode_id"]
    observation, refused = {}, 0
    for action in actions:
        try:
            body = client.step(episode_id, action(observation) if callable(action) else action)
        except InvalidAction:
            refused += 1
            continue
        if body["done"]:
            return body["reward"], refused
        observation = body["observation"]
    client.close(episode_id)
    return None, refused


def main(argv):
    parser = argparse.ArgumentParser(prog="toy canaries")
    parser.add_argument("--url", required=True)
    client = Client(parser.parse_args(argv).url)
    honest, _ = play(client, [Bisect()] * 8)
    rows = [CanaryResult("honest_bisection", honest, allowed=1.0, detail="control")]
    checks = [] if honest == 1.0 else [f"the honest bisection earned {honest}"]
    reward, _ = play(client, [{"operation": "finish"}])
    rows.append(CanaryResult("finish_without_guessing", reward))
    claims = [{"operation": "finish", "reward": 1.0}, {"operation": "guess", "value": "3"},
              {"operation": "finish"}]
    reward, refused = play(client, claims)
    rows.append(CanaryResult("reward_claimed_in_the_action", reward, detail=f"refused {refused}"))
    if refused != 2:
        checks.append(f"a claim in the action was taken ({2 - refused} of 2)")
    return report("toy", rows, checks=checks)
'''

# Its benchmark: step latency in process, its results as one JSON object.
BENCH_PY = '''
import argparse, json, tempfile, time
from camg.environment import ServiceContext, Task
from toyenv.environment import ToyEnvironment


def main(argv):
    parser = argparse.ArgumentParser(prog="toy bench")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    tasks = [Task(f"toy-{i}", {"target": i}) for i in (3, 1, 2)]
    steps = []
    with tempfile.TemporaryDirectory() as state:
        env = ToyEnvironment(ServiceContext("toy", state, {}), tasks)
        for i in range(args.episodes):
            task = tasks[i % len(tasks)]
            episode = env.create_episode(task, seed=None, episode_id=f"e{i}")
            episode.reset()
            started = time.perf_counter()
            episode.step({"operation": "guess", "value": task.data["target"]})
            steps.append(time.perf_counter() - started)
            episode.close()
    steps.sort()
    at = lambda q: round(steps[int(q * (len(steps) - 1))] * 1e3, 4)
    results = {"episodes": args.episodes, "step_ms": {"p50": at(0.5), "p99": at(0.99)}}
    with open(args.json, "w") as out:
        out.write(json.dumps(results, indent=1) + "\\n")
    return 0
'''

ENVIRONMENT_PY = '''
import dataclasses
from tests.support.counter_env import CounterEnvironment


@dataclasses.dataclass(frozen=True)
class Settings:
    pass


class ToyEnvironment(CounterEnvironment):
    name = "toy"
'''

PREPARE_PY = '''
import argparse
from camg.config import task_manifest as manifest


def main(argv):
    ap = argparse.ArgumentParser(prog="toy prepare")
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)
    tasks = [{"task_id": f"toy-{i}", "data": {"target": i}} for i in (3, 1, 2)]
    manifest.write(args.output, manifest.build("toy", tasks, sampling={"order": "given"},
                                               files={}, created_by="toy"))
    print("toy prepared", len(tasks))
    return 0
'''


def checkout_state() -> dict:
    """What the checkout holds beyond its commit: the paths git reports
    (untracked ones too) and the uncommitted changes' content."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                              text=True).stdout
    diff = git("diff", "HEAD", "--binary")
    return {"status": git("status", "--porcelain=v1", "--untracked-files=all"),
            "tracked": git("ls-files"), "diff": hashlib.sha256(diff.encode()).hexdigest()}


@pytest.fixture(scope="module", autouse=True)
def checkout_before() -> dict:
    """The checkout as this module found it (the last test compares)."""
    return checkout_state()


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory):
    """A directory holding the toy package and its installed metadata."""
    root = tmp_path_factory.mktemp("toy-site")
    package = root / "toyenv"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(PLUGIN_PY.format(port=TOY_PORT))
    (package / "environment.py").write_text(ENVIRONMENT_PY)
    (package / "prepare.py").write_text(PREPARE_PY)
    (package / "demo.py").write_text(DEMO_PY)
    (package / "reliability.py").write_text(RELIABILITY_PY)
    (package / "storm.py").write_text(STORM_PY)
    (package / "canaries.py").write_text(CANARIES_PY)
    (package / "bench.py").write_text(BENCH_PY)
    dist = root / "toyenv-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyenv\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[camg.environments]\ntoy = toyenv.plugin:PLUGIN\n")
    return root


# camg.configure's CLI binds to the checkout camg is imported from; these
# tests bind to a clean throw-away tree instead (as tests.support does).
CONFIGURE = """
import sys
from pathlib import Path
from camg.configure import configure
from camg.errors import CamgError
try:
    configure(Path(sys.argv[1]), Path(sys.argv[2]), source_tree=Path(sys.argv[3]))
except CamgError as exc:
    print(f"camg.configure: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def run(toy_path: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_path), str(REPO)])}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_product_environments_are_registered():
    found = plugins.all_plugins()
    assert {"coding", "shop"} <= set(found)
    for name, plugin in found.items():
        assert plugin.name == name
        assert plugin.load_factory().name == name          # the factory implements it
        assert isinstance(plugin.load_settings_type(), type)
        # its canary suite and benchmark: command lines the runners call
        assert callable(plugins.resolve(plugin.canaries)), name
        assert callable(plugins.resolve(plugin.bench)), name


def test_the_readme_table_is_the_registry():
    """The README lists exactly the registered environments, as the plugins
    describe them (python -m camg.plugins --table prints it)."""
    assert plugins.markdown_table(plugins.all_plugins()) in (REPO / "README.md").read_text()


def test_a_toy_package_appears_in_every_listing(toy_path, tmp_path):
    listed = run(toy_path, "-m", "camg.plugins", "--names")
    assert listed.returncode == 0, listed.stderr
    assert "toy" in listed.stdout.split() and "coding" in listed.stdout.split()

    table = run(toy_path, "-m", "camg.plugins", "--table").stdout
    assert "| `toy` | " in table and "[toyenv](toyenv/README.md)" in table
    usage = run(toy_path, "-m", "camg.prepare", "--list")
    assert "python -m camg.prepare --environment toy" in usage.stdout

    manifest_path = tmp_path / "toy-manifest.json"
    prepared = run(toy_path, "-m", "camg.prepare", "--environment", "toy",
                   "--output", str(manifest_path))
    assert prepared.returncode == 0, prepared.stderr
    assert "toy prepared 3" in prepared.stdout

    # configure: no port, no factory in the deployment — both come from the plugin
    lock = tmp_path / "requirements.lock"
    lock.write_text("falcon==4.4.0\n")
    deployment = {"runtime_lock": str(lock), "state_root": str(tmp_path / "state"),
                  "environments": {"toy": {"manifest": str(manifest_path), "capacity": 2}}}
    (tmp_path / "deployment.json").write_text(json.dumps(deployment))
    src = clean_git_tree(tmp_path / "src")
    configured = run(toy_path, "-c", CONFIGURE, str(tmp_path / "deployment.json"),
                     str(tmp_path / "prepared"), str(src))
    assert configured.returncode == 0, configured.stderr
    config = json.loads((tmp_path / "prepared" / "toy.json").read_text())
    assert config["port"] == TOY_PORT
    assert config["factory"] == "toyenv.environment:ToyEnvironment"
    routes = json.loads((tmp_path / "prepared" / "routes.json").read_text())
    assert routes == {"toy": f"http://127.0.0.1:{TOY_PORT}"}
    schedule = json.loads((tmp_path / "prepared" / "schedule.json").read_text())
    assert schedule["environments"]["toy"]["task_ids"] == ["toy-3", "toy-1", "toy-2"]

    # a missing manifest is refused with the plugin's own preparation hint
    deployment["environments"]["toy"]["manifest"] = str(tmp_path / "nowhere.json")
    (tmp_path / "deployment.json").write_text(json.dumps(deployment))
    refused = run(toy_path, "-c", CONFIGURE, str(tmp_path / "deployment.json"),
                  str(tmp_path / "again"), str(src))
    assert refused.returncode == 2
    assert "python -m camg.prepare --environment toy" in refused.stderr


@dataclasses.dataclass
class Served:
    service: ServiceProcess
    #: the installation's configuration directory (ETC/prepared: what camg
    #: status reads)
    etc: Path
    port: int


@pytest.fixture(scope="module")
def served_toy(toy_path, tmp_path_factory):
    """The toy prepared, configured as an installation is (ETC/prepared) and
    served."""
    base = tmp_path_factory.mktemp("toy-served")
    manifest_path = base / "toy-manifest.json"
    assert run(toy_path, "-m", "camg.prepare", "--environment", "toy",
               "--output", str(manifest_path)).returncode == 0
    lock = base / "requirements.lock"
    lock.write_text("falcon==4.4.0\n")
    port = free_port()
    deployment = {"runtime_lock": str(lock), "state_root": str(base / "state"),
                  "auth": deployment_auth(),
                  "environments": {"toy": {"manifest": str(manifest_path), "port": port}}}
    (base / "deployment.json").write_text(json.dumps(deployment))
    src = clean_git_tree(base / "src")
    etc = base / "etc"
    assert run(toy_path, "-c", CONFIGURE, str(base / "deployment.json"),
               str(etc / "prepared"), str(src)).returncode == 0
    service = ServiceProcess(etc / "prepared" / "toy.json",
                             env={"PYTHONPATH": os.pathsep.join([str(toy_path), str(REPO)])})
    try:
        service.wait_ready()
        yield Served(service, etc, port)
    finally:
        assert service.stop() == 0


def test_a_toy_package_serves(served_toy):
    from camg_client import Client
    client = Client(served_toy.service.url)
    assert client.metadata()["environment"] == "toy"
    created = client.create(task_id="toy-2")
    assert created["task_id"] == "toy-2"
    client.close(created["episode_id"])


def test_camg_status_lists_the_toy(toy_path, served_toy, tmp_path):
    """camg status: its row, on its port, under the unit its plugin names."""
    args = ("-m", "camg.status", "--etc", str(served_toy.etc), "--sample-s", "0",
            "--state", str(tmp_path / "samples.json"))
    shown = run(toy_path, *args, "--json")
    report = json.loads(shown.stdout)
    [row] = [r for r in report["environments"] if r["environment"] == "toy"]
    assert (row["port"], row["unit_name"]) == (served_toy.port, "camg-toy-env.service")
    assert row["health"] == "healthy" and row["config"] == "matches disk"
    if not report["systemd"]:  # under systemd its unit (not started here) is a problem
        assert row["ready"] and not row["problems"], row
    table = run(toy_path, *args).stdout.splitlines()
    assert [line.split()[:2] for line in table if line.startswith("toy ")] == [
        ["toy", str(served_toy.port)]]


def test_the_canary_runner_plays_the_toys_suite(toy_path, served_toy):
    """python -m devtools.canaries: the toy's suite, from its descriptor,
    against the served toy: the claims lose, the honest path earns its 1.0."""
    listed = run(toy_path, "-m", "devtools.canaries", "--list")
    assert listed.returncode == 0, listed.stderr
    suites = dict(line.split(" ", 1) for line in listed.stdout.splitlines())
    assert suites["toy"] == "toyenv.canaries:main"
    assert suites["shop"] == "environments.shop.checks.canaries:main"
    played = run(toy_path, "-m", "devtools.canaries", "toy", "--url", served_toy.service.url)
    assert played.returncode == 0, played.stdout + played.stderr
    table = played.stdout
    assert table.startswith("canaries: toy\n") and "CHECK FAILED" not in table, table
    for technique, reward, allowed in (("honest_bisection", "1.0000", "1.0000"),
                                       ("finish_without_guessing", "0.0000", "0.0000"),
                                       ("reward_claimed_in_the_action", "0.0000", "0.0000")):
        assert re.search(rf"^  {technique} +{reward} +{allowed} +- +lost", table, re.M), table
    assert table.rstrip().endswith("3 canaries, 0 won")
    # a suite that fails is the runner's failure: here, a URL with nothing behind it
    refused = run(toy_path, "-m", "devtools.canaries", "toy", "--url",
                  f"http://127.0.0.1:{free_port()}")
    assert refused.returncode != 0


def test_the_bench_runner_runs_the_toys_benchmark(toy_path, tmp_path):
    """bench/environment_bench.py: the toy's benchmark, from its descriptor,
    writes one JSON object that bench/table.py renders as it does the others;
    the fork and session benchmarks list it."""
    listed = run(toy_path, "-m", "bench.environment_bench", "--list")
    assert listed.returncode == 0, listed.stderr
    benches = dict(line.split(" ", 1) for line in listed.stdout.splitlines())
    assert benches["toy"] == "toyenv.bench:main"
    assert benches["coding"] == "environments.coding.checks.bench:main"
    out = tmp_path / "results" / "toy.json"
    ran = run(toy_path, "-m", "bench.environment_bench", "--json", str(out), "toy",
              "--episodes", "30")
    assert ran.returncode == 0, ran.stderr
    results = json.loads(out.read_text())
    assert results["episodes"] == 30 and 0 <= results["step_ms"]["p50"] <= results["step_ms"]["p99"]
    from bench import table
    assert [key for key, _ in table.rows(results)] == ["episodes", "step_ms.p50", "step_ms.p99"]
    # the benchmarks of every environment take it as a subject too: forks
    # (any environment) and light sessions (its episodes run in process)
    for bench in ((str(REPO / "bench" / "bench_fork.py"),), ("-m", "bench.bench_sessions")):
        usage = run(toy_path, *bench, "--help")
        choices = re.search(r"--env \{([\w,-]+)\}", usage.stdout)
        assert choices and {"counter", "toy", "shop"} <= set(choices[1].split(",")), usage


# What packaging and the reliability tools make of the registry, run where
# the toy is installed: the demo's preparers and deployment, the storm's
# drive and plan, camg status's unit.
FIRST_CLASS = """
import dataclasses, importlib.util, json, random, subprocess, sys
from pathlib import Path
repo, data = Path(sys.argv[1]), Path(sys.argv[2])
spec = importlib.util.spec_from_file_location("prepare_demo", repo / "packaging" / "prepare_demo.py")
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)
out = {"preparers": list(demo.PREPARERS), "containers": list(demo.CONTAINER_ENVIRONMENTS)}
out["prepared"] = str(demo.PREPARERS["toy"](data, data / "cache", ""))
demo.write_deployment(repo / "packaging" / "demo-deployment.json", data / "deployment.json",
                      data, ["toy", "shop"])
out["deployment"] = json.loads((data / "deployment.json").read_text())

from devtools.reliability import killstorm_guest, killstorm_report
def run(argv, timeout=None, check=False):  # the guest's /srv/camg/data is DATA here
    return subprocess.run(["cat", argv[1].replace("/srv/camg/data", str(data))], check=check,
                          capture_output=True, text=True)
env = killstorm_guest.describe(killstorm_guest.Guest(run, dict), "toy", 1234)
out["env"] = dataclasses.asdict(env)
out["plan"] = [[t, e.name, p] for t, e, p in killstorm_report.plan([env], 2, random.Random(0))]

from camg import plugins, status, unit_files
out["unit"] = status.unit_name("toy")
out["unit_text"] = unit_files.unit_text(plugins.get("toy"))
print(json.dumps(out))
"""


def test_a_toy_package_is_first_class(toy_path, tmp_path):
    """With no edit outside its package and entry point, the toy is in the
    demo (prepared, deployed), the reliability suites' table, the kill
    storm's plan, and each tool reads its unit and substrate."""
    probe = run(toy_path, "-c", FIRST_CLASS, str(REPO), str(tmp_path))
    assert probe.returncode == 0, probe.stderr
    got = json.loads(probe.stdout.splitlines()[-1])  # after the toy preparation's line
    # the demo: prepared in its rank's place, its plugin's entry deployed
    found = plugins.all_plugins()
    ranked = sorted([(p.demo_rank, n) for n, p in found.items() if p.demo_prepare] + [(15, "toy")])
    assert got["preparers"] == [n for _, n in ranked]
    assert got["containers"] == [n for _, n in ranked if n in found
                                 and found[n].substrate == "container"]
    assert got["prepared"] == str(tmp_path / "toy" / "manifest.json")
    assert json.loads((tmp_path / "toy" / "manifest.json").read_text())["tasks"]
    assert list(got["deployment"]["environments"]) == ["toy", "shop"]
    assert got["deployment"]["environments"]["toy"] == {
        "manifest": "/srv/camg/data/toy/manifest.json", "capacity": 3, "references": False}
    assert got["deployment"]["helper_socket"] == "/run/camg/helper.sock"
    listed = run(toy_path, str(REPO / "packaging" / "prepare_demo.py"), "--data", str(tmp_path),
                 "--cache", str(tmp_path / "cache"), "--helper-socket", "", "--list")
    assert listed.stdout.split() == got["preparers"], listed.stderr

    # the storm: its drive from its own first task, its unit, its grader in the plan
    env = got["env"]
    assert env["create"] == {"task_id": "toy-3"} and env["unit"] == "camg-toy-env.service"
    assert (env["sandboxes"], env["containers"], env["grader"]) == (False, False, "process")
    plan = {(t, p) for t, _, p in got["plan"]}
    assert {t for t, _ in plan} == {"helper", "service", "worker", "grader"}
    assert {p for t, p in plan if t == "service"} <= {"reset", "step", "grading", "idle"}
    assert got["unit"] == "camg-toy-env.service"
    # its unit, made from the descriptor (install.sh writes it)
    assert "Environment=CAMG_ENV=toy HOME=/var/lib/camg/toy" in got["unit_text"]
    assert "SyslogIdentifier=camg-toy-env" in got["unit_text"]

    # the reliability table: its recipe, with its own short-run budget
    table = run(toy_path, "-m", "devtools.reliability", "--list")
    assert table.returncode == 0, table.stderr
    rows = dict(line.split(" ", 1) for line in table.stdout.splitlines())
    assert rows["toy"].split()[:5] == ["churn=2", "frames=300", "files=100", "examples=5",
                                       "load=3"]
    assert rows["coding"].startswith("churn=6 ")
    full = dict(line.split(" ", 1) for line in
                run(toy_path, "-m", "devtools.reliability", "--list", "--full").stdout.splitlines())
    assert full["toy"].startswith("churn=40 ")

    # install.sh's units and run-foreground.sh's substrates
    units = run(toy_path, "-m", "camg.plugins", "--field", "unit").stdout.splitlines()
    assert "toy camg-toy-env.service" in units and "coding camg-coding.service" in units
    substrates = run(toy_path, "-m", "camg.plugins", "--field", "substrate").stdout.splitlines()
    assert {"toy process", "general container", "coding sandbox"} <= set(substrates)


def test_unknown_environment_is_refused_naming_the_installed_ones():
    with pytest.raises(ConfigError, match=r"no environment named 'nope'.*coding"):
        plugins.get("nope")
    proc = subprocess.run([sys.executable, "-m", "camg.prepare", "--environment", "nope"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "known: " in proc.stderr


def test_a_broken_registration_names_itself(tmp_path):
    dist = tmp_path / "broken-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[camg.environments]\nbroken = nowhere.plugin:PLUGIN\n")
    proc = run(tmp_path, "-m", "camg.plugins", "--names")
    assert proc.returncode == 2
    assert "'broken'" in proc.stderr and "does not load" in proc.stderr


def test_descriptor_fields_are_validated():
    good = dict(name="x", port=65001, factory="a.b:C", settings="a.b:S", prepare="a.b:main",
                prepare_hint="prep")
    plugins.EnvironmentPlugin(**good)
    for field, bad in (("name", "Bad Name"), ("port", 80), ("factory", "a.b.C"),
                       ("prepare", "main"), ("substrate", "vm"), ("storm", "drive"),
                       ("canaries", "a.b.main"), ("bench", "bench"),
                       ("demo_prepare", "a.b:prep")):
        with pytest.raises(ConfigError, match=field if field != "demo_prepare" else "demo"):
            plugins.EnvironmentPlugin(**{**good, field: bad})
    with pytest.raises(ConfigError, match="'process' holds no helper sandbox"):
        plugins.EnvironmentPlugin(**good, substrate="process", sandboxes_per_episode=1)
    # the derived defaults: said once, here
    plain = plugins.EnvironmentPlugin(**good)
    assert (plain.unit, plain.sandboxes_per_episode) == ("camg-x.service", 1)
    assert plugins.EnvironmentPlugin(**good, substrate="process").sandboxes_per_episode == 0


# The toy's identifiers: its package, its unit, its name as a string or an
# entry point's key. A tool that had to be told about the toy would name it.
TOY_NAMED = "toyenv|camg-toy-env|[\"'`]toy[\"'`]|^[[:space:]]*toy[[:space:]]*="


def test_making_the_toy_first_class_took_its_package_and_entry_point_alone(toy_path,
                                                                           checkout_before):
    """Everything above the toy does (served, demo, status, unit, canaries,
    reliability, storm, bench) it does from files under its own package and
    its one entry point: no file outside them was edited or written. Last in
    the module, so it sees the checkout after every test above."""
    # installed: its package and its dist-info, whose one entry point is it
    assert sorted(p.name for p in toy_path.iterdir()) == ["toyenv", "toyenv-1.0.dist-info"]
    dist = toy_path / "toyenv-1.0.dist-info"
    assert sorted(p.name for p in dist.iterdir()) == ["METADATA", "entry_points.txt"]
    assert (dist / "entry_points.txt").read_text() == \
        "[camg.environments]\ntoy = toyenv.plugin:PLUGIN\n"
    # it fills every hook of a descriptor, each from its own package
    described = json.loads(run(toy_path, "-m", "camg.plugins").stdout)["toy"]
    hooks = {field: described[field] for field in plugins.HOOKS}
    assert all(spec and spec.startswith("toyenv.") for spec in hooks.values()), hooks
    # no list learned its name: nothing in the checkout names it but this
    # module. Other test modules are left out: the toy is installed for
    # this module's subprocesses alone, and some name toys of their own.
    named = subprocess.run(
        ["git", "-C", str(REPO), "grep", "--untracked", "-l", "-E", TOY_NAMED, "--", ".",
         ":(exclude)tests/*/test_*.py", ":(exclude)tests/*/systest_*.py"],
        capture_output=True, text=True)
    assert named.returncode == 1 and not named.stdout, named.stdout + named.stderr
    # and making it first-class wrote nothing into the checkout
    assert checkout_state() == checkout_before
