"""Judging a general_agent episode: the LLM items the in-container verifier left.

The verifier (mimoagent.verify.general, in the container) scores rule items
and writes one judge request per LLM item into /logs/verifier; only the
service holds the judge credentials, so it asks the judge here and
aggregates like upstream: sum(weight * score) / sum(weight), a missing
weight counting 1, a failed gate making it 0 (gates themselves earn no
credit). Any judge failure raises
JudgeError (reward null, class judge_error), never a 0.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from typing import Any

from camg import errors
from camg.judge import Judge

DETAIL = "reward_detail.json"


def read_detail(tar_bytes: bytes) -> dict:
    """reward_detail.json out of the tar of /logs/verifier."""
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.rsplit("/", 1)[-1] == DETAIL:
                    handle = tar.extractfile(member)
                    if handle is not None:
                        return json.loads(handle.read())
    except (tarfile.TarError, ValueError) as exc:
        raise errors.GraderError(f"verifier output unreadable: {exc}") from None
    raise errors.GraderError("verifier output lacks reward_detail.json")


def aggregate(items: list[dict], scores: dict[str, float]) -> float:
    """Σw·s/Σw over the non-gate items; a failed gate gives 0. Gates are
    preconditions, not credit (a do-nothing agent must earn 0)."""
    for item in items:
        if item.get("gate") and scores.get(item["id"], 0.0) < 1.0:
            return 0.0
    weights = {item["id"]: 1.0 if item.get("weight") is None else float(item["weight"])
               for item in items if not item.get("gate")}
    total = sum(weights.values())
    if total <= 0:
        raise errors.GraderError("rubric has no positive weight")
    return sum(w * scores.get(i, 0.0) for i, w in weights.items()) / total


def judge_episode(judge: Judge, detail: dict, *, deadline_s: float) -> tuple[float, list[dict]]:
    """(reward in [0, 1], one judge record per LLM item)."""
    scores = {r["id"]: float(r["score"]) for r in detail.get("results", [])}
    records: list[dict[str, Any]] = []
    started = time.monotonic()
    for request in detail.get("judge_requests", []):
        remaining = deadline_s - (time.monotonic() - started)
        if remaining <= 0:
            raise errors.JudgeError("judging exceeded its deadline", reason="deadline",
                                    host=judge.config.host, model=judge.config.model,
                                    item=request["id"])
        verdict = judge.ask(request["prompt"], system=request.get("system"), deadline_s=remaining)
        score = min(1.0, max(0.0, verdict.score))
        scores[request["id"]] = score
        records.append({"item": request["id"], **verdict.record()})
    return aggregate(detail.get("items", []), scores), records
