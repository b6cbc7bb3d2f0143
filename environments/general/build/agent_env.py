"""The MiMo agent environment: the Python environment mounted read-only into
every General task container (``mimo.agent_environment`` in the deployment).

It is a virtualenv made by Debian bookworm's ``/usr/bin/python3`` (3.11.2,
the same interpreter the task images carry), holding the MCP
package the tool bridge's child and the tool servers use (the in-container
transport itself is stdlib alone: mimoagent.transport.wsserver), openpyxl for the rule
verifier, and the project's own ``mimoagent`` runtime, installed as a copy
(not editable: the container has no view of the source tree), and camg's
test guard (camg/grading/guard/camg_guard.py, the pytest plugin Coding's grader
loads too) in ``camg-guard/``, which the software verifier puts first on the
test command's path (mimoagent.transport.verifier_guard). Versions are
constrained by ``requirements.lock`` so the container runs what the suite
tested. A venv finds its packages from ``pyvenv.cfg`` next to its ``bin/``,
so it works at any mount point (``/opt/camg/agent-env`` by default) as long
as scripts are started as ``<env>/bin/python -m ...``.

    python -m environments.general.build.agent_env --output /srv/camg/mimo-agent-env
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from camg.config.hashing import sha256_file, sha256_json
from camg.errors import DatasetError
from camg.grading import guard_verdict

REPO = Path(__file__).resolve().parents[3]
RUNTIME = REPO / "third_party" / "mimo_runtime" / "mimoagent"
PYTHON = "/usr/bin/python3"
PACKAGES = ("mcp", "openpyxl")
#: where the helper mounts it inside containers (helper.json containers.agent_env_target)
MOUNT_POINT = "/opt/camg/agent-env"
#: below the environment: camg_guard.py (verifier_guard.TEST_GUARD_DIR is <sys.prefix>/camg-guard)
GUARD_DIR = "camg-guard"


def _pins() -> list[str]:
    lock = (REPO / "requirements.lock").read_text().splitlines()
    wanted = {p.lower().replace("_", "-") for p in PACKAGES}
    pins = [
        line.strip()
        for line in lock
        if "==" in line and line.split("==")[0].lower().replace("_", "-") in wanted
    ]
    if len(pins) != len(wanted):
        raise DatasetError(f"requirements.lock lacks one of {', '.join(PACKAGES)}")
    return pins


def _sources() -> list:
    """The runtime's sources: not the __pycache__ tests leave in the tree, nor
    the build/ and *.egg-info a pip install of the tree in place leaves."""
    return [
        [str(p.relative_to(RUNTIME)), sha256_file(p)]
        for p in sorted(RUNTIME.rglob("*"))
        if p.is_file()
        and not p.name.endswith(".pyc")
        and not any(
            part in ("__pycache__", "build") or part.endswith(".egg-info")
            for part in p.relative_to(RUNTIME).parts
        )
    ]


def key() -> str:
    """Inputs of the build: pins, lock, runtime sources."""
    return sha256_json(
        {
            "pins": _pins(),
            "lock": (REPO / "requirements.lock").read_text(),
            "runtime": _sources(),
            "python": PYTHON,
            "guard": sha256_file(guard_verdict.GUARD_FILE),
            "v": 1,
        }
    ).split(":", 1)[1][:16]


def build(output: Path) -> Path:
    """Build (or reuse, when its recorded key matches) the environment at ``output``."""
    output = Path(output).absolute()
    want = key()
    if _built(output, want):
        return output
    # One builder at a time: CI's lanes and the system tier's guests share
    # this cache, and a second builder would remove the first one's output
    # from under the containers that mount it.
    from tools.oci_demo import locked

    with locked(output.with_name(f".{output.name}.lock")):
        if _built(output, want):
            return output
        return _build(output, want)


def _built(output: Path, want: str) -> bool:
    try:
        return json.loads((output / "camg-agent-env.json").read_text())["key"] == want
    except (OSError, ValueError, KeyError):
        return False


def _build(output: Path, want: str) -> Path:
    work = output.with_name(output.name + ".building")
    shutil.rmtree(work, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(argv: list[str], what: str) -> None:
        proc = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=1800,
            check=False,
        )
        if proc.returncode != 0:
            raise DatasetError(
                f"agent env: {what} failed: {proc.stdout.decode(errors='replace')[-3000:]}"
            )

    run([PYTHON, "-m", "venv", str(work)], "venv")
    pip = [
        str(work / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-cache-dir",
    ]
    constraints = work / "constraints.txt"
    constraints.write_text(
        "\n".join(
            line
            for line in (REPO / "requirements.lock").read_text().splitlines()
            if "==" in line and not line.startswith("torch")
        )
        + "\n"
    )
    run([*pip, "-c", str(constraints), *_pins()], "pip install")
    # pip builds a local directory in place (setuptools writes build/ and
    # *.egg-info into it), and build/ would change key() for the next caller,
    # which then rebuilt this tree from under running containers: build a copy.
    source = work.with_name(work.name + ".src")
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(
        RUNTIME, source, ignore=shutil.ignore_patterns("build", "__pycache__", "*.egg-info")
    )
    try:
        run([*pip, "--no-deps", str(source)], "install mimoagent")
    finally:
        shutil.rmtree(source, ignore_errors=True)
    constraints.unlink()
    (work / GUARD_DIR).mkdir()
    shutil.copyfile(
        guard_verdict.GUARD_FILE, work / GUARD_DIR / Path(guard_verdict.GUARD_FILE).name
    )
    # Readable by the agent uid inside the container; nothing writable.
    subprocess.run(["chmod", "-R", "a+rX,go-w", str(work)], check=True)
    (work / "camg-agent-env.json").write_text(json.dumps({"key": want, "pins": _pins()}) + "\n")
    if output.exists():
        shutil.rmtree(output)
    os.rename(work, output)
    # The venv's own path is baked only in script shebangs; we never run them.
    return output


def cached(cache_root: Path | None = None) -> Path:
    """The shared test cache's environment, one directory per key: a run at
    another commit (a lane, a guest, a second checkout) builds beside this
    one instead of replacing it under containers that mount it."""
    root = Path(cache_root or os.environ.get("CAMG_CACHE") or "/var/cache/camg-test")
    return build(root / "general" / f"agent-env-{key()}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the MiMo agent environment (a venv).")
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)
    print(build(Path(args.output)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
