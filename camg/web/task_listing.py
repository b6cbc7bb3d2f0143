"""``GET /tasks``: the served tasks, paged, in manifest order.

A trainer plans its schedule from this list (which ids, of which kind and
split) and checks ``task_selection_hash`` against ``/metadata`` and its own
records. The rows never change while a service runs, so the listing is
built once, at start-up, and a bad fact from an environment's
``task_facts`` stops the service there instead of breaking a request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from camg.environment import Environment
from camg.errors import ConfigError
from camg.web import http_wire as wire
from camg.web.http import reply

FACTS = ("kind", "split")


class TaskListing:
    def __init__(self, environment: Environment, selection_hash: str) -> None:
        self.rows: Sequence[Mapping[str, Any]] = tuple(
            {"task_id": task.task_id, **_facts(environment, task)} for task in environment.tasks
        )
        self.selection_hash = selection_hash

    def page(self, query: wire.TasksQuery) -> dict:
        total = len(self.rows)
        # Past the end is an empty last page, not an error: a trainer paging
        # while it counts never has to special-case the final request.
        end = min(total, query.offset + query.limit)
        return {
            "tasks": list(self.rows[query.offset : end]),
            "offset": query.offset,
            "limit": query.limit,
            "total": total,
            "next_offset": end if end < total else None,
            "task_selection_hash": self.selection_hash,
        }


def _facts(environment: Environment, task) -> dict:
    facts = dict(environment.task_facts(task))
    if set(facts) != set(FACTS) or not all(v is None or isinstance(v, str) for v in facts.values()):
        raise ConfigError(
            f"{environment.name}: task_facts({task.task_id!r}) must give "
            f"{' and '.join(FACTS)} as strings or None, got {facts!r}"
        )
    return {key: facts[key] for key in FACTS}


class Tasks:
    """The resource; ``camg.web.app`` routes ``/tasks`` here."""

    def __init__(self, service) -> None:
        self.listing = TaskListing(service.env, service.config.task_selection_hash)

    async def on_get(self, req, resp):
        reply(resp, self.listing.page(wire.parse_query(req.params, wire.TasksQuery, "query")))
