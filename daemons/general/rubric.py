"""Judging a general_agent episode: the LLM items the in-container verifier left.

The verifier (mimoagent.verify.general, in the container) scores rule items
and writes one judge request per LLM item into /logs/verifier; only the
service holds the judge credentials, so it asks the judge here and
aggregates like upstream: sum(weight * score) / sum(weight), a missing
weight counting 1, a failed gate making it 0 (gates themselves earn no
credit). Any judge failure raises
JudgeError (reward null, class judge_error), never a 0.

The prompt is built here (camg.judge.rubric_messages) from the request's
fields -- the item and its pass anchor in the system message, the evidence
as JSON strings in a self-named fence -- and the score is the judge's own
``score`` field (camg.judge.parse_verdict). Requests of verifiers before
that (a stored ``prompt``/``system`` pair) are asked as they were.

Integrity (``integrity`` / ``integrity_evidence``, as on opensource-code):
the transport's findings (tool calls outside the task's servers, commands
naming the grade's files, answer.md not a regular file, agent-owned
entries in the root-only directories) and, screened here, evidence text
that addresses the judge (``addressing_findings``). Any finding makes the
reward 0.0; ``reward_unscreened`` keeps what the judge and rules gave.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
import unicodedata
from collections.abc import Mapping
from typing import Any

from camg import errors
from camg.judge import VERDICT_SCHEMA, Judge, parse_verdict, rubric_messages

DETAIL = "reward_detail.json"
#: the service's own caps on what a judge is shown (the verifier caps too)
EVIDENCE_CAP = 20000
ITEM_EVIDENCE_CAP = 60000

# Text that talks to the grader rather than doing the task. Narrow on
# purpose: an honest office answer has no reason to hold any of these.
_ADDRESSING = [
    ("instruction_override", re.compile(
        r"\b(?:ignore|disregard|forget|override)\b[^.\n]{0,40}\b(?:previous|prior|above|earlier|"
        r"all|any|the)\b[^.\n]{0,20}\b(?:instructions?|rules?|rubric|prompt|guidelines)", re.I)),
    ("score_literal", re.compile(r"[\"']\s*(?:score|reward|passed|verdict)\s*[\"']\s*:", re.I)),
    ("score_request", re.compile(
        r"\b(?:score|grade|rate|mark)\b[^.\n]{0,30}\b(?:as|=|:|with|a)\s*(?:1|one|full|100|pass)"
        r"|\b(?:award|give|assign)\b[^.\n]{0,30}\b(?:score|marks?|points?|pass|1\b)"
        r"|\bfull\s+marks\b|\bmust\s+(?:pass|score)\b", re.I)),
    ("rubric_text", re.compile(r"pass[\s_-]*anchor|rubric\s+item|expected\s*\(|"
                               r"\bEVIDENCE\b\s*[0-9a-f]{6,}|<<<|>>>", re.I)),
    ("role_text", re.compile(r"(?im)^\s*(?:#+\s*)?(?:system|assistant|judge|grader|evaluator)"
                             r"\s*(?:message|prompt|note|override)?\s*:"
                             r"|</?\s*(?:system|instructions?|evidence|judge)\s*>"
                             r"|\b(?:dear|hello|hi|attention|note to)\s+(?:the\s+)?"
                             r"(?:judge|grader|evaluator|reviewer|ai)\b", re.I)),
]


def read_detail(tar_bytes: bytes) -> dict:
    """reward_detail.json out of the tar of /logs/verifier."""
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            for member in tar.getmembers():
                # only the verifier's own file at the top of /logs/verifier
                parts = [p for p in member.name.split("/") if p not in ("", ".")]
                if member.isfile() and parts in (["verifier", DETAIL], [DETAIL]):
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


def capped_evidence(request: Mapping) -> list[dict]:
    """The request's evidence, each text at most EVIDENCE_CAP characters and
    ITEM_EVIDENCE_CAP in all (whatever the container wrote)."""
    out, budget = [], ITEM_EVIDENCE_CAP
    for entry in request.get("evidence") or []:
        text = str(entry.get("text", ""))
        cap = min(EVIDENCE_CAP, budget)
        cut = len(text) > cap
        text = text[:cap]
        budget -= len(text)
        out.append({"name": str(entry.get("name", "?"))[:200],
                    "state": str(entry.get("state", "ok"))[:200],
                    "truncated": bool(entry.get("truncated")) or cut, "text": text})
    return out


def _normalised(text: str) -> str:
    """NFKC, zero-width and format characters dropped: what a reader sees."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(c for c in text if unicodedata.category(c) != "Cf")


def addressing_findings(detail: Mapping) -> list[dict]:
    """Evidence text (what the judge is shown) that addresses the judge."""
    out = []
    for request in detail.get("judge_requests", []):
        for entry in capped_evidence(request):
            text = _normalised(entry["text"])
            for rule, pattern in _ADDRESSING:
                hit = pattern.search(text)
                if hit:
                    out.append({"rule": f"judge_addressed:{rule}", "path": entry["name"],
                                "detail": f"item {request.get('id')}: {hit.group(0)[:120]!r}"})
    return out


#: findings kept as evidence that do not make the episode tampered: a call to
#: a plain server name the task lacks fails and earns nothing, and is most
#: often an honest slip; zeroing the episode would punish exploration.
EVIDENCE_ONLY = frozenset({"tool_unknown_server"})


def integrity(detail: Mapping | None, observation: Mapping | None = None) -> dict:
    """The outcome record's integrity part for a general_agent episode."""
    findings: list[dict] = []
    transport = (detail or {}).get("transport_integrity") or {}
    if transport:
        findings += list(transport.get("findings") or [])
    elif observation is not None:
        findings += list(observation.get("integrity_evidence") or [])
    if detail is not None:
        findings += addressing_findings(detail)
    tampered = any(f.get("rule") not in EVIDENCE_ONLY for f in findings)
    body: dict[str, Any] = {"integrity": "tampered" if tampered else "ok"}
    killed = transport.get("processes_killed", (observation or {}).get("processes_killed"))
    if killed is not None:
        body["grade_guard"] = {"processes_killed": killed}
    if tampered:
        body["grade_reason"] = "tampered"
    if findings:
        body["integrity_evidence"] = findings[:60]
    return body


def screened(verdict: dict, reward: float) -> float:
    """0.0 for a tampered episode; records what it would have earned."""
    if verdict.get("integrity") == "tampered":
        verdict["reward_unscreened"] = reward
        return 0.0
    return reward


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
        if "evidence" in request:
            system, prompt = rubric_messages(str(request["id"]), str(request["question"]),
                                             str(request["pass_anchor"]), capped_evidence(request))
            verdict = judge.ask(prompt, system=system, parse=parse_verdict, schema=VERDICT_SCHEMA,
                                deadline_s=remaining)
        else:  # a stored request of an earlier verifier
            verdict = judge.ask(request["prompt"], system=request.get("system"), deadline_s=remaining)
        score = min(1.0, max(0.0, verdict.score))
        scores[request["id"]] = score
        records.append({"item": request["id"], **verdict.record()})
    return aggregate(detail.get("items", []), scores), records
