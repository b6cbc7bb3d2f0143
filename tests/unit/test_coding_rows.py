"""Task rows: reading Parquet/JSONL and rejecting bad rows by index and field."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from camg.errors import DatasetError
from environments.coding import rows

EXAMPLE = Path(rows.__file__).parent / "testdata" / "example_row_pandas.json"
PATCH = ("diff --git a/src/x.py b/src/x.py\nindex 1..2 100644\n--- a/src/x.py\n+++ b/src/x.py\n"
         "@@ -1 +1 @@\n-a = 1\n+a = 2\n")


def good(**changes):
    row = {"instance_id": "acme__calc.1234abcd.func_pm_op_swap__deadbeef",
           "repo": "swesmith/acme__calc.1234abcd", "patch": PATCH,
           "FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": ["tests/test_x.py::test_b"],
           "image_name": "swesmith.x86_64.acme__calc.1234abcd", "problem_statement": "It broke."}
    row.update(changes)
    return row


def test_real_swesmith_row_validates():
    with open(EXAMPLE) as handle:
        raw = json.load(handle)
    row = rows.validate(raw, 0)
    assert row.mirror_name == "pandas-dev__pandas.95280573"
    assert row.fail_to_pass[0].startswith("pandas/tests/indexing/test_datetime.py::")
    assert row.to_data()["FAIL_TO_PASS"] == raw["FAIL_TO_PASS"]


@pytest.mark.parametrize("field,value,message", [
    ("instance_id", "", "non-empty"),
    ("instance_id", "a/b", "branch name"),
    ("instance_id", "a..b", "branch name"),
    ("instance_id", "x y", "branch name"),
    ("instance_id", "-x", "branch name"),
    ("instance_id", "x.lock", "branch name"),
    ("repo", "nobody", "owner/name"),
    ("repo", "a/..", "owner/name"),
    ("patch", "not a diff", "git diff"),
    ("patch", PATCH.replace("b/src/x.py", "b/../etc/passwd"), "outside"),
    ("FAIL_TO_PASS", [], "at least one"),
    ("FAIL_TO_PASS", ["t", "t"], "twice"),
    ("FAIL_TO_PASS", [3], "item 0"),
    ("FAIL_TO_PASS", "not json", "JSON list"),
    ("PASS_TO_PASS", ["tests/test_x.py::test_a"], "also in FAIL_TO_PASS"),
    ("PASS_TO_PASS", {"a": 1}, "list"),
    ("image_name", "a b", "whitespace"),
    ("problem_statement", "   ", "non-empty"),
])
def test_bad_field_is_named(field, value, message):
    with pytest.raises(DatasetError) as info:
        rows.validate(good(**{field: value}), 7)
    text = str(info.value)
    assert "row 7" in text and f"field {field}" in text and message in text
    assert info.value.details["field"] == field


def test_missing_and_unknown_fields():
    raw = good()
    del raw["image_name"]
    with pytest.raises(DatasetError, match="row 3 .*missing field image_name"):
        rows.validate(raw, 3)
    with pytest.raises(DatasetError, match="unknown field surprise"):
        rows.validate(good(surprise=1), 0)
    # The published dataset's extra columns are accepted.
    rows.validate(good(created_at="2025-01-01", base_commit="abc"), 0)


def test_swebench_style_json_string_lists():
    row = rows.validate(good(FAIL_TO_PASS='["t1", "t2"]', PASS_TO_PASS="[]"), 0)
    assert row.fail_to_pass == ("t1", "t2") and row.pass_to_pass == ()


def test_not_an_object():
    with pytest.raises(DatasetError, match="row 2: expected an object"):
        rows.validate(["x"], 2)


def test_read_jsonl_and_parquet_agree(tmp_path):
    data = [good(), good(instance_id="other.id")]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in data))
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(data), parquet)
    from_jsonl = [rows.validate(r, i) for i, r in enumerate(rows.read(jsonl))]
    from_parquet = [rows.validate(r, i) for i, r in enumerate(rows.read(parquet))]
    assert from_jsonl == from_parquet


def test_read_rejects_bad_files(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"a": 1}\n{nope\n')
    with pytest.raises(DatasetError, match="rows.jsonl:2: not JSON"):
        rows.read(bad)
    with pytest.raises(DatasetError, match=".parquet or .jsonl"):
        rows.read(tmp_path / "rows.csv")
    broken = tmp_path / "rows.parquet"
    broken.write_bytes(b"PAR1 garbage")
    with pytest.raises(DatasetError, match="cannot read Parquet"):
        rows.read(broken)
