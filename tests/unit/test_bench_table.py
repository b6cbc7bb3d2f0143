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
