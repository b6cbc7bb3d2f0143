"""The Conda-style JAVA_HOME check and the step that builds it from Debian's JDK."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from camg.errors import ConfigError, PreparationMissing
from environments.shop import javahome
from tests.support.shop_testing import DEBIAN_JDK, REPO


def test_prepare_java_builds_layout_idempotently(tmp_path):
    out = tmp_path / "java"
    for _ in range(2):
        proc = subprocess.run([sys.executable, "scripts/prepare_java.py", "--jdk", DEBIAN_JDK,
                               "--output", str(out)], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert '"java_version": 17' in proc.stdout
    assert (out / "lib/jvm/lib/server/libjvm.so").is_file()
    assert os.access(out / "bin/java", os.X_OK)
    assert javahome.check(out) == out / "lib/jvm/lib/server/libjvm.so"
    assert javahome.feature_version(out) == 17


def test_plain_jdk_directory_is_refused_with_the_fix(tmp_path):
    # Debian's JDK root has lib/server/libjvm.so, not the Conda layout.
    with pytest.raises(ConfigError) as info:
        javahome.check_layout(DEBIAN_JDK)
    message = str(info.value)
    assert "lib/jvm/lib/server/libjvm.so" in message and "prepare_java.py" in message


def test_missing_and_relative_java_home(tmp_path):
    with pytest.raises(PreparationMissing):
        javahome.check_layout(tmp_path / "nope")
    with pytest.raises(ConfigError):
        javahome.check_layout("relative/java")


def test_half_layout_names_what_is_missing(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/java").write_text("#!/bin/sh\n")
    (tmp_path / "bin/java").chmod(0o755)
    with pytest.raises(ConfigError, match=r"missing lib/jvm/lib/server/libjvm.so"):
        javahome.check_layout(tmp_path)


def test_conflicting_output_is_not_overwritten(tmp_path):
    out = tmp_path / "java"
    (out / "lib").mkdir(parents=True)
    (out / "lib/jvm").write_text("something else")
    with pytest.raises(ConfigError, match="exists and is not a link"):
        javahome.build_layout(DEBIAN_JDK, out)
    assert (out / "lib/jvm").read_text() == "something else"


def test_not_a_jdk_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a JDK"):
        javahome.build_layout(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_java_too_old_is_refused(tmp_path):
    # A real launcher script reporting an old specification version.
    home = tmp_path / "old"
    (home / "lib/jvm/lib/server").mkdir(parents=True)
    (home / "lib/jvm/lib/server/libjvm.so").write_bytes(b"")
    (home / "bin").mkdir()
    java = home / "bin/java"
    java.write_text("#!/bin/sh\necho '    java.specification.version = 1.8' >&2\n")
    java.chmod(0o755)
    with pytest.raises(ConfigError, match="Java 8 is too old"):
        javahome.check(home)
    assert Path(DEBIAN_JDK).is_dir()
