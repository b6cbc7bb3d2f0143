"""The General environment's settings (the deployment's ``settings`` object).

Credentials are never settings: the judge's URL, model and key come from the
service's environment under ``judge_env`` (GA_JUDGE_URL/MODEL/KEY, optional
GA_JUDGE_API), which camg.configure refuses to write anywhere.
"""

from __future__ import annotations

import dataclasses
import re

_PREFIX = re.compile(r"[A-Z][A-Z0-9_]{0,31}")


@dataclasses.dataclass(frozen=True)
class Settings:
    helper_owner: str = "general"
    #: started, never-used containers kept per image (0: create on reset)
    pool_size: int = 2
    cpu: float = 1.0
    memory_bytes: int = 2 << 30
    pids_max: int = 512
    #: how long reset waits for the transport to listen (pool misses boot a container)
    connect_timeout_s: float = 60.0
    #: pool misses booting a container at once, through the transport's
    #: setup (why: environments/general/README.md); 0: environment.boot_limit
    concurrent_boots: int = 0
    #: how long a reset waits for a boot slot; then it fails at_capacity
    #: (errors.AtCapacity). Below the service's reset deadline
    #: (limits.reset_timeout_s, 300 s by default), which bounds the wait too.
    boot_wait_s: float = 240.0
    #: a shell/tool step is bounded by the transport (60 s); this bounds the
    #: service's wait for any message, finish (the verifier) included
    step_timeout_s: float = 1900.0
    judge_env: str = "GA_JUDGE"
    judge_timeout_s: float = 180.0
    judge_attempts: int = 4
    judge_backoff_s: float = 2.0
    #: the whole judging of one episode, retries included
    judge_deadline_s: float = 600.0
    #: upstream's REWARD_BINARIZE: 1 iff the rubric score reaches 1 - 1e-6
    binarize: bool = False
    #: the most an opensource-code grade the code screen flags earns
    #: (integrity "suspicious", camg/grading/code_screen.py)
    suspicious_reward: float = 0.0

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", self.helper_owner):
            raise ValueError("helper_owner must be a short lowercase name")
        if not 0 <= self.pool_size <= 64:
            raise ValueError("pool_size must be in [0, 64]")
        if not (0 < self.cpu <= 64 and self.memory_bytes >= 64 << 20 and self.pids_max >= 16):
            raise ValueError("cpu, memory_bytes (>= 64 MiB) and pids_max (>= 16) must be sane")
        if isinstance(self.concurrent_boots, bool) or not 0 <= self.concurrent_boots <= 1024:
            raise ValueError("concurrent_boots must be in [0, 1024] (0: 4 per core)")
        for name in (
            "connect_timeout_s",
            "step_timeout_s",
            "judge_timeout_s",
            "judge_deadline_s",
            "boot_wait_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 1 <= self.judge_attempts <= 10 or self.judge_backoff_s < 0:
            raise ValueError("judge_attempts must be in [1, 10], judge_backoff_s >= 0")
        if isinstance(self.suspicious_reward, bool) or not 0.0 <= self.suspicious_reward <= 1.0:
            raise ValueError("suspicious_reward must be a number in [0, 1]")
        if not _PREFIX.fullmatch(self.judge_env):
            raise ValueError("judge_env must be an environment-variable prefix like GA_JUDGE")
