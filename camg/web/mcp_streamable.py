"""``/mcp``'s streamable HTTP sessions, with the ``mcp`` SDK's session
manager and low-level server (camg.web.mcp_server imports this module on the
first request that needs it; the contract is described there).

The handshake era only: ``initialize`` opens a session, and here it also
creates the episode (before the SDK sees the request, so a refused create
is the initialize's error with the HTTP contract's status and body). The
SDK assigns the session id; the response's ``Mcp-Session-Id`` header binds
it to the episode. A ``DELETE`` the SDK accepts closes the episode; the
SDK's idle timeout is the episode's lease (``idle_ttl_s``), so a session
and its episode are abandoned together.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

import camg
from camg.errors import AtCapacity, CamgError, EpisodeNotFound
from camg.web import auth
from camg.web.mcp_server import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    SESSION_HEADER,
    UNSUPPORTED_VERSION,
    EpisodeTools,
    Sessions,
    UnknownTool,
    answered,
    create_request,
    hangup,
    rpc_code,
    rpc_error,
    send_json,
)

#: where the ASGI dispatch leaves the created episode for the initialize result
_SCOPE_KEY = "camg.mcp.episode"


class Streamable:
    def __init__(self, service, tools: EpisodeTools, sessions: Sessions) -> None:
        env = service.env
        self.env_name = env.name
        self.tools = tools
        self.sessions = sessions
        self.server = Server(
            env.name,
            version=camg.__version__,
            description=f"camg {env.name}: one MCP session is one episode",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.middleware.append(self._initialized)
        self.sdk = StreamableHTTPSessionManager(
            self.server,
            # One JSON body per POST, not an SSE stream: the server sends
            # nothing unasked, and a call answers about three times sooner
            # than as SSE.
            json_response=True,
            session_idle_timeout=service.config.limits.idle_ttl_s,
            max_request_body_size=service.config.limits.max_body_bytes,
            # Services listen on loopback; a web page must not reach them
            # through a DNS name rebound to 127.0.0.1.
            security_settings=TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            ),
        )
        # One line per session at INFO is the episode log's job, not the SDK's.
        logging.getLogger("mcp.server").setLevel(logging.WARNING)
        self._runner: asyncio.Task | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()

    # -- the SDK server's handlers ---------------------------------------
    # The SDK runs these in its session's task, whose context is not the
    # request's: ASGI dispatch (``_refused``) has checked the caller owns the
    # session, and the step acts as the session's owner.
    async def _list_tools(self, ctx, params) -> types.ListToolsResult:
        session_id = ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None
        entry = self.sessions.entry(session_id)
        listing = self.tools.listing(entry[0] if entry is not None else None)
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in listing])

    async def _call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        session_id = ctx.request.headers.get(SESSION_HEADER) if ctx.request is not None else None
        entry = self.sessions.entry(session_id)
        try:
            if entry is None:
                raise EpisodeNotFound("this MCP session holds no episode")
            with auth.acting_as(entry[1]):
                body = await self.tools.call(entry[0], params.name, params.arguments or {})
        except UnknownTool as exc:  # the spec's protocol error for an unknown tool
            raise MCPError(code=INVALID_PARAMS, message=exc.message, data=exc.to_dict()) from None
        except CamgError as exc:  # a tool execution error: the model sees it
            return _tool_result(exc.to_dict(), error=True)
        return _tool_result(body, error=False)

    async def _initialized(self, ctx, call_next):
        """The initialize result names the episode its request created."""
        result = await call_next(ctx)
        body = (
            ctx.request.scope.get(_SCOPE_KEY)
            if ctx.method == "initialize" and ctx.request is not None
            else None
        )
        if body is not None and isinstance(result, dict):
            meta = result.get("_meta")
            if not isinstance(meta, dict):
                meta = {}
            result = {
                **result,
                "instructions": _instructions(self.env_name, body),
                "_meta": {**meta, "camg/episode": body},
            }
        return result

    # -- lifecycle -----------------------------------------------------------
    async def _running(self) -> None:
        """The SDK manager's task group on a task of its own, started on the
        first request (so it does not depend on the task that runs lifespan)."""
        async with self._lock:
            if self._runner is not None:
                return
            started = asyncio.Event()

            async def run() -> None:
                async with self.sdk.run():
                    started.set()
                    await self._stop.wait()

            self._runner = asyncio.create_task(run())
            waiter = asyncio.create_task(started.wait())
            await asyncio.wait({waiter, self._runner}, return_when=asyncio.FIRST_COMPLETED)
            if not started.is_set():
                waiter.cancel()
                self._runner.result()  # raises what stopped it

    async def stop(self) -> None:
        if self._runner is not None:
            self._stop.set()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._runner, 10)

    # -- ASGI ------------------------------------------------------------------
    async def post(self, scope, receive, send, headers: dict, message, raw_receive) -> None:
        """A POST; ``receive`` replays the body already read (``message``)."""
        version = headers.get("mcp-protocol-version")
        if (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS) or (
            isinstance(message, dict) and message.get("method") == "server/discover"
        ):
            return await send_json(send, 400, _handshake_only(message, version))
        await self._running()
        if (
            SESSION_HEADER not in headers
            and isinstance(message, dict)
            and message.get("method") == "initialize"
        ):
            return await self._initialize(scope, receive, send, message, raw_receive)
        if await self._refused(send, headers):
            return
        await self.sdk.handle_request(scope, receive, send)

    async def _refused(self, send, headers: dict) -> bool:
        """Answer another principal's session as the SDK answers an unknown one."""
        entry = self.sessions.entry(headers.get(SESSION_HEADER))
        if entry is None or self.sessions.visible(entry):
            return False
        await send_json(send, 404, rpc_error(None, INVALID_REQUEST, "Session not found"))
        return True

    async def other(self, scope, receive, send, headers: dict) -> None:
        """DELETE (the session's end). GET, the standalone event stream, is
        405 as the transport allows: the server sends nothing unasked, and an
        open stream would hold a graceful stop until its timeout."""
        if scope["method"] == "GET":
            return await send_json(
                send,
                405,
                rpc_error(None, INVALID_REQUEST, "no event stream here"),
                {"allow": "POST, DELETE"},
            )
        await self._running()
        session_id = headers.get(SESSION_HEADER)
        if await self._refused(send, headers):
            return
        if scope["method"] == "DELETE" and session_id is not None:
            status = await answered(self.sdk.handle_request, scope, receive, send)
            if status is not None and status < 400:
                episode_id = self.sessions.pop(session_id)
                if episode_id is not None:
                    await self.tools.close(episode_id, "MCP session deleted")
            return
        await self.sdk.handle_request(scope, receive, send)

    async def _initialize(self, scope, receive, send, message: dict, raw_receive) -> None:
        request_id = message.get("id")
        try:
            request = create_request(scope.get("query_string", b""))
            body = await self.tools.open(request, hangup=hangup(raw_receive))
        except CamgError as exc:
            extra = {"retry-after": str(exc.retry_after)} if isinstance(exc, AtCapacity) else {}
            return await send_json(
                send,
                exc.http_status,
                rpc_error(request_id, rpc_code(exc), exc.message, exc.to_dict()),
                extra,
            )
        created: dict = {}

        async def watch(event) -> None:
            if event["type"] == "http.response.start":
                created["status"] = event["status"]
                for key, value in event.get("headers") or []:
                    if key.decode("latin-1").lower() == SESSION_HEADER:
                        created["session"] = value.decode("latin-1")
                if created.get("session") and created["status"] < 400:
                    self.sessions.add(created["session"], body["episode_id"])
            await send(event)

        try:
            await self.sdk.handle_request({**scope, _SCOPE_KEY: body}, receive, watch)
        finally:
            if not created.get("session") or created.get("status", 500) >= 400:
                await self.tools.close(body["episode_id"], "MCP initialize failed")


def _tool_result(body: dict, *, error: bool) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body, ensure_ascii=False))],
        structured_content=body,
        is_error=error,
    )


def _instructions(env: str, body: dict) -> str:
    return (
        f"camg {env}: this MCP session is episode {body['episode_id']} "
        f"(task {body.get('task_id')}). Each tool call is one step; its result "
        "carries observation, reward, done and failure_class (reward null: an "
        "infrastructure failure, not a score). The first observation:\n"
        + json.dumps(body.get("observation"), ensure_ascii=False)
    )


def _handshake_only(message, version: str | None) -> dict:
    request_id = message.get("id") if isinstance(message, dict) else None
    return rpc_error(
        request_id,
        UNSUPPORTED_VERSION,
        "one MCP session is one episode: this server speaks the initialize handshake only",
        {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": version or ""},
    )
