"""The reliability suites' census of a service's state directory
(devtools.reliability.rig.state_strays) and the runner's short sizes."""

from __future__ import annotations

import hashlib

from camg import plugins
from devtools.reliability import __main__ as reliability
from devtools.reliability.rig import state_strays


def _state(tmp_path, blobs=(b"diff",)):
    state = tmp_path / "state"
    (state / "trajectories").mkdir(parents=True)
    (state / "outcomes.jsonl").write_text("")
    (state / "trajectories" / "e1.jsonl").write_text("")
    refs = []
    for data in blobs:
        digest = hashlib.sha256(data).hexdigest()
        (state / "submissions" / digest[:2]).mkdir(parents=True, exist_ok=True)
        (state / "submissions" / digest[:2] / digest).write_bytes(data)
        refs.append({"submission": {"sha256": f"sha256:{digest}", "bytes": len(data)}})
    return state, refs


def test_records_trajectories_and_named_submissions_are_no_strays(tmp_path):
    state, records = _state(tmp_path)
    records.append({"submission": {"sha256": None, "bytes": 0}})  # an empty submission
    assert state_strays(state, {"e1"}, records=records) == []


def test_everything_else_is_a_stray(tmp_path):
    state, records = _state(tmp_path, blobs=(b"named", b"orphan"))
    (state / "trajectories" / "e2.open").write_text("")   # not an episode of the run
    (state / "run.json").write_text("{}")
    tmp = state / "submissions" / "ab" / ".in-x"
    tmp.parent.mkdir(exist_ok=True)
    tmp.write_text("")                                     # a torn store
    strays = state_strays(state, {"e1"}, records=records[:1])
    orphan = hashlib.sha256(b"orphan").hexdigest()
    assert strays == ["run.json", f"submissions/{orphan[:2]}/{orphan}", "submissions/ab/.in-x",
                      "trajectories/e2.open"]


def test_kept_files_and_per_episode_directories(tmp_path):
    state, _ = _state(tmp_path, blobs=())
    (state / "clean.json").write_text("{}")
    (state / "screenshots").mkdir()
    (state / "screenshots" / "e1.jpg").write_bytes(b"")
    (state / "screenshots" / ".e9.tmp").write_bytes(b"")
    assert state_strays(state, {"e1"}, ("clean.json",), ("screenshots",)) == \
        ["screenshots/.e9.tmp"]


def test_every_plugin_has_a_recipe_and_its_budgets_name_real_sizes():
    from devtools.reliability.targets import all_targets
    targets = {t.name: t for t in all_targets()}
    assert set(targets) == {"sandbox", *plugins.all_plugins()}
    assert not [n for n, t in targets.items() if t.missing]
    for target in targets.values():
        assert set(target.short) | set(target.full) <= set(reliability.SIZES), target.name
    # CI's short run asks fewer episodes of the expensive targets
    assert reliability.target_sizes(targets["general"], reliability.SHORT)["churn"] == 3
    assert reliability.target_sizes(targets["coding"], reliability.SHORT)["churn"] == 6
    given = dict(reliability.SHORT, churn=5, given=("churn",))
    assert reliability.target_sizes(targets["general"], given)["churn"] == 5
