"""One running environment service: the environment, its episode manager,
its outcome log, and the background duties (lease reaper, watchdog,
STATUS=) that keep systemd informed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Mapping
from typing import Any

import camg
from camg import metrics
from camg.config.service_config import ServiceConfig
from camg.environment import Environment
from camg.episodes import signing
from camg.episodes.manager import EpisodeManager
from camg.episodes.outcomes import OutcomeLog
from camg.serving.notify import Notifier
from camg.web import auth

log = logging.getLogger("camg.service")


def raise_fd_limit(want: int = 1 << 16) -> None:
    """Soft RLIMIT_NOFILE up to the hard limit (no privilege needed).

    systemd's soft default is 1024; at the default capacity every episode
    can hold a trainer connection and a helper connection at once.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class Service:
    def __init__(
        self, config: ServiceConfig, environment: Environment, notifier: Notifier | None = None
    ) -> None:
        self.config = config
        self.env = environment
        self.notifier = notifier or Notifier()
        key = config.outcome_key
        self.signer = signing.Signer.load(key.path, expect=key.fingerprint)
        self.outcomes = OutcomeLog(
            config.state_dir,
            signer=self.signer,
            stamp={"task_selection_hash": config.task_selection_hash},
        )
        # Episodes a killed predecessor left running end here, masked.
        for episode_id in self.outcomes.recover(environment.name, config.config_hash):
            log.warning("episode %s ended with the previous process: recorded as infra", episode_id)
        self.metrics = metrics.for_environment(environment.name)
        self.manager = EpisodeManager(
            environment,
            capacity=config.capacity,
            limits=config.limits,
            config_hash=config.config_hash,
            outcomes=self.outcomes,
            on_change=self._status,
            metrics=self.metrics,
            queue_bound=config.queue_bound,
            canary_fraction=config.canary_fraction,
        )
        admission = self.manager.admission
        self.metrics.watch(
            live=self.manager.active,
            capacity=config.capacity,
            # only environments that talk to the helper have one to report
            helper_up=metrics.helper_up(environment, self.health)
            if hasattr(environment, "helper")
            else None,
            queued=lambda: admission.counts()["queued"],
            queue_bound=admission.bound,
            canary_fraction=config.canary_fraction,
        )
        #: the trainers whose tokens the HTTP gate accepts (None: authentication off)
        self.tokens = auth.TokenStore(config.auth.trainers) if config.auth.required else None
        self._tasks: list[asyncio.Task] = []
        self.started = False

    async def start(self) -> None:
        raise_fd_limit()
        self.env.start_in_only_thread()
        # Environment start-up (JVMs, indexes, helper connection) blocks.
        await self.manager.threads.run(self.env.start)
        metrics.observe_judge(self.env, self.metrics)
        self._tasks.append(asyncio.create_task(self._reaper()))
        if self.notifier.watchdog_interval:
            self._tasks.append(asyncio.create_task(self._watchdog()))
        self.started = True
        log.info(
            "serving %s on %s:%d (%d tasks, capacity %d)",
            self.env.name,
            self.config.host,
            self.config.port,
            len(self.env.tasks),
            self.config.capacity,
        )
        self.notifier.ready(self._status_text())

    async def stop(self) -> None:
        self.notifier.stopping()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.manager.shutdown()
        try:
            self.env.stop()
        finally:
            self.outcomes.close()
        log.info("stopped")

    def _status_text(self) -> str:
        counts = self.manager.counts()
        return (
            f"{counts['active']}/{counts['capacity']} episodes active, "
            f"{counts['finished']} finished"
        )

    def _status(self) -> None:
        self.notifier.status(self._status_text())

    async def _reaper(self) -> None:
        interval = max(0.05, min(5.0, self.config.limits.idle_ttl_s / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.manager.reap()
            except Exception:  # keep reaping; one bad episode must not stop it
                log.exception("lease reaper failed")

    async def _watchdog(self) -> None:
        # Sent from the event loop: a wedged loop stops the pings and
        # systemd restarts us.
        interval = self.notifier.watchdog_interval
        assert interval is not None  # started only when systemd set a watchdog interval
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(interval)

    def health(self) -> tuple[bool, list[str]]:
        healthy, reasons, _ = self.health_report()
        return healthy, reasons

    def health_report(self) -> tuple[bool, list[str], bool]:
        """(healthy, reasons, serving): serving while only recent unproven
        nulls degrade it."""
        blocking = self.blocking_reasons()
        reasons = blocking + self.manager.null_proof.health()
        return not reasons, reasons, not blocking

    def blocking_reasons(self) -> list[str]:
        """Why the service cannot take episodes now: every health reason but
        recent unproven nulls, which say its grading path failed a while ago
        (the service degraded for DEGRADED_FOR_S) and not that it fails now."""
        reasons = [] if self.started else ["starting"]
        try:
            reasons += list(self.env.health())
        except Exception as exc:
            reasons.append(f"health check failed: {exc}")
        if self.tokens is not None:
            if self.tokens.error is not None:
                reasons.append(self.tokens.error)
            elif self.tokens.count() == 0:
                reasons.append(
                    f"authentication is on and no trainer holds a token in "
                    f"{self.config.auth.trainers} (camg trainer add NAME)"
                )
        return reasons

    def auth_summary(self) -> str:
        """What /health and camg status show of the authentication setting."""
        return "off" if self.tokens is None else "tokens"

    def metadata(self) -> Mapping[str, Any]:
        c = self.config
        return {
            "environment": self.env.name,
            "version": camg.__version__,
            "source_commit": c.source_commit,
            "config_hash": c.config_hash,
            "task_selection_hash": c.task_selection_hash,
            "task_count": len(self.env.tasks),
            "capacity": c.capacity,
            "admission": self.manager.admission.counts(),  # queued, queue_bound
            "references": c.references,
            # impossible variants: the mix fraction and how many (camg.config.variants)
            "canaries": self.manager.mix.describe(),
            "auth": self.auth_summary(),
            "outcome_signing": signing.describe(self.signer.public),
            "limits": {k: getattr(c.limits, k) for k in c.limits.__dataclass_fields__},
            "hashes": {
                "manifest": c.manifest.sha256,
                "runtime_lock": c.runtime_lock.sha256,
                **{f"executable:{k}": v.sha256 for k, v in c.executables.items()},
                **dict(self.env.metadata()),
            },
        }
