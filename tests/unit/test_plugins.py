"""Environments are plugins: one package plus one entry point, no other edit.

A toy environment is "installed" the way pip installs one — a package on
the path and a ``*.dist-info/entry_points.txt`` naming its descriptor in the
``camg.environments`` group — and must then appear in the service list,
in ``camg.prepare``'s dispatch, in ``camg.configure`` (port, factory,
refusal hint) and in routes.json, and serve.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from camg import plugins
from camg.errors import ConfigError
from tests.support.services import REPO, ServiceProcess, clean_git_tree, free_port

TOY_PORT = 65000 + (os.getpid() % 400)

PLUGIN_PY = '''
from camg.plugins import EnvironmentPlugin

PLUGIN = EnvironmentPlugin(
    name="toy", port={port}, title="a toy for the plugin test",
    factory="toyenv.environment:ToyEnvironment", settings="toyenv.environment:Settings",
    prepare="toyenv.prepare:main", prepare_hint="python -m camg.prepare --environment toy",
)
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
from camg import task_manifest as manifest


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


def test_a_toy_package_appears_in_every_listing(toy_path, tmp_path):
    listed = run(toy_path, "-m", "camg.plugins", "--names")
    assert listed.returncode == 0, listed.stderr
    assert "toy" in listed.stdout.split() and "coding" in listed.stdout.split()

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


def test_a_toy_package_serves(toy_path, tmp_path):
    manifest_path = tmp_path / "toy-manifest.json"
    assert run(toy_path, "-m", "camg.prepare", "--environment", "toy",
               "--output", str(manifest_path)).returncode == 0
    lock = tmp_path / "requirements.lock"
    lock.write_text("falcon==4.4.0\n")
    port = free_port()
    deployment = {"runtime_lock": str(lock), "state_root": str(tmp_path / "state"),
                  "environments": {"toy": {"manifest": str(manifest_path), "port": port}}}
    (tmp_path / "deployment.json").write_text(json.dumps(deployment))
    src = clean_git_tree(tmp_path / "src")
    assert run(toy_path, "-c", CONFIGURE, str(tmp_path / "deployment.json"),
               str(tmp_path / "prepared"), str(src)).returncode == 0
    service = ServiceProcess(tmp_path / "prepared" / "toy.json",
                             env={"PYTHONPATH": os.pathsep.join([str(toy_path), str(REPO)])})
    try:
        service.wait_ready()
        from camg_client import Client
        client = Client(service.url)
        assert client.metadata()["environment"] == "toy"
        created = client.create(task_id="toy-2")
        assert created["task_id"] == "toy-2"
        client.close(created["episode_id"])
    finally:
        assert service.stop() == 0


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
                       ("prepare", "main")):
        with pytest.raises(ConfigError, match=field if field != "name" else "name"):
            plugins.EnvironmentPlugin(**{**good, field: bad})
