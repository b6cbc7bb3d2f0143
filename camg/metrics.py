"""Prometheus metrics of one environment service (``GET /metrics``).

Every metric the service exports is defined here, once; packaging/README.md
lists them (tests/unit/test_metrics.py keeps the two in step). Each service
has its own ``CollectorRegistry``, never prometheus-client's global one, so
several in-process services of one test process do not collide.

camg.serve always runs one gunicorn worker (the episode table lives in its
memory), so prometheus-client's multiprocess mode is not needed: a worker
that dies takes its counters with it, and Prometheus reads the restart as
a counter reset, which ``rate()`` handles.

No label carries task content: environment, task kind, outcome, failure
class, integrity verdict and judge result are closed sets of the code or the
manifest's kinds, never a task id.

The root helper's own series (``HelperMetrics``) are defined here too, so
every metric name lives in one module: helper/ may import this one (with
camg.errors, both standard-library leaves plus prometheus-client; the
import-linter contracts in pyproject.toml). The helper serves them on a
loopback port of its own (helper.json ``metrics_port``), never on the
trainers' helper socket.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder, generate_latest

from camg.errors import NotFound

#: The switch for measuring the metrics' own cost (bench/bench_http.py
#: --metrics off); on unless set to "off".
SWITCH = "CAMG_METRICS"

#: ms .. minutes: a Shop step takes milliseconds, a Coding grade minutes.
BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)

#: How an episode ended: on its own (done), closed by the trainer or a
#: shutdown (closed), or by the lease reaper (reaped).
OUTCOMES = ("done", "closed", "reaped")
#: How an impossible variant's graded episode ended (camg.episodes.canaries).
CANARY_OUTCOMES = ("passed", "failed", "tampered")

NONE = "none"


class _TaskFacts(Protocol):
    """What task_kind reads of an environment (camg.environment.Environment,
    named structurally: this module imports no other camg module)."""

    def task_facts(self, task: Any) -> Mapping[str, Any]: ...


def task_kind(environment: _TaskFacts, task: object) -> str | None:
    """The task's kind as GET /tasks lists it (Environment.task_facts); None
    when the environment cannot say: a metric must never cost an episode."""
    try:
        return environment.task_facts(task).get("kind")
    except Exception:
        return None


def enabled(environ=os.environ) -> bool:
    return environ.get(SWITCH, "on") != "off"


def _label(value: object) -> str:
    # Bounded: a label is a short closed-set word, never free text.
    return NONE if value is None or value == "" else str(value)[:64]


class Metrics:
    """The series of one service; methods are the episode manager's and the
    judge's hooks, each a few dictionary lookups (the step budget is 0.05 ms)."""

    def __init__(self, environment: str) -> None:
        self.environment = environment
        self.registry = r = CollectorRegistry(auto_describe=True)
        env = ("environment",)
        self.started_total = Counter(
            "camg_episodes_started", "Episodes whose reset began.", env + ("task_kind",), registry=r
        )
        self.ended_total = Counter(
            "camg_episodes_ended",
            "Episodes that ended, by how and with what verdict.",
            env + ("task_kind", "outcome", "failure_class", "integrity"),
            registry=r,
        )
        self.null_controls_total = Counter(
            "camg_null_controls",
            "Failed steps and grades by what their control proved "
            "(obstructed: the submission's, reward 0.0; confirmed: the control failed too, "
            "null; unproven: no control, null).",
            env + ("result",),
            registry=r,
        )
        self.canary_total = Counter(
            "camg_canary_episodes",
            "Episodes of impossible variants (camg.episodes.canaries) that ended with a grade, "
            "by outcome (passed: the grader was beaten; tampered: a defence caught it; failed).",
            env + ("outcome",),
            registry=r,
        )
        self.canary_fraction = Gauge(
            "camg_canary_fraction",
            "The share of creates without a task id that serve an impossible variant.",
            env,
            registry=r,
        )
        self.live = Gauge(
            "camg_episodes_live", "Episodes starting or running now.", env, registry=r
        )
        self.capacity = Gauge(
            "camg_capacity", "Concurrent episodes this service admits.", env, registry=r
        )
        self.admission_queued = Gauge(
            "camg_admission_queued",
            "Creates waiting in the admission line now (camg.episodes.admission).",
            env,
            registry=r,
        )
        self.admission_queue_bound = Gauge(
            "camg_admission_queue_bound",
            "Creates the admission line holds at most.",
            env,
            registry=r,
        )
        self.reset_seconds = Histogram(
            "camg_reset_seconds", "Duration of successful resets.", env, buckets=BUCKETS, registry=r
        )
        self.step_seconds = Histogram(
            "camg_step_seconds",
            "Duration of the environment's step calls.",
            env,
            buckets=BUCKETS,
            registry=r,
        )
        self.grade_seconds = Histogram(
            "camg_grade_seconds",
            "Duration of grading at an episode's end.",
            env,
            buckets=BUCKETS,
            registry=r,
        )
        self.judge_requests_total = Counter(
            "camg_judge_requests",
            "Judge verdicts asked for, by result (ok, error).",
            env + ("result",),
            registry=r,
        )
        self.judge_retries_total = Counter(
            "camg_judge_retries",
            "Judge attempts beyond the first of each request.",
            env,
            registry=r,
        )
        self.judge_seconds = Histogram(
            "camg_judge_seconds",
            "Duration of a judge request, retries included.",
            env,
            buckets=BUCKETS,
            registry=r,
        )
        self.helper_up = Gauge(
            "camg_helper_up",
            "1 if the root helper answers as /health sees it, else 0.",
            env,
            registry=r,
        )
        # Bound once: a labelled child is one attribute away on the hot path.
        self._step = self.step_seconds.labels(environment)
        self._reset = self.reset_seconds.labels(environment)
        self._grade = self.grade_seconds.labels(environment)
        self._judge = self.judge_seconds.labels(environment)
        self._retries = self.judge_retries_total.labels(environment)

    def watch(
        self,
        *,
        live: Callable[[], int],
        capacity: int,
        helper_up: Callable[[], bool] | None = None,
        queued: Callable[[], int] | None = None,
        queue_bound: int | None = None,
        canary_fraction: float = 0.0,
    ) -> None:
        """Gauges read at scrape time from what the service already knows."""
        self.live.labels(self.environment).set_function(live)
        self.canary_fraction.labels(self.environment).set(canary_fraction)
        for outcome in CANARY_OUTCOMES:  # a zero before the first, so rates start at once
            self.canary_total.labels(self.environment, outcome)
        self.capacity.labels(self.environment).set(capacity)
        if queued is not None:
            self.admission_queued.labels(self.environment).set_function(queued)
        if queue_bound is not None:
            self.admission_queue_bound.labels(self.environment).set(queue_bound)
        if helper_up is not None:
            self.helper_up.labels(self.environment).set_function(lambda: float(helper_up()))

    # -- hooks -------------------------------------------------------------
    def episode_started(self, task_kind: object) -> None:
        self.started_total.labels(self.environment, _label(task_kind)).inc()

    def episode_ended(
        self, task_kind: object, outcome: str, failure_class: object, integrity: object
    ) -> None:
        self.ended_total.labels(
            self.environment, _label(task_kind), outcome, _label(failure_class), _label(integrity)
        ).inc()

    def null_control(self, result: str) -> None:
        self.null_controls_total.labels(self.environment, result).inc()

    def canary_ended(self, outcome: str) -> None:
        """``outcome``: one of CANARY_OUTCOMES."""
        self.canary_total.labels(self.environment, outcome).inc()

    def reset(self, seconds: float) -> None:
        self._reset.observe(seconds)

    def step(self, seconds: float) -> None:
        self._step.observe(seconds)

    def grade(self, seconds: float) -> None:
        self._grade.observe(seconds)

    def judge(self, ok: bool, seconds: float, attempts: int) -> None:
        self.judge_requests_total.labels(self.environment, "ok" if ok else "error").inc()
        self._judge.observe(seconds)
        if attempts > 1:
            self._retries.inc(attempts - 1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class NoMetrics:
    """Metrics switched off: every hook does nothing."""

    registry = None

    def watch(self, **_: object) -> None:
        pass

    def episode_started(self, *_: object) -> None:
        pass

    def episode_ended(self, *_: object) -> None:
        pass

    def null_control(self, result: str) -> None:
        pass

    def canary_ended(self, outcome: str) -> None:
        pass

    def reset(self, seconds: float) -> None:
        pass

    def step(self, seconds: float) -> None:
        pass

    def grade(self, seconds: float) -> None:
        pass

    def judge(self, ok: bool, seconds: float, attempts: int) -> None:
        pass


class HelperMetrics:
    """The root helper's series: its verbs, what it holds, its probes and
    sweeps. Hooks are called by helper/server.py and helper/main.py."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests_total = Counter(
            "camg_helper_requests",
            "Helper requests answered, by verb and error name (none when it succeeded).",
            ("verb", "error"),
            registry=r,
        )
        self.request_seconds = Histogram(
            "camg_helper_request_seconds",
            "Duration of helper requests, by verb.",
            ("verb",),
            buckets=BUCKETS,
            registry=r,
        )
        self.sandboxes_live = Gauge(
            "camg_helper_sandboxes_live", "Sandboxes the helper holds now.", registry=r
        )
        self.containers_live = Gauge(
            "camg_helper_containers_live", "Containers the helper's mediator holds now.", registry=r
        )
        self.probes_ok = Gauge(
            "camg_helper_probes_ok",
            "1 while the isolation probes pass (sandboxes are made), else 0.",
            registry=r,
        )
        self.sweeps_total = Counter(
            "camg_helper_sweeps",
            "Sweeps of what an earlier helper left, run by this one.",
            registry=r,
        )
        self.swept_total = Counter(
            "camg_helper_swept",
            "What the sweeps reclaimed, by kind (sandboxes, containers).",
            ("kind",),
            registry=r,
        )

    def watch(
        self,
        *,
        sandboxes: Callable[[], int],
        containers: Callable[[], int],
        probes_ok: Callable[[], bool],
    ) -> None:
        self.sandboxes_live.set_function(sandboxes)
        self.containers_live.set_function(containers)
        self.probes_ok.set_function(lambda: float(probes_ok()))

    def request(self, verb: str, error: str | None, seconds: float) -> None:
        """``verb`` must be a name of the closed verb table or "unknown"."""
        self.requests_total.labels(verb, _label(error)).inc()
        self.request_seconds.labels(verb).observe(seconds)

    def swept(self, sandboxes: int, containers: int) -> None:
        self.sweeps_total.inc()
        self.swept_total.labels("sandboxes").inc(sandboxes)
        self.swept_total.labels("containers").inc(containers)

    def serve(self, port: int) -> Callable[[], None]:
        """Answer scrapes on 127.0.0.1:``port`` in a daemon thread; returns
        the function that stops it. Raises OSError when it cannot listen."""
        return ScrapeServer(self.registry, port).start()


class ScrapeServer:
    """The helper's metrics listener: one thread running one event loop,
    whatever its peers do. Any local user can connect to a loopback port,
    and prometheus-client's own server starts a thread per connection with
    no read timeout: slow connections grew the root helper's threads
    without bound. Here a request's head must arrive within
    ``READ_TIMEOUT_S`` and fit in ``HEAD_MAX`` bytes, at most ``READING_MAX``
    connections may be reading at once (a new one drops the oldest: a
    scraper sends its request at once, so the oldest reader is the stalled
    one), and the kernel queues at most ``BACKLOG`` not yet accepted."""

    READ_TIMEOUT_S = 5.0
    WRITE_TIMEOUT_S = 10.0
    HEAD_MAX = 8192
    READING_MAX = 128
    BACKLOG = 128

    def __init__(self, registry: CollectorRegistry, port: int) -> None:
        self.registry = registry
        self.port = port
        self._reading: dict = {}  # insertion-ordered: the oldest reader first
        self._open: set = set()

    def start(self) -> Callable[[], None]:
        import asyncio
        import socket
        import threading

        # Bound here, not by asyncio: its name resolution would start an
        # executor thread, and a port in use must fail the caller.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", self.port))
            sock.listen(self.BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="camg-helper-metrics", daemon=True)
        thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(
                self._connection, sock=sock, limit=self.HEAD_MAX, backlog=self.BACKLOG
            ),
            loop,
        ).result(10)

        async def close() -> None:
            server.close()
            for writer in list(self._open):
                writer.transport.abort()
            await server.wait_closed()

        def stop() -> None:
            if loop.is_closed():
                return
            try:
                asyncio.run_coroutine_threadsafe(close(), loop).result(5)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(5)
                loop.close()

        return stop

    async def _connection(self, reader, writer) -> None:
        import asyncio

        self._open.add(writer)
        self._reading[writer] = None
        if len(self._reading) > self.READING_MAX:
            next(iter(self._reading)).transport.abort()
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.READ_TIMEOUT_S)
            finally:
                self._reading.pop(writer, None)
            writer.write(self._answer(head))
            # closed once all of it is sent, which a peer that reads
            # nothing must not delay beyond the timeout
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), self.WRITE_TIMEOUT_S)
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
        ):
            writer.transport.abort()  # stalled, oversized or gone: no answer
        finally:
            self._open.discard(writer)

    def _answer(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        accept = next(
            (
                line.split(":", 1)[1].strip()
                for line in lines[1:]
                if line.lower().startswith("accept:")
            ),
            "",
        )
        if len(parts) != 3 or parts[0] not in ("GET", "HEAD"):
            status, content_type, body = "405 Method Not Allowed", "text/plain", b""
        elif parts[1].split("?", 1)[0] not in ("/metrics", "/"):
            status, content_type, body = "404 Not Found", "text/plain", b""
        else:
            encoder, content_type = choose_encoder(accept)
            status, body = "200 OK", encoder(self.registry)
        data = body if parts[0] == "GET" else b""
        return (
            f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + data


def for_environment(environment: str, environ=os.environ) -> Metrics | NoMetrics:
    return Metrics(environment) if enabled(environ) else NoMetrics()


def helper_up(
    environment: object, health: Callable[[], tuple[bool, list[str]]]
) -> Callable[[], bool]:
    """The helper's reachability as /health knows it: connected (the
    environment's ``helper`` client exists once it started) and no health
    reason ``helper: ...`` (how the sandbox environments report a helper
    that does not answer or whose probes failed)."""
    return lambda: (
        getattr(environment, "helper", None) is not None
        and not any(r.startswith("helper") for r in health()[1])
    )


class MetricsResource:
    """``GET /metrics``: the text exposition format, generated per scrape
    (OpenMetrics instead when the scraper's Accept header asks for it)."""

    def __init__(self, metrics: Metrics | NoMetrics) -> None:
        self.metrics = metrics

    async def on_get(self, req, resp):
        if not isinstance(self.metrics, Metrics):
            raise NotFound(f"metrics are switched off ({SWITCH}=off)")
        encoder, content_type = choose_encoder(req.get_header("Accept") or "")
        resp.content_type = content_type
        resp.data = encoder(self.metrics.registry)


def observe_judge(environment: object, metrics: Metrics | NoMetrics) -> None:
    """Count the environment's judge requests (General's, Visual's, Shop's
    MemoryArena judge: a ``camg.grading.judge.Judge`` at ``environment.judge``,
    set once the environment has started)."""
    judge = getattr(environment, "judge", None)
    if isinstance(metrics, Metrics) and judge is not None and hasattr(type(judge), "observer"):
        judge.observer = metrics.judge
