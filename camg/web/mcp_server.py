"""MCP on every service: the environment's actions as MCP tools, one MCP
session as one episode.

The tools are ``/schema``'s ``tools`` (camg.web.action_tools, made from the
action schema): name, description, and the function's parameters as the
MCP ``inputSchema``. A tool call is turned back into the action by the same
ActionTools and stepped through ``EpisodeManager.step``, exactly as
``POST /episodes/{id}/step``: leases, deadlines, outcome records, metrics
and ``reward: null`` with a ``failure_class`` on an infrastructure failure.
Every tool result is the step's reply (``episode_id``, ``observation``,
``reward``, ``done``, ``failure_class``, ``step``), as ``structuredContent``
and as JSON text. An unknown tool is a JSON-RPC ``-32602``; arguments the
action schema refuses, or a step the episode cannot take (busy), are a tool
result with ``isError`` whose body is the camg error (``invalid_action``,
``episode_busy``, …): a model sees it and may retry.

Three forms, one episode table (the manager's):

* ``/mcp`` — streamable HTTP with the ``mcp`` SDK's session manager, the
  handshake era only (``initialize``; the stateless 2026-07-28 era has no
  session to hold an episode, so ``server/discover`` and that protocol
  version answer ``-32022`` naming the handshake versions, and the SDK's
  ``mode="auto"`` client falls back to ``initialize``). ``initialize``
  creates the episode: ``task_id``, ``seed``, ``episode_id`` and ``wait_s``
  come from the URL's query (``/mcp?task_id=…``; every MCP client takes a
  URL) and are parsed as ``POST /episodes`` parses them. A refused create is
  the initialize's error (HTTP status and ``data`` as the HTTP contract's,
  e.g. 429 ``at_capacity``); the first observation is in the initialize
  result's ``instructions`` and ``_meta["camg/episode"]``. ``DELETE`` (the
  SDK client sends it on exit) closes the episode; an abandoned session
  ends with its lease (the SDK's idle timeout is the same ``idle_ttl_s``).
* ``/mcp`` — openenv-core 0.3.0's HTTP session methods (a JSON-RPC POST
  without ``Mcp-Session-Id`` whose method is ``openenv/session/*`` or whose
  params carry ``session_id``): ``openenv/session/create`` creates the
  episode (params: ``POST /episodes``'s fields), ``tools/list``,
  ``tools/call`` (``session_id``, ``name``, ``arguments``; the result is
  the step's reply), ``openenv/session/close`` closes it.
* ``/ws`` (camg.web.openenv_compat) — openenv's ``{"type": "mcp", "data":
  <JSON-RPC>}`` messages, and the steps its ``MCPToolClient`` sends
  (``{"type": "list_tools"}``, ``{"type": "call_tool", "tool_name",
  "arguments"}`` as the step's data, whenever the action schema itself
  refuses them), on the connection's own episode (its ``reset``).

A general_agent task's own MCP tools are passed through: General's first
observation lists them (``tools``: server, name, description,
input_schema), and the episode's session lists each as ``<server>__<name>``
with the task's input schema after the actions; a call is General's
``tool`` action (``server``, ``name``, ``arguments``), which stays a tool
too. Before a session has an episode (openenv's ``tools/list`` without
one) only the actions are listed.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast
from urllib.parse import parse_qsl

from camg.errors import (
    BadRequest,
    CamgError,
    EpisodeDone,
    EpisodeNotFound,
    InvalidAction,
    PayloadTooLarge,
)
from camg.web import action_tools, auth
from camg.web import http_wire as wire

#: JSON-RPC codes (JSON-RPC 2.0; -32000 is openenv's SERVER_ERROR)
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
SERVER_ERROR, UNSUPPORTED_VERSION = -32000, -32022
SESSION_HEADER = "mcp-session-id"
_SESSIONS_KEPT = 10_000  # ended sessions still answered (as the manager's tombstones)
#: the action a task's own tools pass through (General's general_agent tasks)
_PASS_THROUGH = "tool"
_QUERY_INT = re.compile(r"-?[0-9]{1,19}")
# MCP's rule for a tool name (specification 2025-11-25, "Tool names")
_MCP_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def rpc_code(exc: CamgError) -> int:
    return INVALID_PARAMS if isinstance(exc, BadRequest) else SERVER_ERROR


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict:
    error: dict = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def rpc_result(request_id: Any, result: Any) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


class UnknownTool(InvalidAction):
    """A call of a tool the service does not list (JSON-RPC -32602)."""


class EpisodeTools:
    """The service's actions as MCP tools, and one tool call as one step."""

    def __init__(self, service) -> None:
        env = service.env
        self.manager = service.manager
        self.calls = action_tools.ActionTools(env.action_schema, name=env.name)
        self.tools = [
            {"name": f["name"], "description": f["description"], "inputSchema": f["parameters"]}
            for f in (tool["function"] for tool in self.calls.tools)
        ]
        self.names = frozenset(t["name"] for t in self.tools)
        #: running episode id -> its task's own tools (name -> (server, tool, listing))
        self.task_tools: dict[str, dict] = {}

    def is_action(self, data: Mapping[str, Any]) -> bool:
        try:
            self.manager.validate_action(data)
        except InvalidAction:
            return False
        return True

    def remember(self, episode_id: str, observation: Any) -> None:
        """Pass a task's own MCP tools through: where the environment has a
        ``tool`` action (server, name, arguments) and the first observation
        lists ``tools`` ({server, name, description, input_schema}: General's
        general_agent tasks), each becomes a tool ``<server>__<name>`` of the
        episode's session with the task's input schema, stepping ``tool``."""
        listed = observation.get("tools") if isinstance(observation, Mapping) else None
        if _PASS_THROUGH not in self.names or not isinstance(listed, list):
            return
        tools = {}
        for entry in listed:
            if not isinstance(entry, Mapping):
                continue
            server, tool = entry.get("server"), entry.get("name")
            name = f"{server}__{tool}"
            schema = entry.get("input_schema")
            if (
                not (
                    isinstance(server, str)
                    and isinstance(tool, str)
                    and _MCP_TOOL_NAME.fullmatch(name)
                )
                or name in self.names
            ):
                continue  # still reachable through the tool action itself
            tools[name] = (
                server,
                tool,
                {
                    "name": name,
                    "description": str(entry.get("description") or "")
                    + f" (the task's MCP tool {server}.{tool})",
                    "inputSchema": dict(schema)
                    if isinstance(schema, Mapping) and schema
                    else {"type": "object"},
                },
            )
        # Kept while their episode runs (at most capacity of them: a task's
        # listing can be kilobytes), so after the end only the actions list.
        for ended in [e for e in self.task_tools if e not in self.manager.records]:
            del self.task_tools[ended]
        if tools:
            self.task_tools[episode_id] = tools

    def listing(self, episode_id: str | None) -> list[dict]:
        """The tools of an episode's session: the actions, then its task's."""
        extra = self.task_tools.get(episode_id, {}) if episode_id else {}
        return self.tools + [entry[2] for entry in extra.values()]

    async def open(self, request: wire.CreateEpisode, hangup=None) -> dict:
        body = await self.manager.create(request, hangup=hangup)
        self.remember(body["episode_id"], body.get("observation"))
        return body

    async def call(self, episode_id: str, name: Any, arguments: Any) -> dict:
        """The step reply of one tool call; after the end, the sticky terminal."""
        extra = self.task_tools.get(episode_id, {})
        if isinstance(name, str) and name in extra:
            server, tool, _ = extra[name]
            if arguments is None or isinstance(arguments, str) and not arguments.strip():
                arguments = {}
            action = self.calls.action(
                _PASS_THROUGH, {"server": server, "name": tool, "arguments": arguments}
            )
        elif isinstance(name, str) and name in self.names:
            action = self.calls.action(name, arguments)
        else:
            known = sorted(self.names | set(extra))
            raise UnknownTool(f"no tool named {name!r} (tools: {', '.join(known)})")
        try:
            body = await self.manager.step(episode_id, wire.StepRequest(action=action))
        except EpisodeDone as done:
            body = done.details["terminal"]
        # The agent reads tool results: whether its episode was an impossible
        # variant's is the trainer's (GET /episodes/{id}), never the agent's.
        return {
            **{k: v for k, v in body.items() if k != "canary"},
            "failure_class": body.get("failure_class"),
        }

    async def close(self, episode_id: str, reason: str) -> None:
        try:
            await self.manager.close(episode_id, reason)
        except EpisodeNotFound:
            pass


class Sessions:
    """Session id → episode id and the principal that opened it (camg.web.auth),
    for sessions that ended kept a while (their calls answer the sticky
    terminal, not 'unknown session'). Another principal's session is
    absent to ``get`` and ``pop``, as its episode is to the manager."""

    def __init__(self) -> None:
        self.table: collections.OrderedDict[str, tuple[str, Any]] = collections.OrderedDict()

    def add(self, session_id: str, episode_id: str) -> None:
        self.table[session_id] = (episode_id, auth.caller())
        while len(self.table) > _SESSIONS_KEPT:
            self.table.popitem(last=False)

    def get(self, session_id: Any) -> str | None:
        entry = self.entry(session_id)
        return entry[0] if entry is not None and self.visible(entry) else None

    def entry(self, session_id: Any) -> tuple[str, Any] | None:
        """The session's episode and owner, whoever asks."""
        return self.table.get(session_id) if isinstance(session_id, str) else None

    @staticmethod
    def visible(entry: tuple[str, Any]) -> bool:
        owner = entry[1]
        return auth.may_see(None if owner is None else owner.name)

    def pop(self, session_id: str) -> str | None:
        if self.get(session_id) is None:
            return None
        return self.table.pop(session_id)[0]


class OpenEnvRpc:
    """openenv-core 0.3.0's MCP JSON-RPC (its http_server ``mcp_handler``):
    on HTTP ``/mcp`` with ``openenv/session/*``, and on ``/ws``."""

    def __init__(self, tools: EpisodeTools) -> None:
        self.tools = tools
        self.sessions = Sessions()

    async def answer(self, message: Any, ws_session=None) -> dict:
        """The JSON-RPC response to ``message``; ``ws_session`` is a /ws
        connection's session (camg.web.openenv_compat.Session), else HTTP."""
        if (
            not isinstance(message, dict)
            or message.get("jsonrpc") != "2.0"
            or not isinstance(message.get("method"), str)
        ):
            return rpc_error(
                None, INVALID_REQUEST, "Invalid request: a JSON-RPC 2.0 request object"
            )
        request_id, method = message.get("id"), message["method"]
        params = message.get("params", {})
        if not isinstance(params, dict):
            return rpc_error(request_id, INVALID_PARAMS, "Params must be an object")
        try:
            return rpc_result(request_id, await self._dispatch(method, params, ws_session))
        except _MethodNotFound as exc:
            return rpc_error(request_id, METHOD_NOT_FOUND, exc.message)
        except UnknownTool as exc:
            return rpc_error(request_id, INVALID_PARAMS, exc.message, exc.to_dict())
        except CamgError as exc:
            return rpc_error(request_id, rpc_code(exc), exc.message, exc.to_dict())

    async def _dispatch(self, method: str, params: dict, ws_session) -> Any:
        if method == "openenv/session/create":
            if ws_session is not None:
                if ws_session.episode_id is None:
                    answer = await ws_session.reset(params)
                    # reset() set the id; mypy keeps the `is None` narrowing past the call.
                    self.tools.remember(cast(str, ws_session.episode_id), answer["observation"])
                return {"session_id": ws_session.episode_id}
            body = await self.tools.open(wire.parse(wire.CreateEpisode, params, "params"))
            new_id = secrets.token_hex(16)
            self.sessions.add(new_id, body["episode_id"])
            return {"session_id": new_id, **body}
        if method == "openenv/session/close":
            if ws_session is not None:
                raise BadRequest("Cannot close active WebSocket-managed session via MCP method")
            session_id = params.get("session_id")
            episode_id = self.sessions.pop(session_id) if isinstance(session_id, str) else None
            if episode_id is None:
                raise BadRequest(f"Unknown session_id: {session_id}")
            await self.tools.close(episode_id, "OpenEnv MCP session closed")
            return {"session_id": session_id, "closed": True}
        if method == "tools/list":
            if ws_session is not None:
                return {"tools": self.tools.listing(ws_session.episode_id)}
            return {"tools": self.tools.listing(self.sessions.get(params.get("session_id")))}
        if method == "tools/call":
            if ws_session is not None:
                episode_id = ws_session.episode_id
            elif "session_id" in params:
                episode_id = self.sessions.get(params["session_id"])
                if episode_id is None:
                    raise BadRequest(f"Unknown session_id: {params['session_id']}")
            else:
                episode_id = None
            if episode_id is None:
                raise EpisodeNotFound(
                    "no episode for this client: create a session "
                    "(openenv/session/create) or reset first"
                )
            return await self.tools.call(
                episode_id, params.get("name"), params.get("arguments", {})
            )
        raise _MethodNotFound(method)

    async def ws_step(self, ws_session, data: dict) -> dict:
        """OpenEnv MCPToolClient's list_tools/call_tool step on /ws, as its
        MCPEnvironment answers it (an observation with ``tools``, or with
        ``tool_name``, ``result`` and ``error``)."""
        if data.get("type") == "list_tools":
            return {
                "observation": {"tools": self.tools.listing(ws_session.episode_id), "metadata": {}},
                "reward": None,
                "done": False,
            }
        name = data.get("tool_name")
        if ws_session.episode_id is None:
            raise EpisodeNotFound("no episode for this client: reset first")
        try:
            body = await self.tools.call(ws_session.episode_id, name, data.get("arguments", {}))
        except InvalidAction as exc:
            kind = "tool_not_found" if isinstance(exc, UnknownTool) else "invalid_args"
            return {
                "observation": {
                    "tool_name": str(name),
                    "result": None,
                    "error": {"error_type": kind, "message": exc.message},
                    "metadata": exc.to_dict(),
                },
                "reward": None,
                "done": False,
            }
        return {
            "observation": {"tool_name": name, "result": body, "error": None, "metadata": {}},
            "reward": body.get("reward"),
            "done": bool(body.get("done")),
        }


def is_ws_tool_step(tools: EpisodeTools, data: Mapping[str, Any]) -> bool:
    """A /ws step's data is OpenEnv's ListToolsAction/CallToolAction, not an
    action of this environment (whose schema refuses it)."""
    return data.get("type") in ("list_tools", "call_tool") and not tools.is_action(data)


class _MethodNotFound(CamgError):
    def __init__(self, method: str) -> None:
        super().__init__(f"Method not found: {method}")


class Endpoint:
    """``/mcp``: openenv's HTTP session methods here, everything else to the
    SDK's streamable HTTP sessions (camg.web.mcp_streamable, imported by the
    first request that needs it: importing the SDK takes about 2 s and 30 MB,
    which a service no MCP client talks to, and every test start, should
    not pay)."""

    def __init__(self, service) -> None:
        self.service = service
        self.limit = service.config.limits.max_body_bytes
        self.tools = EpisodeTools(service)
        self.openenv = OpenEnvRpc(self.tools)
        self.sessions = Sessions()
        self._streamable = None
        self._lock = asyncio.Lock()

    async def streamable(self):
        async with self._lock:
            if self._streamable is None:
                # on a thread: the import must not stall the event loop
                module = await asyncio.to_thread(importlib.import_module, "camg.web.mcp_streamable")
                self._streamable = module.Streamable(self.service, self.tools, self.sessions)
        return self._streamable

    async def process_shutdown(self, scope, event) -> None:
        """falcon lifespan: end the SDK's sessions (their episodes are closed
        by the service's own shutdown)."""
        if self._streamable is not None:
            await self._streamable.stop()

    async def __call__(self, scope, receive, send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if scope["method"] != "POST":
            return await (await self.streamable()).other(scope, receive, send, headers)
        try:
            body = await _read_body(receive, self.limit)
        except PayloadTooLarge as exc:
            return await send_json(
                send, 413, rpc_error(None, INVALID_REQUEST, exc.message, exc.to_dict())
            )
        if wire.json_too_deep(body):
            # refused before json (or the SDK after it) can recurse that deep
            return await send_json(
                send,
                400,
                rpc_error(
                    None, INVALID_REQUEST, f"request nests deeper than {wire.MAX_JSON_DEPTH} levels"
                ),
            )
        try:
            message = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return await send_json(send, 400, rpc_error(None, PARSE_ERROR, f"Parse error: {exc}"))
        if SESSION_HEADER not in headers and _is_openenv(message):
            return await send_json(send, 200, await self.openenv.answer(message))
        await (await self.streamable()).post(
            scope, _replayed(body, receive), send, headers, message, receive
        )


def _is_openenv(message: Any) -> bool:
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return False
    params = message.get("params")
    return message["method"].startswith("openenv/") or (
        isinstance(params, dict) and "session_id" in params
    )


def create_request(query: bytes) -> wire.CreateEpisode:
    """``POST /episodes``'s fields from the /mcp URL's query, as strictly."""
    data: dict[str, Any] = {}
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if name in data:
            raise BadRequest(f"query.{name}: given more than once")
        if name == "seed":
            if not _QUERY_INT.fullmatch(value):
                raise BadRequest(f"query.seed: must be an integer, got {value!r}")
            data[name] = int(value)
        elif name == "wait_s":
            try:
                data[name] = float(value)
            except ValueError:
                raise BadRequest(f"query.wait_s: must be a number, got {value!r}") from None
        else:
            data[name] = value
    return wire.parse(wire.CreateEpisode, data, "query")


async def _read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            break
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not event.get("more_body"):
            break
    return b"".join(chunks)


def _replayed(body: bytes, receive):
    """A receive that gives the body already read, then the real one's events."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def hangup(receive) -> Callable[[], Awaitable[None]]:
    async def hung_up() -> None:
        while (await receive()).get("type") != "http.disconnect":
            await asyncio.sleep(0)

    return hung_up


async def answered(app, scope, receive, send) -> int | None:
    status: dict = {}

    async def watch(event) -> None:
        if event["type"] == "http.response.start":
            status["code"] = event["status"]
        await send(event)

    await app(scope, receive, watch)
    return status.get("code")


async def send_json(
    send, status: int, body: dict, headers: Mapping[str, str] | None = None
) -> None:
    raw = json.dumps(body, ensure_ascii=False).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
                *((k.encode(), v.encode()) for k, v in (headers or {}).items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})


class Mounted:
    """The falcon app with ``/mcp`` dispatched in front of it at the ASGI
    level (so it holds whichever worker class serves the app); anything else
    is the falcon app's, attributes included."""

    def __init__(self, app, endpoint: Endpoint) -> None:
        self.app = app
        self.endpoint = endpoint
        app.add_middleware(endpoint)  # its process_shutdown

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") == "/mcp":
            return await self.endpoint(scope, receive, send)
        return await self.app(scope, receive, send)

    def __getattr__(self, name: str):
        return getattr(self.app, name)


def mount(app, service):
    """``app`` serving MCP at ``/mcp`` too."""
    return Mounted(app, Endpoint(service))
