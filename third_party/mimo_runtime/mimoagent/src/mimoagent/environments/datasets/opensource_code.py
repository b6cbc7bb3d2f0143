"""OpenSourceCodeEnvironment: the ``opensource-code`` (MiMo code) verifier.

Setup: mark the repo safe, make it a git work tree if it is not one, record
HEAD as the base ref, strip every commit outside the base's ancestry (the
published images still carry the fix in their history), then assert that
nothing outside the base is reachable.

Reward (FACTS 3.1), in order: reset every path the test patch touches to the
base (restore or delete), write the patch to a file and ``git apply`` it
(no --reject), run ``test_command`` in the repo; reward 1.0 iff it exits 0.
The touched files are reset again afterwards so a re-grade starts clean.
Errors: a failed reset or apply reports ``error_category``
``reward/testbed_corrupted`` (reward 0, masked by callers).
"""

from __future__ import annotations

import os
import shlex
import time

from mimoagent.environments.datasets.base import DatasetEnvironment
from mimoagent.errors import TransportError

PATCH_FILE = "/tmp/_opensource_code_test.patch"
TESTBED_CORRUPTED = "reward/testbed_corrupted"

STRIP_HISTORY = r"""
set -e
base=$(git rev-parse HEAD)
git checkout -q --detach "$base"
git for-each-ref --format='%(refname)' | while read -r ref; do
  git update-ref -d "$ref"
done
for remote in $(git remote); do git remote remove "$remote"; done
rm -f .git/ORIG_HEAD .git/FETCH_HEAD .git/MERGE_HEAD .git/packed-refs.lock
git reflog expire --expire=now --all
git gc -q --prune=now
"""


class OpenSourceCodeEnvironment(DatasetEnvironment):
    REQUIRED_FIELDS = ("dataset_type", "docker_image", "cwd", "instance_id", "problem_statement",
                       "test_patch", "test_command", "verifier_timeout_sec")

    base_ref: str | None = None

    def _setup_dataset_specific(self) -> None:
        self.git_add_safe_directory()
        if self.execute("git rev-parse --is-inside-work-tree", cwd=self.repo_path,
                        timeout=60)["returncode"] != 0:
            self._checked("git init -q && git add -A && git -c user.name=mimo -c user.email=mimo@local "
                          "commit -q --allow-empty -m baseline", "git init baseline")
        self.base_ref = self._checked("git rev-parse HEAD", "rev-parse").strip().splitlines()[-1]
        self._checked(STRIP_HISTORY, "strip history", timeout=600)
        leftover = self._checked(f"git rev-list --all --not {shlex.quote(self.base_ref)}",
                                 "rev-list").strip()
        if leftover:
            raise RuntimeError("commits outside the base ref remain reachable after stripping")

    def _do_calculate_reward(self, timeout, model_patch):
        if self.base_ref is None:
            self.base_ref = self._checked("git rev-parse HEAD", "rev-parse").strip()
        patch = self.instance["test_patch"]
        try:
            self.reset_test_files_to_base(patch, self.base_ref)
        except TransportError:
            raise
        except Exception as exc:  # noqa: BLE001
            return 0.0, str(exc), {"error_category": TESTBED_CORRUPTED, "error": "reset_tests_failed"}
        # Upstream's /tmp file, in the verifier's own TMPDIR when it has one
        # (a path in the shared /tmp is the agent's to occupy first).
        patch_file = os.path.join(self.env.get_template_vars().get("tmp_dir") or "/tmp",
                                  os.path.basename(PATCH_FILE))
        try:
            self.copy_text_to(patch, patch_file)
            self._checked(f"git apply --verbose {shlex.quote(patch_file)}", "git apply")
        except TransportError:
            raise
        except Exception as exc:  # noqa: BLE001
            return 0.0, str(exc), {"error_category": TESTBED_CORRUPTED,
                                   "error": "apply_test_patch_failed"}
        command = self.instance["test_command"]
        started = time.monotonic()
        result = self.execute(command, cwd=self.repo_path,
                              timeout=timeout or self.instance["verifier_timeout_sec"])
        duration = time.monotonic() - started
        if result.get("reason") == "transport_error":
            raise TransportError("test command: transport error")
        try:
            self.reset_test_files_to_base(patch, self.base_ref)
        except TransportError:
            raise
        except Exception:  # noqa: BLE001 -- the verdict stands; the next grade resets first
            self.logger.warning("post-grade reset failed")
        passed = result["returncode"] == 0
        return (1.0 if passed else 0.0), result["output"], {
            "verifier_returncode": result["returncode"], "resolved": passed,
            "test_duration": round(duration, 3), "test_command": command}
