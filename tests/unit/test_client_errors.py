"""The trainer client's error classes against the service's one taxonomy
(camg/errors.py): the client imports nothing of the services, so it keeps
its own table, and this is what keeps the two the same."""

from __future__ import annotations

import camg_client
from camg import errors


def _service_classes() -> list[type[errors.CamgError]]:
    found, todo = [], [errors.CamgError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if c.__module__ == errors.__name__]


def test_every_service_error_name_has_a_client_class():
    names = {c.name for c in _service_classes()}
    assert {"episode_exists", "at_capacity", "sandbox_died"} <= names
    missing = sorted(names - set(camg_client.ERROR_CLASSES))
    assert not missing, f"camg/errors.py names the client does not map: {missing}"
    stale = sorted(set(camg_client.ERROR_CLASSES) - names)
    assert not stale, f"the client maps names the service no longer has: {stale}"


def test_client_classes_keep_the_service_hierarchy():
    # A service error under another (EpisodeBusy under Conflict) arrives as a
    # client class under that one's, so `except Conflict` catches both ends.
    by_name = camg_client.ERROR_CLASSES
    for cls in _service_classes():
        for parent in cls.__mro__[1:]:
            if parent is errors.CamgError or not issubclass(parent, errors.CamgError):
                continue
            assert issubclass(by_name[cls.name], by_name[parent.name]), (cls, parent)


def test_a_body_becomes_its_class_and_an_unknown_name_stays_generic():
    exc = camg_client.ServiceError(409, {"error": "episode_exists", "message": "taken"})
    assert type(exc) is camg_client.EpisodeExists and isinstance(exc, camg_client.Conflict)
    assert exc.name == "episode_exists" and exc.status == 409 and "taken" in str(exc)
    failed = camg_client.ServiceError(503, {"error": "sandbox_died", "message": "x",
                                            "failure_class": "sandbox_died"})
    assert type(failed) is camg_client.Unavailable and failed.failure_class == "sandbox_died"
    other = camg_client.ServiceError(418, "not json")
    assert type(other) is camg_client.ServiceError and other.name == "http_418"
