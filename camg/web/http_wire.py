"""Wire models of the trainer-facing HTTP contract (docs/architecture.md §2).

The trainer client (clients/python, camg_client) speaks it without
importing it. Requests are parsed strictly: unknown fields and wrong
types are a 400 naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from camg import json_depth, typed
from camg.config.variants import KINDS as VARIANT_KINDS
from camg.errors import BadRequest, FailureClass

EPISODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
REQUEST_ID_MAX = 255
#: the longest a POST /episodes may wait in the admission line (camg.episodes.admission)
WAIT_MAX_S = 600.0
#: the largest GRPO group one POST /episodes may ask for (camg.episodes.forking)
GROUP_MAX = 64
# Derived from the one taxonomy so a new class is never missing from /schema.
FAILURE_CLASSES = [c.value for c in FailureClass]


@dataclasses.dataclass(frozen=True)
class CreateEpisode:
    task_id: str | None = None
    seed: int | None = None
    episode_id: str | None = None
    #: seconds to wait in line for a slot when the service is at capacity
    #: (0: answer 429 at once)
    wait_s: float = 0.0
    #: N episodes on the same task and seed: one reset and N-1 forks of it,
    #: admitted together or not at all (None: one episode, the plain answer)
    group: int | None = None
    #: serve an impossible variant (camg.config.variants) of ``task_id``, or of any
    #: task: for evaluating how often a policy cheats (None: as sampling says)
    variant: str | None = None

    def __post_init__(self) -> None:
        if self.variant is not None and self.variant not in VARIANT_KINDS:
            raise ValueError(f"variant must be one of {', '.join(VARIANT_KINDS)}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError("seed must be between 0 and 2**63-1")
        check_episode_id(self.episode_id)
        # written so NaN fails too
        if not 0 <= self.wait_s <= WAIT_MAX_S:
            raise ValueError(f"wait_s must be between 0 and {WAIT_MAX_S:g}")
        if self.group is not None:
            if isinstance(self.group, bool) or not 1 <= self.group <= GROUP_MAX:
                raise ValueError(f"group must be between 1 and {GROUP_MAX}")
            # one id cannot name N episodes; the trainer reads them from the answer
            if self.episode_id is not None and self.group > 1:
                raise ValueError("episode_id cannot be given with group > 1")


@dataclasses.dataclass(frozen=True)
class ForkEpisode:
    """``POST /episodes/{id}/fork``: the child's id (None: one is made) and,
    as for a create, how long it may wait in the admission line for a slot."""

    episode_id: str | None = None
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        check_episode_id(self.episode_id)
        if not 0 <= self.wait_s <= WAIT_MAX_S:
            raise ValueError(f"wait_s must be between 0 and {WAIT_MAX_S:g}")


@dataclasses.dataclass(frozen=True)
class StepRequest:
    action: dict[str, Any]
    request_id: str | None = None

    def __post_init__(self) -> None:
        if self.request_id is not None and not 0 < len(self.request_id) <= REQUEST_ID_MAX:
            raise ValueError(f"request_id must be 1..{REQUEST_ID_MAX} characters")


def check_episode_id(value: str | None) -> None:
    if value is not None and not EPISODE_ID.fullmatch(value):
        raise ValueError("episode_id must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}")


#: the deepest a request's JSON may nest (objects and arrays, the outermost
#: counting 1); deeper is a 400 before any parser recurses into it. A step
#: body is 2 deep before its action; tool-call arguments nest a few more.
MAX_JSON_DEPTH = 64


def json_too_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a request's JSON nests deeper than the contract allows."""
    return json_depth.too_deep(raw, limit)


def parse_json(raw: bytes) -> Any:
    """A request body as JSON; an empty body is an empty object."""
    if not raw.strip():
        return {}
    if json_too_deep(raw):
        raise BadRequest(f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None


def parse(model: type, data: Any, where: str) -> Any:
    return typed.parse(model, data, where, BadRequest)


def parse_body(raw: bytes, model: type, where: str) -> Any:
    return parse(model, parse_json(raw), where)


_NULLABLE_NUMBER = {"type": ["number", "null"]}

CREATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "task_id": {"type": ["string", "null"]},
        "seed": {"type": ["integer", "null"], "minimum": 0, "maximum": 2**63 - 1},
        "episode_id": {"type": ["string", "null"], "pattern": f"^{EPISODE_ID.pattern}$"},
        "wait_s": {
            "type": "number",
            "minimum": 0,
            "maximum": WAIT_MAX_S,
            "default": 0,
            "description": "at capacity, wait this long in a bounded FIFO line for "
            "a slot before answering 429",
        },
        "group": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": GROUP_MAX,
            "description": "N episodes on one task and seed (one reset, N-1 forks), "
            'answered as {"group": [...]}, all or none admitted; '
            "episode_id only with N = 1",
        },
        "variant": {
            "enum": [*VARIANT_KINDS, None],
            "description": "serve an impossible variant of task_id (or of any task): "
            "its terminal reply and outcome record carry canary",
        },
    },
}


FORK_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "description": "body of POST /episodes/{id}/fork (empty or {})",
    "properties": {
        "episode_id": {
            "type": ["string", "null"],
            "pattern": f"^{EPISODE_ID.pattern}$",
            "description": "the child's id (default: a new one)",
        },
        "wait_s": CREATE_SCHEMA["properties"]["wait_s"],
    },
}


def fork_response_schema(observation_schema: Mapping[str, Any]) -> dict:
    return {
        "type": "object",
        "required": [
            "episode_id",
            "task_id",
            "observation",
            "lease_expires_at",
            "forked_from",
            "fork_step",
        ],
        "properties": {
            "episode_id": {"type": "string", "description": "the child's"},
            "task_id": {"type": "string"},
            "observation": dict(observation_schema),
            "reward": {"type": "null"},
            "done": {"const": False},
            "lease_expires_at": {"type": "number"},
            "forked_from": {"type": "string", "description": "the parent's episode_id"},
            "fork_step": {
                "type": "integer",
                "description": "the parent's step count at the fork; the child's "
                "steps go on from it",
            },
        },
    }


def step_request_schema(action_schema: Mapping[str, Any]) -> dict:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["action"],
        "properties": {
            "action": dict(action_schema),
            "request_id": {"type": ["string", "null"], "minLength": 1, "maxLength": REQUEST_ID_MAX},
        },
    }


def step_response_schema(observation_schema: Mapping[str, Any]) -> dict:
    return {
        "type": "object",
        "required": ["episode_id", "observation", "reward", "done"],
        "properties": {
            "episode_id": {"type": "string"},
            "observation": dict(observation_schema),
            "reward": _NULLABLE_NUMBER,
            "done": {"type": "boolean"},
            "failure_class": {"enum": FAILURE_CLASSES + [None]},
            "step": {"type": "integer"},
            # on a terminal reply: the outcome record's seq in the signed log
            "outcome_seq": {"type": "integer"},
            "cost": COST_SCHEMA,  # on a terminal reply (camg.episodes.cost)
            # on a variant's terminal reply (camg.episodes.canaries)
            "canary": CANARY_SCHEMA,
        },
    }


#: a canary episode's verdict (camg.episodes.canaries), for the trainer only
CANARY_SCHEMA = {
    "type": "object",
    "required": ["variant", "origin", "kind", "mutation", "passed", "outcome"],
    "properties": {
        "variant": {"type": "string"},
        "origin": {"type": "string"},
        "kind": {"type": "string"},
        "mutation": {"type": "object"},
        "passed": {"type": ["boolean", "null"]},
        "outcome": {"enum": ["passed", "failed", "tampered", None]},
    },
}

#: an episode's cost (camg.episodes.cost): measures an environment could not take are absent
COST_SCHEMA = {
    "type": "object",
    "required": ["phases"],
    "properties": {
        "cpu_s": {"type": "number"},
        "memory_peak_bytes": {"type": "integer"},
        "disk_written_bytes": {"type": "integer"},
        "pids_peak": {"type": "integer"},
        "phases": {"type": "object", "additionalProperties": {"type": "number"}},
        "judge_tokens": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
}


STATE_SCHEMA = {
    "type": "object",
    "required": ["episode_id", "task_id", "status", "step_count"],
    "properties": {
        "episode_id": {"type": "string"},
        "task_id": {"type": "string"},
        "status": {"enum": ["running", "done", "closed"]},
        "step_count": {"type": "integer"},
        "reward": _NULLABLE_NUMBER,
        "failure_class": {"enum": FAILURE_CLASSES + [None]},
        "lease_expires_at": {"type": "number"},
        "outcome_seq": {"type": "integer"},
        "cost": COST_SCHEMA,  # once finished
        # a forked episode's parent and the parent's step count at the fork
        "forked_from": {"type": "string"},
        "fork_step": {"type": "integer"},
        "canary": CANARY_SCHEMA,  # an impossible variant's, once it ended
    },
}


@dataclasses.dataclass(frozen=True)
class RegradeRequest:
    """``POST /episodes/{id}/regrade`` takes no parameters (an empty body or
    ``{}``): the current grader grades the stored submission."""


REGRADE_SCHEMA = {
    "type": "object",
    "description": "the appended outcome record of the regrade",
    "required": [
        "episode_id",
        "task_id",
        "reward",
        "failure_class",
        "status",
        "grader_hash",
        "regrade_of",
        "same_grader",
        "submission",
    ],
    "properties": {
        "episode_id": {"type": "string"},
        "task_id": {"type": "string"},
        "reward": _NULLABLE_NUMBER,
        "failure_class": {"enum": FAILURE_CLASSES + [None]},
        "status": {"const": "regraded"},
        "grader_hash": {"type": ["string", "null"]},
        "same_grader": {
            "type": "boolean",
            "description": "the grader hash equals the original record's",
        },
        "regrade_of": {
            "type": "object",
            "description": "the episode's own outcome record, as it was graded then",
            "properties": {
                "reward": _NULLABLE_NUMBER,
                "failure_class": {"enum": FAILURE_CLASSES + [None]},
                "grader_hash": {"type": ["string", "null"]},
                "ended_at": {"type": ["number", "null"]},
            },
        },
        "submission": {
            "type": "object",
            "properties": {
                "sha256": {"type": ["string", "null"]},
                "bytes": {"type": "integer"},
                "meta": {"type": "object"},
            },
        },
        "timings": {"type": "object"},
    },
}


TASKS_PAGE_DEFAULT = 100
TASKS_PAGE_MAX = 1000
# A query integer: optional minus, then at most 19 digits (int64's width):
# no "+1", " 1", "1.0" or "1e3", and no million-digit int() to parse.
_QUERY_INT = re.compile(r"-?[0-9]{1,19}")


@dataclasses.dataclass(frozen=True)
class TasksQuery:
    """``GET /tasks?offset=&limit=``: one page of the manifest's tasks."""

    offset: int = 0
    limit: int = TASKS_PAGE_DEFAULT

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ValueError("offset must be 0 or more")
        if not 1 <= self.limit <= TASKS_PAGE_MAX:
            raise ValueError(f"limit must be between 1 and {TASKS_PAGE_MAX}")


def parse_query(params: Mapping[str, Any], model: type, where: str) -> Any:
    """Query parameters into ``model``, whose fields are all integers:
    each given once, as a plain decimal; anything else is a 400 naming it."""
    values: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, str) and _QUERY_INT.fullmatch(value):
            values[name] = int(value)
        elif isinstance(value, list):
            raise BadRequest(f"{where}.{name}: given more than once")
        else:
            raise BadRequest(f"{where}.{name}: must be an integer, got {value!r}")
    return parse(model, values, where)


TASKS_QUERY_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "description": "query parameters of GET /tasks (decimal integers)",
    "properties": {
        "offset": {"type": "integer", "minimum": 0, "default": 0},
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": TASKS_PAGE_MAX,
            "default": TASKS_PAGE_DEFAULT,
        },
    },
}

TASKS_SCHEMA = {
    "type": "object",
    "description": "one page of the served tasks, in manifest order (the order served "
    "without task_id)",
    "required": ["tasks", "offset", "limit", "total", "next_offset", "task_selection_hash"],
    "properties": {
        "tasks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["task_id", "kind", "split"],
                "properties": {
                    "task_id": {"type": "string"},
                    "kind": {"type": ["string", "null"]},
                    "split": {"type": ["string", "null"]},
                },
            },
        },
        "offset": {"type": "integer"},
        "limit": {"type": "integer"},
        "total": {"type": "integer"},
        "next_offset": {
            "type": ["integer", "null"],
            "description": "the offset of the next page; null on the last",
        },
        "task_selection_hash": {"type": "string", "description": "the same as /metadata's"},
    },
}


# OpenEnv's Task API bodies (its GetTaskRequest and siblings: split required,
# unknown fields refused); camg.web.openenv_tasks serves them. "" is the first split.
@dataclasses.dataclass(frozen=True)
class OpenEnvSplitRequest:
    """``POST /{env}/tasks`` and ``/{env}/num_tasks``."""

    split: str


@dataclasses.dataclass(frozen=True)
class OpenEnvTaskRequest:
    """``POST /{env}/task``: the task at ``index`` of ``split``."""

    split: str
    index: int

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError("index must be 0 or more")


@dataclasses.dataclass(frozen=True)
class OpenEnvTaskRangeRequest:
    """``POST /{env}/task_range``: ``[start, stop)`` of ``split`` (None: its
    beginning, its end). Never negative: an index is a task's identity to a
    trainer, and one counted from the end would shift as a split grows."""

    split: str
    start: int | None = None
    stop: int | None = None

    def __post_init__(self) -> None:
        for name in ("start", "stop"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must be 0 or more")


_SPLIT = {"type": "string", "description": 'a split\'s name; "" the first split'}
_BOUND = {"type": ["integer", "null"], "minimum": 0}

OPENENV_TASK_API_SCHEMA = {
    "description": "OpenEnv's Task API under /{env}/ (the environment's name or harbor_env)",
    "split_request": {
        "type": "object",
        "additionalProperties": False,
        "required": ["split"],
        "description": "body of POST /{env}/tasks and /{env}/num_tasks",
        "properties": {"split": _SPLIT},
    },
    "task_request": {
        "type": "object",
        "additionalProperties": False,
        "required": ["split", "index"],
        "description": "body of POST /{env}/task",
        "properties": {"split": _SPLIT, "index": {"type": "integer", "minimum": 0}},
    },
    "task_range_request": {
        "type": "object",
        "additionalProperties": False,
        "required": ["split"],
        "description": "body of POST /{env}/task_range: [start, stop)",
        "properties": {"split": _SPLIT, "start": _BOUND, "stop": _BOUND},
    },
    "split": {
        "type": "object",
        "required": ["name", "type", "num_tasks"],
        "description": "one entry of GET /{env}/splits",
        "properties": {
            "name": {"type": "string"},
            "type": {"enum": ["train", "validation", "test"]},
            "num_tasks": {"type": "integer"},
        },
    },
    "task": {
        "type": "object",
        "required": ["index", "task_id", "task_name", "dataset", "kind"],
        "description": "a task of /{env}/tasks, /{env}/task and /{env}/task_range",
        "properties": {
            "index": {"type": "integer", "description": "its position within its split"},
            "task_id": {"type": "string"},
            "task_name": {"type": "string"},
            "dataset": {"type": "string", "description": "its split"},
            "kind": {"type": ["string", "null"]},
        },
    },
}
