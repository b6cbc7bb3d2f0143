"""The Visual environment's settings (the ``settings`` object of its entry in
the deployment JSON). Paths of the renderer tree and the CDN mirror are not
settings: they are manifest files (``renderer``, ``cdn_mirror``) that
camg.configure hashes and camg.serve re-verifies."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Settings:
    # The agent's task container (seed 001's rules; upstream: 2 CPU / 2 Gi).
    cpu: float = 2.0
    memory_bytes: int = 2 << 30
    pids_max: int = 1024
    pool_size: int = 2
    command_timeout: float = 60.0
    output_bytes: int = 12000
    max_command_chars: int = 16000
    max_steps: int = 64
    # The renderer sandbox (upstream's shot timeout is 150 s; keep the
    # deployment's limits.action_timeout_s above render_timeout + 30).
    render_timeout: float = 150.0
    render_memory_bytes: int = 1536 << 20
    render_cpu: float = 1.0
    render_pids_max: int = 512
    dist_bytes: int = 48 << 20
    # The judge (upstream's webdev eval client: temperature 1.0, 180 s per
    # call, 4 attempts with backoff, /v1 appended, "openai/" stripped).
    judge_temperature: float = 1.0
    judge_timeout_s: float = 180.0
    judge_attempts: int = 4
    judge_backoff_s: float = 3.0
    judge_env_prefix: str = "WD_JUDGE"
    # Where screenshots are kept, relative to the service's state dir.
    screenshots_dir: str = "screenshots"
    helper_owner: str = "visual"

    def __post_init__(self) -> None:
        if not 0 < self.command_timeout <= 3600 or not 0 < self.render_timeout <= 3600:
            raise ValueError("timeouts must be in (0, 3600]")
        if (
            min(
                self.max_steps,
                self.output_bytes,
                self.max_command_chars,
                self.pids_max,
                self.render_pids_max,
            )
            < 1
            or self.pool_size < 0
        ):
            raise ValueError("counts and sizes must be positive")
        if (
            self.cpu <= 0
            or self.render_cpu <= 0
            or self.memory_bytes < 64 << 20
            or self.render_memory_bytes < 256 << 20
        ):
            raise ValueError("cpu must be positive; memory at least 64 MiB (render: 256 MiB)")
        if "/" in self.screenshots_dir or self.screenshots_dir in ("", ".", ".."):
            raise ValueError("screenshots_dir must be a plain directory name")
        if self.judge_env_prefix not in ("WD_JUDGE",) and not self.judge_env_prefix.isidentifier():
            raise ValueError("judge_env_prefix must be an identifier")
