"""The general-agent verifier runner (``python -m mimoagent.verify.general``).

Reads ``verifier_meta.json`` from the task directory: a list of rubric
``items``, each ``{"id", "method": "rule"|"llm", "weight"?, "gate"?, ...}``.

* Rule items are code checks scored 0 or 1 against the post-state:
  ``sql`` (a query on a server's SQLite state equals ``expect``), ``regex``
  (a workspace file's text matches), ``xlsx_cell`` (a cell equals ``expect``
  within ``tolerance``), ``unchanged`` (listed workspace files keep their
  original bytes: the source-conservation gate).
* LLM items become judge requests: the item's question and pass anchor plus
  the extracted text of its workspace files (each capped at 20,000
  characters), asking for ``{"score": 0 or 1}``.

Outputs (in ``--out``): ``reward_detail.json`` with ``results`` (rule items)
and ``judge_requests``; ``reward.json`` with ``{"reward": x}`` when no LLM
item needs judging (or a gate failed: reward 0, LLM items skipped), else
``{"pending_judge": true}`` -- the judge is called by whoever holds its
credentials (the General service), which then aggregates with
``aggregate``: sum(weight * score) / sum(weight) over the non-gate items, a missing
weight counting 1, a failed gate giving 0.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
import sqlite3
import sys
from pathlib import Path

EVIDENCE_CAP = 20000

JUDGE_SYSTEM = ("You grade one rubric item of an office task an agent performed. Use only the "
                "evidence given. Answer with a JSON object {\"score\": 1} if the item is fully "
                "satisfied, otherwise {\"score\": 0}, optionally with a short \"reason\".")


def file_text(path: Path) -> str:
    """A workspace file as text: xlsx as sheet/row lines, others decoded."""
    if path.suffix.lower() == ".xlsx":
        import openpyxl

        book = openpyxl.load_workbook(path, data_only=True, read_only=True)
        out = io.StringIO()
        for sheet in book.worksheets:
            out.write(f"## sheet {sheet.title}\n")
            for row in sheet.iter_rows(values_only=True):
                out.write("\t".join("" if v is None else str(v) for v in row) + "\n")
        return out.getvalue()
    if path.suffix.lower() in (".db", ".sqlite"):
        return "[binary sqlite file]"
    return path.read_bytes().decode("utf-8", "replace")


def _rule(item: dict, workspace: Path, state_root: Path, task_dir: Path) -> tuple[float, str]:
    kind = item.get("kind")
    if kind == "sql":
        db = state_root / item["server"] / "state.db"
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = [list(r) for r in conn.execute(item["query"]).fetchall()]
        ok = rows == item["expect"]
        return float(ok), f"query returned {json.dumps(rows)[:200]}"
    if kind == "regex":
        path = workspace / item["file"]
        if not path.is_file():
            return 0.0, f"{item['file']} missing"
        flags = re.I if "i" in item.get("flags", "") else 0
        ok = re.search(item["pattern"], file_text(path), flags) is not None
        return float(ok), "matched" if ok else "no match"
    if kind == "xlsx_cell":
        import openpyxl

        path = workspace / item["file"]
        if not path.is_file():
            return 0.0, f"{item['file']} missing"
        book = openpyxl.load_workbook(path, data_only=True)
        if item["sheet"] not in book.sheetnames:
            return 0.0, f"sheet {item['sheet']} missing"
        value = book[item["sheet"]][item["cell"]].value
        expect = item["expect"]
        if isinstance(expect, (int, float)):
            try:
                ok = abs(float(value) - expect) <= item.get("tolerance", 0)
            except (TypeError, ValueError):
                ok = False
        else:
            ok = str(value).strip() == str(expect)
        return float(ok), f"cell value {value!r}"
    if kind == "unchanged":
        changed = []
        for name in item["files"]:
            original = task_dir / "workspace" / name
            current = workspace / name
            if not current.is_file() or _sha(current) != _sha(original):
                changed.append(name)
        return float(not changed), ("changed: " + ", ".join(changed)) if changed else "unchanged"
    raise ValueError(f"unknown rule kind {kind!r}")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def judge_prompt(item: dict, workspace: Path) -> str:
    parts = [f"Rubric item {item['id']}: {item['question']}",
             f"Expected (pass anchor): {item['pass_anchor']}", "", "Evidence:"]
    for name in item.get("files", ["answer.md"]):
        path = workspace / name
        if path.is_file() and not path.is_symlink():
            text = file_text(path)
            if len(text) > EVIDENCE_CAP:
                text = text[:EVIDENCE_CAP] + "\n[truncated]"
        else:
            text = "[file missing]"
        parts += [f"--- {name} ---", text]
    parts += ["", 'Answer with JSON: {"score": 0 or 1, "reason": "..."}']
    return "\n".join(parts)


def _weight(item: dict) -> float:
    weight = item.get("weight")
    return 1.0 if weight is None else float(weight)


def aggregate(items: list[dict], scores: dict[str, float]) -> float:
    """sum(w*s)/sum(w) over the non-gate items; a failed gate makes it 0.

    Gates (src_protect) are preconditions, not credit: an agent that does
    nothing must not earn the gate's share."""
    for item in items:
        if item.get("gate") and scores.get(item["id"], 0.0) < 1.0:
            return 0.0
    scored = [item for item in items if not item.get("gate")]
    total = sum(_weight(item) for item in scored)
    if total <= 0:
        return 0.0
    return sum(_weight(item) * scores.get(item["id"], 0.0) for item in scored) / total


def run(task_dir: Path, workspace: Path, state_root: Path, out: Path) -> dict:
    meta = json.loads((task_dir / "verifier_meta.json").read_text())
    items = meta["items"]
    results, requests, scores = [], [], {}
    for item in items:
        if item.get("method") == "rule":
            try:
                score, message = _rule(item, workspace, state_root, task_dir)
            except (OSError, sqlite3.Error, KeyError) as exc:
                score, message = 0.0, f"check failed: {type(exc).__name__}: {exc}"
            scores[item["id"]] = score
            results.append({"id": item["id"], "score": score, "passed": score >= 1.0,
                            "message": message, "gate": bool(item.get("gate"))})
    gate_failed = any(r["gate"] and not r["passed"] for r in results)
    if not gate_failed:
        for item in items:
            if item.get("method") == "llm":
                requests.append({"id": item["id"], "weight": _weight(item),
                                 "system": JUDGE_SYSTEM, "prompt": judge_prompt(item, workspace)})
    out.mkdir(parents=True, exist_ok=True)
    detail = {"results": results, "judge_requests": requests,
              "items": [{"id": item["id"], "method": item.get("method"), "weight": _weight(item),
                         "gate": bool(item.get("gate"))} for item in items],
              "gate_failed": gate_failed}
    (out / "reward_detail.json").write_text(json.dumps(detail, indent=1))
    if requests:
        reward = {"pending_judge": True}
    else:
        reward = {"reward": aggregate(items, scores)}
    (out / "reward.json").write_text(json.dumps(reward))
    return reward


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="general_agent verifier runner")
    ap.add_argument("--task-dir", required=True, type=Path)
    ap.add_argument("--workspace", required=True, type=Path)
    ap.add_argument("--state-root", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    print(json.dumps(run(args.task_dir, args.workspace, args.state_root, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
