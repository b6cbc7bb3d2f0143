"""Forking a Visual episode through the real service's HTTP API (issue 26):
the scenario of fork_http.py on the plain-CSS demo task, with its reference
site (test_oracle_visual's configuration: references enabled) and the
scripted judge, whose maximum is ``MAX_SCORE``. The in-process split is
test_fork_containers.py's; this is the route a trainer uses.

Afterwards nothing of the service's is left: no container, sandbox or
browser (assert_nothing_left), no fork snapshot image, and the conftest's
leak check (mounts, cgroups, processes)."""

from __future__ import annotations

import pytest

from fork_http import oracle_and_noop_branches, snapshot_images
from test_oracle_visual import oracle_config  # noqa: F401 (fixture)
from test_visual_episodes import (assert_nothing_left, judge, judge_env,  # noqa: F401
                                  mirror_manifest, renderer_dir, visual_helper)
from tests.privileged.container_fixtures import image_ref, needs_docker  # noqa: F401 (fixture)
from tests.support.services import ServiceProcess
from tools.judge_stub import MAX_SCORE

pytestmark = [pytest.mark.privileged, pytest.mark.slow, pytest.mark.docker, needs_docker]

TASK = "camg_webdev_demo_003"  # plain CSS: the cheaper render of test_oracle_visual's two


def test_fork_over_http_oracle_branch_maximum_noop_branch_zero(oracle_config, judge,  # noqa: F811
                                                               visual_helper):  # noqa: F811
    svc = ServiceProcess(oracle_config / "prepared" / "visual.json",
                         env=judge_env(judge)).wait_ready(120)
    try:
        child, _parent = oracle_and_noop_branches(svc, TASK, MAX_SCORE)
        assert child["judge"]["judge_model"] == "fake-vision", child
    finally:
        code = svc.stop()
    assert code == 0, svc.output()[-3000:]
    assert_nothing_left(visual_helper, svc)
    assert snapshot_images("visual") == 0, "fork snapshot images left behind"
