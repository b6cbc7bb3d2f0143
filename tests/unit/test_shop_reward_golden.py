"""The service's reward equals upstream WebShop's get_reward on the golden
table (tests/support/shop_data/reward_golden.jsonl, upstream's own outputs on
973 real (goal, purchase) cases), column ``upstream_without_spacy``: see
environments/shop/README.md for why that column."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from environments.shop import golden
from environments.shop.prepare import DEFAULT_CATALOG

GOLDEN = Path(__file__).resolve().parents[1] / "support" / "shop_data" / "reward_golden.jsonl"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def products():
    return golden.products_by_asin(DEFAULT_CATALOG)


def _cases():
    return [case for _, case in golden.read_cases(GOLDEN)]


def test_every_golden_row_equals_upstream(products):
    cases = _cases()
    assert len(cases) == 973
    differing = []
    for case in cases:
        reward, info = golden.score_case(case, products)
        expected = case["upstream_without_spacy"]
        assert 0.0 <= reward <= 1.0
        if abs(reward - expected["reward"]) > 1e-6:
            differing.append((case["kind"], case["goal"]["asin"], reward, expected["reward"]))
        # every component too, under upstream's names
        for key in golden.COMPONENTS:
            if key in expected or key in info:
                assert golden._same(info.get(key), expected.get(key)), (key, case)
    assert differing == []
    assert max(golden.score_case(c, products)[0] for c in cases) == 1.0


def test_option_counts_are_upstreams(products):
    """The option term alone (independent of spaCy): upstream's counts."""
    from environments.shop import rewards
    for case in _cases():
        _, n_option = rewards.option_reward(case["goal"]["goal_options"],
                                            case["purchase"]["options"])
        assert n_option == case["upstream_counts"]["num_option_matches"], case


def test_golden_cli_prints_the_summary_line():
    proc = subprocess.run([sys.executable, "-m", "environments.shop.golden", str(GOLDEN)],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "equal 973/973 max_reward 1.0"


def test_golden_cli_reports_differences_and_bad_files(tmp_path):
    rows = [json.loads(line) for line in GOLDEN.read_text().splitlines()[:3]]
    rows[1]["upstream"]["reward"] = 0.5   # a target_correct row really earns 1.0
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, "-m", "environments.shop.golden", str(changed),
                           "--column", "upstream"],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "equal 1/2 max_reward 1.0"
    assert "line 2 target_correct: reward 1.0 expected 0.5" in proc.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"goal": 1}\n')
    proc = subprocess.run([sys.executable, "-m", "environments.shop.golden", str(bad)],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "'goal' must be an object" in proc.stderr
    assert "Traceback" not in proc.stderr
