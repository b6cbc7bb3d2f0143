"""The agent environment's cache key: what pip leaves in the runtime's source
tree must not change it. CI's agent env was rebuilt in place because the first
build's build/ directory changed the key the next caller computed, and the
rebuild removed the tree from under running containers ("container … is not
running")."""

import shutil

from environments.general.build import agent_env


def test_build_leftovers_in_the_runtime_do_not_change_the_key(tmp_path, monkeypatch):
    runtime = tmp_path / "mimoagent"
    shutil.copytree(agent_env.RUNTIME, runtime,
                    ignore=shutil.ignore_patterns("build", "__pycache__", "*.egg-info"))
    monkeypatch.setattr(agent_env, "RUNTIME", runtime)
    before = agent_env.key()
    (runtime / "build" / "lib" / "mimoagent").mkdir(parents=True)
    (runtime / "build" / "lib" / "mimoagent" / "transport.py").write_text("# a copy\n")
    (runtime / "src" / "mimoagent.egg-info").mkdir()
    (runtime / "src" / "mimoagent.egg-info" / "PKG-INFO").write_text("Name: mimoagent\n")
    assert agent_env.key() == before
    # a real source change still does
    next(p for p in sorted((runtime / "src").rglob("*.py"))).write_text("# changed\n")
    assert agent_env.key() != before


def test_the_cache_keeps_one_directory_per_key(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(agent_env, "build", lambda output: built.append(output) or output)
    path = agent_env.cached(tmp_path)
    assert path == tmp_path / "general" / f"agent-env-{agent_env.key()}"
    assert built == [path]
