"""The warm-upper pool's bookkeeping (helper/upper_pool.py): how the ceiling
is shared between sizes, that a pool of 0 makes nothing, that its ceiling
is validated with the others. The real entries (loop devices, detached
ext4s) are tests/privileged/test_fork_sandboxes.py's."""

from __future__ import annotations

import os

import pytest

from helper.config import ConfigError, HelperConfig, Ceilings
from helper.upper_pool import UpperPool, targets


def test_the_ceiling_is_shared_by_the_most_recent_sizes():
    assert targets([], 4) == {}
    assert targets([64], 0) == {}
    assert targets([64], 4) == {64: 4}
    assert targets([64, 32], 4) == {64: 2, 32: 2}
    assert targets([64, 32, 16], 4) == {64: 1, 32: 1, 16: 1}
    # more sizes than entries: the most recent ones, one each
    assert targets([1, 2, 3, 4, 5, 6], 4) == {3: 1, 4: 1, 5: 1, 6: 1}
    for sizes in ([1], [1, 2], [1, 2, 3], list(range(9))):
        assert sum(targets(sizes, 4).values()) <= 4


def test_a_pool_of_zero_makes_nothing(tmp_path):
    pool = UpperPool(str(tmp_path), 0)
    pool.want(64 << 20)
    assert pool.thread is None and pool.take(1 << 20) is None
    assert pool.drain() == 0 and pool.drain() == 0  # idempotent


def test_sizes_are_remembered_most_recent_last_within_the_ceiling(tmp_path):
    pool = UpperPool(str(tmp_path), 2)
    with pool.cond:  # as want() does, without starting the thread
        for size in (1, 2, 1, 3):
            pool.sizes[size] = None
            pool.sizes.move_to_end(size)
            while len(pool.sizes) > pool.limit:
                pool.sizes.popitem(last=False)
        assert list(pool.sizes) == [1, 3]
        assert pool._next() == 3  # the most recent size first
        pool.making = 2
        assert pool._next() is None  # entries being made count against the ceiling


def test_warm_uppers_is_a_validated_ceiling():
    assert HelperConfig().ceilings.warm_uppers == 4
    assert HelperConfig(ceilings=Ceilings(warm_uppers=0)).ceilings.warm_uppers == 0
    with pytest.raises(ConfigError, match="ceilings"):
        HelperConfig(ceilings=Ceilings(warm_uppers=-1))

def test_status_reports_held_and_making_together(tmp_path):
    # what Ping carries, and devtools/reliability/rig.py subtracts from the
    # helper's detached mounts: a warm entry is not a leaked fork layer
    pool = UpperPool(str(tmp_path), 4)
    assert pool.status() == {"held": 0, "making": 0}
    r, w = os.pipe()
    with pool.cond:
        pool.warm.append((1 << 20, r))
        pool.making = 1
    assert pool.status() == {"held": 1, "making": 1}
    assert pool.drain() == 1 and pool.status() == {"held": 0, "making": 1}
    os.close(w)
