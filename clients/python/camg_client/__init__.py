"""camg's trainer client: what a trainer installs alone (``pip install
clients/python``), without the services or their lock.

``Client`` (standard library only) and ``AsyncClient`` (extra ``async``:
httpx) speak the HTTP contract; ``python -m camg_client`` runs a rollout
(extra ``rollout``: httpx, openai, tqdm), ``--ray`` over a Ray cluster
(extra ``ray``). The services may import this package; it imports nothing
of theirs.
"""

from camg_client.client import (
    ERROR_CLASSES,
    AsyncClient,
    AtCapacity,
    BadRequest,
    Client,
    Conflict,
    EpisodeBusy,
    EpisodeDone,
    EpisodeExists,
    EpisodeRunning,
    InvalidAction,
    NoSubmission,
    NotForkable,
    NotFound,
    PermissionDenied,
    RegradeUnsupported,
    ServerError,
    ServiceError,
    Unavailable,
    load_routes,
)

__all__ = [
    "ERROR_CLASSES",
    "AsyncClient",
    "AtCapacity",
    "BadRequest",
    "Client",
    "Conflict",
    "EpisodeBusy",
    "EpisodeDone",
    "EpisodeExists",
    "EpisodeRunning",
    "InvalidAction",
    "NoSubmission",
    "NotForkable",
    "NotFound",
    "PermissionDenied",
    "RegradeUnsupported",
    "ServerError",
    "ServiceError",
    "Unavailable",
    "load_routes",
]
