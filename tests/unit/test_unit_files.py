"""Environment units are made from the plugins (camg.unit_files): the frame
every unit has, each plugin's own lines and drop-ins, what install.sh
writes, and the descriptor checks that keep a unit well formed."""

from __future__ import annotations

import dataclasses
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from camg import plugins, unit_files
from camg.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / "units" / "camg-environment.conf"


def directives(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split("=", 1)) for line in text.splitlines()
            if line and not line.startswith("#") and "=" in line]


def test_every_registered_environment_gets_the_frame_and_its_own_lines():
    for name, plugin in plugins.all_plugins().items():
        found = directives(unit_files.unit_text(plugin))
        assert ("Environment", f"CAMG_ENV={name} HOME=/var/lib/camg/{name}") in found
        assert ("StateDirectory", f"camg/{name}") in found
        assert ("SyslogIdentifier", plugin.unit.removesuffix(".service")) in found
        assert ("WantedBy", "camg.target") in found
        own = [tuple(line.split("=", 1)) for line in plugin.unit_service if not line.startswith("#")]
        assert own and all(d in found for d in own), name
        # the shared drop-in holds User=, Type=, the hardening: not repeated
        assert not [k for k, _ in found if k in ("User", "Type", "ExecStart")], name


def test_what_the_product_environments_need_of_their_units():
    shop = dict(directives(unit_files.unit_text(plugins.get("shop"))))
    assert shop["MemoryDenyWriteExecute"] == "no" and shop["ProcSubset"] == "all"  # the JVM
    research = plugins.get("autoresearch")
    assert "--check-clean" in dict(directives(unit_files.unit_text(research)))["ExecStartPre"]
    grader = unit_files.dropins(research)["20-grader.conf"]
    assert ("SystemCallFilter", "@setuid capset") in directives(grader)
    for env in ("coding", "general", "visual"):
        assert dict(directives(unit_files.unit_text(plugins.get(env))))[
            "MemoryDenyWriteExecute"] == "yes"


def test_write_puts_the_unit_the_shared_and_own_drop_ins_and_drops_stale_ones(tmp_path):
    research = plugins.get("autoresearch")
    stale = tmp_path / f"{research.unit}.d" / "20-old.conf"
    stale.parent.mkdir()
    stale.write_text("[Service]\n")
    for _ in range(2):  # idempotent
        written = unit_files.write(research, tmp_path, SHARED)
    names = sorted(p.relative_to(tmp_path).as_posix() for p in written)
    assert names == [research.unit, f"{research.unit}.d/10-environment.conf",
                     f"{research.unit}.d/20-grader.conf"]
    assert not stale.exists()
    assert (tmp_path / research.unit).read_text() == unit_files.unit_text(research)
    assert (tmp_path / f"{research.unit}.d" / "10-environment.conf").read_text() == SHARED.read_text()
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path


def test_the_command_writes_the_registered_units_and_refuses_unknown_names(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "camg.unit_files", "--unitdir", str(tmp_path),
                               *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    done = run("--shared", str(SHARED))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.glob("*.service")) == sorted(
        p.unit for p in plugins.all_plugins().values())
    unknown = run("--shared", str(SHARED), "nosuch")
    assert unknown.returncode == 2 and "not registered: nosuch" in unknown.stderr
    missing = run("--shared", str(tmp_path / "none.conf"), "coding")
    assert missing.returncode == 2 and "the shared drop-in is missing" in missing.stderr


@pytest.mark.parametrize("change, words", [
    ({"unit_service": ("MemoryDenyWriteExecute=yes\nExecStart=/bin/sh",)}, "unit_service line"),
    ({"unit_service": ("not a directive",)}, "unit_service line"),
    ({"unit_dropins": (("10-environment.conf", "[Service]\n"),)}, "10- is the shared one"),
    ({"unit_dropins": (("../escape.conf", "[Service]\n"),)}, "must look like 20-name.conf"),
])
def test_a_descriptor_that_would_make_a_broken_unit_is_refused(change, words):
    base = plugins.get("coding")
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    with pytest.raises(ConfigError, match=words):
        plugins.EnvironmentPlugin(**{**fields, **change})
