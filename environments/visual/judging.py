"""How a rendered page is judged: the address question, then the rubric.

One function the episode, its regrade, its control (control.py) and the
canaries (environments/visual/checks/canaries.py) share, so each asks exactly what a
live episode asks: first whether the page's text addresses its evaluator
(addressing.py; yes is 0.0 with ``judge_addressed_model`` evidence and no
vision call), then the vision judge for the rubric's score (rubric.py; the
screenshot first, then the rubric with the brief, upstream's order).
"""

from __future__ import annotations

from camg import errors
from environments.visual import addressing, rubric


def vision(judge, brief: str, jpeg: bytes):
    """(Verdict, parsed rubric) of one screenshot; JudgeError on failure."""
    from camg.grading.judge import Image

    if judge is None:
        raise errors.JudgeError("judge unconfigured", reason="unconfigured")
    verdict = judge.ask(
        rubric.prompt(brief), images=[Image(jpeg, "image/jpeg")], parse=rubric.score
    )
    return verdict, rubric.parse(verdict.raw)


def judge_page(judge, brief: str, jpeg: bytes, text: str) -> tuple[float, dict, list[str]]:
    """(score, judge records, integrity evidence) of a rendered page whose
    text is ``text`` (addressing.excerpt). JudgeError on failure."""
    if judge is None:
        raise errors.JudgeError("judge unconfigured", reason="unconfigured")
    address, found = addressing.ask(judge, text)
    records: dict = {}
    if address is not None:
        records["address"] = address.record()
    if found:
        return 0.0, records, found
    verdict, parsed = vision(judge, brief, jpeg)
    records["judge"] = {**verdict.record(), "rubric": parsed}
    return parsed["score"], records, []
