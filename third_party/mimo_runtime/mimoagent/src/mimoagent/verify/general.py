"""The general-agent verifier runner (``python -m mimoagent.verify.general``).

Reads ``verifier_meta.json`` from the task directory: a list of rubric
``items``, each ``{"id", "method": "rule"|"llm", "weight"?, "gate"?, ...}``.

* Rule items are code checks scored 0 or 1 against the post-state:
  ``sql`` (a query on a server's SQLite state equals ``expect``), ``regex``
  (a workspace file's text matches), ``xlsx_cell`` (a cell equals ``expect``
  within ``tolerance``), ``unchanged`` (listed workspace files keep their
  original bytes: the source-conservation gate).
* LLM items become judge requests: the item's id, question and pass anchor
  plus the extracted text of its workspace files as data (``evidence``:
  name, state, truncated, text; each capped at 20,000 characters, 60,000
  for the item). The prompt is built by whoever asks the judge
  (environments.general.judge_prompt.rubric_messages), never from text written here.

Every workspace file is read as root from a tree the agent wrote, after the
transport has killed the agent's processes: only regular files inside the
workspace are read (a symlink anywhere on the path, a fifo, a device, a
directory reads as absent), through ``O_NOFOLLOW | O_NONBLOCK``, and at
most what the caps need (a huge file costs no memory; an xlsx above
``XLSX_LIMIT`` bytes is not opened).

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
import os
import sqlite3
import stat
import sys
from pathlib import Path

EVIDENCE_CAP = 20000
ITEM_EVIDENCE_CAP = 60000
XLSX_LIMIT = 20 << 20


class NotReadable(OSError):
    """A workspace path the verifier does not read (not a regular file in the workspace)."""


def read_regular(workspace: Path, name: str, limit: int) -> bytes:
    """At most ``limit`` bytes of ``workspace/name``, a regular file reached
    without a symlink; NotReadable otherwise."""
    base = os.path.realpath(workspace)
    path = os.path.join(base, name)
    if os.path.realpath(path) != os.path.normpath(path) or \
            os.path.commonpath([base, os.path.normpath(path)]) != base:
        raise NotReadable(f"{name}: outside the workspace or through a symlink")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise NotReadable(f"{name}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotReadable(f"{name}: not a regular file")
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _workbook(workspace: Path, name: str):
    import openpyxl

    data = read_regular(workspace, name, XLSX_LIMIT + 1)
    if len(data) > XLSX_LIMIT:
        raise NotReadable(f"{name}: larger than {XLSX_LIMIT} bytes")
    return openpyxl.load_workbook(io.BytesIO(data), data_only=True, read_only=True)


def file_text(workspace: Path, name: str, cap: int = EVIDENCE_CAP) -> tuple[str, bool]:
    """(text, truncated) of a workspace file: xlsx as sheet/row lines, others
    decoded; NotReadable for anything but a regular file in the workspace."""
    suffix = Path(name).suffix.lower()
    if suffix in (".db", ".sqlite"):
        read_regular(workspace, name, 1)
        return "[binary sqlite file]", False
    if suffix == ".xlsx":
        book = _workbook(workspace, name)
        out = io.StringIO()
        for sheet in book.worksheets:
            out.write(f"## sheet {sheet.title}\n")
            for row in sheet.iter_rows(values_only=True):
                out.write("\t".join("" if v is None else str(v) for v in row) + "\n")
                if out.tell() > cap:
                    break
        text = out.getvalue()
    else:
        # utf-8 needs at most 4 bytes a character: 4 * cap + 1 bytes say
        # whether there is more than the cap
        text = read_regular(workspace, name, 4 * cap + 1).decode("utf-8", "replace")
    return (text[:cap], True) if len(text) > cap else (text, False)


def _rule(item: dict, workspace: Path, state_root: Path, task_dir: Path) -> tuple[float, str]:
    kind = item.get("kind")
    if kind == "sql":
        db = state_root / item["server"] / "state.db"
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = [list(r) for r in conn.execute(item["query"]).fetchall()]
        ok = rows == item["expect"]
        return float(ok), f"query returned {json.dumps(rows)[:200]}"
    if kind == "regex":
        try:
            text, _ = file_text(workspace, item["file"], cap=ITEM_EVIDENCE_CAP)
        except NotReadable as exc:
            return 0.0, f"not read: {exc}"
        flags = re.I if "i" in item.get("flags", "") else 0
        ok = re.search(item["pattern"], text, flags) is not None
        return float(ok), "matched" if ok else "no match"
    if kind == "xlsx_cell":
        try:
            book = _workbook(workspace, item["file"])
        except NotReadable as exc:
            return 0.0, f"not read: {exc}"
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
            try:
                current = read_regular(workspace, name, original.stat().st_size + 1)
            except NotReadable:
                changed.append(name)
                continue
            if hashlib.sha256(current).hexdigest() != _sha(original):
                changed.append(name)
        return float(not changed), ("changed: " + ", ".join(changed)) if changed else "unchanged"
    raise ValueError(f"unknown rule kind {kind!r}")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def evidence(item: dict, workspace: Path) -> list[dict]:
    """The item's files as data for the judge: name, state (``ok`` or why
    not read), truncated, text; ITEM_EVIDENCE_CAP characters in all."""
    out, budget = [], ITEM_EVIDENCE_CAP
    for name in item.get("files", ["answer.md"]):
        try:
            text, truncated = file_text(workspace, name, cap=min(EVIDENCE_CAP, budget))
            state = "ok"
        except NotReadable as exc:
            text, truncated, state = "", False, "not read: " + str(exc).split(": ", 1)[-1]
        except Exception as exc:  # noqa: BLE001 -- a file openpyxl cannot read is no evidence
            text, truncated, state = "", False, f"unreadable: {type(exc).__name__}"
        budget -= len(text)
        out.append({"name": name, "state": state, "truncated": truncated, "text": text})
    return out


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
            except Exception as exc:  # noqa: BLE001 -- a corrupt agent file scores 0, never masks
                score, message = 0.0, f"check failed: {type(exc).__name__}: {str(exc)[:200]}"
            scores[item["id"]] = score
            results.append({"id": item["id"], "score": score, "passed": score >= 1.0,
                            "message": message, "gate": bool(item.get("gate"))})
    gate_failed = any(r["gate"] and not r["passed"] for r in results)
    if not gate_failed:
        for item in items:
            if item.get("method") == "llm":
                requests.append({"id": item["id"], "weight": _weight(item),
                                 "question": item["question"], "pass_anchor": item["pass_anchor"],
                                 "evidence": evidence(item, workspace)})
    out.mkdir(parents=True, mode=0o700, exist_ok=True)
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
