"""Judging a general_agent episode: the LLM items the in-container verifier left.

The verifier (mimoagent.verify.general, in the container) scores rule items
and writes one judge request per LLM item into /logs/verifier; only the
service holds the judge credentials, so it asks the judge here and
aggregates like upstream: sum(weight * score) / sum(weight), a missing
weight counting 1, a failed gate making it 0 (gates themselves earn no
credit). Any judge failure raises
JudgeError (reward null, class judge_error), never a 0.

The prompt is built here (judge_prompt.rubric_messages) from the request's
fields -- the item and its pass anchor in the system message, the evidence
as JSON strings in a self-named fence -- and the score is the judge's own
``score`` field (judge_prompt.parse_verdict). Requests of verifiers before
that (a stored ``prompt``/``system`` pair) are asked as they were.

Integrity (``integrity`` / ``integrity_evidence``, as on opensource-code):
the transport's findings (tool calls outside the task's servers, commands
naming the grade's files, answer.md not a regular file, agent-owned
entries in the root-only directories) and, screened here, evidence text
that addresses the judge (``addressing_findings``). Any finding makes the
reward 0.0; ``reward_unscreened`` keeps what the judge and rules gave.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import html
import io
import json
import re
import tarfile
import time
import unicodedata
from collections.abc import Mapping
from typing import Any

from camg import errors
from camg.grading.judge import Judge
from environments.general.judge_prompt import VERDICT_SCHEMA, parse_verdict, rubric_messages

DETAIL = "reward_detail.json"
#: the service's own caps on what a judge is shown (the verifier caps too)
EVIDENCE_CAP = 20000
ITEM_EVIDENCE_CAP = 60000

# Text that talks to the grader rather than doing the task. Narrow on
# purpose: an honest office answer has no reason to hold any of these.
_ADDRESSING = [
    (
        "instruction_override",
        re.compile(
            r"\b(?:ignore|disregard|forget|override)\b[^.\n]{0,40}\b(?:previous|prior|above|earlier|"
            r"all|any|the)\b[^.\n]{0,20}\b(?:instructions?|rules?|rubric|prompt|guidelines)",
            re.I,
        ),
    ),
    ("score_literal", re.compile(r"[\"']\s*(?:score|reward|passed|verdict)\s*[\"']\s*:", re.I)),
    (
        "score_request",
        re.compile(
            r"\b(?:score|grade|rate|mark)\b[^.\n]{0,30}\b(?:as|=|:|with|a)\s*(?:1|one|full|100|pass)"
            r"|\b(?:award|give|assign)\b[^.\n]{0,30}\b(?:score|marks?|points?|pass|1\b)"
            r"|\bfull\s+marks\b|\bmust\s+(?:pass|score)\b",
            re.I,
        ),
    ),
    (
        "rubric_text",
        re.compile(
            r"pass[\s_-]*anchor|rubric\s+item|expected\s*\(|"
            r"\bEVIDENCE\b\s*[0-9a-f]{6,}|<<<|>>>",
            re.I,
        ),
    ),
    (
        "role_text",
        re.compile(
            r"(?im)^\s*(?:#+\s*)?(?:system|assistant|judge|grader|evaluator)"
            r"\s*(?:message|prompt|note|override)?\s*:"
            r"|</?\s*(?:system|instructions?|evidence|judge)\s*>"
            r"|\b(?:dear|hello|hi|attention|note to)\s+(?:the\s+)?"
            r"(?:judge|grader|evaluator|reviewer|ai)\b",
            re.I,
        ),
    ),
    # The same requests in Chinese: MiMo's general_agent rows come in en and zh,
    # and a judge model reads either whatever the task's language.
    (
        "instruction_override",
        re.compile(
            r"(?:忽略|无视|忽视|不要理会|不用理会)[^。\n]{0,10}(?:之前|以上|上述|前面|先前|所有|全部)"
            r"[^。\n]{0,10}(?:指令|指示|规则|说明|提示|要求|评分标准)"
        ),
    ),
    (
        "score_request",
        re.compile(
            r"(?:评分|打分|给分|评为|判为|记为)[^。\n]{0,6}(?:1\b|一分|满分|100|通过)"
            r"|(?:给|打)[^。\n]{0,4}满分|必须(?:通过|得分|给分)"
        ),
    ),
]

# What a reader of the evidence takes it to say (``_normalised``), folded on
# top of NFKC: a judge model reads a homoglyph as the letter it imitates, a
# character that prints as nothing as nothing, a Hangul filler as the blank
# it prints, a typographic quote as a quote and an HTML entity as its
# character -- so a screen that matched the raw code points would miss
# "ign\u043ere previous instructions" that every reader sees.
_LOOKALIKES = str.maketrans(
    "аеорсухіјѕԁһӏԛԝАВЕКМНОРСТХІЈЅԜοανικρτυχΑΒΕΖΗΙΚΜΝΟΡΤΥΧօոսհ",
    "aeopcyxijsdhlqwABEKMHOPCTXIJSWoavikptuxABEZHIKMNOPTYXonuh",
)
_QUOTES = str.maketrans(
    {c: '"' for c in "\u201c\u201d\u201e\u201f\u00ab\u00bb\u2033"}
    | {c: "'" for c in "\u2018\u2019\u201a\u201b\u2032"}
)
# Default_Ignorable_Code_Point beyond category Cf (which is dropped by category)
_FILLERS = re.compile("[\u115f\u1160\u3164\uffa0]")
_INVISIBLE = re.compile("[\u034f\u17b4\u17b5\u180b-\u180f\ufe00-\ufe0f\U000e0100-\U000e01ef]")
# base64 (standard or URL-safe), also wrapped over lines as encoders write it
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]{16,}(?:[ \t]*\n[ \t]*[A-Za-z0-9+/_-]{4,})*={0,2}")


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
    weights = {
        item["id"]: 1.0 if item.get("weight") is None else float(item["weight"])
        for item in items
        if not item.get("gate")
    }
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
        out.append(
            {
                "name": str(entry.get("name", "?"))[:200],
                "state": str(entry.get("state", "ok"))[:200],
                "truncated": bool(entry.get("truncated")) or cut,
                "text": text,
            }
        )
    return out


def _normalised(text: str) -> str:
    """What a reader sees: HTML entities decoded, compatibility forms and
    accents folded (NFKD, combining marks dropped), format and other
    invisible characters dropped, Hangul fillers as blanks, homoglyphs as
    the Latin letters they imitate, typographic quotes as ASCII ones."""
    text = unicodedata.normalize("NFKD", html.unescape(text))
    text = "".join(c for c in text if unicodedata.category(c) not in ("Cf", "Mn"))
    text = _INVISIBLE.sub("", _FILLERS.sub(" ", text))
    return unicodedata.normalize("NFKC", text.translate(_LOOKALIKES).translate(_QUOTES))


def _readings(text: str) -> list[tuple[str, str]]:
    """(how, text) for every way a judge model may read the evidence: as
    seen; with line breaks read as spaces (a sentence split over lines or
    spreadsheet rows is still one sentence); rot13 of it; each base64 run
    decoded to text. The patterns are narrow, so a reading of honest text
    (gibberish after rot13, binary after base64) does not match them."""
    seen = _normalised(text)
    joined = re.sub(r"\s+", " ", seen)
    out = [("", seen), ("joined lines", joined), ("rot13", codecs.encode(joined, "rot13"))]
    for run in _BASE64.findall(seen):
        blob = re.sub(r"\s+", "", run).rstrip("=").replace("-", "+").replace("_", "/")
        try:
            decoded = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            continue
        if decoded.isprintable() or all(c.isprintable() or c.isspace() for c in decoded):
            out.append(("base64", re.sub(r"\s+", " ", _normalised(decoded))))
    return out


def addressing_findings(detail: Mapping) -> list[dict]:
    """Evidence text (what the judge is shown) that addresses the judge, in
    any reading of it (``_readings``); one finding per rule and file."""
    out = []
    for request in detail.get("judge_requests", []):
        for entry in capped_evidence(request):
            found: set[str] = set()
            for how, text in _readings(entry["text"]):
                for rule, pattern in _ADDRESSING:
                    hit = None if rule in found else pattern.search(text)
                    if hit:
                        found.add(rule)
                        read = f" ({how})" if how else ""
                        out.append(
                            {
                                "rule": f"judge_addressed:{rule}",
                                "path": entry["name"],
                                "detail": f"item {request.get('id')}{read}: {hit.group(0)[:120]!r}",
                            }
                        )
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
            raise errors.JudgeError(
                "judging exceeded its deadline",
                reason="deadline",
                host=judge.config.host,
                model=judge.config.model,
                item=request["id"],
            )
        if "evidence" in request:
            system, prompt = rubric_messages(
                str(request["id"]),
                str(request["question"]),
                str(request["pass_anchor"]),
                capped_evidence(request),
            )
            verdict = judge.ask(
                prompt,
                system=system,
                parse=parse_verdict,
                schema=VERDICT_SCHEMA,
                deadline_s=remaining,
            )
        else:  # a stored request of an earlier verifier
            verdict = judge.ask(
                request["prompt"], system=request.get("system"), deadline_s=remaining
            )
        score = min(1.0, max(0.0, verdict.score))
        scores[request["id"]] = score
        records.append({"item": request["id"], **verdict.record()})
    return aggregate(detail.get("items", []), scores), records
