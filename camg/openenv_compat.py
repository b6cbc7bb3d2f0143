"""OpenEnv compatibility: ``POST /reset``, ``POST /step``, ``GET /state`` and
the ``/ws`` WebSocket protocol spoken by openenv-core's clients.

Each WebSocket connection is one session with at most one live episode; a
new reset closes the previous one, and a disconnect closes it. The plain
HTTP endpoints address an episode by ``episode_id`` in the body (or query
for /state), defaulting to the last episode started through ``/reset``.
Observations are wrapped the OpenEnv way: ``{observation, reward, done}``.
After the end, a step answers with the sticky terminal observation, as
OpenEnv environments do.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import falcon
import falcon.asgi

from camg import wire
from camg.errors import AtCapacity, BadRequest, CamgError, EpisodeDone, EpisodeNotFound
from camg.http import read_body, reply
from camg.service import Service

log = logging.getLogger("camg.openenv")

_WS_MESSAGE_MAX = 1 << 20


@dataclasses.dataclass(frozen=True)
class StepRequest(wire.StepRequest):
    episode_id: str | None = None
    timeout_s: float | None = None   # accepted for compatibility; server deadlines rule


def _openenv_body(body: dict) -> dict:
    out = {"observation": body.get("observation", {}), "reward": body.get("reward"),
           "done": bool(body.get("done")), "episode_id": body.get("episode_id")}
    if body.get("failure_class"):
        out["failure_class"] = body["failure_class"]
    return out


class Session:
    """The episode a client drives through the OpenEnv protocol."""

    def __init__(self, service: Service) -> None:
        self.manager = service.manager
        self.episode_id: str | None = None

    async def reset(self, data: dict) -> dict:
        request = wire.parse(wire.CreateEpisode, data, "data")
        await self.close()
        body = await self.manager.create(request)
        self.episode_id = body["episode_id"]
        return _openenv_body(body)

    async def step(self, data: dict, episode_id: str | None = None) -> dict:
        episode_id = episode_id or self.episode_id
        if episode_id is None:
            raise EpisodeNotFound("no episode: reset first")
        request = wire.parse(wire.StepRequest, data, "data")
        try:
            body = await self.manager.step(episode_id, request)
        except EpisodeDone as done:
            body = done.details["terminal"]
        return _openenv_body(body)

    def state(self, episode_id: str | None = None) -> dict:
        episode_id = episode_id or self.episode_id
        if episode_id is None:
            return {"episode_id": None, "step_count": 0}
        return self.manager.state(episode_id)

    async def close(self) -> None:
        if self.episode_id is not None:
            episode_id, self.episode_id = self.episode_id, None
            try:
                await self.manager.close(episode_id, "OpenEnv session closed")
            except EpisodeNotFound:
                pass


class Reset:
    def __init__(self, service: Service, session: Session) -> None:
        self.session = session
        self.limit = service.config.limits.max_body_bytes

    async def on_post(self, req, resp):
        data = wire.parse_json(await read_body(req, self.limit))
        reply(resp, await self.session.reset(data))


class Step:
    def __init__(self, service: Service, session: Session) -> None:
        self.session = session
        self.limit = service.config.limits.max_body_bytes

    async def on_post(self, req, resp):
        request = wire.parse_body(await read_body(req, self.limit), StepRequest, "body")
        data = {"action": request.action}
        if request.request_id:
            data["request_id"] = request.request_id
        reply(resp, await self.session.step(data, request.episode_id))


class State:
    def __init__(self, session: Session) -> None:
        self.session = session

    async def on_get(self, req, resp):
        reply(resp, self.session.state(req.get_param("episode_id")))


class WebSocket:
    def __init__(self, service: Service) -> None:
        self.service = service

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
        try:
            message = json.loads(raw)
        except ValueError:
            return _ws_error("message is not valid JSON", "INVALID_JSON")
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            return _ws_error("message must be an object with a type", "VALIDATION_ERROR")
        kind, data = message["type"], message.get("data", {})
        if not isinstance(data, dict):
            return _ws_error("data must be an object", "VALIDATION_ERROR")
        try:
            if kind == "reset":
                return {"type": "observation", "data": await session.reset(data)}
            if kind == "step":
                # openenv-core sends the bare action as data.
                step = data if "action" in data else {"action": data}
                return {"type": "observation", "data": await session.step(step)}
            if kind == "state":
                return {"type": "state", "data": session.state()}
            if kind == "close":
                await session.close()
                return None
            return _ws_error(f"unknown message type {kind!r}", "UNKNOWN_TYPE")
        except CamgError as exc:
            code = ("CAPACITY_REACHED" if isinstance(exc, AtCapacity) else
                    "VALIDATION_ERROR" if isinstance(exc, BadRequest) else "EXECUTION_ERROR")
            return {"type": "error", "data": {"code": code, **exc.to_dict()}}


def _ws_error(message: str, code: str) -> dict:
    return {"type": "error", "data": {"message": message, "code": code}}


def add_routes(app: falcon.asgi.App, service: Service) -> None:
    session = Session(service)
    app.add_route("/reset", Reset(service, session))
    app.add_route("/step", Step(service, session))
    app.add_route("/state", State(session))
    app.add_route("/ws", WebSocket(service))
