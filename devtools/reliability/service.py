"""One real ``python -m camg.serve`` process of a target, on the rig's helper."""

from __future__ import annotations

import contextlib
import signal
import tempfile
from pathlib import Path

from camg.sandboxes.census import children_of
from devtools.reliability.rig import Helper, rss_kib
from devtools.reliability.targets import Target, configure


class Prepared:
    """A target's preparation, done once per run and shared by its suites."""

    def __init__(self, target: Target, helper: Helper, work: Path, rig=None) -> None:
        self.target = target
        self.helper = helper
        self.work = work
        #: devtools.reliability.rigged.Rig of a target with a helper of its own
        self.rig = rig
        work.mkdir(parents=True, exist_ok=True)
        self.result = rig.prepared if rig else target.prepare(work / "prepared-data", helper.socket)
        self.count = 0

    @contextlib.contextmanager
    def serve(self, *, capacity: int | None, limits: dict, ready_timeout: float = 600):
        from devtools.harness.services import ServiceProcess
        self.count += 1
        work = Path(tempfile.mkdtemp(prefix=f"svc{self.count}-", dir=self.work))
        if self.rig is not None:
            limits = {**self.rig.limits, **limits}
        config = configure(self.target, work, self.result, self.helper.socket,
                           capacity=capacity, limits=limits)
        if self.rig is not None and self.rig.pre_serve is not None:
            self.rig.pre_serve(config)
        service = ServiceProcess(config, env=self.rig.env if self.rig else None)
        self._replacements = []
        try:
            service.wait_ready(timeout=ready_timeout)
            yield service
        finally:
            # SIGTERM: the graceful path (episodes closed, sandboxes released).
            for each in [service, *self._replacements]:
                each.stop(signal.SIGTERM)

    def restart(self, service, ready_timeout: float = 600):
        """What the unit's Restart= does for a service that stopped itself
        (AutoResearch stops when its worker or grader dies): its
        ExecStartPre= (the rig's pre_serve: --check-clean) and a new process
        on the same config, stopped with the ``serve`` it replaces."""
        from devtools.harness.services import ServiceProcess
        service.stop(signal.SIGTERM)
        if self.rig is not None and self.rig.pre_serve is not None:
            self.rig.pre_serve(service.config_path)
        again = ServiceProcess(service.config_path, env=self.rig.env if self.rig else None)
        self._replacements.append(again)
        return again.wait_ready(timeout=ready_timeout)


def service_rss_kib(service) -> int:
    """Peak RSS of the service: gunicorn's arbiter plus its worker."""
    pids = {service.proc.pid} | children_of({service.proc.pid})
    return sum(rss_kib(pid, "VmHWM") for pid in pids)
