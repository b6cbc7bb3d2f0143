"""Forking a General episode through the real service's HTTP API (issue 26):
the scenario of fork_http.py on the demo's opensource-code task, with its
gold patch as the reference (test_oracle_general's service: references
enabled, the anchor judge), whose maximum is 1.0. The in-process split is
test_fork_containers.py's; this is the route a trainer uses. Only HTTP is
looked at, so it holds whatever runs inside the container (the transport).

Afterwards nothing is left: no container (the service fixture's check),
no fork snapshot image, and the conftest's leak check (mounts, cgroups,
processes)."""

from __future__ import annotations

import pytest

from fork_http import oracle_and_noop_branches, snapshot_images
from test_oracle_general import oracle_demo, oracle_helper, oracle_service  # noqa: F401 (fixtures)
from tests.privileged.container_fixtures import needs_docker

pytestmark = [pytest.mark.privileged, pytest.mark.slow, pytest.mark.docker, needs_docker]


def test_fork_over_http_oracle_branch_one_noop_branch_zero(oracle_service):  # noqa: F811
    task_id = oracle_service["tasks"]["opensource-code"][0]
    child, _parent = oracle_and_noop_branches(oracle_service["service"], task_id, 1.0)
    assert child["integrity"] == "ok", child
    assert snapshot_images("general") == 0, "fork snapshot images left behind"
