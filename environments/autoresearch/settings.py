"""The AutoResearch environment's settings (the ``settings`` object of its
entry in the deployment JSON). Budgets are research-sized: minutes per
command, hours per episode."""

from __future__ import annotations

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Settings:
    #: task packages (task.json and the reference solution, per task)
    packages_root: str
    #: public workspaces: one read-only lower per task (a helper lower root)
    workspaces_root: str
    #: private answers: readable by the grader's uid alone; on the helper's
    #: private_roots deny-list, so it is never a sandbox path
    private_root: str
    #: materialized-images.json holding the research image
    images: str
    image: str = "camg/demo-autoresearch"
    grader_user: str = "camg-grader"
    grader_python: str = ""  # empty: the service's own interpreter
    grade_timeout: float = 120.0
    memory_bytes: int = 4 << 30
    cpu_quota: float = 2.0
    pids_max: int = 1024
    disk_bytes: int = 4 << 30  # the sandbox's disk upper
    command_minutes: float = 30.0  # one foreground command
    background_minutes: float = 0.0  # one background job; 0: the episode's wall time
    episode_minutes: float = 240.0  # whole episode, then the next step submits
    output_bytes: int = 12000
    max_command_chars: int = 16000
    max_steps: int = 400
    max_jobs: int = 16
    helper_owner: str = "autoresearch"

    def __post_init__(self) -> None:
        for name in ("packages_root", "workspaces_root", "private_root", "images"):
            if not os.path.isabs(getattr(self, name)):
                raise ValueError(f"{name} must be an absolute path")
        roots = [
            os.path.normpath(getattr(self, n))
            for n in ("packages_root", "workspaces_root", "private_root")
        ]
        for a in roots:
            for b in roots:
                if a != b and (a + "/").startswith(b + "/"):
                    raise ValueError(f"the three roots must be separate: {a} lies in {b}")
        if len(set(roots)) != 3:
            raise ValueError("packages_root, workspaces_root and private_root must differ")
        if not 0 < self.command_minutes <= 24 * 60 or not 0 < self.episode_minutes <= 7 * 24 * 60:
            raise ValueError(
                "command_minutes and episode_minutes must be positive (at most a day and a week)"
            )
        if self.background_minutes < 0 or self.grade_timeout <= 0:
            raise ValueError("background_minutes must be >= 0 and grade_timeout positive")
        if (
            min(
                self.output_bytes,
                self.max_command_chars,
                self.max_steps,
                self.max_jobs,
                self.disk_bytes,
                self.memory_bytes,
                self.pids_max,
            )
            < 1
            or self.cpu_quota <= 0
        ):
            raise ValueError("budgets must be positive")
