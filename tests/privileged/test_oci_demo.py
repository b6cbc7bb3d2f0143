"""The demo image: built from Debian and PyPI packages, published, pulled back, and able to
run apispec 6.8.1's own test suite from /testbed with its venv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oci_fixtures import REPO_ROOT, registry, run_prepare  # noqa: E402

from tools import oci_demo as demo  # noqa: E402
from camg.oci.images import load_materialized  # noqa: E402
from environments.coding.demo.demo_tasks import extract_sdist, fetch_sdist  # noqa: E402

pytestmark = [pytest.mark.privileged, pytest.mark.slow]
_ = registry


@pytest.fixture(scope="module")
def demo_image():
    if os.geteuid() != 0:
        pytest.skip("privileged: run as root")
    return demo.ensure_demo_image(demo.cache_root_from_env())


@pytest.fixture(scope="module")
def apispec_source():
    """apispec 6.8.1's sdist (source and tests), fetched once into $CAMG_CACHE."""
    target = demo.cache_root_from_env() / "apispec-sdist"
    tree = target / "apispec-6.8.1"
    if not (tree / "pyproject.toml").is_file():
        # The project's own safe extraction: Debian's 3.11.2 has no tarfile filters.
        shutil.rmtree(tree, ignore_errors=True)
        extract_sdist(fetch_sdist(target), tree)
    return tree


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as handle:
        return [line.split()[4] for line in handle if line.split()[4].startswith(str(path))]


def test_demo_rootfs_runs_apispec_tests_as_agent(demo_image, apispec_source, tmp_path):
    rootfs = demo_image.rootfs
    assert demo_image.image.workspace == "/testbed"
    assert (rootfs / "opt/testbed-venv/bin/python").exists()
    assert (rootfs / "usr/bin/git").exists() and (rootfs / "usr/bin/patch").exists()
    assert list((rootfs / "dev").iterdir()) == [] and list((rootfs / "testbed").iterdir()) == []
    assert (rootfs / "etc/ssl/certs/ca-certificates.crt").exists()
    pth = rootfs / "opt/testbed-venv/lib/python3.11/site-packages/testbed.pth"
    assert pth.read_text() == "/testbed/src\n"
    # Overlay over the cached rootfs (never written), apispec at /testbed owned
    # by the agent uid, run as that uid in a chroot; the private mount
    # namespace takes every mount with it.
    upper, work, merged = tmp_path / "upper", tmp_path / "work", tmp_path / "merged"
    for d in (upper, work, merged):
        d.mkdir()
    script = f"""set -e
mount -t overlay overlay -o lowerdir={rootfs},upperdir={upper},workdir={work} {merged}
touch {merged}/dev/null && mount --bind /dev/null {merged}/dev/null
cp -a {apispec_source}/. {merged}/testbed/
chown -R 2000:2000 {merged}/testbed
exec chroot --userspec=2000:2000 {merged} /usr/bin/env -i PATH=/opt/testbed-venv/bin:/usr/bin:/bin \
    HOME=/tmp sh -c 'cd /testbed && python -m pytest -q -p no:cacheprovider tests'
"""
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "failed" not in result.stdout
    assert mounts_under(tmp_path) == []
    assert not any((rootfs / "testbed").iterdir())


def test_build_script_publishes_and_prepare_pulls_it_back(demo_image, registry, tmp_path):
    cache_root = demo.cache_root_from_env()
    out = tmp_path / "demo-out"
    built = subprocess.run([sys.executable, str(REPO_ROOT / "scripts/build_demo_image.py"),
                            "--cache-root", str(cache_root), "--registry", registry.address,
                            "--output", str(out)], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    images = json.loads((out / "images.json").read_text())
    (spec,) = images["images"]
    assert spec == {"name": demo.NAME, "repository": f"{registry.address}/{demo.REPOSITORY}",
                    "digest": demo_image.image.digest, "workspace": "/testbed"}
    # Into a fresh cache: a real pull of both layers from the registry.
    fresh = tmp_path / "cache"
    pulled = run_prepare(fresh, out / "images.json", tmp_path / "materialized.json", "--skopeo", "skopeo")
    assert pulled.returncode == 0, pulled.stderr
    (image,) = load_materialized(tmp_path / "materialized.json").images
    assert image.hash == demo_image.image.hash
    assert Path(image.rootfs, "opt/testbed-venv/bin/pytest").exists()
    shutil.rmtree(fresh)  # a second 300 MB copy is not worth keeping


def test_build_script_one_shot_with_throwaway_registry(demo_image, tmp_path):
    out = tmp_path / "out"
    built = subprocess.run([sys.executable, str(REPO_ROOT / "scripts/build_demo_image.py"),
                            "--cache-root", str(demo.cache_root_from_env()), "--output", str(out),
                            "--materialize", str(out / "materialized.json")],
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    (image,) = load_materialized(out / "materialized.json").images
    assert Path(image.rootfs) == demo_image.rootfs and image.hash == demo_image.image.hash
    refused = subprocess.run([sys.executable, str(REPO_ROOT / "scripts/build_demo_image.py"),
                              "--cache-root", str(tmp_path / "unused"), "--output", str(out)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "give --materialize" in refused.stderr
