"""OpenEnv's Task API (``/{env}/splits``, ``/{env}/tasks``, ``/{env}/num_tasks``,
``/{env}/task``, ``/{env}/task_range``, ``/list_environments``), as the
stock ``openenv`` 0.10.0 serves it (``openenv.core.env_server.http_server``)
and its one client of it calls it (``openenv.harbor.client.HarborEnv``).

Everything is read from the listing ``GET /tasks`` serves
(camg.web.task_listing), so both views agree: manifest order, the ids, kind and
split, never a task's data. A split is a dataset split the rows name, in
order of first appearance; rows naming none (all of them, for a dataset
without splits) form one split named for the environment, as OpenEnv's
Harbor server names a dataset's only split for the dataset. A task's index
is its position within its split.

``{env}``: OpenEnv's server answers under its ``env_name`` (the
environment's name, compared without case) and 404s any other;
``HarborEnv``, the stock client, always sends ``harbor_env`` (the name
Harbor's server is built with). A camg service answers both: its
environment's name and ``harbor_env``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import falcon.asgi

from camg.errors import BadRequest, ConfigError, NotFound
from camg.web import http_wire as wire
from camg.web.http import read_body, reply
from camg.web.task_listing import TaskListing

#: the ``{env}`` segment openenv.harbor.client.HarborEnv puts in every path
HARBOR_CLIENT_ENV = "harbor_env"
#: a Task API body is a split name and two integers
BODY_LIMIT = 4096
#: OpenEnv's split types; any other name is typed "validation" (its _normalize_split)
SPLIT_TYPES = ("train", "validation", "test")


class TaskSplits:
    """The listing's rows grouped into OpenEnv splits, built once."""

    def __init__(self, env_name: str, listing: TaskListing) -> None:
        self.env_name = env_name
        self.splits: dict[str, list[dict]] = {}
        for row in listing.rows:
            name = row["split"] if row["split"] is not None else env_name
            tasks = self.splits.setdefault(name, [])
            tasks.append(_task(row, name, len(tasks)))
        if any(row["split"] == env_name for row in listing.rows) and any(
            row["split"] is None for row in listing.rows
        ):
            raise ConfigError(
                f"{env_name}: a split named like the environment would hold "
                "the tasks without a split too"
            )

    def describe(self) -> list[dict]:
        return [
            {
                "name": name,
                "type": name if name in SPLIT_TYPES else "validation",
                "num_tasks": len(tasks),
            }
            for name, tasks in self.splits.items()
        ]

    def tasks(self, split: str) -> Sequence[dict]:
        # "" is the first split, as Harbor's provider reads it (HarborEnv's
        # num_tasks defaults to it)
        if split == "" and self.splits:
            return next(iter(self.splits.values()))
        if split not in self.splits:
            raise BadRequest(
                f"split: unknown split {split!r}; served splits are {list(self.splits)}"
            )
        return self.splits[split]

    def task(self, split: str, index: int) -> dict:
        tasks = self.tasks(split)
        if index >= len(tasks):
            raise BadRequest(
                f"index: {index} is past the end of split {split!r} ({len(tasks)} tasks)"
            )
        return tasks[index]


def _task(row: Mapping[str, Any], split: str, index: int) -> dict:
    # HarborTaskRef's fields (index, task_id, task_name, dataset, instruction)
    # where camg knows them: a task's name is its id, its dataset the split,
    # and its prompt exists only once an episode renders it; kind beside.
    return {
        "index": index,
        "task_id": row["task_id"],
        "task_name": row["task_id"],
        "dataset": split,
        "kind": row["kind"],
    }


class _Resource:
    def __init__(self, splits: TaskSplits) -> None:
        self.splits = splits

    def check(self, env: str) -> None:
        if env.lower() not in (self.splits.env_name.lower(), HARBOR_CLIENT_ENV):
            raise NotFound(
                f"unknown environment {env!r}; this service is "
                f"{self.splits.env_name!r} (or {HARBOR_CLIENT_ENV!r})"
            )

    async def body(self, req, model: type) -> Any:
        return wire.parse_body(await read_body(req, BODY_LIMIT), model, "body")


class Splits(_Resource):
    async def on_get(self, req, resp, env):
        self.check(env)
        reply(resp, self.splits.describe())


class Tasks(_Resource):
    async def on_post(self, req, resp, env):
        self.check(env)
        query = await self.body(req, wire.OpenEnvSplitRequest)
        reply(
            resp, {"tasks": list(self.splits.tasks(query.split)), "env_name": self.splits.env_name}
        )


class NumTasks(_Resource):
    async def on_post(self, req, resp, env):
        self.check(env)
        query = await self.body(req, wire.OpenEnvSplitRequest)
        reply(resp, {"num_tasks": len(self.splits.tasks(query.split))})


class Task(_Resource):
    async def on_post(self, req, resp, env):
        self.check(env)
        query = await self.body(req, wire.OpenEnvTaskRequest)
        reply(resp, {"task": self.splits.task(query.split, query.index)})


class TaskRange(_Resource):
    async def on_post(self, req, resp, env):
        self.check(env)
        query = await self.body(req, wire.OpenEnvTaskRangeRequest)
        # bounds are never negative (the wire type), so the slice is a plain
        # [start, stop): past the end or stop <= start is an empty list
        reply(resp, {"tasks": list(self.splits.tasks(query.split)[query.start : query.stop])})


class Environments:
    def __init__(self, env_name: str) -> None:
        self.env_name = env_name

    async def on_get(self, req, resp):
        reply(resp, [self.env_name])


def add_routes(app: falcon.asgi.App, env_name: str, listing: TaskListing) -> None:
    splits = TaskSplits(env_name, listing)
    app.add_route("/list_environments", Environments(env_name))
    app.add_route("/{env}/splits", Splits(splits))
    app.add_route("/{env}/tasks", Tasks(splits))
    app.add_route("/{env}/num_tasks", NumTasks(splits))
    app.add_route("/{env}/task", Task(splits))
    app.add_route("/{env}/task_range", TaskRange(splits))
