"""ContainerFork's policy (helper/container_fork.py) with Docker stood in for
by a recorder: who may fork what, what is checked before the commit, the
child's parameters and labels, and the order snapshot images are released
in. The same verb runs against a real dockerd in
tests/privileged/test_fork_containers.py."""

from __future__ import annotations

import json
import os

import pytest

from camg import helper_wire as wire
from helper import config as helper_config
from helper import container_fork, containers as mc
from helper.sandbox_table import Peer

IMAGE = "127.0.0.1:5000/camg/x@sha256:" + "a" * 64
PEER = Peer(uid=990, gid=990, pid=1, owner="general")


class FakeDocker:
    """Records calls; images in use answer 409 (None) as Docker does."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.images: dict[str, set[str]] = {}  # image -> its users (containers, newer images)
        self.n = 0

    def commit(self, cid, labels):
        self.n += 1
        image = f"sha256:{self.n:064x}"
        self.images[image] = set()
        for users in self.images.values():
            if cid in users:  # the committed container runs an image: the new one stacks on it
                users.add(image)
        self.calls.append(("commit", cid, dict(labels)))
        return image

    def run(self, **kw):
        cid = f"{len(self.calls) + 1:064x}"
        if kw["image"] in self.images:
            self.images[kw["image"]].add(cid)
        self.calls.append(("run", cid, kw))
        return cid, os.getpid()  # a live pid for the pidfd

    def remove(self, cid):
        for users in self.images.values():
            users.discard(cid)
        self.calls.append(("remove", cid))
        return True

    def remove_image(self, image):
        if image not in self.images:
            return False
        if self.images[image]:
            return None
        del self.images[image]
        for users in self.images.values():
            users.discard(image)
        self.calls.append(("remove_image", image))
        return True

    def remove_labelled(self, labels):
        return 0

    def remove_images_labelled(self, labels):
        return sum(1 for i in list(self.images) if self.remove_image(i))


@pytest.fixture
def m(tmp_path, monkeypatch):
    manifest = tmp_path / "images.json"
    manifest.write_text(json.dumps({"images": [IMAGE]}))
    cfg = mc.ContainerConfig(images_manifest=str(manifest), scope="unit", containers_per_peer=3)
    mediator = mc.Mediator(cfg, agent_uid=2000, agent_gid=2000, ceilings=helper_config.Ceilings())
    mediator.docker = FakeDocker()
    # (this host's own agent-uid processes are not the container's)
    monkeypatch.setattr(container_fork, "agent_processes", lambda pidfd, uid: [])
    yield mediator
    for held in list(mediator.held.values()):
        if held.pidfd >= 0:
            os.close(held.pidfd)


def create(m, **kw):
    base = dict(image=IMAGE, cpu=1.0, memory_bytes=256 << 20, pids_max=128, episode_id="p",
                command=("sleep", "infinity"), user="agent", pool=True)
    base.update(kw)
    return m.create(PEER, wire.ContainerCreateParams(**base))


def fork(m, held, episode_id="c", peer=PEER):
    return container_fork.fork(m, peer, wire.ContainerForkParams(held.id, episode_id))[0]


def refused(fn, name):
    with pytest.raises(wire.WireError) as info:
        fn()
    assert info.value.name == name, info.value.message
    return info.value


def test_the_child_runs_the_snapshot_with_the_parents_parameters(m):
    parent = create(m)
    child = fork(m, parent, "child-1")
    commit, run = m.docker.calls[-2], m.docker.calls[-1]
    assert commit[0] == "commit" and commit[1] == parent.id
    assert commit[2]["camg.fork"] == "1" and commit[2]["camg.service"] == "general"
    assert commit[2]["camg.boot"] == m.boot and commit[2]["camg.helper"] == "unit"
    first_run = next(c for c in m.docker.calls if c[0] == "run")[2]
    kw = run[2]
    assert kw["image"] == child.snapshot and child.image == IMAGE and child.depth == 1
    for key in ("command", "env", "workdir", "user", "cpu", "memory", "pids", "binds"):
        assert kw[key] == first_run[key], key
    assert kw["labels"] == {**first_run["labels"], "camg.episode": "child-1", "camg.pool": "0"}


def test_another_peer_cannot_fork_and_nothing_is_committed(m):
    parent = create(m)
    refused(lambda: fork(m, parent, peer=Peer(990, 990, 1, "visual")), "not_found")
    refused(lambda: fork(m, parent, peer=Peer(991, 990, 1, "general")), "not_found")
    assert not [c for c in m.docker.calls if c[0] == "commit"]


def test_capacity_and_depth_are_checked_before_the_commit(m, monkeypatch):
    parent = create(m)
    fork(m, parent)
    fork(m, parent)  # 3 of 3
    commits = len([c for c in m.docker.calls if c[0] == "commit"])
    refused(lambda: fork(m, parent), "at_capacity")
    assert len([c for c in m.docker.calls if c[0] == "commit"]) == commits
    monkeypatch.setattr(container_fork, "MAX_FORK_DEPTH", 1)
    deep = next(h for h in m.held.values() if h.depth == 1)
    refused(lambda: fork(m, deep), "limit_exceeded")


def test_agent_processes_are_refused_by_name(m, monkeypatch):
    parent = create(m)
    monkeypatch.setattr(container_fork, "agent_processes", lambda pidfd, uid: [41, 42])
    err = refused(lambda: fork(m, parent), "not_allowed")
    assert "2 agent process(es)" in err.message
    assert not [c for c in m.docker.calls if c[0] == "commit"]
    allowed = container_fork.fork(m, PEER, wire.ContainerForkParams(parent.id, "c", True))[0]
    assert allowed.snapshot


def test_snapshots_go_with_their_last_user_oldest_last(m):
    parent = create(m)
    first = fork(m, parent, "g1")
    second = fork(m, first, "g2")  # stacks on the first snapshot
    assert second.depth == 2
    m.remove(first)
    assert set(m.docker.images) == {first.snapshot, second.snapshot}  # held by the newer one
    m.remove(second)
    assert m.docker.images == {}
    removed = [c[1] for c in m.docker.calls if c[0] == "remove_image"]
    assert removed == [second.snapshot, first.snapshot] and m.lineage == {}
    m.remove(parent)


def test_a_failed_child_start_releases_its_snapshot(m, monkeypatch):
    parent = create(m)

    def broken(**kw):
        raise wire.WireError("sandbox_died", "exited at start")
    monkeypatch.setattr(m.docker, "run", broken)
    refused(lambda: fork(m, parent), "sandbox_died")
    assert m.docker.images == {} and len(m.held) == 1
