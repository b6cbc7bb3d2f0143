"""The falcon ASGI application: thin resources over ``camg.serving.service.Service``.

Domain errors map to HTTP once (``_handle_camg_error``); resources never
choose status codes for failures. Anything unexpected is logged and becomes
a 500 without internals in the body.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import cast

import falcon
import falcon.asgi

from camg import metrics
from camg.episodes import admission
from camg.errors import CamgError, PermissionDenied
from camg.serving.service import Service
from camg.web import (
    action_tools,
    http_auth,
    mcp_server,
    openenv_compat,
    openenv_tasks,
    step_route,
    task_listing,
)
from camg.web import http_wire as wire
from camg.web.http import INTERNAL_ERROR, dumps, error_headers, read_body, reply

log = logging.getLogger("camg.http")


class Health:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def on_get(self, req, resp):
        healthy, reasons, serving = self.service.health_report()
        reply(
            resp,
            {
                "status": "healthy" if healthy else "degraded",
                "reasons": reasons,
                # degraded by recent unproven nulls alone: it takes episodes
                "serving": serving,
                "environment": self.service.env.name,
                # what camg status compares with the config on disk
                "config_hash": self.service.config.config_hash,
                "auth": self.service.auth_summary(),
                "episodes": self.service.manager.counts(),
            },
            200 if healthy else 503,
        )


class Metadata:
    def __init__(self, service: Service) -> None:
        self.service = service

    async def on_get(self, req, resp):
        reply(resp, self.service.metadata())


class Schema:
    def __init__(self, service: Service) -> None:
        env = service.env
        self.body = {
            "action": env.action_schema,
            "observation": env.observation_schema,
            "state": wire.STATE_SCHEMA,
            "create_episode": wire.CREATE_SCHEMA,
            "step_request": wire.step_request_schema(env.action_schema),
            "step_response": wire.step_response_schema(env.observation_schema),
            "regrade_response": wire.REGRADE_SCHEMA,
            "fork_request": wire.FORK_SCHEMA,
            "fork_response": wire.fork_response_schema(env.observation_schema),
            "tasks_query": wire.TASKS_QUERY_SCHEMA,
            "tasks_response": wire.TASKS_SCHEMA,
            "openenv_task_api": wire.OPENENV_TASK_API_SCHEMA,
            # the action schema above as OpenAI function-calling tools
            "tools": action_tools.tools(env.action_schema, name=env.name),
        }

    async def on_get(self, req, resp):
        reply(resp, self.body)


class Episodes:
    def __init__(self, service: Service) -> None:
        self.manager = service.manager
        self.limit = service.config.limits.max_body_bytes

    async def on_get(self, req, resp):
        reply(resp, {"episodes": self.manager.list(), **self.manager.counts()})

    async def on_post(self, req, resp):
        request = wire.parse_body(await read_body(req, self.limit), wire.CreateEpisode, "body")
        if request.group is None:
            body = await self.manager.create(request, hangup=admission.hangup(req))
            resp.location = f"/episodes/{body['episode_id']}"
        else:  # the Location of a group's first, which the others forked from
            body = await self.manager.create_group(request, hangup=admission.hangup(req))
            resp.location = f"/episodes/{body['group'][0]['episode_id']}"
        reply(resp, body, 201)


class Episode:
    def __init__(self, service: Service) -> None:
        self.manager = service.manager

    async def on_get(self, req, resp, episode_id):
        reply(resp, self.manager.state(episode_id))

    async def on_delete(self, req, resp, episode_id):
        reply(resp, await self.manager.close(episode_id))


class EpisodeReference:
    """The oracle's next action; only where the deployment enables references."""

    def __init__(self, service: Service) -> None:
        self.manager = service.manager
        self.enabled = service.config.references

    async def on_get(self, req, resp, episode_id):
        if not self.enabled:
            raise PermissionDenied(
                "references are not enabled in this deployment (environments.<name>.references)"
            )
        reply(resp, await self.manager.reference(episode_id))


class EpisodeStep:
    """The step route's every form but the plain one, which camg/web/step_route.py
    answers ahead of falcon with the same parsing, call and errors."""

    def __init__(self, service: Service) -> None:
        self.manager = service.manager
        self.limit = service.config.limits.max_body_bytes

    async def on_post(self, req, resp, episode_id):
        request = wire.parse_body(await read_body(req, self.limit), wire.StepRequest, "body")
        reply(resp, await self.manager.step(episode_id, request))


class EpisodeRegrade:
    """Grade a finished episode's stored submission again (camg.episodes.regrading)."""

    def __init__(self, service: Service) -> None:
        self.manager = service.manager
        self.limit = service.config.limits.max_body_bytes

    async def on_post(self, req, resp, episode_id):
        wire.parse_body(await read_body(req, self.limit), wire.RegradeRequest, "body")
        reply(resp, await self.manager.regrade(episode_id))


class EpisodeFork:
    """A running, idle episode's child (camg.episodes.forking)."""

    def __init__(self, service: Service) -> None:
        self.manager = service.manager
        self.limit = service.config.limits.max_body_bytes

    async def on_post(self, req, resp, episode_id):
        request = wire.parse_body(await read_body(req, self.limit), wire.ForkEpisode, "body")
        body = await self.manager.fork(episode_id, request, hangup=admission.hangup(req))
        resp.location = f"/episodes/{body['episode_id']}"
        reply(resp, body, 201)


async def _handle_camg_error(req, resp, exc: CamgError, params, ws=None):
    if ws is not None:  # errors inside a WebSocket are answered by the protocol
        return
    resp.status = falcon.code_to_http_status(exc.http_status)
    for name, value in error_headers(exc).items():
        resp.set_header(name, value)
    resp.content_type = falcon.MEDIA_JSON
    resp.text = dumps(exc.to_dict())


async def _handle_http_error(req, resp, exc: falcon.HTTPError, params, ws=None):
    if ws is not None:
        return
    resp.status = exc.status
    resp.content_type = falcon.MEDIA_JSON
    resp.text = dumps({"error": _slug(exc.title), "message": exc.description or exc.title})
    # falcon's own errors turn headers given as pairs into a dict.
    headers = cast("Mapping[str, str]", exc.headers or {})
    for name, value in headers.items():
        resp.set_header(name, value)


async def _handle_unexpected(req, resp, exc: Exception, params, ws=None):
    log.error("unhandled error on %s %s", req.method, req.path, exc_info=exc)
    if ws is not None:
        return
    resp.status = falcon.HTTP_500
    resp.content_type = falcon.MEDIA_JSON
    resp.text = dumps(INTERNAL_ERROR)


def _slug(title: str) -> str:
    return (title or "error").lower().replace(" ", "_")


class Lifespan:
    """ASGI lifespan: start the environment before READY=1, close episodes
    on shutdown."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def process_startup(self, scope, event):
        await self.service.start()

    async def process_shutdown(self, scope, event):
        await self.service.stop()


def create_app(service: Service) -> step_route.StepRoute | http_auth.AuthGate:
    app = falcon.asgi.App(middleware=[Lifespan(service)], cors_enable=False)
    app.req_options.strip_url_path_trailing_slash = True
    app.add_route("/health", Health(service))
    app.add_route("/metadata", Metadata(service))
    app.add_route("/schema", Schema(service))
    tasks = task_listing.Tasks(service)
    app.add_route("/tasks", tasks)
    openenv_tasks.add_routes(app, service.env.name, tasks.listing)
    app.add_route("/metrics", metrics.MetricsResource(service.metrics))
    app.add_route("/episodes", Episodes(service))
    app.add_route("/episodes/{episode_id}", Episode(service))
    app.add_route("/episodes/{episode_id}/step", EpisodeStep(service))
    app.add_route("/episodes/{episode_id}/reference", EpisodeReference(service))
    app.add_route("/episodes/{episode_id}/regrade", EpisodeRegrade(service))
    app.add_route("/episodes/{episode_id}/fork", EpisodeFork(service))
    openenv_compat.add_routes(app, service)
    app.add_error_handler(Exception, _handle_unexpected)
    app.add_error_handler(falcon.HTTPError, _handle_http_error)
    app.add_error_handler(CamgError, _handle_camg_error)
    # /mcp and the plain step route, dispatched before falcon, all behind
    # the token gate
    routes = step_route.StepRoute(mcp_server.mount(app, service), service)
    return routes if service.tokens is None else http_auth.AuthGate(routes, service.tokens)
