"""GeneralAgentEnvironment: ``general_agent`` tasks (office work with MCP tools).

Task directory (FACTS 1.4, our single-container layout): ``workspace/``
(files the agent works on), ``tools/<server>.py`` (one MCP server per file,
stdio), ``system/<server>/state.db`` (the SQLite state behind each server),
``verifier_meta.json`` (rubric items) and ``instance.json``. The task
directory is root-only; the agent (an unprivileged uid) sees only the
workspace, so the state files and the rubric's pass anchors stay out of its
reach, which upstream gets from a separate sidecar container.

Setup copies the workspace to ``cwd`` and a fresh copy of each server's state
to ``state_root``, then lists every server's tools (a server that does not
list is an infrastructure failure). The final answer is written to
``<cwd>/answer.md`` unless the agent already left a non-empty one. Reward:
``python -m mimoagent.verify.general`` (the verifier runner) scores rule
items against the post-state and emits one judge request per LLM item; the
caller (the General service, which alone holds the judge credentials) asks
the judge and aggregates. Preconditions that mask the episode, as upstream:
a tool server that no longer starts (``mcp_backend_down``), a missing
verifier (``missing_run_verify``), a missing or out-of-range reward file.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import sys
from pathlib import Path

from mimoagent.environments.datasets.base import DatasetEnvironment
from mimoagent.tools import mcp_bridge
from mimoagent.verify import general as verify_runner

TESTBED_CORRUPTED = "reward/testbed_corrupted"
STATE_ROOT = "/var/lib/mimo-system"
VERIFIER_OUT = "/logs/verifier"


def server_names(task_dir: Path) -> list[str]:
    """tools/*.py stems, sorted, skipping ``_*`` and ``tools_test.py`` (upstream's rule)."""
    tools = Path(task_dir) / "tools"
    if not tools.is_dir():
        return []
    return sorted(p.stem for p in tools.glob("*.py")
                  if not p.name.startswith("_") and p.name != "tools_test.py")



#: how long a tool server has to list its tools at grading, and how much
#: longer its second chance is
LIST_TIMEOUT_S = 60.0
SECOND_CHANCE = 2.0


def servers_down(servers: list) -> str | None:
    """Why a tool server does not answer at grading, or None when all do.

    A server that gives no answer is asked once more, for longer, before the
    episode is called ``mcp_backend_down``. Grading runs after the agent's
    processes are gone, so a server the agent broke (its state corrupted,
    its file replaced) fails again; one that a busy host slowed answers the
    second time. Without the second chance an honest episode on an
    overloaded host would be graded as an obstruction."""
    for server in servers:
        try:
            mcp_bridge.list_tools(server, timeout=LIST_TIMEOUT_S)
        except mcp_bridge.ToolServerDown:
            try:
                mcp_bridge.list_tools(server, timeout=LIST_TIMEOUT_S * SECOND_CHANCE)
            except mcp_bridge.ToolServerDown as again:
                return str(again)
    return None


class GeneralAgentEnvironment(DatasetEnvironment):
    REQUIRED_FIELDS = ("instance_id", "dataset_type", "docker_image", "env_task_dir", "cwd",
                       "problem_statement")

    def __init__(self, base_env, instance: dict, *, task_dir: str | None = None,
                 state_root: str = STATE_ROOT, verifier_out: str = VERIFIER_OUT,
                 python: str | None = None) -> None:
        super().__init__(base_env, instance)
        self.task_dir = Path(task_dir or instance["env_task_dir"])
        self.state_root = Path(state_root)
        self.verifier_out = Path(verifier_out)
        self.python = python or sys.executable
        self.tools: dict[str, list[dict]] = {}
        #: the episode's resident bridges (mcp_bridge.Sessions), closed before grading
        self.sessions = mcp_bridge.Sessions()

    # -- servers -----------------------------------------------------------------
    def server(self, name: str) -> mcp_bridge.ServerSpec:
        if name not in server_names(self.task_dir):
            raise KeyError(name)
        return mcp_bridge.ServerSpec.for_script(
            name, str(self.task_dir / "tools" / f"{name}.py"), python=self.python,
            cwd=str(self.task_dir / "tools"),
            env={"MIMO_STATE_DB": str(self.state_root / name / "state.db"),
                 "MIMO_WORKSPACE": self.repo_path})

    def call_tool(self, server: str, name: str, arguments: dict, timeout: float = 120) -> dict:
        return self.sessions.call_tool(self.server(server), name, arguments, timeout=timeout)

    # -- life cycle ------------------------------------------------------------------
    def cleanup(self) -> None:
        self.sessions.close()
        super().cleanup()

    def _setup_dataset_specific(self) -> None:
        workspace = Path(self.repo_path)
        if workspace.exists():
            shutil.rmtree(workspace)
        shutil.copytree(self.task_dir / "workspace", workspace, symlinks=False)
        if self.state_root.exists():
            shutil.rmtree(self.state_root)
        self.state_root.mkdir(parents=True, mode=0o700)
        system = self.task_dir / "system"
        for name in server_names(self.task_dir):
            target = self.state_root / name
            if (system / name).is_dir():
                shutil.copytree(system / name, target, symlinks=False)
            else:
                target.mkdir()
        shutil.rmtree(self.verifier_out, ignore_errors=True)
        self.tools = {name: self.sessions.list_tools(self.server(name), timeout=120)
                      for name in server_names(self.task_dir)}

    def write_answer(self, answer: str) -> str | None:
        """Write ``answer.md`` unless the agent left a non-empty regular file
        there (upstream's rule). Anything else in its place -- a symlink, a
        fifo, a directory -- is removed first and named in the return value
        (an integrity finding); the file is created with O_EXCL|O_NOFOLLOW.
        Run only after the agent's processes are gone (no race)."""
        path = Path(self.repo_path) / "answer.md"
        odd = None
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISREG(mode):
            if verify_runner.file_text(Path(self.repo_path), "answer.md", cap=4096)[0].strip():
                return None
            path.unlink()
        elif mode is not None:
            odd = ("a symlink" if stat.S_ISLNK(mode) else "a fifo" if stat.S_ISFIFO(mode)
                   else "a directory" if stat.S_ISDIR(mode) else "not a regular file")
            if stat.S_ISDIR(mode):
                shutil.rmtree(path)
            else:
                path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(answer)
        return odd

    def _do_calculate_reward(self, timeout, model_patch):
        verify = self.task_dir / "verifier_meta.json"
        if not verify.is_file():
            return 0.0, "verifier materials missing", {
                "error_category": TESTBED_CORRUPTED, "reward_error": "missing_run_verify"}
        # The episode's servers go first: what grades meets fresh ones only.
        self.sessions.close()
        down = servers_down([self.server(name) for name in server_names(self.task_dir)])
        if down is not None:
            return 0.0, down, {"error_category": TESTBED_CORRUPTED,
                               "reward_error": "mcp_backend_down"}
        shutil.rmtree(self.verifier_out, ignore_errors=True)
        command = " ".join(shlex.quote(a) for a in (
            self.python, str(Path(verify_runner.__file__)), "--task-dir", str(self.task_dir),
            "--workspace", self.repo_path, "--state-root", str(self.state_root),
            "--out", str(self.verifier_out)))
        result = self.execute(command, cwd="/", timeout=timeout or self.instance.get(
            "verifier_timeout_sec", 900))
        extra: dict = {"verifier_returncode": result["returncode"]}
        try:
            reward = json.loads((self.verifier_out / "reward.json").read_text())
            detail = json.loads((self.verifier_out / "reward_detail.json").read_text())
        except (OSError, ValueError):
            return 0.0, result["output"], {**extra, "error_category": TESTBED_CORRUPTED,
                                           "reward_error": "missing_or_invalid_reward_json"}
        extra["reward_detail"] = detail
        if reward.get("pending_judge"):
            extra["pending_judge"] = True
            return 0.0, result["output"], extra
        value = reward.get("reward")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0.0 <= float(value) <= 1.0:
            return 0.0, result["output"], {**extra, "error_category": TESTBED_CORRUPTED,
                                           "reward_error": "reward_out_of_range"}
        return float(value), result["output"], extra


    def record_integrity(self, findings: list[dict], processes_killed: int) -> None:
        """Add the transport's findings to reward_detail.json (the service
        reads them with the judge requests; a regrade sees them again)."""
        path = self.verifier_out / "reward_detail.json"
        detail = json.loads(path.read_text())
        detail["transport_integrity"] = {"findings": findings,
                                         "processes_killed": processes_killed}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(detail, indent=1))
        os.replace(tmp, path)


def ensure_private(path: str | os.PathLike) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
