"""The trainer client installs alone: ``pip install`` of clients/python into
a fresh venv (no lock, no camg), then one episode through it against a real
camg.serve process (issue 24's acceptance).

The fresh venv is made without pip (ensurepip alone costs ~10 s here); the
services' pip builds the client's wheel from a copy of the directory (so
the checkout gets no build/ or egg-info; its build-system's setuptools comes
from the package index, as for any trainer) and installs it into the fresh
interpreter with ``--python``, from that wheel alone (``--no-index``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv

from tests.support.services import REPO

EPISODE = r"""
import importlib.util, json, sys
# Nothing of the services or their lock is importable here.
assert [m for m in ("camg", "environments", "helper", "tools", "devtools", "httpx")
        if importlib.util.find_spec(m)] == []
import camg_client
# the framework adapters ship too, and import no framework until used
import camg_client.adapters.skyrl_gym, camg_client.adapters.verifiers, camg_verifiers
assert not {"verifiers", "skyrl_gym"} & set(sys.modules)

client = camg_client.Client(sys.argv[1])
created = client.create(task_id="task-02", episode_id="fresh-venv")
episode, low, high = created["episode_id"], 0, 100
try:
    client.create(episode_id="fresh-venv")
except camg_client.EpisodeExists as exc:
    exists = exc.name
while True:
    guess = (low + high) // 2
    answer = client.step(episode, {"operation": "guess", "value": guess})
    if answer["done"]:
        break
    low, high = (guess + 1, high) if answer["observation"]["text"] == "higher" else (low, guess - 1)
try:
    client.step(episode, {"operation": "finish"})
except camg_client.EpisodeDone as exc:
    done = exc.name
closed = client.close(episode)
print(json.dumps({"reward": answer["reward"], "guess": guess, "exists": exists,
                  "done": done, "closed": closed.get("episode_id")}))
"""


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                           "--no-input", *args], capture_output=True, text=True, timeout=300)


def test_a_fresh_venv_runs_an_episode_with_the_client_alone(counter_service, tmp_path):
    service = counter_service()
    source = tmp_path / "src"
    shutil.copytree(REPO / "clients" / "python", source,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    # Built as a trainer's pip builds it: in an isolated build environment
    # with the build-system's own setuptools from the index (the services'
    # venv may carry one too old to build wheels: Debian's 66 has no
    # bdist_wheel without the wheel package).
    built = pip("wheel", "--no-deps", "--wheel-dir", str(tmp_path / "wheels"), str(source))
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("camg_client-*.whl")
    fresh = tmp_path / "venv"
    # symlinks, as `python -m venv` makes them: a copied interpreter would look
    # for its libpython beside the copy (the 3.12 copy has RUNPATH $ORIGIN/../lib)
    venv.create(fresh, with_pip=False, symlinks=True)
    python = fresh / "bin" / "python"
    installed = pip("--python", str(python), "install", "--no-index", str(wheel))
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # cwd outside the checkout: '' on sys.path must not find camg/.
    run = subprocess.run([str(python), "-c", EPISODE, service.url], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    # task-02's target is 7 * 3 = 21 (tests/support/services.py counter_tasks)
    assert json.loads(run.stdout) == {"reward": 1.0, "guess": 21, "exists": "episode_exists",
                                      "done": "episode_done", "closed": "fresh-venv"}
    # The rollout CLI is installed too; without its extras it still answers --help.
    cli = subprocess.run([str(fresh / "bin" / "camg-rollout"), "--help"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "--policy" in cli.stdout, cli.stderr[-2000:]
