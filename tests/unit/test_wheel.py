"""The services' wheel ships the product and nothing test-only.

Built from the tracked files, as pip builds it (an isolated build
environment): camg/, helper/, tools/ (OCI and image builders, the demo's
assembly and its scripted judge), the client and each environment's
service, demo and build code. Not devtools/ (the development and test
harness), no environment's checks/ (canaries, reliability recipes,
benchmarks), no tests/ or bench/.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from camg import plugins

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    tmp = tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    source = tmp / "src"
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                            "--no-input", "wheel", "--no-deps", "--wheel-dir", str(tmp / "out"),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp / "out").glob("camg-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_nothing_test_only_ships(wheel_names):
    leaked = [n for n in wheel_names
              if n.split("/")[0] in ("devtools", "tests", "bench", "packaging", "scripts")
              or (n.startswith("environments/") and "/checks/" in n)]
    assert leaked == []


def test_the_product_ships(wheel_names):
    names = set(wheel_names)
    for module in ("camg/serve.py", "camg/unit_files.py", "helper/main.py", "helper/sbxinit.c",
                   "camg_client/client.py", "tools/oci/layout.py", "tools/judge_stub.py",
                   "tools/demo_data.py", "camg/grading/guard/camg_guard.py"):
        assert module in names, module
    for name, plugin in plugins.all_plugins().items():
        for spec in (plugin.factory, plugin.settings, plugin.prepare, plugin.demo_prepare):
            if spec:
                path = spec.split(":")[0].replace(".", "/") + ".py"
                assert path in names, (name, path)
