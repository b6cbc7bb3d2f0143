"""Run the demo project's suite in a helper sandbox over the demo image.

The task builder uses this to find FAIL_TO_PASS/PASS_TO_PASS with exactly
the interpreter, packages and test command the grader will use: each run
is a fresh sandbox over the materialized rootfs, the checkout (without
.git) copied to /testbed with PutArchive, the profile's command run as the
agent uid, and the sandbox destroyed.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from environments.coding.demo.demo_tasks import Runner
from environments.coding.profiles import demo_profile, parse_pytest_verbose

#: the agent uid the sandbox runs the suite as; it owns what the tar lays down
AGENT_UID = 2000


def tar_checkout(checkout: Path) -> bytes:
    """A checkout's files (no .git, no bytecode caches) as a tar owned by
    AGENT_UID, for a sandbox's /testbed."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(checkout.rglob("*")):
            rel = path.relative_to(checkout)
            if rel.parts[0] == ".git" or "__pycache__" in rel.parts:
                continue
            info = tar.gettarinfo(str(path), str(rel))
            info.uid = info.gid = AGENT_UID
            info.uname = info.gname = ""
            if info.isreg():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def sandbox_runner(
    helper_socket: str, rootfs: str, *, timeout: float = 600, memory_bytes: int = 2 << 30
) -> Runner:
    from camg.helper_client import HelperClient

    client = HelperClient(helper_socket, owner="coding-builder")
    command = demo_profile("builder").test_cmd

    def run(checkout: Path) -> dict[str, str]:
        sandbox = client.create_sandbox(
            [str(rootfs)], memory_bytes=memory_bytes, cpu_quota=1.0, pids_max=512
        )
        try:
            client.put_archive(sandbox, "/testbed", tar_checkout(checkout), user="root")
            result = client.exec(
                sandbox,
                command,
                user="agent",
                cwd="/testbed",
                timeout=timeout,
                output_limit=1 << 20,
            )
        finally:
            client.destroy(sandbox)
        if result.truncated or result.timed_out:
            raise RuntimeError(
                f"suite run unusable (truncated={result.truncated}, timed_out={result.timed_out})"
            )
        status = parse_pytest_verbose(result.output)
        if not status:
            raise RuntimeError(
                f"suite run reported no test (exit {result.exit_code}): {result.output[-3000:]}"
            )
        return status

    return run


def ensure_demo_set(cache_dir: Path, image, helper_socket: str, sdist: Path) -> Path:
    """The demo task set for ``image`` (a materialized demo image), built with
    the suite run in sandboxes and cached under ``cache_dir`` keyed by the
    image digest, the sdist and the builder's sources."""
    import hashlib
    import json
    import os
    import shutil

    from environments.coding.demo import demo_tasks
    from tools.oci_demo import locked

    here = Path(__file__).resolve().parent
    sources = "".join(
        (here / name).read_text() for name in ("bugs.py", "demo_tasks.py", "sandbox_runner.py")
    )
    key = hashlib.sha256(
        json.dumps([image.digest, sources, hashlib.sha256(sdist.read_bytes()).hexdigest()]).encode()
    ).hexdigest()[:16]
    final = Path(cache_dir) / f"demo-{key}"
    if (final / "tasks.jsonl").is_file():
        return final
    # One builder at a time (the privileged lanes and the system tier's
    # guests share this cache through bind mounts; flock holds across them):
    # the others wait and take its set.
    with locked(Path(cache_dir) / f".demo-{key}.lock"):
        if (final / "tasks.jsonl").is_file():
            return final
        tmp = Path(cache_dir) / f".demo-{key}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            runner = sandbox_runner(helper_socket, image.rootfs)
            spec = demo_tasks.DemoSpec(sdist=sdist, image_name=image.name)
            demo_tasks.write_rows(demo_tasks.build(spec, tmp, runner), tmp)
            shutil.rmtree(final, ignore_errors=True)  # an unfinished set of a killed run
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final
