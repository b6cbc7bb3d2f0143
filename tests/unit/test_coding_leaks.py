"""The agent-view leak probe (environments.coding.leaks), run here with this
interpreter on a workspace laid out as an image built at the clean commit
leaves it: each kind of artefact of the clean source is found and named,
and the same artefacts made from the visible (buggy) source are not."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import zipfile

import pytest

from environments.coding import leaks

CLEAN = '''def widen(a, b):
    """Sum of both."""
    return a + b


def narrow(a, b):
    return a * b
'''
BUGGY = CLEAN.replace("return a + b", "return a - b")
REL = "src/pkg/calcwidget.py"


def run_local(command: str, stdin: bytes) -> tuple[int, str]:
    proc = subprocess.run(["bash", "-c", command.replace("python3", sys.executable, 1)],
                          input=stdin, capture_output=True, timeout=120)
    return proc.returncode, proc.stdout.decode() + proc.stderr.decode()


def probe(work):
    found, stats = leaks.findings(run_local, {REL: CLEAN}, python=sys.executable,
                                  workdir=str(work), roots=(), site=False)
    return {(f.kind, os.path.relpath(f.path.split("!")[0], work)): f for f in found}, stats


@pytest.fixture
def work(tmp_path):
    src = tmp_path / "testbed" / "src" / "pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "calcwidget.py").write_text(BUGGY)
    return tmp_path / "testbed"


def compile_to(text: str, pyc, source) -> None:
    source.write_text(text)
    py_compile.compile(str(source), cfile=str(pyc), doraise=True)


def test_clean_bytecode_names_the_fixed_function(work, tmp_path):
    pyc = work / "src/pkg/__pycache__/calcwidget.cpython-311.pyc"
    pyc.parent.mkdir()
    # As the image built it: compiled from the clean file at the same path.
    clean_copy = tmp_path / "clean.py"
    compile_to(CLEAN, pyc, clean_copy)
    found, stats = probe(work)
    hit = found[("bytecode", "src/pkg/__pycache__/calcwidget.cpython-311.pyc")]
    assert hit.file == REL and "widen" in hit.detail and "narrow" not in hit.detail
    assert stats["pyc"] >= 1


def test_bytecode_of_the_visible_source_is_no_finding(work):
    py_compile.compile(str(work / REL), doraise=True)
    assert list((work / "src/pkg/__pycache__").glob("*.pyc"))
    found, _ = probe(work)
    assert found == {}


def test_copies_archives_and_git_objects_of_the_clean_text(work):
    copy = work / "build/lib/pkg/calcwidget.py"
    copy.parent.mkdir(parents=True)
    copy.write_text(CLEAN)
    (work / "dist").mkdir()
    with zipfile.ZipFile(work / "dist" / "pkg-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("pkg/calcwidget.py", CLEAN)
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
    subprocess.run(["git", "init", "-q", str(work)], check=True, env=env)
    # The clean blob in the repository's object store (history the agent could read).
    subprocess.run(["git", "-C", str(work), "hash-object", "-w", "--stdin"],
                   input=CLEAN.encode(), capture_output=True, check=True, env=env)
    found, _ = probe(work)
    assert set(found) == {("text", "build/lib/pkg/calcwidget.py"),
                          ("text", "dist/pkg-1.0-py3-none-any.whl"), ("git_object", ".git")}


def test_a_workspace_without_artefacts_is_clean(work):
    found, stats = probe(work)
    assert found == {} and stats["pyc"] == 0


def test_changed_paths_and_shell_command():
    patch = ("diff --git a/src/pkg/calcwidget.py b/src/pkg/calcwidget.py\n--- a/x\n+++ b/x\n"
             "diff --git a/old.py b/new.py\n")
    assert leaks.changed_paths(patch) == ["src/pkg/calcwidget.py", "old.py", "new.py"]
    command = leaks.shell_command({REL: CLEAN}, python=sys.executable)
    assert len(command) < 16000


def test_general_instance_clean_sources_and_no_bytecode_in_its_workspace(tmp_path):
    """A MiMo instance built from a tree holding bytecode and caches: the
    workspace.tar carries none of them; clean_sources gives the fixed file."""
    import tarfile

    from environments.general.demo import code_tasks
    source = tmp_path / "source"
    (source / "src/pkg/__pycache__").mkdir(parents=True)
    (source / REL).write_text(BUGGY)
    (source / "src/pkg/__pycache__/calcwidget.cpython-311.pyc").write_bytes(b"x")
    (source / "src/pkg/stale.pyc").write_bytes(b"x")
    (source / ".pytest_cache").mkdir()
    import difflib
    fix = "diff --git a/{0} b/{0}\n".format(REL) + "".join(difflib.unified_diff(
        BUGGY.splitlines(True), CLEAN.splitlines(True), f"a/{REL}", f"b/{REL}"))
    out = tmp_path / "task"
    code_tasks.build_instance(out, instance_id="t1", source=source, fix_patch=fix, test_files={},
                              test_commands=["true"], problem_statement="p")
    with tarfile.open(out / "workspace.tar") as tar:
        names = tar.getnames()
    assert "testbed/src/pkg/calcwidget.py" in names
    assert not [n for n in names if n.endswith(".pyc") or "__pycache__" in n or "pytest_cache" in n]
    assert code_tasks.clean_sources(out) == {REL: CLEAN}


def test_validation_refuses_a_task_whose_view_leaks():
    from camg.errors import DatasetError
    from environments.coding.validate import Result, refuse_bad
    good = Result("t-good", 1.0, 0.0)
    leaky = Result("t-leaky", 1.0, 0.0, "agent view: bytecode ...", ("bytecode /testbed/x.pyc",))
    assert good.ok and not leaky.ok and good.to_data() == {"gold": 1.0, "noop": 0.0}
    assert leaky.to_data()["leaks"] == ["bytecode /testbed/x.pyc"]
    refuse_bad([good])
    with pytest.raises(DatasetError, match="t-leaky.*agent view"):
        refuse_bad([good, leaky])
