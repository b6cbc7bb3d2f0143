"""OpenEnv compatibility: ``POST /reset``, ``POST /step``, ``GET /state`` and
the ``/ws`` WebSocket protocol, with openenv-core 0.3.0's wire messages
exactly (``openenv.core.env_server.types``):

* ``/ws`` — client messages ``{"type": "reset", "data"?: ResetRequest}``,
  ``{"type": "step", "data": <the action itself>}``, ``{"type": "state"}``,
  ``{"type": "close"}`` (no other keys); replies ``{"type": "observation",
  "data": {observation, reward, done}}``, ``{"type": "state", "data":
  State}`` or ``{"type": "error", "data": {message, code, ...}}``. A step's
  data is always the bare action: the message type says what it is, so an
  action with a field named ``action`` (Shop's) is never mistaken for a
  wrapper. Each connection is one session holding at most one episode: a
  new reset closes the previous one, a close or a disconnect closes it.
* HTTP — ``/reset`` takes a ResetRequest (``seed``, ``episode_id``, and
  camg's ``task_id``) and answers a ResetResponse ``{observation, reward,
  done}``; ``/step`` takes a StepRequest (``action``, ``timeout_s``,
  ``request_id``, and camg's ``episode_id``) and answers a StepResponse.
  Upstream's HTTP routes are stateless (a fresh environment per request),
  which cannot hold an episode; camg keeps one per *client*: ``/reset`` sets
  the cookie ``camg_openenv_episode`` (and the header ``X-Camg-Episode-Id``)
  and ``/step``/``/state`` address the episode named by ``episode_id``, else
  by that cookie. No client can reach another's episode by default, and a
  reset closes only the episode of the client that sent it.

What OpenEnv's three-key replies cannot carry (the episode id, a
``failure_class`` beside ``reward: null``) is in the state: ``State`` allows
extra fields. Unknown request fields are refused (OpenEnv drops those its
environment does not take): a misspelt ``task_id`` must not run another task.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import cast

import falcon
import falcon.asgi

from camg.errors import AtCapacity, BadRequest, CamgError, EpisodeDone, EpisodeNotFound
from camg.serving.service import Service
from camg.web import http_wire as wire
from camg.web import mcp_server
from camg.web.http import read_body, reply

log = logging.getLogger("camg.openenv")

_WS_MESSAGE_MAX = 1 << 20
COOKIE = "camg_openenv_episode"
EPISODE_HEADER = "X-Camg-Episode-Id"
#: keys each client message may carry (openenv BaseMessage: extra="forbid")
_WS_KEYS = {
    "reset": ({"type"}, {"data"}),
    "step": ({"type", "data"}, set()),
    "state": ({"type"}, set()),
    "close": ({"type"}, set()),
    "mcp": ({"type", "data"}, set()),
}  # a JSON-RPC request (camg.web.mcp_server)


@dataclasses.dataclass(frozen=True)
class StepRequest(wire.StepRequest):
    """openenv StepRequest plus camg's ``episode_id``."""

    episode_id: str | None = None
    timeout_s: float | None = None  # accepted as OpenEnv does; the server's deadlines rule

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError("timeout_s must be greater than 0")
        wire.check_episode_id(self.episode_id)


def _openenv_body(body: dict) -> dict:
    """openenv ``serialize_observation``: exactly observation, reward, done."""
    return {
        "observation": body.get("observation", {}),
        "reward": body.get("reward"),
        "done": bool(body.get("done")),
    }


class Session:
    """The episode one client drives through the OpenEnv protocol."""

    def __init__(self, service: Service, episode_id: str | None = None) -> None:
        self.manager = service.manager
        self.episode_id = episode_id

    async def reset(self, data: dict) -> dict:
        request = wire.parse(wire.CreateEpisode, data, "data")
        await self.close()
        body = await self.manager.create(request)
        self.episode_id = body["episode_id"]
        return _openenv_body(body)

    async def step(self, action: dict, request_id: str | None = None) -> dict:
        if self.episode_id is None:
            raise EpisodeNotFound("no episode for this client: reset first")
        request = wire.StepRequest(action=action, request_id=request_id)
        try:
            body = await self.manager.step(self.episode_id, request)
        except EpisodeDone as done:
            # sticky terminal observation, as OpenEnv
            body = cast(dict, done.details["terminal"])
        return _openenv_body(body)

    def state(self) -> dict:
        if self.episode_id is None:
            return {"episode_id": None, "step_count": 0}
        return self.manager.state(self.episode_id)

    async def close(self) -> None:
        if self.episode_id is not None:
            episode_id, self.episode_id = self.episode_id, None
            try:
                await self.manager.close(episode_id, "OpenEnv session closed")
            except EpisodeNotFound:
                pass


def _client_episode(req: falcon.asgi.Request, explicit: str | None = None) -> str | None:
    if explicit is not None:
        return explicit
    values = req.get_cookie_values(COOKIE) or []
    for value in values:
        try:
            wire.check_episode_id(value)
        except ValueError:
            raise BadRequest(f"cookie {COOKIE} does not hold an episode id") from None
        return value
    return None


class Reset:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.limit = service.config.limits.max_body_bytes

    async def on_post(self, req, resp):
        data = wire.parse_json(await read_body(req, self.limit))
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object (OpenEnv ResetRequest)")
        # a client's reset replaces its own previous episode, nobody else's
        session = Session(self.service, _client_episode(req))
        body = await session.reset(data)
        resp.set_cookie(
            COOKIE, session.episode_id, path="/", secure=False, http_only=True, same_site="Strict"
        )
        resp.set_header(EPISODE_HEADER, session.episode_id)
        reply(resp, body)


class Step:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.limit = service.config.limits.max_body_bytes

    async def on_post(self, req, resp):
        request = wire.parse_body(await read_body(req, self.limit), StepRequest, "body")
        episode_id = _client_episode(req, request.episode_id)
        if episode_id is None:
            raise BadRequest(
                "no episode for this client: POST /reset first (keep its cookie) or pass episode_id"
            )
        session = Session(self.service, episode_id)
        reply(resp, await session.step(request.action, request.request_id))


class State:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def on_get(self, req, resp):
        episode_id = req.get_param("episode_id")
        if episode_id is not None:
            try:
                wire.check_episode_id(episode_id)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        reply(resp, Session(self.service, _client_episode(req, episode_id)).state())


class WebSocket:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.mcp = mcp_server.OpenEnvRpc(mcp_server.EpisodeTools(service))

    async def on_websocket(self, req, ws: falcon.asgi.WebSocket):
        await ws.accept()
        session = Session(self.service)
        try:
            while True:
                try:
                    raw = await ws.receive_text()
                except falcon.WebSocketDisconnected:
                    return
                answer = await self._answer(session, raw)
                if answer is None:
                    return
                await ws.send_text(json.dumps(answer, ensure_ascii=False))
        except falcon.WebSocketDisconnected:
            return
        finally:
            await session.close()

    async def _answer(self, session: Session, raw: str) -> dict | None:
        if len(raw) > _WS_MESSAGE_MAX:
            return _ws_error("message too large", "VALIDATION_ERROR")
        if wire.json_too_deep(raw):
            return _ws_error(
                f"message nests deeper than {wire.MAX_JSON_DEPTH} levels", "VALIDATION_ERROR"
            )
        try:
            message = json.loads(raw)
        except ValueError as exc:
            return _ws_error(f"Invalid JSON: {exc}", "INVALID_JSON")
        if not isinstance(message, dict):
            return _ws_error("message must be a JSON object", "VALIDATION_ERROR")
        kind = message.get("type", "")
        if kind not in _WS_KEYS:
            return _ws_error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
        required, optional = _WS_KEYS[kind]
        keys = set(message)
        if not required <= keys or keys - required - optional:
            return _ws_error(
                f"a {kind} message has exactly the keys "
                f"{sorted(required)} (optional: {sorted(optional)})",
                "VALIDATION_ERROR",
            )
        data = message.get("data", {})
        if not isinstance(data, dict):
            return _ws_error("data must be an object", "VALIDATION_ERROR")
        try:
            if kind == "reset":
                answer = await session.reset(data)
                assert session.episode_id is not None  # reset() set it
                self.mcp.tools.remember(session.episode_id, answer["observation"])
                return {"type": "observation", "data": answer}
            if kind == "mcp":
                return {"type": "mcp", "data": await self.mcp.answer(data, session)}
            if kind == "step" and mcp_server.is_ws_tool_step(self.mcp.tools, data):
                # OpenEnv MCPToolClient's list_tools/call_tool
                return {"type": "observation", "data": await self.mcp.ws_step(session, data)}
            if kind == "step":
                return {"type": "observation", "data": await session.step(data)}
            if kind == "state":
                return {"type": "state", "data": session.state()}
            await session.close()
            return None
        except CamgError as exc:
            code = (
                "CAPACITY_REACHED"
                if isinstance(exc, AtCapacity)
                else "VALIDATION_ERROR"
                if isinstance(exc, BadRequest)
                else "EXECUTION_ERROR"
            )
            return {"type": "error", "data": {**exc.to_dict(), "code": code}}


def _ws_error(message: str, code: str) -> dict:
    return {"type": "error", "data": {"message": message, "code": code}}


def add_routes(app: falcon.asgi.App, service: Service) -> None:
    app.add_route("/reset", Reset(service))
    app.add_route("/step", Step(service))
    app.add_route("/state", State(service))
    app.add_route("/ws", WebSocket(service))
