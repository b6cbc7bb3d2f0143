"""General's service-side parts without containers: schemas per task kind,
transport error mapping, rubric aggregation and judging, preparation."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from camg import errors
from camg.episodes.cost import judge_tokens
from camg.grading.judge import Judge, JudgeConfig, prompt_hash
from environments.general import channel, rubric
from environments.general.environment import GeneralEnvironment, judge_config
from environments.general.prepare import main as prepare_main, prepare_general
from environments.general.schemas import ACTION_SCHEMA, allowed_action
from environments.general.settings import Settings
from tests.support.fake_judge import FakeJudge, Reply
from tools.judge_stub import count_usage
from devtools.harness.auth import deployment_auth

ROWS = str(Path(__file__).resolve().parents[1] / "support" / "mimo_rows" / "example_rows_nemo_gym.jsonl")


def test_schema_branches_and_kind_rules():
    import fastjsonschema

    validate = fastjsonschema.compile(ACTION_SCHEMA)
    validate({"operation": "shell", "command": "ls"})
    validate({"operation": "tool", "server": "crm", "name": "x", "arguments": {"a": 1}})
    with pytest.raises(fastjsonschema.JsonSchemaException):
        validate({"operation": "shell", "command": "x" * 16001})
    with pytest.raises(fastjsonschema.JsonSchemaException):
        validate({"operation": "rm"})
    assert allowed_action("opensource-code", {"operation": "finish"}) is None
    assert "only" in allowed_action("opensource-code", {"operation": "tool", "server": "a", "name": "b"})
    assert "only" in allowed_action("opensource-code", {"operation": "finish", "answer": "x"})
    assert allowed_action("general_agent", {"operation": "finish", "answer": "x"}) is None
    assert "server and name" in allowed_action("general_agent", {"operation": "tool"})


@pytest.mark.parametrize("message,cls,failure", [
    ("[grader_error] MiMo verifier infrastructure failed", errors.GraderError, "grader_error"),
    ("[infra] tool server down", errors.InfraFailure, "infra"),
    ("something else broke", errors.InfraFailure, "infra"),
])
def test_transport_errors_map_to_failure_classes(message, cls, failure):
    err = channel.error_of({"message": message, "code": "EXECUTION_ERROR"}, "step")
    assert type(err) is cls and err.failure_class.value == failure
    assert not err.message.startswith("[")


def test_transport_validation_error_is_invalid_action():
    err = channel.error_of({"message": "Invalid message", "code": "VALIDATION_ERROR"}, "step")
    assert isinstance(err, errors.InvalidAction)


def test_aggregate_weights_and_gates():
    items = [{"id": "g", "gate": True, "weight": 1.0}, {"id": "a", "weight": 2.0}, {"id": "b", "weight": None}]
    assert rubric.aggregate(items, {"g": 1, "a": 1, "b": 0}) == pytest.approx(2 / 3)
    assert rubric.aggregate(items, {"g": 0, "a": 1, "b": 1}) == 0.0


def _tar(detail: dict) -> bytes:
    buf = io.BytesIO()
    data = json.dumps(detail).encode()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("verifier/reward_detail.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


DETAIL = {"results": [{"id": "r", "score": 1.0, "passed": True, "gate": False}],
          "judge_requests": [{"id": "l", "weight": 1.0, "system": "s", "prompt": "p"}],
          "items": [{"id": "r", "weight": 1.0}, {"id": "l", "weight": 1.0}]}


def test_judge_episode_records_and_failures():
    with FakeJudge() as fake:
        cfg = JudgeConfig.from_env("GA_JUDGE", {"GA_JUDGE_URL": fake.url, "GA_JUDGE_MODEL": "m",
                                                "GA_JUDGE_KEY": "k"}, attempts=1, timeout_s=2)
        judge = Judge(cfg)
        detail = rubric.read_detail(_tar(DETAIL))
        fake.script(Reply(text='{"score": 0}'))
        reward, records = rubric.judge_episode(judge, detail, deadline_s=30)
        assert reward == 0.5 and records[0]["item"] == "l" and records[0]["judge_score"] == 0.0
        assert records[0]["judge_host"] == f"127.0.0.1:{fake.port}"
        assert records[0]["judge_model"] == "m" and records[0]["judge_raw"] == '{"score": 0}'
        assert records[0]["judge_prompt_hash"] == prompt_hash("chat", "s", "p", ())
        # the tokens the judge reported, as the episode's cost sums them
        tokens = count_usage(fake.requests[0].body, '{"score": 0}')
        assert records[0]["judge_tokens"] == tokens
        assert judge_tokens(r.get("judge_tokens") for r in records) == {"judge_tokens": tokens}
        fake.default = Reply(status=500)
        with pytest.raises(errors.JudgeError):
            rubric.judge_episode(judge, detail, deadline_s=30)
    with pytest.raises(errors.GraderError):
        rubric.read_detail(b"not a tar")


def test_check_config_needs_the_judge_variables(monkeypatch):
    class Config:
        settings = {}
    for name in ("GA_JUDGE_URL", "GA_JUDGE_MODEL", "GA_JUDGE_KEY"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(errors.ConfigError) as info:
        GeneralEnvironment.check_config(Config)
    assert all(n in info.value.message for n in ("GA_JUDGE_URL", "GA_JUDGE_MODEL", "GA_JUDGE_KEY"))
    assert "general-judge.env" in info.value.message
    monkeypatch.setenv("GA_JUDGE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("GA_JUDGE_MODEL", "m")
    monkeypatch.setenv("GA_JUDGE_KEY", "secret")
    GeneralEnvironment.check_config(Config)
    assert judge_config(Settings()).api == "chat"


def test_settings_refuse_nonsense():
    with pytest.raises(ValueError):
        Settings(pool_size=-1)
    with pytest.raises(ValueError):
        Settings(judge_env="lower")


def _mapping(tmp_path, rows):
    lines = [{"dataset_image": json.loads(r)["instance"]["docker_image"],
              "dockerhub_image": "127.0.0.1:5000/x@sha256:" + "a" * 64} for r in rows]
    path = tmp_path / "image-mapping.jsonl"
    path.write_text("".join(json.dumps(l) + "\n" for l in lines))
    return path


def test_prepare_keeps_order_and_writes_parquet(tmp_path):
    import pyarrow.parquet as pq

    rows = open(ROWS).read().splitlines()
    code = [r for r in rows if json.loads(r)["instance"]["dataset_type"] == "opensource-code"]
    (tmp_path / "code.jsonl").write_text("\n".join(code) + "\n")
    images = _mapping(tmp_path, code)
    body = prepare_general(code_rows=str(tmp_path / "code.jsonl"), general_rows=None, envs=None,
                           images=str(images), output_dir=tmp_path / "out")
    assert [t["task_id"] for t in body["tasks"]] == ["format-code-task-001457"]
    table = pq.read_table(tmp_path / "out" / "code.parquet").to_pylist()
    assert table[0]["instance_id"] == "format-code-task-001457"
    assert json.loads(table[0]["instance_json"])["test_command"] == "bash /testbed/mimo_test_command.sh"
    assert set(body["files"]) == {"code_table", "general_table", "images"}


def test_prepare_refuses_bad_input(tmp_path, capsys):
    rows = open(ROWS).read().splitlines()
    webdev = [r for r in rows if json.loads(r)["instance"]["dataset_type"] == "webdev"]
    (tmp_path / "w.jsonl").write_text(webdev[0] + "\n")
    images = _mapping(tmp_path, webdev)
    assert prepare_main(["--code-rows", str(tmp_path / "w.jsonl"), "--images", str(images),
                         "--output-dir", str(tmp_path / "o")]) == 2
    assert "not served by General" in capsys.readouterr().err
    general = [r for r in rows if json.loads(r)["instance"]["dataset_type"] == "general_agent"]
    (tmp_path / "g.jsonl").write_text(general[0] + "\n")
    images = _mapping(tmp_path, general)
    assert prepare_main(["--general-rows", str(tmp_path / "g.jsonl"), "--images", str(images),
                         "--envs", str(tmp_path / "none"), "--output-dir", str(tmp_path / "o")]) == 2
    assert "task folder" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"dataset_image": "a", "dockerhub_image": "b:latest"}\n')
    assert prepare_main(["--general-rows", str(tmp_path / "g.jsonl"), "--images",
                         str(tmp_path / "bad.jsonl"), "--output-dir", str(tmp_path / "o")]) == 2
    assert "pinned by digest" in capsys.readouterr().err


def test_check_config_cli_refuses_without_judge_variables(tmp_path, monkeypatch):
    import os
    import subprocess
    import sys

    from camg.configure import configure
    from tests.support.services import REPO, clean_git_tree

    rows = open(ROWS).read().splitlines()
    code = [r for r in rows if json.loads(r)["instance"]["dataset_type"] == "opensource-code"]
    (tmp_path / "code.jsonl").write_text("\n".join(code) + "\n")
    prepare_general(code_rows=str(tmp_path / "code.jsonl"), general_rows=None, envs=None,
                    images=str(_mapping(tmp_path, code)), output_dir=tmp_path / "out")
    lock = tmp_path / "requirements.lock"
    lock.write_text("openai==3.57.0\n")
    (tmp_path / "deployment.json").write_text(json.dumps({
        "auth": deployment_auth(),
        "runtime_lock": str(lock), "state_root": str(tmp_path / "state"),
        "environments": {"general": {"manifest": str(tmp_path / "out" / "manifest.json")}}}))
    planted = {"GA_JUDGE_URL": "http://judge.example:8000/v1", "GA_JUDGE_MODEL": "planted-model",
               "GA_JUDGE_KEY": "sk-planted-general-77"}
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    configure(tmp_path / "deployment.json", tmp_path / "prepared",
              source_tree=clean_git_tree(tmp_path / "src"))
    config = tmp_path / "prepared" / "general.json"
    # No judge key field: the one *key* a config names is the outcome-signing
    # key's public half and path (camg.episodes.signing), never key material.
    body = json.loads(config.read_text())
    assert "BEGIN PRIVATE" not in json.dumps(body.pop("outcome_key"))
    assert "KEY" not in json.dumps(body).upper().replace("KEYS", "")
    for path in (tmp_path / "prepared").iterdir():  # configure never writes judge variables
        assert not any(v in path.read_text() for v in planted.values()), path
    env = {k: v for k, v in os.environ.items() if not k.startswith("GA_JUDGE")}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "camg.serve", "--config", str(config), "--check-config"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    assert refused.returncode == 2 and "GA_JUDGE_KEY" in refused.stderr
    assert "GA_JUDGE_URL" in refused.stderr and "general-judge.env" in refused.stderr
    env.update(GA_JUDGE_URL="http://127.0.0.1:9/v1", GA_JUDGE_MODEL="m", GA_JUDGE_KEY="sk-secret-9")
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    assert "sk-secret-9" not in ok.stdout + ok.stderr
    env["GA_JUDGE_MODEL"] = ""  # an empty variable is a missing one; the key stays unprinted
    empty = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    assert empty.returncode == 2 and "GA_JUDGE_MODEL" in empty.stderr
    assert "sk-secret-9" not in empty.stdout + empty.stderr


def test_units_read_the_judge_from_an_operator_file_and_stay_loopback_only():
    """General and Visual take their judge from an EnvironmentFile= the operator
    writes; the units themselves allow no address beyond the shared
    loopback-only policy (the operator's drop-in adds the judge's); nothing in
    camg/ (configure included) names the credentials directory or writes a
    judge variable (the demo install's loopback stub files are packaging's)."""
    from camg import plugins, unit_files
    from environments.general.environment import JUDGE_ENV_FILE as GENERAL_FILE
    from environments.visual.environment import JUDGE_ENV_FILE as VISUAL_FILE

    repo = Path(__file__).resolve().parents[2]

    def directives(path: Path) -> list[tuple[str, str]]:
        return [tuple(line.split("=", 1)) for line in path.read_text().splitlines()
                if line and not line.startswith("#") and "=" in line]

    shared = directives(repo / "units" / "camg-environment.conf")
    assert ("IPAddressAllow", "localhost") in shared and ("IPAddressDeny", "any") in shared
    for env, path in (("general", GENERAL_FILE), ("visual", VISUAL_FILE)):
        unit = unit_files.unit_text(plugins.get(env))
        lines = [tuple(line.split("=", 1)) for line in unit.splitlines()
                 if line and not line.startswith("#") and "=" in line]
        assert ("EnvironmentFile", f"-{path}") in lines
        assert path == f"/etc/camg/credentials/{env}-judge.env"
        assert not [v for k, v in lines if k.startswith("IPAddress")], f"{env}: loopback only"
        assert f"systemctl edit camg-{env}" in unit
        assert f"systemctl edit camg-{env}" in (repo / "environments" / env / "README.md").read_text()
    for source in sorted(repo.glob("camg/**/*.py")):
        text = source.read_text()
        assert "/etc/camg/credentials" not in text and "_JUDGE_KEY=" not in text, source
