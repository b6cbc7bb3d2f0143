"""DatasetEnvironment: how a task of one dataset type is set up and graded.

Interface (FACTS 5, mimoagent ``datasets/base.py``): constructed from
``(base_env, instance)``; ``setup_environment()`` starts the base
environment and runs the subclass's ``_setup_dataset_specific()``;
``attach_rollout()`` is called between the run and grading;
``calculate_reward(timeout)`` returns ``(reward, test_output, extra)``. It
captures ``model_patch`` first, then calls ``_do_calculate_reward`` and
converts exceptions: a ``TransportError`` gives reward 0 with
``transport_error: True``; any other exception gives reward 0 with only
``model_patch`` (no ``verifier_returncode``) -- both are infrastructure
failures a caller must mask, never train on.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import tempfile
from typing import Any

from mimoagent.errors import TransportError

MODEL_PATCH_LIMIT = 1 << 20
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


class DatasetEnvironment:
    REQUIRED_FIELDS: tuple[str, ...] = ()

    def __init__(self, base_env: Any, instance: dict) -> None:
        missing = [f for f in self.REQUIRED_FIELDS if f not in instance]
        if missing:
            raise ValueError(f"instance lacks required field(s): {', '.join(missing)}")
        self.env = base_env
        self.instance = instance
        self.rollout: dict = {}
        self._logger = logging.getLogger(f"mimoagent.{type(self).__name__}")

    # -- properties and pass-throughs ---------------------------------------
    @property
    def repo_path(self) -> str:
        return self.instance.get("cwd", "/")

    @property
    def instance_id(self) -> str:
        return str(self.instance.get("instance_id", ""))

    @property
    def logger(self) -> logging.Logger:
        return self._logger

    def execute(self, command: str, cwd: str = "", timeout: float | None = None) -> dict:
        return self.env.execute(command, cwd=cwd, timeout=timeout)

    def cleanup(self) -> None:
        self.env.cleanup()

    def get_template_vars(self) -> dict:
        return {**self.env.get_template_vars(), "cwd": self.repo_path}

    # -- life cycle ------------------------------------------------------------
    def setup_environment(self) -> None:
        self.env.start()
        self._setup_dataset_specific()

    def _setup_dataset_specific(self) -> None:
        pass

    def attach_rollout(self, agent: Any = None, task: str = "", result: str = "") -> None:
        self.rollout = {"agent": agent, "task": task, "result": result}

    def calculate_reward(self, timeout: float | None = None) -> tuple[float, str, dict]:
        model_patch = ""
        try:
            model_patch = self._model_patch()
            reward, output, extra = self._do_calculate_reward(timeout, model_patch)
            return float(reward), output, {**extra, "model_patch": model_patch}
        except TransportError as exc:
            return 0.0, f"transport error: {exc}", {"transport_error": True,
                                                    "model_patch": model_patch}
        except Exception as exc:  # noqa: BLE001 -- upstream's contract: no returncode = infra
            self.logger.exception("reward computation failed")
            return 0.0, f"reward computation failed: {exc}", {"model_patch": model_patch}

    def _do_calculate_reward(self, timeout: float | None, model_patch: str) -> tuple[float, str, dict]:
        raise NotImplementedError

    # -- helpers -----------------------------------------------------------------
    def _checked(self, command: str, what: str, timeout: float = 120) -> str:
        result = self.execute(command, cwd=self.repo_path, timeout=timeout)
        if result.get("reason") == "transport_error":
            raise TransportError(f"{what}: transport error")
        if result["returncode"] != 0:
            raise RuntimeError(f"{what} failed (exit {result['returncode']}): {result['output'][-2000:]}")
        return result["output"]

    def _model_patch(self) -> str:
        """Staged and unstaged changes against HEAD (untracked files included)."""
        if self.execute("git rev-parse --is-inside-work-tree", cwd=self.repo_path,
                        timeout=60)["returncode"] != 0:
            return ""
        self.execute("git add --intent-to-add --all", cwd=self.repo_path, timeout=120)
        result = self.execute("git -c core.fileMode=false diff --binary HEAD",
                              cwd=self.repo_path, timeout=120)
        return result["output"][:MODEL_PATCH_LIMIT]

    def copy_text_to(self, text: str, path: str, executable: bool = False) -> None:
        with tempfile.NamedTemporaryFile("w", delete=False, encoding="utf-8") as handle:
            handle.write(text)
            local = handle.name
        try:
            self.env.copy_to(local, path)
        finally:
            os.unlink(local)
        if executable:
            self._checked(f"chmod +x {shlex.quote(path)}", "chmod")

    @staticmethod
    def patch_paths(patch: str) -> list[str]:
        """Every path a patch touches (both sides of each ``diff --git``)."""
        paths: list[str] = []
        for a, b in _DIFF_HEADER.findall(patch):
            for path in (a, b):
                if path not in paths and path != "/dev/null":
                    paths.append(path)
        return paths

    def reset_test_files_to_base(self, patch: str, base: str) -> None:
        """Restore every patched path from ``base`` if it existed there,
        otherwise remove it: files the agent planted cannot shadow the tests."""
        for path in self.patch_paths(patch):
            q = shlex.quote(path)
            exists = self.execute(f"git cat-file -e {shlex.quote(base)}:{q}", cwd=self.repo_path,
                                  timeout=60)["returncode"] == 0
            if exists:
                self._checked(f"git checkout {shlex.quote(base)} -- {q}", f"restore {path}")
            else:
                self._checked(f"git rm -q --cached --ignore-unmatch -- {q} && rm -rf -- {q}",
                              f"remove {path}")

    def git_reset_hard(self, ref: str = "HEAD") -> None:
        self._checked(f"git reset -q --hard {shlex.quote(ref)}", "git reset --hard")

    def git_add_safe_directory(self) -> None:
        # Non-fatal: the agent owns the repository, so git never needs it there.
        self.execute(f"git config --global --add safe.directory {shlex.quote(self.repo_path)}",
                     cwd=self.repo_path, timeout=60)
