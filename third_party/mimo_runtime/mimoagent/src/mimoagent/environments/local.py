"""LocalEnvironment: run commands on this machine (inside the task container).

The base execution contract every dataset environment relies on (FACTS 2.1,
5): each command is a fresh ``bash -c`` (no persistent shell: cd and export
do not carry over), stderr merged into stdout, the result a dict with
``output``, ``returncode`` and ``reason`` ("ok", "timeout" with returncode
124, or "transport_error"). Files go in with ``copy_to``. Subclasses (the
transport's verifier execution) override ``execute``/``copy_to`` to add
privilege separation; the dataset environments only use this interface.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
from typing import Any

from mimoagent.errors import TransportError

DEFAULT_OUTPUT_LIMIT = 1 << 20


@dataclasses.dataclass
class LocalEnvironmentConfig:
    cwd: str = "/"
    timeout: float = 120.0
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    answer_leak_blocklist: list[str] = dataclasses.field(default_factory=list)


class LocalEnvironment:
    def __init__(self, *, cwd: str = "/", timeout: float = 120.0, env: dict | None = None,
                 output_limit: int = DEFAULT_OUTPUT_LIMIT, **_: Any) -> None:
        self.config = LocalEnvironmentConfig(cwd=cwd, timeout=timeout, env=dict(env or {}),
                                             output_limit=output_limit)
        self.started = False

    def start(self) -> None:
        self.started = True

    def get_template_vars(self) -> dict:
        return {"cwd": self.config.cwd}

    def execute(self, command: str, cwd: str = "", timeout: float | None = None) -> dict:
        return run_bash(command, cwd or self.config.cwd, timeout or self.config.timeout,
                        env={**os.environ, **self.config.env},
                        output_limit=self.config.output_limit)

    def copy_to(self, src_path: str, dest_path: str, **_: Any) -> None:
        try:
            if os.path.isdir(src_path):
                shutil.copytree(src_path, dest_path, dirs_exist_ok=True, symlinks=False)
            else:
                shutil.copyfile(src_path, dest_path)
        except OSError as exc:
            raise TransportError(f"copy_to {dest_path} failed: {exc}") from exc

    def cleanup(self) -> None:
        self.started = False


def run_bash(command: str, cwd: str, timeout: float, *, env: dict | None = None,
             output_limit: int = DEFAULT_OUTPUT_LIMIT, stdin=None, user: int | None = None,
             truncation_note: bool = True) -> dict:
    """One ``bash -c`` in its own session; the whole process group is killed
    at the end (a background child cannot outlive its command). Output is the
    final ``output_limit`` bytes, prefixed by a note when cut; a timeout
    reports returncode 124 and appends a note."""
    with tempfile.TemporaryFile() as output:
        try:
            proc = subprocess.Popen(
                ["/bin/bash", "-c", command], cwd=cwd, env=env, stdin=stdin or subprocess.DEVNULL,
                stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                user=user, group=user, extra_groups=[] if user is not None else None)
        except OSError as exc:
            raise TransportError(f"cannot start bash: {exc}") from exc
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        length = output.tell()
        output.seek(max(0, length - output_limit))
        text = output.read(output_limit).decode("utf-8", "replace")
    if length > output_limit and truncation_note:
        text = f"[output truncated to final {output_limit} bytes]\n" + text
    if timed_out:
        text += "\n[command timed out]"
    return {"output": text, "returncode": 124 if timed_out else proc.returncode,
            "reason": "timeout" if timed_out else "ok"}
