"""Build a SWE-smith-style task set from a PyPI sdist (the demo: apispec 6.8.1).

Layout SWE-smith uses, reproduced: a mirror repository whose base commit is
the project, and one branch per task named exactly by its instance_id
(``<owner>__<repo>.<commit8>.<modifier>__<hash8>``) holding a "Bug Patch"
commit and then a "Remove F2P Tests" commit. FAIL_TO_PASS and PASS_TO_PASS
come from really running the test suite on the base and on each bug. Rows
carry SWE-smith's columns; ``patch`` creates the bug, so its reverse is the
gold fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from camg.config import progress
from camg.errors import DatasetError
from environments.coding.demo import bugs
from environments.coding.profiles import DEMO_OWNER, parse_pytest_verbose
from tools.oci.apply import extract_tree

log = logging.getLogger("camg.coding")

GITIGNORE = "__pycache__/\n*.py[cod]\n*.egg-info/\n.pytest_cache/\nbuild/\ndist/\n.tox/\n"
_ENV = {
    "GIT_AUTHOR_NAME": "camg demo",
    "GIT_AUTHOR_EMAIL": "demo@camg.invalid",
    "GIT_COMMITTER_NAME": "camg demo",
    "GIT_COMMITTER_EMAIL": "demo@camg.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00Z",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}

# A suite runner: checkout dir -> {test id: status} (pytest verbose parse).
Runner = Callable[[Path], dict[str, str]]

#: the PyPI release the demo task set is built from
DEMO_SDIST = "apispec==6.8.1"
DEMO_SDIST_FILE = "apispec-6.8.1.tar.gz"


def fetch_sdist(directory: Path) -> Path:
    """The demo project's sdist (source and tests), downloaded once into ``directory``."""
    path = Path(directory) / DEMO_SDIST_FILE
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-qq",
                "--no-deps",
                "--no-binary",
                ":all:",
                DEMO_SDIST,
                "-d",
                str(path.parent),
            ],
            check=True,
        )
    return path


@dataclasses.dataclass(frozen=True)
class DemoSpec:
    sdist: Path
    owner: str = "marshmallow-code"
    project: str = "apispec"
    package_dir: str = "src"
    image_name: str = "camg/demo-apispec-6.8.1"  # tools.oci_demo.NAME
    count: int = 12
    per_modifier: int = 3
    max_f2p: int = 60
    seed: int = 0


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        env={**os.environ, **_ENV},
        check=False,
    )
    if proc.returncode != 0:
        raise DatasetError(
            f"git {' '.join(args[:3])} failed in {repo}: "
            f"{proc.stderr.decode(errors='replace').strip()}"
        )
    return proc.stdout.decode()


def local_runner(python: str | Path, timeout: float = 600) -> Runner:
    """Run the suite with a local interpreter that has the test dependencies
    (the builder's fallback when no helper and image are at hand)."""
    from environments.coding.profiles import local_profile

    cmd = local_profile("local", str(python), ".").test_cmd

    def run(checkout: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        proc = subprocess.run(
            ["bash", "-c", cmd],
            cwd=checkout,
            env=env,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        return parse_pytest_verbose(proc.stdout.decode("utf-8", "replace"))

    return run


def extract_sdist(sdist: Path, dest: Path) -> None:
    """Unpack an sdist without its top-level directory, refusing unsafe members."""
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        top = {m.name.split("/", 1)[0] for m in members}
        if len(top) != 1:
            raise DatasetError(f"{sdist}: expected one top-level directory, found {sorted(top)}")
        prefix = top.pop() + "/"
        inner = []
        for member in members:
            if member.name.startswith(prefix) and member.name != prefix:
                member.name = member.name[len(prefix) :]
                inner.append(member)
        extract_tree(tar, dest, what=str(sdist), members=inner)


def build(spec: DemoSpec, out: Path, runner: Runner) -> list[dict]:
    """Build mirror + rows under ``out``; return the rows (SWE-smith columns)."""
    work = out / "work"
    if out.exists():
        shutil.rmtree(out)
    extract_sdist(spec.sdist, work)
    (work / ".gitignore").write_text(GITIGNORE)
    _git(work, "init", "-q", "--template=", "-b", "main")
    _git(work, "add", "-A", "-f")
    _git(work, "commit", "-q", "-m", f"{spec.project} {_sdist_version(spec.sdist)} from its sdist")
    base = _git(work, "rev-parse", "HEAD").strip()
    repo_name = f"{spec.owner}__{spec.project}.{base[:8]}"
    mirror = out / "mirrors" / repo_name
    mirror.parent.mkdir(parents=True)
    work.rename(mirror)

    baseline = runner(mirror)
    passing = sorted(t for t, s in baseline.items() if s == "PASSED")
    if not passing:
        raise DatasetError(f"the base of {repo_name} passes no test; check the runner")
    log.info("base %s: %d tests, %d pass", base[:8], len(baseline), len(passing))

    rng = random.Random(spec.seed)
    candidates = _candidates(mirror, spec, rng)
    rows: list[dict] = []
    per_modifier: dict[str, int] = {}
    seen: set[str] = set()
    # Each candidate runs the whole suite in a sandbox: show the pace.
    bar = progress.Progress("coding: demo task set: candidate bugs tried", None, "candidate")
    for mutation in candidates:
        bar.update()
        if len(rows) >= spec.count:
            break
        if per_modifier.get(mutation.modifier, 0) >= spec.per_modifier:
            continue
        target = mirror / mutation.path
        original = target.read_text()
        target.write_text(mutation.source)
        try:
            status = runner(mirror)
        finally:
            target.write_text(original)
        if set(status) != set(baseline):
            continue  # collection changed (import error...): not a clean task
        f2p = sorted(t for t in passing if status[t] in ("FAILED", "ERROR"))
        if not f2p or len(f2p) > spec.max_f2p:
            continue
        p2p = sorted(t for t in passing if status[t] == "PASSED")
        row = _commit_task(mirror, base, repo_name, mutation, f2p, p2p, spec)
        if row["patch"] in seen:
            continue
        seen.add(row["patch"])
        per_modifier[mutation.modifier] = per_modifier.get(mutation.modifier, 0) + 1
        rows.append(row)
        log.info("task %s: %d F2P, %d P2P", row["instance_id"], len(f2p), len(p2p))
    bar.close()
    _git(mirror, "checkout", "-q", "main")
    _git(mirror, "gc", "-q", "--prune=now")
    if len(rows) < spec.count:
        raise DatasetError(f"only {len(rows)} usable bugs found (wanted {spec.count})")
    return rows


def _sdist_version(sdist: Path) -> str:
    return sdist.name.removesuffix(".tar.gz").rpartition("-")[2]


def _candidates(mirror: Path, spec: DemoSpec, rng: random.Random):
    """Mutations of every source file, interleaved so modifiers alternate."""
    pools: dict[str, list[bugs.Mutation]] = {}
    for path in sorted((mirror / spec.package_dir).rglob("*.py")):
        rel = str(path.relative_to(mirror))
        for mutation in bugs.mutations(rel, path.read_text(), rng):
            pools.setdefault(mutation.modifier, []).append(mutation)
    for pool in pools.values():
        rng.shuffle(pool)
    names = sorted(pools)
    while any(pools.values()):
        for name in names:
            if pools[name]:
                yield pools[name].pop()


def _commit_task(
    mirror: Path,
    base: str,
    repo_name: str,
    mutation: bugs.Mutation,
    f2p: list[str],
    p2p: list[str],
    spec: DemoSpec,
) -> dict:
    digest = hashlib.sha256(f"{mutation.path}\n{mutation.source}".encode()).hexdigest()[:8]
    instance_id = f"{repo_name}.{mutation.modifier}__{digest}"
    _git(mirror, "checkout", "-q", "-B", instance_id, base)
    (mirror / mutation.path).write_text(mutation.source)
    _git(mirror, "add", "--", mutation.path)
    _git(mirror, "commit", "-q", "-m", "Bug Patch")
    bug = _git(mirror, "rev-parse", "HEAD").strip()
    test_files = sorted({t.split("::", 1)[0] for t in f2p})
    _git(mirror, "rm", "-q", "--", *test_files)
    _git(mirror, "commit", "-q", "-m", "Remove F2P Tests")
    patch = _git(mirror, "diff", base, bug)
    _git(mirror, "checkout", "-q", "main")
    return {
        "instance_id": instance_id,
        "repo": f"{DEMO_OWNER}/{repo_name}",
        "patch": patch,
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "image_name": spec.image_name,
        "problem_statement": _statement(mutation, f2p),
    }


def _statement(mutation: bugs.Mutation, f2p: list[str]) -> str:
    module = mutation.path.removeprefix("src/").removesuffix(".py").replace("/", ".")
    shown = "\n".join(f"- `{t}`" for t in f2p[:10])
    more = f"\n- ... and {len(f2p) - 10} more" if len(f2p) > 10 else ""
    return (
        f"# Regression in `{module}`\n\n"
        f"Since the last change to `{mutation.path}`, part of the library misbehaves. "
        f"These tests of the project's suite now fail (they are not in your checkout):\n\n"
        f"{shown}{more}\n\n"
        "Find the defect in the library code and fix it, without changing the tests. "
        "Every other test must keep passing.\n"
    )


def write_rows(rows: list[dict], out: Path) -> tuple[Path, Path]:
    """The rows as JSONL and as Parquet (list<string> test columns, like SWE-smith's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = out / "tasks.jsonl"
    with open(jsonl, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    parquet = out / "tasks.parquet"
    schema = pa.schema(
        [
            ("instance_id", pa.string()),
            ("repo", pa.string()),
            ("patch", pa.string()),
            ("FAIL_TO_PASS", pa.list_(pa.string())),
            ("PASS_TO_PASS", pa.list_(pa.string())),
            ("image_name", pa.string()),
            ("problem_statement", pa.string()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), parquet)
    return jsonl, parquet
