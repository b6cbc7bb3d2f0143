"""Visual starts when its image's registry is gone (found by the reliability
suite: a loopback registry used to publish the demo image is gone once the
image is in dockerd). A failed pull is logged, as General does; the pool is
made, and a missing image would fail its creates, not the start."""

from __future__ import annotations

from camg import errors
from camg.environment import ServiceContext, Task
from environments.visual.environment import VisualEnvironment

IMAGE = "127.0.0.1:1/r/x@sha256:" + "0" * 64


class GoneRegistry:
    def __init__(self) -> None:
        self.pulled: list[str] = []

    def pull(self, image: str) -> str:
        self.pulled.append(image)
        raise errors.InfraFailure(f"helper: pulling {image}: docker answered 500: connection refused")


def test_pool_made_when_the_pull_fails(tmp_path, caplog):
    task = Task("t1", {"problem_statement": "A bakery site", "cwd": "/workspace", "image": IMAGE})
    env = VisualEnvironment(ServiceContext("visual", str(tmp_path / "state"), {"pool_size": 0}),
                            [task])
    env.containers = GoneRegistry()
    pool = env._pool(IMAGE)
    try:
        assert env.containers.pulled == [IMAGE]
        assert env.pools[IMAGE] is pool
        assert "pulling" in caplog.text
    finally:
        pool.close()
