"""packaging/: one interpreter chosen in one place (lib.sh camg_python), the
seed's requirements file, the environment list read from the registry."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from camg import plugins

CHECKOUT = Path(__file__).resolve().parents[2]
LIB = CHECKOUT / "packaging" / "lib.sh"


def lib(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'set -euo pipefail; . "{LIB}"; {script}'],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_requirements_environments_is_the_lock():
    # The seed installs requirements-environments.txt; the services hash the
    # lock. A symlink, so an edit of the lock cannot leave it behind.
    ours = (CHECKOUT / "requirements-environments.txt").read_bytes()
    assert ours == (CHECKOUT / "requirements.lock").read_bytes(), \
        "requirements-environments.txt differs from requirements.lock: cp requirements.lock " \
        "requirements-environments.txt"


def test_camg_python_defaults_to_debians_interpreter():
    result = lib("camg_python")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "/usr/bin/python3"


def test_camg_python_honours_the_override():
    assert lib("camg_python", {"CAMG_PYTHON": "/opt/x/python"}).stdout.strip() == "/opt/x/python"


@pytest.fixture
def fake_312_dir():
    # Not under pytest's tmp_path: its parents are 0700, which is the very
    # case one test makes on purpose.
    d = Path(tempfile.mkdtemp(prefix="camg-pytest-"))
    try:
        d.chmod(0o755)
        # A symlink keeps its own path as sys.executable.
        (d / "python3.12").symlink_to(os.path.realpath("/usr/bin/python3"))
        yield d
    finally:
        (d / "python3.12").unlink()
        d.rmdir()


def test_camg_python_prefers_a_312_the_service_user_can_run(fake_312_dir):
    result = lib("camg_python", {"PATH": f"{fake_312_dir}:/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(fake_312_dir / "python3.12")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can test as another uid")
def test_camg_python_skips_a_312_the_service_user_cannot_run(fake_312_dir):
    # Like a pyenv shim under /root (0700): root runs it, user camg cannot.
    (fake_312_dir / "python3.12").unlink()
    (fake_312_dir / "python3.12").write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
    (fake_312_dir / "python3.12").chmod(0o755)
    fake_312_dir.chmod(0o700)
    result = lib("camg_python", {"PATH": f"{fake_312_dir}:/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "/usr/bin/python3"


def test_the_environment_list_comes_from_the_registry():
    result = lib(f'camg_environments "{sys.executable}"')
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == list(plugins.all_plugins())


def test_no_packaging_script_names_the_environments():
    # Adding an environment is a package and an entry point; no shell list.
    for script in sorted((CHECKOUT / "packaging").glob("*.sh")):
        text = script.read_text()
        for name in ("(shop coding", "autoresearch general", "coding,shop"):
            assert name not in text, f"{script.name} lists environments: {name!r}"


def test_pip_noise_is_filtered_and_errors_stay(tmp_path):
    # A fake venv whose "python -m pip" writes noise and an error to stderr.
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "python"
    fake.write_text("#!/bin/sh\n"
                    "echo \"Location 'file:///opt/x' is ignored: it is neither a file nor a "
                    "directory.\" >&2\n"
                    "echo '  warnings.warn(msg, _BetaConfiguration)' >&2\n"
                    "echo 'ERROR: No matching distribution found for nothing' >&2\n")
    fake.chmod(0o755)
    result = lib(f'camg_pip "{tmp_path}" install nothing; wait')
    assert "ERROR: No matching distribution" in result.stderr
    assert "is ignored" not in result.stderr
    assert "_BetaConfiguration" not in result.stderr


def _third_party_imports(package: Path) -> set[str]:
    import ast

    names: set[str] = set()
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("camg", "helper")}


def test_the_helper_venv_holds_every_package_the_helper_imports():
    # The helper runs from /srv/camg/helper-venv, built from requirements/helper.in
    # alone: an import missing there is a helper that dies at start.
    from importlib import metadata

    wanted = {line.split("==")[0].strip().lower()
              for line in (CHECKOUT / "requirements" / "helper.in").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    # pip installs what they require too (docker brings requests).
    closure, todo = set(), list(wanted)
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        closure.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform (a marker)
        for req in requires:
            if "extra ==" not in req:
                todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0].lower())
    wanted = {n.replace("_", "-") for n in closure}
    providers = metadata.packages_distributions()
    for module in sorted(_third_party_imports(CHECKOUT / "helper")):
        dists = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        assert dists & wanted, f"helper/ imports {module} ({dists}); add it to requirements/helper.in"


def test_the_helper_pins_are_the_locks():
    lock = {line.split("==")[0].lower(): line for line in
            (CHECKOUT / "requirements.lock").read_text().splitlines() if "==" in line}
    for line in (CHECKOUT / "requirements" / "helper.in").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert lock.get(line.split("==")[0].lower()) == line.strip(), line


# -- the demo: all five environments (packaging/prepare_demo.py, demo-deployment.json)

def _prepare_demo():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "prepare_demo_under_test", CHECKOUT / "packaging" / "prepare_demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _demo_deployment() -> dict:
    demo = _prepare_demo()
    return demo.deployment(CHECKOUT / "packaging" / "demo-deployment.json", list(demo.PREPARERS))


def test_the_demo_serves_every_registered_environment():
    demo = _prepare_demo()
    assert sorted(demo.demo_names("all")) == sorted(plugins.all_plugins())
    # the template holds the service-wide keys; the entries are the plugins'
    template = __import__("json").loads((CHECKOUT / "packaging" / "demo-deployment.json").read_text())
    assert template["environments"] == {}
    assert list(_demo_deployment()["environments"]) == list(demo.PREPARERS)
    # in the order of their plugins' demo_rank; the container ones need Docker
    found = plugins.all_plugins()
    ranked = sorted((p.demo_rank, n) for n, p in found.items() if p.demo_prepare)
    assert list(demo.PREPARERS) == [n for _, n in ranked]
    assert demo.CONTAINER_ENVIRONMENTS == tuple(
        n for _, n in ranked if found[n].substrate == "container")


def test_the_example_deployment_names_every_registered_environment():
    import json

    body = json.loads((CHECKOUT / "deployment.example.json").read_text())
    assert sorted(body["environments"]) == sorted(plugins.all_plugins())
    for name, entry in body["environments"].items():
        assert entry.get("port", plugins.get(name).port) == plugins.get(name).port, name


@pytest.mark.parametrize("deployment", ["packaging/demo-deployment.json", "deployment.example.json"])
def test_deployment_settings_parse_and_limits_cover_the_budgets(deployment):
    import json

    from camg import typed
    from camg.errors import ConfigError
    from camg.config.service_config import Limits

    body = (_demo_deployment() if deployment == "packaging/demo-deployment.json"
            else json.loads((CHECKOUT / deployment).read_text()))
    for name, entry in body["environments"].items():
        settings_type = plugins.get(name).load_settings_type()
        settings = typed.parse(settings_type, entry.get("settings", {}), name, ConfigError) \
            if name != "shop" else None  # Shop's hashes are recorded by its preparation
        limits = typed.parse(Limits, entry.get("limits", {}), name, ConfigError)
        if name == "general":   # a software finish runs the verifier (environments/general/README.md)
            assert limits.action_timeout_s >= max(1900, settings.step_timeout_s)
        if name == "visual":
            assert limits.action_timeout_s > settings.render_timeout + 30
        if name == "autoresearch":
            assert limits.action_timeout_s > settings.command_minutes * 60
            assert limits.episode_timeout_s > settings.episode_minutes * 60


def test_demo_helper_config_adds_lower_roots_and_the_mediator_only_for_containers(tmp_path):
    import json

    demo = _prepare_demo()
    base = json.loads((CHECKOUT / "units" / "helper.json").read_text())
    cache, data = tmp_path / "cache", tmp_path / "data"
    # the demo's environments, by whether their preparation lists task images
    served = {n: p for n, p in plugins.all_plugins().items() if p.demo_prepare}
    listings = {n: p.demo_images for n, p in served.items() if p.demo_images}
    assert {"general", "visual"} <= set(listings)
    plain = demo.helper_config(base, data, cache, [n for n in served if n not in listings])
    assert plain["lower_roots"][:len(base["lower_roots"])] == base["lower_roots"]
    assert {str(cache / "oci"), str(cache / "helper")} <= set(plain["lower_roots"])
    assert "containers" not in plain and plain["private_roots"] == base["private_roots"]
    for name, listing in listings.items():
        (data / listing).parent.mkdir(parents=True, exist_ok=True)
        (data / listing).write_text(json.dumps({"images": [f"r/{name}@sha256:{'a' * 64}"]}))
    full = demo.helper_config(base, data, cache, list(listings))
    allowed = json.loads(Path(full["containers"]["images_manifest"]).read_text())["images"]
    assert sorted(allowed) == sorted(f"r/{name}@sha256:{'a' * 64}" for name in listings)
    [agent_env] = [p.demo_agent_env for p in served.values() if p.demo_agent_env]
    assert agent_env == "general/agent-env"
    assert full["containers"]["agent_env_source"] == str(data / agent_env)
    # The helper's mediator accepts it.
    from camg import typed
    from helper.container_config import ContainerConfig
    typed.parse(ContainerConfig, full["containers"], "containers", ValueError)


def test_demo_judge_stub_scores_images_by_statistics_and_texts_by_script():
    import base64
    import io
    import json

    from PIL import Image

    from tools import judge_stub

    respond = judge_stub.demo_responder

    def item(evidence: str) -> int:
        reply = respond(judge_stub.Request("/v1/chat/completions", {}, {"messages": [
            {"role": "user", "content": "Rubric item: totals\nExpected (pass anchor): 42, EUR\n"
                                        f"Evidence:\n{evidence}"}]}))
        return json.loads(reply.text)["score"]
    assert item("the total is 42 EUR") == 1
    assert item("") == 0 and item("42 only") == 0

    def shot(draw) -> judge_stub.Reply:
        im = Image.new("RGB", (288, 180), "white")
        draw(im)
        buf = io.BytesIO()
        im.save(buf, "JPEG")
        url = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
        return respond(judge_stub.Request("/v1/chat/completions", {}, {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "rubric"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]}))

    def design(im):
        for i in range(0, 288, 24):
            im.paste((i, 255 - i, (i * 7) % 256), (i, 20 + i // 4, i + 20, 160))
    blank, designed = json.loads(shot(lambda im: None).text), json.loads(shot(design).text)
    assert blank["layout_integrity"] < designed["layout_integrity"]
    assert set(blank) >= {"layout_integrity", "query_fulfillment", "premium_assets"}


# -- the lock (packaging/lock.sh, lib.sh camg_install_lock / camg_pip_check)

def _fake_pip_check(tmp_path, lines: str, status: int) -> subprocess.CompletedProcess:
    (tmp_path / "bin").mkdir(exist_ok=True)
    fake = tmp_path / "bin" / "python"
    fake.write_text(f"#!/bin/sh\nprintf '{lines}'\nexit {status}\n")
    fake.chmod(0o755)
    return lib(f'camg_pip_check "{tmp_path}"')


def test_pip_check_allows_only_pyserinis_dense_stack_missing(tmp_path):
    dense = ("pyserini 0.24.0 requires transformers, which is not installed.\\n"
             "pyserini 0.24.0 requires onnxruntime, which is not installed.\\n")
    assert _fake_pip_check(tmp_path, dense, 1).returncode == 0
    assert _fake_pip_check(tmp_path, "No broken requirements found.\\n", 0).returncode == 0
    other = dense + "swebench 4.1.0 requires modal, which is not installed.\\n"
    result = _fake_pip_check(tmp_path, other, 1)
    assert result.returncode != 0 and "swebench 4.1.0 requires modal" in result.stderr
    conflict = "pyserini 0.24.0 has requirement numpy>=1.18.1, but you have numpy 1.0.\\n"
    assert _fake_pip_check(tmp_path, conflict, 1).returncode != 0


def test_every_reader_installs_the_lock_without_deps():
    # A plain `pip install -r requirements.lock` would pull pyserini's
    # declared dense stack (transformers, onnxruntime, ...) back in.
    for script in ("bootstrap.sh", "install.sh"):
        text = (CHECKOUT / "packaging" / script).read_text()
        assert 'camg_install_lock "' in text and "install -q -r \"$SRC/requirements.lock\"" not in text
        assert "install -q -r \"$here/requirements.lock\"" not in text


def test_the_lock_covers_every_in_file_pin():
    def key(pin: str) -> str:
        return pin.strip().lower().replace("_", "-")
    lock = {key(line.split("==")[0]): key(line) for line in
            (CHECKOUT / "requirements.lock").read_text().splitlines() if "==" in line}
    ins = sorted((CHECKOUT / "requirements").glob("*.in"))
    assert {p.stem for p in ins} >= {"base", "helper", "test", "nodeps", *plugins.all_plugins()}
    for path in ins:
        name = path.stem
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                assert lock.get(key(line.split("==")[0])) == key(line), f"requirements/{name}.in: {line}"


@pytest.mark.skipif(not os.path.exists("/opt/camg-python3.12/bin/python3.12"),
                    reason="no copied 3.12 on this machine (packaging/copy-python312.sh)")
def test_camg_python312_finds_the_copy_but_camg_python_stays_on_debians():
    found = lib("camg_python312")
    assert found.returncode == 0 and found.stdout.strip() == "/opt/camg-python3.12/bin/python3.12"
    assert lib("camg_python").stdout.strip() == "/usr/bin/python3"
