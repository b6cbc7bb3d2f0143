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
from helper import container_fork, container_standby, containers as mc
from helper.sandbox_table import Peer

IMAGE = "127.0.0.1:5000/camg/x@sha256:" + "a" * 64
PEER = Peer(uid=990, gid=990, pid=1, owner="general")


class FakeDocker:
    """Records calls; images in use answer 409 (None) as Docker does. With
    ``overlay`` every container has a layer directory (the copy path), else
    none (another storage driver: the commit path)."""

    def __init__(self, overlay: bool = False) -> None:
        self.calls: list[tuple] = []
        self.images: dict[str, set[str]] = {}  # image -> its users (containers, newer images)
        self.n = 0
        self.overlay = overlay
        self.containers: set[str] = set()

    def layer(self, cid):
        return f"/layers/{cid}" if self.overlay else None

    def create(self, **kw):
        self.n += 1
        cid = f"{self.n:064x}"
        self.containers.add(cid)
        self.calls.append(("create", cid, kw))
        return cid, self.layer(cid)

    def start(self, cid):
        self.calls.append(("start", cid))
        return os.getpid()

    def pause(self, cid):
        self.calls.append(("pause", cid))

    def unpause(self, cid):
        self.calls.append(("unpause", cid))

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
        self.n += 1
        cid = f"{self.n:064x}"
        self.containers.add(cid)
        if kw["image"] in self.images:
            self.images[kw["image"]].add(cid)
        self.calls.append(("run", cid, kw))
        return cid, os.getpid()  # a live pid for the pidfd

    def remove(self, cid):
        self.containers.discard(cid)
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
def m(request, tmp_path, monkeypatch):
    manifest = tmp_path / "images.json"
    manifest.write_text(json.dumps({"images": [IMAGE]}))
    cfg = mc.ContainerConfig(images_manifest=str(manifest), scope="unit", containers_per_peer=3)
    mediator = mc.Mediator(cfg, agent_uid=2000, agent_gid=2000, ceilings=helper_config.Ceilings())
    mediator.docker = FakeDocker(overlay=getattr(request, "param", False))
    copies: list[tuple[str, str]] = []
    monkeypatch.setattr(container_fork.container_disk, "copy_upper", lambda a, b: copies.append((a, b)))
    mediator.copies = copies
    mediator.cfg_manifest = manifest
    # (this host's own agent-uid processes are not the container's)
    monkeypatch.setattr(container_fork, "agent_processes", lambda pidfd, uid: [])
    yield mediator
    mediator.standby.drop_peer(PEER)
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


# -- the copy path (overlay2): standby children, no image ---------------------------------

copying = pytest.mark.parametrize("m", [True], indirect=True)


def settle(m):
    for spec in list(m.standby.specs.values()):
        if spec.filling is not None:
            spec.filling.join()


@copying
def test_a_copied_fork_pauses_the_parent_copies_its_upper_and_makes_no_image(m):
    parent = create(m)
    child, timings = container_fork.fork(m, PEER, wire.ContainerForkParams(parent.id, "child-1"))
    assert timings["standby"] is False and not child.snapshot and child.depth == 1
    kinds = [c[0] for c in m.docker.calls]
    assert "commit" not in kinds and m.docker.images == {}
    i = kinds.index("pause")
    assert m.docker.calls[i][1] == parent.id and ("unpause", parent.id) in m.docker.calls[i:]
    assert m.copies == [(f"/layers/{parent.id}", f"/layers/{child.id}")]
    made = next(c for c in m.docker.calls if c[0] == "create" and c[1] == child.id)[2]
    first_run = next(c for c in m.docker.calls if c[0] == "run")[2]
    assert made["image"] == IMAGE and child.image == IMAGE
    for key in ("command", "env", "workdir", "user", "cpu", "memory", "pids", "binds"):
        assert made[key] == first_run[key], key
    assert made["labels"] == {**first_run["labels"], "camg.episode": "child-1", "camg.pool": "0",
                              "camg.fork": "1"}


@copying
def test_the_next_fork_takes_a_standby_of_the_same_spec(m):
    parent = create(m)
    fork(m, parent, "c1")
    settle(m)
    ready = m.standby.ids()
    assert len(ready) == container_standby.PER_SPEC and not ready & set(m.held)
    standby_labels = next(c[2]["labels"] for c in m.docker.calls if c[0] == "create" and c[1] in ready)
    assert standby_labels["camg.episode"] == "" and standby_labels["camg.fork"] == "1"
    assert standby_labels["camg.service"] == "general" and standby_labels["camg.pool"] == "0"
    child, timings = container_fork.fork(m, PEER, wire.ContainerForkParams(parent.id, "c2"))
    assert timings["standby"] is True and child.id in ready and child.episode_id == "c2"
    # the standbys never counted against the peer: 3 of 3 held, then at capacity
    refused(lambda: fork(m, parent), "at_capacity")


@copying
def test_standbys_go_with_the_last_container_of_their_spec(m):
    parent = create(m)
    other = create(m, memory_bytes=128 << 20)  # another spec: no standby of its own
    child = fork(m, parent)
    settle(m)
    assert len(m.standby.ids()) == container_standby.PER_SPEC
    m.remove(parent)
    assert len(m.standby.ids()) == container_standby.PER_SPEC  # the child is of the same spec
    m.remove(child)
    assert m.standby.ids() == set()
    assert m.docker.containers == {other.id}
    m.remove(other)


@copying
def test_ceilings_and_peers_are_checked_before_any_pause(m, monkeypatch):
    parent = create(m)
    refused(lambda: fork(m, parent, peer=Peer(990, 990, 1, "visual")), "not_found")
    monkeypatch.setattr(container_fork, "agent_processes", lambda pidfd, uid: [7])
    refused(lambda: fork(m, parent), "not_allowed")
    assert not [c for c in m.docker.calls if c[0] in ("pause", "create")]
    monkeypatch.setattr(container_fork, "agent_processes", lambda pidfd, uid: [])
    # an image dropped from the manifest is not forked either
    (m.cfg_manifest).write_text(json.dumps({"images": []}))
    os.utime(m.cfg_manifest, (1, 1))
    refused(lambda: fork(m, parent), "not_allowed")
    assert not [c for c in m.docker.calls if c[0] in ("pause", "create")]


@copying
def test_a_failed_copy_resumes_the_parent_and_removes_the_child(m, monkeypatch):
    parent = create(m)

    def full(a, b):
        raise wire.WireError("limit_exceeded", "no space")
    monkeypatch.setattr(container_fork.container_disk, "copy_upper", full)
    refused(lambda: fork(m, parent), "limit_exceeded")
    assert m.docker.calls[-2][0] == "unpause" and m.docker.calls[-1][0] == "remove"
    settle(m)
    assert set(m.held) == {parent.id}
    m.remove(parent)
    assert m.docker.containers == set()
