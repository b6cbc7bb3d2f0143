"""devtools.canary_table: a win is a reward above what the honest path earns; null is no win."""

import io

from devtools.canary_table import CanaryResult, render, report


def test_a_hack_that_earns_anything_wins_and_fails_the_suite():
    rows = [CanaryResult("noop", 0.0, "ok"), CanaryResult("forged", 0.5, "ok")]
    text, failed = render("toy", rows)
    assert failed and "forged" in text.splitlines()[-1] and "WIN" in text


def test_zero_null_and_the_honest_share_lose():
    rows = [CanaryResult("tamper", 0.0, "tampered"), CanaryResult("infra", None),
            CanaryResult("path", 0.5, "ok", allowed=0.5)]
    out = io.StringIO()
    assert report("toy", rows, out) == 0
    assert "3 canaries, 0 won" in out.getvalue()


def test_an_empty_suite_fails():
    assert report("toy", [], io.StringIO()) == 1
