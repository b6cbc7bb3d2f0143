"""Preparation refuses early what the helper refuses at the first reset: a
lower outside its lower_roots, two services with one owner name."""

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

import pytest

from camg.sandboxes import helper_roots
from camg.configure import main as configure_main
from camg.errors import ConfigError
from camg.oci.images import MaterializedImage, write_materialized
from environments.coding.prepare import prepare_coding
from environments.coding.checks import synthetic

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import prepare_images  # noqa: E402

IMAGE = "camg/demo-apispec-6.8.1"


def helper_config(tmp_path: Path, *roots: Path) -> Path:
    path = tmp_path / "helper.json"
    path.write_text(json.dumps({"socket": "/run/camg/helper.sock",
                                "lower_roots": [str(r) for r in roots]}))
    return path


@pytest.fixture(scope="module")
def task_set():
    return synthetic.task_set(sys.executable)


def images_at(tmp_path: Path, rootfs: Path) -> Path:
    rootfs.mkdir(parents=True)
    digest = "sha256:" + "a" * 64
    (rootfs.parent / "complete.json").write_text(json.dumps({"digest": digest,
                                                             "rootfs": str(rootfs)}))
    image = MaterializedImage(name=IMAGE, repository="127.0.0.1:5000/camg/demo-apispec",
                              digest=digest, config_digest="sha256:" + "b" * 64,
                              diff_ids=(), rootfs=str(rootfs), workspace="/testbed", env=(),
                              working_dir="/testbed", setuid_policy="keep",
                              hash="sha256:" + "c" * 64)
    path = tmp_path / "materialized-images.json"
    write_materialized(path, (image,))
    return path


def test_below_a_root_passes_and_outside_names_the_setting(tmp_path):
    roots = helper_roots.load(helper_config(tmp_path, tmp_path / "oci"))
    helper_roots.check_lower(tmp_path / "oci" / "cache", "--cache-root", roots)
    helper_roots.check_lower(tmp_path / "oci", "--cache-root", roots)
    for outside in (tmp_path / "ocix", tmp_path / "elsewhere", tmp_path / "oci" / ".." / "x"):
        with pytest.raises(ConfigError) as info:
            helper_roots.check_lower(outside, "--cache-root", roots)
        assert str(info.value).startswith("--cache-root: ")
        assert "lower_roots" in str(info.value) and str(tmp_path / "helper.json") in str(info.value)


def test_a_symlink_into_a_root_is_still_outside(tmp_path):
    (tmp_path / "oci").mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "oci" / "cache")
    roots = helper_roots.load(helper_config(tmp_path, tmp_path / "oci"))
    with pytest.raises(ConfigError):
        helper_roots.check_lower(tmp_path / "oci" / "cache", "--cache-root", roots)


def test_a_missing_helper_config_is_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="camg.sandboxes.helper_roots"):
        roots = helper_roots.load(tmp_path / "not-installed.json")
    assert roots is None
    assert "cannot read the helper config" in caplog.text
    helper_roots.check_lower(tmp_path / "anywhere", "--cache-root", roots)
    # A config that is there but broken is an error, not a warning.
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError):
        helper_roots.load(tmp_path / "bad.json")


def test_the_default_lower_roots_are_the_helpers():
    # helper/config.py is not importable from camg; the default must match it.
    from helper.config import HelperConfig
    assert helper_roots.DEFAULT_LOWER_ROOTS == HelperConfig().lower_roots


def test_prepare_images_refuses_a_cache_root_outside_before_pulling(tmp_path, capsys):
    config = helper_config(tmp_path, tmp_path / "oci")
    code = prepare_images.main(["--cache-root", str(tmp_path / "cache"), "--output",
                                str(tmp_path / "out.json"), "--helper-config", str(config),
                                "--images", str(tmp_path / "no-such-images.json")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--cache-root: " in err and "lower_roots" in err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out.json").exists()


def test_coding_prepare_refuses_a_layers_root_outside(task_set, tmp_path):
    images = images_at(tmp_path, tmp_path / "oci" / "img" / "rootfs")
    config = helper_config(tmp_path, tmp_path / "oci", tmp_path / "layers")
    with pytest.raises(ConfigError) as info:
        prepare_coding(rows_path=task_set / "tasks.parquet", mirrors_root=task_set / "mirrors",
                       images_path=images, output=tmp_path / "manifest.json",
                       layers_root=tmp_path / "other-layers", helper_config=config)
    assert str(info.value).startswith("--layers-root: ")
    assert not (tmp_path / "other-layers").exists()
    assert not (tmp_path / "manifest.json").exists()


def test_coding_prepare_refuses_an_image_cached_outside(task_set, tmp_path):
    images = images_at(tmp_path, tmp_path / "cache" / "img" / "rootfs")
    config = helper_config(tmp_path, tmp_path / "oci", tmp_path / "layers")
    with pytest.raises(ConfigError) as info:
        prepare_coding(rows_path=task_set / "tasks.parquet", mirrors_root=task_set / "mirrors",
                       images_path=images, output=tmp_path / "manifest.json",
                       layers_root=None, helper_config=config)
    message = str(info.value)
    assert message.startswith(f"image {IMAGE} rootfs: ")
    assert "--cache-root of scripts/prepare_images.py" in message


def test_coding_prepare_passes_below_the_roots(task_set, tmp_path):
    images = images_at(tmp_path, tmp_path / "oci" / "img" / "rootfs")
    config = helper_config(tmp_path, tmp_path / "oci")
    body = prepare_coding(rows_path=task_set / "tasks.parquet",
                          mirrors_root=task_set / "mirrors", images_path=images,
                          output=tmp_path / "manifest.json", layers_root=None,
                          helper_config=config)
    assert body["tasks"]


def deployment(tmp_path: Path, environments: dict) -> Path:
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps({"helper_socket": "/run/camg/helper.sock",
                                "environments": environments}))
    return path


def test_check_config_refuses_two_services_with_one_owner(tmp_path, capsys):
    config = helper_config(tmp_path, Path("/var/lib/camg/task-layers"))
    path = deployment(tmp_path, {
        "coding": {"manifest": "coding.json", "settings": {"helper_owner": "shared"}},
        "general": {"manifest": "general.json", "settings": {"helper_owner": "shared"}}})
    assert configure_main(["--deployment", str(path), "--check-config",
                           "--helper-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "environments.general.settings.helper_owner: 'shared'" in err
    assert "'coding'" in err


def test_check_config_refuses_a_settings_default_another_service_uses(tmp_path, capsys,
                                                                      caplog):
    # A second service that leaves helper_owner out takes its settings'
    # default; a first that names that default explicitly collides with it.
    path = deployment(tmp_path, {
        "autoresearch": {"manifest": "a.json", "settings": {"helper_owner": "visual"}},
        "visual": {"manifest": "v.json"}})
    assert configure_main(["--deployment", str(path), "--check-config",
                           "--helper-config", str(tmp_path / "none.json")]) == 2
    assert "environments.visual.settings.helper_owner: 'visual'" in capsys.readouterr().err
    # An owner other than the name is not what the unit's ExecStopPost= releases.
    assert "environments.autoresearch.settings.helper_owner 'visual'" in caplog.text


def test_check_config_refuses_a_layers_root_outside(tmp_path, capsys):
    config = helper_config(tmp_path, tmp_path / "layers")
    path = deployment(tmp_path, {"coding": {"manifest": "coding.json", "settings": {
        "layers_root": str(tmp_path / "elsewhere")}}})
    assert configure_main(["--deployment", str(path), "--check-config",
                           "--helper-config", str(config)]) == 2
    assert "environments.coding.settings.layers_root: " in capsys.readouterr().err
    ok = deployment(tmp_path, {"coding": {"manifest": "coding.json", "settings": {
        "layers_root": str(tmp_path / "layers" / "coding")}}})
    assert configure_main(["--deployment", str(ok), "--check-config",
                           "--helper-config", str(config)]) == 0
    # Left out, the setting's default (/var/lib/camg/task-layers/coding) is checked.
    default = deployment(tmp_path, {"coding": {"manifest": "coding.json"}})
    assert configure_main(["--deployment", str(default), "--check-config",
                           "--helper-config", str(config)]) == 2
    assert "/var/lib/camg/task-layers/coding" in capsys.readouterr().err


def test_default_owner_names_are_unique_per_service(tmp_path, capsys):
    from camg import plugins
    from camg.configure import helper_owner
    from camg.config.service_config import EnvironmentDeployment
    names = sorted(plugins.all_plugins())
    owners = {n: helper_owner(n, EnvironmentDeployment(manifest="m.json")) for n in names}
    assert owners == {n: n for n in names}
    # A second Coding service under a name of its own gets that name.
    factory = plugins.all_plugins()["coding"].factory
    second = EnvironmentDeployment(manifest="m.json", factory=factory, port=65200)
    assert helper_owner("coding-b", second) == "coding-b"
    path = deployment(tmp_path, {
        **{n: {"manifest": f"{n}.json"} for n in names},
        "coding-b": {"manifest": "b.json", "factory": factory, "port": 65200}})
    assert configure_main(["--deployment", str(path), "--check-config",
                           "--helper-config", str(tmp_path / "none.json")]) == 0


def test_the_coding_service_gives_the_helper_its_own_name():
    from environments.coding.settings import Settings
    owner = {f.name: f.default for f in dataclasses.fields(Settings)}["helper_owner"]
    assert owner == ""
    with pytest.raises(ValueError):
        Settings(mirrors_root="/m", images="/i", helper_owner="Not A Name")
