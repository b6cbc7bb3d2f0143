"""camg.configure and camg.serve --check-config on real files and git."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from camg.config import task_manifest as manifest
from camg.configure import configure, main as configure_main
from camg.errors import ConfigError, PreparationMissing
from tests.support.services import REPO, clean_git_tree, configure_counter, counter_tasks


def check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "camg.serve", "--config", str(path),
                           "--check-config"], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_outputs_preserve_ids_order_and_sampling(tmp_path):
    tasks = counter_tasks(7)
    sampling = {"mode": "random", "seed": 1234, "temperature": [0.5, 1]}
    config_path = configure_counter(tmp_path, tasks=tasks, sampling=sampling)
    prepared = config_path.parent
    schedule = json.loads((prepared / "schedule.json").read_text())
    entry = schedule["environments"]["counter"]
    assert entry["task_ids"] == [t["task_id"] for t in tasks]
    assert entry["task_ids"] != sorted(entry["task_ids"])
    assert entry["sampling"] == sampling
    config = json.loads(config_path.read_text())
    assert entry["config_hash"] == config["config_hash"]
    assert config["host"] == "127.0.0.1"
    assert len(config["source_commit"]) == 40
    assert config["runtime_lock"]["sha256"].startswith("sha256:")
    assert config["executables"]["python"]["path"] == str(Path(sys.executable).resolve())
    routes = json.loads((prepared / "routes.json").read_text())
    assert routes == {"counter": f"http://127.0.0.1:{config['port']}"}
    checked = check_config(config_path)
    assert checked.returncode == 0
    # authentication is on unless a deployment says otherwise, and the check says so
    assert config["auth"]["required"] is True
    assert "authentication on: 1 trainer(s)" in checked.stdout


def test_product_ports(tmp_path):
    # The seed's ports stay where trainers' routes point; an environment
    # registered since brings its own (the registry refuses two on one port).
    from camg.plugins import all_plugins
    seed_ports = {"shop": 65131, "coding": 65134, "autoresearch": 65133,
                  "general": 65139, "visual": 65140}
    plugins = all_plugins()
    assert {"shop", "coding"} <= set(plugins)
    for name, port in seed_ports.items():
        if name in plugins:
            assert plugins[name].port == port, name
    assert len({plugin.port for plugin in plugins.values()}) == len(plugins)


def test_dirty_checkout_is_refused_naming_paths(tmp_path):
    src = clean_git_tree(tmp_path / "src")
    (src / "stray.py").write_text("x = 1\n")
    (src / "README").write_text("edited\n")
    config_path = configure_counter(tmp_path / "ok")  # builds a valid deployment
    deployment = config_path.parent.parent / "deployment.json"
    with pytest.raises(ConfigError) as info:
        configure(deployment, tmp_path / "out", source_tree=src)
    assert "stray.py" in str(info.value) and "README" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_missing_manifest_names_the_step(tmp_path, capsys):
    config_path = configure_counter(tmp_path)
    deployment_path = config_path.parent.parent / "deployment.json"
    deployment = json.loads(deployment_path.read_text())
    deployment["environments"]["coding"] = {"manifest": "nowhere/coding.json"}
    deployment_path.write_text(json.dumps(deployment))
    with pytest.raises(PreparationMissing) as info:
        configure(deployment_path, tmp_path / "out", source_tree=tmp_path / "src")
    assert "python -m camg.prepare --environment coding" in str(info.value)
    # The CLI exits non-zero with the same message (and refuses the dirty tree
    # or the missing step, whichever comes first: both name what to do).
    assert configure_main(["--deployment", str(deployment_path), "--output",
                           str(tmp_path / "out")]) == 2
    assert "camg.configure:" in capsys.readouterr().err


def test_missing_runtime_lock_and_executable(tmp_path):
    config_path = configure_counter(tmp_path)
    deployment_path = config_path.parent.parent / "deployment.json"
    deployment = json.loads(deployment_path.read_text())
    deployment["executables"]["java"] = str(tmp_path / "no-java")
    deployment_path.write_text(json.dumps(deployment))
    with pytest.raises(PreparationMissing, match="install the java executable"):
        configure(deployment_path, tmp_path / "out", source_tree=tmp_path / "src")
    deployment["executables"].pop("java")
    deployment["runtime_lock"] = str(tmp_path / "no.lock")
    deployment_path.write_text(json.dumps(deployment))
    with pytest.raises(PreparationMissing, match="runtime lock"):
        configure(deployment_path, tmp_path / "out", source_tree=tmp_path / "src")


def test_credentials_never_written(tmp_path, monkeypatch):
    secrets = {"GA_JUDGE_KEY": "sk-planted-ga-0123456789", "WD_JUDGE_KEY": "sk-planted-wd-987",
               "AWS_SECRET_ACCESS_KEY": "planted-aws-secret", "HF_TOKEN": "hf_planted_token"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    config_path = configure_counter(tmp_path, settings={"judge_url": "http://127.0.0.1:9/v1"})
    for path in config_path.parent.iterdir():
        text = path.read_text()
        for value in secrets.values():
            assert value not in text, f"{value} leaked into {path}"
    # A credential in the deployment itself is refused, not copied.
    deployment_path = config_path.parent.parent / "deployment.json"
    deployment = json.loads(deployment_path.read_text())
    deployment["environments"]["counter"]["settings"] = {"judge": {"api_key": "sk-inline"}}
    deployment_path.write_text(json.dumps(deployment))
    with pytest.raises(ConfigError, match="credentials are never written"):
        configure(deployment_path, tmp_path / "out2", source_tree=tmp_path / "src")


def test_deployment_rejects_unknown_fields_and_bad_values(tmp_path):
    config_path = configure_counter(tmp_path)
    deployment_path = config_path.parent.parent / "deployment.json"
    deployment = json.loads(deployment_path.read_text())
    for mutate, fragment in [
        (lambda d: d.update(bogus=1), "unknown field(s) bogus"),
        (lambda d: d["environments"]["counter"].update(capacity=0), "capacity"),
        (lambda d: d["environments"]["counter"].update(limits={"action_timeout_s": -1}),
         "action_timeout_s"),
        (lambda d: d["environments"]["counter"].update(port="80"), "port"),
        (lambda d: d["environments"].update({"Bad Name": {"manifest": "x"}}), "invalid environment name"),
    ]:
        broken = json.loads(json.dumps(deployment))
        mutate(broken)
        deployment_path.write_text(json.dumps(broken))
        with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            configure(deployment_path, tmp_path / "out", source_tree=tmp_path / "src")


@pytest.mark.parametrize("tamper, named", [
    ("manifest", "counter-manifest.json"),
    ("lock", "requirements.lock"),
    ("config", "counter.json"),
    ("schedule", "schedule.json"),
])
def test_check_config_names_the_changed_file(tmp_path, tamper, named):
    config_path = configure_counter(tmp_path)
    root = config_path.parent.parent
    if tamper == "manifest":
        body = json.loads((root / "counter-manifest.json").read_text())
        body["tasks"].reverse()  # same tasks, different order: must be caught
        (root / "counter-manifest.json").write_text(json.dumps(body))
    elif tamper == "lock":
        (root / "requirements.lock").write_text("falcon==4.3.0\n")
    elif tamper == "config":
        body = json.loads(config_path.read_text())
        body["capacity"] += 1
        config_path.write_text(json.dumps(body))
    else:
        body = json.loads((config_path.parent / "schedule.json").read_text())
        body["environments"]["counter"]["config_hash"] = "sha256:" + "0" * 64
        (config_path.parent / "schedule.json").write_text(json.dumps(body))
    result = check_config(config_path)
    assert result.returncode != 0
    assert named in result.stderr, result.stderr
    # The server refuses to start on the same conditions.
    serve = subprocess.run([sys.executable, "-m", "camg.serve", "--config", str(config_path)],
                           capture_output=True, text=True, cwd=REPO, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert serve.returncode != 0 and named in serve.stderr


def test_manifest_file_entries_are_rehashed(tmp_path):
    pool = tmp_path / "pool.json"
    pool.write_text("[1, 2]")
    body = manifest.build("counter", counter_tasks(2), sampling={}, files={"pool": pool},
                          created_by="t")
    manifest.write(tmp_path / "m.json", body)
    loaded = manifest.load(tmp_path / "m.json")
    loaded.verify_files()
    pool.write_text("[1, 3]")
    with pytest.raises(ConfigError, match="pool"):
        loaded.verify_files()


@pytest.mark.parametrize("tasks, fragment", [
    ([{"task_id": "a", "data": {}}, {"task_id": "a", "data": {}}], "appears twice"),
    ([{"task_id": "", "data": {}}], "invalid task_id"),
    ([{"task_id": "a/b", "data": {}}], "invalid task_id"),
    ([{"task_id": "a", "data": []}], "data must be an object"),
    ([{"task_id": "a"}], "exactly task_id and data"),
])
def test_manifest_rejects_bad_tasks(tasks, fragment):
    from camg.errors import DatasetError
    with pytest.raises(DatasetError, match=fragment):
        manifest.build("counter", tasks, sampling={}, files={}, created_by="t")
