"""The trainer's clients for the camg HTTP contract.

``Client`` is synchronous, standard library only, one persistent keep-alive
connection per client (use one client per thread). ``AsyncClient`` is the
asyncio twin over httpx (one pooled client for many concurrent episodes).
Both wait out 429 with the service's Retry-After where asked, resend only
retry-safe requests (reads, closes, steps with a ``request_id``, which the
service de-duplicates), and raise a ``ServiceError`` subclass named for the
service's error (``AtCapacity``, ``EpisodeDone``, ``InvalidAction`` …), so
a trainer can tell "retry later" from its own bug. ``load_routes`` reads the
``routes.json`` camg.configure writes.

``Client`` needs nothing beyond the standard library; ``AsyncClient`` needs
httpx (``pip install 'camg-client[async]'``). Nothing here imports the
services.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any, overload

from camg_client import token as tokens
from camg_client.transport import Connection

# Below the service's keep-alive (5 s, camg.serve): reconnect before reusing
# a connection the server may already have closed.
_IDLE_RECONNECT = 4.0


class ServiceError(Exception):
    """An error answer; ``name`` is the service's error name."""

    def __new__(cls, status: int, body: Any, retry_after: float | None = None):
        # Any JSON value: whatever the body holds is looked up as it is.
        name: Any = body.get("error") if isinstance(body, dict) else None
        if cls is ServiceError:
            cls = ERROR_CLASSES.get(name, ServiceError)
        return super().__new__(cls)

    def __init__(self, status: int, body: Any, retry_after: float | None = None) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after
        name = body.get("error") if isinstance(body, dict) else None
        self.name = name or f"http_{status}"
        message = body.get("message") if isinstance(body, dict) else body
        self.failure_class = body.get("failure_class") if isinstance(body, dict) else None
        super().__init__(f"{status} {self.name}: {message}")


class BadRequest(ServiceError):
    """bad_request, payload_too_large: the request itself is wrong."""


class InvalidAction(BadRequest):
    """invalid_action: the action does not fit /schema; nothing changed."""


class Unauthorized(ServiceError):
    """unauthorized (401): no token, or one the service does not know
    (see camg_client.token for where a client finds its token)."""


class PermissionDenied(ServiceError):
    """permission_denied, e.g. references not enabled by the deployment."""


class NotFound(ServiceError):
    """not_found, episode_not_found, task_not_found."""


class Conflict(ServiceError):
    """conflict (409): the episode is not in a state that allows this."""


class EpisodeExists(Conflict):
    """episode_exists: a create with an ``episode_id`` already in use."""


class EpisodeBusy(Conflict):
    """episode_busy: a step is already running on the episode."""


class EpisodeDone(Conflict):
    """episode_done: the body's ``details.terminal`` is the sticky answer."""


class EpisodeRunning(Conflict):
    """episode_running: a regrade of an episode that has not ended yet."""


class NotForkable(Conflict):
    """not_forkable: the episode cannot be forked now, or its environment
    cannot carry some of its state (``details.what`` names it)."""


class NoSubmission(Conflict):
    """no_submission: the episode ended before it submitted, or its stored
    submission was evicted; nothing to regrade."""


class RegradeUnsupported(ServiceError):
    """regrade_unsupported (501): this environment cannot regrade."""


class AtCapacity(ServiceError):
    """at_capacity (429): retry after ``retry_after`` seconds."""


class Unavailable(ServiceError):
    """unavailable, or an infrastructure failure of a reset (``failure_class``)."""


class ServerError(ServiceError):
    """error, config_error, preparation_missing, dataset_error (500): the
    service's own fault (its deployment or data), not the request's."""


#: Every error name of the service's taxonomy (camg/errors.py) and the class
#: it raises here; tests/unit/test_client_errors.py fails on a name missing.
ERROR_CLASSES: dict[str, type[ServiceError]] = {
    "bad_request": BadRequest,
    "payload_too_large": BadRequest,
    "invalid_action": InvalidAction,
    "permission_denied": PermissionDenied,
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "episode_not_found": NotFound,
    "task_not_found": NotFound,
    "conflict": Conflict,
    "episode_exists": EpisodeExists,
    "episode_busy": EpisodeBusy,
    "episode_done": EpisodeDone,
    "episode_running": EpisodeRunning,
    "no_submission": NoSubmission,
    "not_forkable": NotForkable,
    "regrade_unsupported": RegradeUnsupported,
    "at_capacity": AtCapacity,
    "unavailable": Unavailable,
    "infra": Unavailable,
    "sandbox_died": Unavailable,
    "grader_error": Unavailable,
    "judge_error": Unavailable,
    "timeout": Unavailable,
    "render_error": Unavailable,
    "error": ServerError,
    "config_error": ServerError,
    "preparation_missing": ServerError,
    "dataset_error": ServerError,
}


def load_routes(path: str) -> dict[str, str]:
    """``{environment: "http://127.0.0.1:PORT"}`` from camg.configure's routes.json."""
    with open(path, encoding="utf-8") as handle:
        routes = json.load(handle)
    if not isinstance(routes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in routes.items()
    ):
        raise ValueError(f"{path}: not a routes.json (an object of environment -> URL)")
    return routes


def _step_body(action: dict, request_id: str | None) -> dict:
    # Always de-duplicated server-side, so a resend after a dropped
    # connection can never run the action twice.
    return {"action": action, "request_id": request_id or uuid.uuid4().hex}


def _tasks_path(offset: int, limit: int | None) -> str:
    query = {"offset": offset, **({"limit": limit} if limit is not None else {})}
    return "/tasks?" + urllib.parse.urlencode(query)


def _next_offset(offset: int, page: dict) -> int | None:
    # A page that does not move forward would page forever.
    following = page["next_offset"]
    if following is not None and following <= offset:
        raise ValueError(f"/tasks at offset {offset} answered next_offset {following}")
    return following


def _create_body(
    task_id: str | None,
    seed: int | None,
    episode_id: str | None,
    group: int | None = None,
    variant: str | None = None,
) -> dict:
    return {
        k: v
        for k, v in (
            ("task_id", task_id),
            ("seed", seed),
            ("episode_id", episode_id),
            ("group", group),
            ("variant", variant),
        )
        if v is not None
    }


def _created(body: dict, group: int | None) -> dict | list[dict]:
    """A create's answer: the episode, or with ``group`` its N episodes."""
    return body if group is None else list(body["group"])


# The most a service lets a create wait in its line (camg.web.http_wire.WAIT_MAX_S;
# the client does not import the services).
_WAIT_MAX_S = 600.0


def _with_wait(body: dict, deadline: float) -> dict:
    """The create body asking the service to queue us for what is left of
    the wait: the service hands a freed slot to the oldest waiter, which a
    client sleeping between retries would never be."""
    left = min(_WAIT_MAX_S, deadline - time.monotonic())
    return {**body, "wait_s": round(left, 3)} if left >= 0.001 else body


class Client:
    def __init__(self, base_url: str, timeout: float = 3600.0, token: str | None = None) -> None:
        """``token``: the trainer's (default: camg_client.token's search)."""
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self.host, self.port = url.hostname, url.port or 80
        self.timeout = timeout
        self.headers = tokens.header(tokens.resolve(token))
        self._conn: Connection | None = None
        self._last_used = 0.0

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = None if body is None else json.dumps(body).encode()
        # A request is resent after a dropped connection only when running it
        # twice is harmless: reads, closes, and steps carrying a request_id.
        retry_safe = method in ("GET", "DELETE") or (
            isinstance(body, dict) and "request_id" in body
        )
        if self._conn is not None and time.monotonic() - self._last_used > _IDLE_RECONNECT:
            # The service drops idle keep-alive connections; don't find out
            # by losing a non-idempotent request on one.
            self.close_connection()
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = Connection(self.host, self.port, self.timeout, self.headers)
            try:
                response = self._conn.request(method, path, payload)
                raw = response.body
                break
            except ConnectionError:
                self.close_connection()
                if attempt == 2 or not retry_safe:
                    raise
        self._last_used = time.monotonic()
        data = json.loads(raw) if raw else None
        if response.status >= 400:
            retry = response.getheader("Retry-After")
            raise ServiceError(response.status, data, float(retry) if retry else None)
        return response.status, data

    def close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the contract ----------------------------------------------------
    def health(self) -> dict:
        try:
            return self.request("GET", "/health")[1]
        except ServiceError as exc:
            if exc.status == 503:
                return exc.body
            raise

    def metadata(self) -> dict:
        return self.request("GET", "/metadata")[1]

    def schema(self) -> dict:
        return self.request("GET", "/schema")[1]

    def tasks(self, offset: int = 0, limit: int | None = None) -> dict:
        """One page of the served tasks in manifest order: ``tasks`` (id,
        kind, split), ``total``, ``next_offset`` (None on the last page) and
        ``task_selection_hash``; ``limit`` None is the service's default."""
        return self.request("GET", _tasks_path(offset, limit))[1]

    def iter_tasks(self, limit: int | None = None) -> Iterator[dict]:
        """Every served task, page by page, in manifest order."""
        offset: int | None = 0
        while offset is not None:
            page = self.tasks(offset, limit)
            yield from page["tasks"]
            offset = _next_offset(offset, page)

    # Overloads so a caller without ``group`` gets its one episode typed as a dict.
    @overload
    def create(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        wait: float = 0.0,
        group: None = None,
        variant: str | None = None,
    ) -> dict: ...
    @overload
    def create(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        wait: float = 0.0,
        *,
        group: int,
        variant: str | None = None,
    ) -> list[dict]: ...
    @overload
    def create(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        wait: float = 0.0,
        group: int | None = None,
        variant: str | None = None,
    ) -> dict | list[dict]: ...
    def create(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        wait: float = 0.0,
        group: int | None = None,
        variant: str | None = None,
    ) -> dict | list[dict]:
        """Start an episode; with ``wait`` > 0, wait in the service's line
        (``wait_s``) and retry a 429 (a full line) for whatever time remains.
        With ``group`` N: a list of N episodes on one task and seed, the
        first reset and the others its forks at step 0, all or none. With
        ``variant`` ("impossible"): an impossible variant of ``task_id`` (or
        of any task), whose terminal reply carries ``canary``: how often a
        policy cheats, measured (camg_client.canaries)."""
        body = _create_body(task_id, seed, episode_id, group, variant)
        deadline = time.monotonic() + wait
        while True:
            try:
                return _created(
                    self.request("POST", "/episodes", _with_wait(body, deadline))[1], group
                )
            except ServiceError as exc:
                if exc.status != 429 or time.monotonic() >= deadline:
                    raise
                time.sleep(min(exc.retry_after or 1.0, max(0.0, deadline - time.monotonic())))

    def fork(self, episode_id: str, child_id: str | None = None, wait: float = 0.0) -> dict:
        """A child of a running, idle episode, continuing from where it is:
        ``{episode_id, task_id, observation, lease_expires_at, forked_from,
        fork_step}`` as ``create`` answers; ``wait`` as for ``create`` (the
        child takes a slot). Not resent after a dropped connection."""
        body = {"episode_id": child_id} if child_id is not None else {}
        deadline = time.monotonic() + wait
        while True:
            try:
                return self.request(
                    "POST", f"/episodes/{episode_id}/fork", _with_wait(body, deadline)
                )[1]
            except ServiceError as exc:
                if exc.status != 429 or time.monotonic() >= deadline:
                    raise
                time.sleep(min(exc.retry_after or 1.0, max(0.0, deadline - time.monotonic())))

    def step(self, episode_id: str, action: dict, request_id: str | None = None) -> dict:
        return self.request("POST", f"/episodes/{episode_id}/step", _step_body(action, request_id))[
            1
        ]

    def reference(self, episode_id: str) -> dict:
        """The reference solution's next action (deployments with references)."""
        return self.request("GET", f"/episodes/{episode_id}/reference")[1]

    def regrade(self, episode_id: str) -> dict:
        """Grade a finished episode's stored submission again; the appended
        outcome record (``reward``, ``grader_hash``, ``regrade_of`` …).
        Not resent after a dropped connection: a resend would grade twice."""
        return self.request("POST", f"/episodes/{episode_id}/regrade", {})[1]

    def get(self, episode_id: str) -> dict:
        return self.request("GET", f"/episodes/{episode_id}")[1]

    def list(self) -> dict:
        return self.request("GET", "/episodes")[1]

    def close(self, episode_id: str) -> dict:
        return self.request("DELETE", f"/episodes/{episode_id}")[1]


class AsyncClient:
    """The asyncio client: one pooled httpx connection set for many episodes."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 3600.0,
        max_connections: int = 256,
        token: str | None = None,
    ) -> None:
        import httpx

        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self._httpx = httpx
        self._client = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout,
            headers=tokens.header(tokens.resolve(token)),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=_IDLE_RECONNECT,
            ),
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        retry_safe = method in ("GET", "DELETE") or (
            isinstance(body, dict) and "request_id" in body
        )
        for attempt in (1, 2):
            try:
                response = await self._client.request(method, path, json=body)
                break
            except (
                self._httpx.RemoteProtocolError,
                self._httpx.ConnectError,
                self._httpx.ReadError,
            ):
                if attempt == 2 or not retry_safe:
                    raise
        data = response.json() if response.content else None
        if response.status_code >= 400:
            retry = response.headers.get("Retry-After")
            raise ServiceError(response.status_code, data, float(retry) if retry else None)
        return data

    async def health(self) -> dict:
        try:
            return await self.request("GET", "/health")
        except ServiceError as exc:
            if exc.status == 503:
                return exc.body
            raise

    async def metadata(self) -> dict:
        return await self.request("GET", "/metadata")

    async def schema(self) -> dict:
        return await self.request("GET", "/schema")

    async def tasks(self, offset: int = 0, limit: int | None = None) -> dict:
        """One page of the served tasks (see Client.tasks)."""
        return await self.request("GET", _tasks_path(offset, limit))

    async def iter_tasks(self, limit: int | None = None) -> AsyncIterator[dict]:
        """Every served task, page by page, in manifest order."""
        offset: int | None = 0
        while offset is not None:
            page = await self.tasks(offset, limit)
            for task in page["tasks"]:
                yield task
            offset = _next_offset(offset, page)

    # Overloads so a caller without ``group`` gets its one episode typed as a dict.
    @overload
    async def create(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        wait: float = 0.0,
        group: None = None,
        variant: str | None = None,
    ) -> dict: ...
    @overload
    async def create(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        wait: float = 0.0,
        *,
        group: int,
        variant: str | None = None,
    ) -> list[dict]: ...
    @overload
    async def create(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        wait: float = 0.0,
        group: int | None = None,
        variant: str | None = None,
    ) -> dict | list[dict]: ...
    async def create(
        self,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
        wait: float = 0.0,
        group: int | None = None,
        variant: str | None = None,
    ) -> dict | list[dict]:
        """Start an episode (see Client.create; ``group`` and ``variant`` too)."""
        import asyncio

        body = _create_body(task_id, seed, episode_id, group, variant)
        deadline = time.monotonic() + wait
        while True:
            try:
                return _created(
                    await self.request("POST", "/episodes", _with_wait(body, deadline)), group
                )
            except AtCapacity as exc:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(
                    min(exc.retry_after or 1.0, max(0.0, deadline - time.monotonic()))
                )

    async def fork(self, episode_id: str, child_id: str | None = None, wait: float = 0.0) -> dict:
        """A child of a running, idle episode (see Client.fork)."""
        import asyncio

        body = {"episode_id": child_id} if child_id is not None else {}
        deadline = time.monotonic() + wait
        while True:
            try:
                return await self.request(
                    "POST", f"/episodes/{episode_id}/fork", _with_wait(body, deadline)
                )
            except AtCapacity as exc:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(
                    min(exc.retry_after or 1.0, max(0.0, deadline - time.monotonic()))
                )

    async def step(self, episode_id: str, action: dict, request_id: str | None = None) -> dict:
        return await self.request(
            "POST", f"/episodes/{episode_id}/step", _step_body(action, request_id)
        )

    async def reference(self, episode_id: str) -> dict:
        return await self.request("GET", f"/episodes/{episode_id}/reference")

    async def regrade(self, episode_id: str) -> dict:
        """Grade a finished episode's stored submission again (see Client.regrade)."""
        return await self.request("POST", f"/episodes/{episode_id}/regrade", {})

    async def get(self, episode_id: str) -> dict:
        return await self.request("GET", f"/episodes/{episode_id}")

    async def close(self, episode_id: str) -> dict:
        return await self.request("DELETE", f"/episodes/{episode_id}")
