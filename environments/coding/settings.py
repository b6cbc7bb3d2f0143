"""The Coding environment's settings (the ``settings`` object of its entry in
the deployment JSON)."""

from __future__ import annotations

import dataclasses
import os
import re


@dataclasses.dataclass(frozen=True)
class Settings:
    mirrors_root: str
    images: str  # materialized-images.json
    layers_root: str = "/var/lib/camg/task-layers/coding"
    memory_bytes: int = 4 << 30
    cpu_quota: float = 1.0
    pids_max: int = 1024
    command_timeout: float = 60.0
    output_bytes: int = 12000
    max_command_chars: int = 16000
    max_steps: int = 64
    grade_timeout: float = 0.0  # 0: the profile's own timeout
    #: the owner name of this service's sandboxes on the helper; "" (the
    #: default): the service's environment name, as the unit's ExecStopPost=
    #: release-all uses, so two services on one helper never share it
    helper_owner: str = ""
    #: what a resolved submission the code screen flags earns (integrity
    #: "suspicious", camg/grading/code_screen.py): 0.0 pays nothing for a fix that
    #: reaches for frames, exit hooks or the import system; 1.0 trusts the tests
    suspicious_reward: float = 0.0

    def __post_init__(self) -> None:
        for name in ("mirrors_root", "images", "layers_root"):
            if not os.path.isabs(getattr(self, name)):
                raise ValueError(f"{name} must be an absolute path")
        if not 0 < self.command_timeout <= 3600 or self.grade_timeout < 0:
            raise ValueError("timeouts must be positive")
        if self.max_steps < 1 or self.output_bytes < 1 or self.max_command_chars < 1:
            raise ValueError("max_steps, output_bytes and max_command_chars must be positive")
        if self.helper_owner and not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", self.helper_owner):
            raise ValueError("helper_owner must be a short lowercase name")
        if isinstance(self.suspicious_reward, bool) or not 0.0 <= self.suspicious_reward <= 1.0:
            raise ValueError("suspicious_reward must be a number in [0, 1]")
