"""The image builder's boundary and bookkeeping (tools/oci/build.py, tools/prepare_image.py):
bad specs are refused naming the field, the demo images keep their cache
keys and config bytes, a built layout materializes without a registry (every
blob verified), and the image's /testbed commit is the task mirror's base.
The build itself (debootstrap, chroot) runs in
tests/privileged/test_coding_second_repository.py and test_oci_demo.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from camg.errors import ConfigError, DatasetError
from camg.oci.images import ImageSpec
from tools.oci import build as builder
from tools.oci import layout

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "environments" / "coding" / "demo" / "parse.json"


def spec_doc(**changes) -> dict:
    doc = json.loads(EXAMPLE.read_text())
    doc.update(changes)
    return doc


def test_the_example_spec_is_valid():
    spec = builder.load_spec(EXAMPLE)
    assert spec.layout == "swesmith" and spec.python == "3.11"
    assert spec.source is not None and spec.source.sdist == "parse==1.22.4"
    assert "pytest-cov==7.1.0" in spec.pip_packages
    from environments.coding import profiles
    assert spec.test_cmd == profiles.SWESMITH_PYTHON_TEST_CMD
    assert profiles.for_repo("camg-built/x__y.12345678").test_cmd == spec.test_cmd


@pytest.mark.parametrize("changes,names", [
    ({"python": "3.10"}, ["python '3.10' is not available", "bookworm", "3.11"]),
    ({"pip_packages": ["pytest>=8"]}, ["pip_packages[0]", "not pinned"]),
    ({"pip_packages": []}, ["pip_packages"]),
    ({"pip_packages": ["pytest==8.3.4", "PyTest==8.3.4"]}, ["listed twice"]),
    ({"build_packages": ["pytest==8.3.4"]}, ["also in pip_packages"]),
    ({"source": {"sdist": "parse"}}, ["source.sdist", "name==version"]),
    ({"source": {"sdist": "parse==1.22.4", "git": "/srv/m"}}, ["exactly one"]),
    ({"source": {"git": "/srv/mirror"}}, ["40-hex commit"]),
    ({"source": None}, ["source: the swesmith layout clones"]),
    ({"test_cmd": " "}, ["test_cmd"]),
    ({"layout": "conda"}, ["layout 'conda'"]),
    ({"layout": "venv"}, ["venv layout lays no repository"]),
    ({"compile": ["../etc"]}, ["compile[0]"]),
    ({"install_cmds": ["a\nb"]}, ["install_cmds[0]"]),
    ({"repository": "Camg/Parse"}, ["repository"]),
    ({"debian_packages": ["Bad Name"]}, ["debian_packages[0]"]),
    ({"pythn": "3.11"}, ["unknown field(s) pythn"]),
])
def test_a_bad_spec_is_refused_naming_the_field(changes, names):
    with pytest.raises(ConfigError) as info:
        builder.parse_spec(spec_doc(**changes), "spec.json")
    assert all(name in str(info.value) for name in names), str(info.value)


def test_the_cli_refuses_a_bad_spec_and_an_outside_cache_root_before_building(tmp_path, capsys):
    from tools.prepare_image import main
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(spec_doc(python="3.12")))
    assert main(["--spec", str(bad), "--cache-root", str(tmp_path / "c"),
                 "--output", str(tmp_path / "o")]) == 2
    assert "config_error" in capsys.readouterr().err
    helper = tmp_path / "helper.json"
    helper.write_text(json.dumps({"lower_roots": [str(tmp_path / "roots")]}))
    assert main(["--spec", str(EXAMPLE), "--cache-root", str(tmp_path / "elsewhere"),
                 "--output", str(tmp_path / "o"), "--materialize", str(tmp_path / "m.json"),
                 "--helper-config", str(helper)]) == 2
    err = capsys.readouterr().err
    assert "--cache-root: " in err and "lower_roots" in err
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "o").exists()


# -- the demo's images keep their keys -------------------------------------------

BASE = layout.Layer(Path("/nonexistent"), "sha256:" + "1" * 64, "sha256:" + "2" * 64, 10)


def _key(value) -> str:
    from camg.config.hashing import sha256_json
    return sha256_json(value).split(":", 1)[1][:16]


def test_the_demo_images_keep_their_cache_keys():
    from tools import oci_demo as demo
    # The keys tools/oci_demo.py computed before the builder was shared.
    assert _key({"suite": "bookworm", "mirror": "http://deb.debian.org/debian",
                 "variant": "minbase", "include": demo.BASE_PACKAGES}) == "4c0c3cf138000023"
    plain = builder.layer_key(demo.PLAIN_SPEC, BASE, None)
    assert plain == {"base": BASE.digest, "requirements": demo.REQUIREMENTS,
                     "venv": "/opt/testbed-venv", "pth": "v1"}
    sdist = Path("/x/apispec-6.8.1.tar.gz")
    assert builder.layer_key(demo.SWESMITH_SPEC, BASE, sdist) == {
        "base": BASE.digest, "requirements": demo.REQUIREMENTS,
        "build": demo.BUILD_REQUIREMENTS, "sdist": sdist.name,
        "activate": demo.CONDA_ACTIVATE, "layout": "v1"}
    # Another repository's key names everything its layer depends on.
    spec = builder.load_spec(EXAMPLE)
    key = builder.layer_key(spec, BASE, Path("/x/parse-1.22.4.tar.gz"))
    assert key["install"] == spec.install_cmds and key["compile"] == spec.compile
    assert key["sdist_sha256"] == spec.source.sha256


def test_the_demo_images_keep_their_config_bytes():
    from tools import oci_demo as demo
    layers = (BASE, BASE)
    debootstrap = ("debootstrap --variant=minbase "
                   "--include=python3,python3-venv,git,patch,ca-certificates bookworm")
    assert builder.image_config(demo.PLAIN_SPEC, layers) == layout.image_config(
        layers, env=demo.ENV, working_dir="/testbed",
        labels={"org.opencontainers.image.title": demo.NAME,
                "camg.demo.requirements": ",".join(demo.REQUIREMENTS)},
        history=(debootstrap, "python3 -m venv /opt/testbed-venv && pip install apispec[tests] pins"))
    assert builder.image_config(demo.SWESMITH_SPEC, layers) == layout.image_config(
        layers, env=demo.SWESMITH_ENV, working_dir="/testbed",
        labels={"org.opencontainers.image.title": demo.SWESMITH_NAME,
                "camg.demo.requirements": ",".join(demo.REQUIREMENTS + demo.BUILD_REQUIREMENTS)},
        history=(debootstrap, "git clone (base commit) /testbed; venv "
                              "/opt/miniconda3/envs/testbed; pip install -e /testbed; "
                              "conda activation stand-in"))


# -- a layout materializes without a registry -------------------------------------------

def _tiny_layout(tmp_path: Path) -> tuple[Path, str]:
    tree = tmp_path / "tree"
    (tree / "testbed").mkdir(parents=True)
    (tree / "testbed" / "hello.py").write_text("print('hello')\n")
    layer = layout.layer_from_tree(tree, tmp_path / "layer.tar.gz")
    config = layout.image_config((layer,), env=("LANG=C.UTF-8",), working_dir="/testbed")
    out = tmp_path / "layout"
    return out, layout.write_layout(out, (layer,), config, "1")


def test_a_built_layout_materializes_without_a_registry(tmp_path):
    from tools.oci.prepare import prepare_images
    from tools.oci.pull import LayoutPuller
    out, digest = _tiny_layout(tmp_path)
    spec = ImageSpec(name="unit/tiny", repository="localhost/unit/tiny", digest=digest)
    (image,) = prepare_images([spec], tmp_path / "cache", LayoutPuller(out))
    assert (Path(image.rootfs) / "testbed" / "hello.py").read_text() == "print('hello')\n"
    assert image.repository == "localhost/unit/tiny" and image.digest == digest


def test_a_tampered_layout_blob_is_refused(tmp_path):
    from tools.oci.prepare import prepare_images
    from tools.oci.pull import LayoutPuller
    out, digest = _tiny_layout(tmp_path)
    manifest = json.loads((out / "blobs" / "sha256" / digest.split(":")[1]).read_bytes())
    blob = out / "blobs" / "sha256" / manifest["layers"][0]["digest"].split(":")[1]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    os.unlink(blob)  # the layout's blob may be a hard link of the build's layer
    blob.write_bytes(bytes(data))
    spec = ImageSpec(name="unit/tiny", repository="localhost/unit/tiny", digest=digest)
    with pytest.raises(DatasetError, match="content digest"):
        prepare_images([spec], tmp_path / "cache", LayoutPuller(out))


# -- the repository at /testbed --------------------------------------------------------

def test_the_image_clone_is_the_task_mirrors_base_commit(tmp_path):
    from environments.coding.checks import synthetic
    from environments.coding.demo import demo_tasks
    sdist = synthetic.write_sdist(tmp_path / "sdist")
    commit = builder.sdist_repository(sdist, tmp_path / "testbed")
    runs: list[int] = []

    def runner(checkout):
        runs.append(1)
        status = "PASSED" if len(runs) == 1 else "FAILED"
        return {"tests/test_clamp.py::test_clamp_edges": status,
                "tests/test_stats.py::test_mean": "PASSED"}
    spec = demo_tasks.DemoSpec(sdist=sdist, owner="acme", project="calc", count=1,
                               per_modifier=1)
    (row,) = demo_tasks.build(spec, tmp_path / "set", runner)
    mirror = tmp_path / "set" / "mirrors" / row["repo"].split("/", 1)[1]
    assert demo_tasks._git(mirror, "rev-parse", "main").strip() == commit
    assert row["repo"].endswith(f".{commit[:8]}")


def test_a_git_source_is_cloned_at_its_commit_alone(tmp_path):
    src = builder.sdist_repository(
        __import__("environments.coding.checks.synthetic", fromlist=["x"]).write_sdist(
            tmp_path / "sdist"), tmp_path / "mirror")
    (tmp_path / "mirror" / "later.txt").write_text("later\n")
    builder._git(tmp_path / "mirror", "add", "later.txt")
    builder._git(tmp_path / "mirror", "commit", "-q", "-m", "later")
    builder._git(tmp_path / "mirror", "branch", "task-branch")
    head = builder.git_repository(str(tmp_path / "mirror"), src, tmp_path / "testbed")
    assert head == src and not (tmp_path / "testbed" / "later.txt").exists()
    refs = builder._git(tmp_path / "testbed", "for-each-ref", "--format=%(refname)").split()
    assert refs == ["refs/heads/main"]


@pytest.mark.parametrize("result,ok", [
    ((0, "tests/a.py::t PASSED\n"), 1),
    ((1, "tests/a.py::t PASSED\ntests/a.py::u FAILED\n"), 1),
    ((4, "ERROR: usage: pytest [options]\npytest: error: unrecognized arguments: --cov=parse\n"),
     None),
    ((5, "no tests ran\n"), None),
    ((127, "bash: pytest: command not found\n"), None),
])
def test_the_test_command_must_run_in_the_built_image(result, ok):
    if ok:
        assert builder.check_test_run(result, "pytest") == ok
    else:
        with pytest.raises(DatasetError, match="does not run in the built image"):
            builder.check_test_run(result, "pytest")


def test_the_task_builder_refuses_an_image_graded_otherwise(tmp_path):
    from environments.coding.build import tasks
    record = {"name": "camg/x", "digest": "sha256:" + "a" * 64, "sdist": "/x/p-1.0.tar.gz",
              "sdist_sha256": "sha256:" + "b" * 64, "commit": "c" * 40, "test_cmd": "pytest"}
    image = type("Image", (), {"hash": "sha256:" + "d" * 64, "name": "camg/x", "rootfs": "/"})()
    with pytest.raises(DatasetError, match="is not the command"):
        tasks.build_tasks(record, image, "/nonexistent.sock", tmp_path, owner="o",
                          package_dir="p")
