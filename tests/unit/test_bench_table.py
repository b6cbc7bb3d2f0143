"""docs/benchmarks.md is what bench/table.py makes of bench/results/: a
results file changed without regenerating the doc fails here."""

from __future__ import annotations

import json

from bench import table


def test_the_doc_is_generated_from_the_results():
    assert table.DOC.read_text() == table.render(), "run .venv/bin/python bench/table.py"


def test_every_results_file_has_a_section_with_each_value():
    doc = table.DOC.read_text()
    for path in sorted(table.RESULTS.glob("*.json")):
        assert f"\n## {path.stem}\n" in doc, path.name
        for key, shown in table.rows(json.loads(path.read_text())):
            assert f"| `{key}` | {shown} |" in doc, (path.name, key)


def test_values_are_flattened_the_documented_way():
    assert table.rows({"a": {"p50": 0.153, "ok": True}, "l": [1, 2], "n": None}) == [
        ("a.p50", "0.153"), ("a.ok", "yes"), ("l", "2 entries"), ("n", "-")]


def test_every_environments_benchmark_is_in_the_testing_doc():
    """docs/testing.md's table of benchmarks lists each registered
    environment's own (its plugin's ``bench``)."""
    from camg import plugins

    doc = (table.REPO / "docs" / "testing.md").read_text()
    for name, plugin in plugins.all_plugins().items():
        if plugin.bench is None:  # listed as having none by bench/environment_bench.py
            continue
        path = plugin.bench.split(":")[0].replace(".", "/") + ".py"
        assert (table.REPO / path).is_file(), (name, path)
        assert f"| `{path}` |" in doc, (name, path)
