"""MiMo-format ``opensource-code`` instances (instance.json + workspace.tar).

An instance is what upstream's code rows carry (FACTS 1.3): the eight
required fields, a repository at ``cwd`` whose HEAD is the task's base, a
``test_patch`` that adds the hidden tests plus the verifier script
``mimo_test_command.sh`` and ``test_commands.json``, and a one-line
``test_command`` that runs it. Like the published images, the repository
still carries the fix in its history (a branch ``upstream-fix`` holding the
fix and the tests): the transport strips it before the agent starts.

``from_coding_row`` turns a row of the Coding demo set (SWE-smith layout:
a mirror branch per task, ``patch`` creates the bug) into such an instance.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from camg.errors import DatasetError

GIT_ENV = {
    "GIT_AUTHOR_NAME": "camg demo",
    "GIT_AUTHOR_EMAIL": "demo@camg.invalid",
    "GIT_COMMITTER_NAME": "camg demo",
    "GIT_COMMITTER_EMAIL": "demo@camg.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}
AGENT_UID = 2000
VERIFIER_TIMEOUT = 1800
# Never copied into a workspace: bytecode and caches a run of the tree
# leaves. Made from a fixed tree they would give the fix away
# (environments/coding/leaks.py). Build output (build/, dist/) is not dropped by
# name: a tracked directory may be called so.
BUILD_OUTPUT = (
    "__pycache__",
    "*.pyc",
    "*.pyo",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
)


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        input=input,
        env={**os.environ, **GIT_ENV},
        check=False,
    )
    if proc.returncode != 0:
        raise DatasetError(
            f"git {' '.join(args[:3])} failed in {repo}: "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout.decode()


def test_script(cwd: str, commands: list[str]) -> str:
    lines = ["#!/bin/bash", f"cd {cwd} || exit 2", "export PYTHONDONTWRITEBYTECODE=1", "rc=0"]
    lines += [f"{command} || rc=1" for command in commands]
    lines += ["exit $rc", ""]
    return "\n".join(lines)


def build_instance(
    out: Path,
    *,
    instance_id: str,
    source: Path,
    fix_patch: str,
    test_files: dict[str, str],
    test_commands: list[str],
    problem_statement: str,
    docker_image: str = "",
    cwd: str = "/testbed",
    verifier_timeout_sec: int = VERIFIER_TIMEOUT,
) -> dict:
    """Write ``out``/instance.json and ``out``/workspace.tar; return the instance.

    ``source`` is the tree the agent starts from (bug present, hidden tests
    absent); ``fix_patch`` (applies to it) is the gold fix; ``test_files``
    are the hidden tests (path -> text), run by ``test_commands``.
    """
    out.mkdir(parents=True, exist_ok=True)
    stage = out / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    repo = stage / Path(cwd).name
    shutil.copytree(
        source, repo, symlinks=True, ignore=shutil.ignore_patterns(".git", *BUILD_OUTPUT)
    )
    git(repo, "init", "-q", "--template=", "-b", "main")
    git(repo, "add", "-A", "-f")
    git(repo, "commit", "-q", "-m", "baseline")
    base = git(repo, "rev-parse", "HEAD").strip()
    # test_patch: the hidden tests and the verifier script, as a diff from the base.
    files = {
        **test_files,
        "mimo_test_command.sh": test_script(cwd, test_commands),
        "test_commands.json": json.dumps(test_commands, indent=2) + "\n",
    }
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", "-A", "-f")
    test_patch = git(repo, "diff", "--cached", base)
    git(repo, "reset", "-q", "--hard", base)
    # The post-fix history a published image still carries.
    git(repo, "checkout", "-q", "-b", "upstream-fix")
    git(repo, "apply", "--index", "-", input=fix_patch.encode())
    for rel, text in test_files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A", "-f")
    git(repo, "commit", "-q", "-m", "Fix the issue (upstream)")
    git(repo, "checkout", "-q", "main")
    instance = {
        "dataset_type": "opensource-code",
        "docker_image": docker_image,
        "cwd": cwd,
        "instance_id": instance_id,
        "problem_statement": problem_statement,
        "test_patch": test_patch,
        "test_command": f"bash {cwd}/mimo_test_command.sh",
        "verifier_timeout_sec": verifier_timeout_sec,
    }
    with tarfile.open(out / "workspace.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(str(repo), arcname=repo.name, filter=_agent_owned)
    (out / "instance.json").write_text(json.dumps(instance, indent=1, ensure_ascii=False) + "\n")
    (out / "gold.patch").write_text(fix_patch)
    shutil.rmtree(stage)
    return instance


def _agent_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = AGENT_UID
    info.uname = info.gname = ""
    info.mtime = 1735689600
    return info


def from_coding_row(
    row: dict,
    mirror: Path,
    out: Path,
    *,
    python: str = "/opt/testbed-venv/bin/python",
    docker_image: str = "",
) -> dict:
    """A MiMo instance from a Coding demo row (apispec): the agent gets the
    bug commit without the failing tests; the hidden tests are the FAIL_TO_PASS
    files as of the base, run by their FAIL_TO_PASS and PASS_TO_PASS ids."""
    branch = row["instance_id"]
    base = git(mirror, "rev-parse", f"{branch}~2").strip()
    scratch = out / "source"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(mirror), "archive", branch], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    test_paths = sorted({t.split("::", 1)[0] for t in row["FAIL_TO_PASS"]})
    test_files = {p: git(mirror, "show", f"{base}:{p}") for p in test_paths}
    ids = [
        t for t in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"] if t.split("::", 1)[0] in test_paths
    ]
    fix = git(mirror, "diff", f"{branch}~1", base, "--", ".", *[f":!{p}" for p in test_paths])
    quoted = " ".join("'" + t.replace("'", "'\\''") + "'" for t in ids)
    commands = [f"{python} -m pytest -q -p no:cacheprovider {quoted}"]
    try:
        return build_instance(
            out,
            instance_id=f"mimo-{branch}",
            source=scratch,
            fix_patch=fix,
            test_files=test_files,
            test_commands=commands,
            problem_statement=row["problem_statement"],
            docker_image=docker_image,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def clean_sources(task_dir: Path) -> dict[str, str]:
    """The fixed versions of the files an instance's gold patch changes
    (workspace.tar's repository with ``gold.patch`` applied): what a leak
    check (environments.coding.leaks) looks for in the agent's view."""
    import tempfile

    from environments.coding.leaks import changed_paths
    from tools.oci.apply import extract_tree

    instance = json.loads((task_dir / "instance.json").read_text())
    patch = (task_dir / "gold.patch").read_text()
    with tempfile.TemporaryDirectory(prefix="camg-clean-") as tmp:
        with tarfile.open(task_dir / "workspace.tar") as tar:
            extract_tree(tar, tmp, what="workspace.tar")
        repo = Path(tmp) / Path(instance["cwd"]).name
        git(repo, "apply", "-", input=patch.encode())
        return {
            rel: (repo / rel).read_text(errors="surrogateescape")
            for rel in changed_paths(patch)
            if (repo / rel).is_file()
        }


def container_leaks(containers, container_id: str, task_dir: Path) -> list:
    """The leak check (environments.coding.leaks) in a General code-task container
    after reset, as the agent: every artefact of the fixed sources it can
    read (bytecode, copies, archives, git objects). ``containers`` is a
    camg.sandboxes.containers.ContainerClient of the container's owner."""
    from environments.coding import leaks

    instance = json.loads((task_dir / "instance.json").read_text())

    def run(command: str, stdin: bytes) -> tuple[int, str]:
        r = containers.exec(
            container_id,
            command,
            user="agent",
            cwd=instance["cwd"],
            stdin=stdin,
            timeout=120,
            output_limit=65536,
        )
        return r.exit_code, r.output

    return leaks.findings(run, clean_sources(task_dir), workdir=instance["cwd"])[0]
