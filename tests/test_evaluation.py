"""Evaluation metrics (rl/evaluation.py) against brute-force and hand-computed references."""
import itertools
import math

import numpy as np
import pytest

from rl import evaluation as ev


def brute_pass_at_k(correct, k):
    """Fraction of all k-subsets of the n samples that contain at least one correct sample."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 1, 1), (5, 2, 3), (6, 3, 2), (8, 1, 8), (8, 7, 2), (7, 7, 4), (10, 2, 5)])
def test_pass_at_k_matches_combinatorial_definition(n, c, k):
    correct = [True] * c + [False] * (n - c)
    assert ev.pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(correct, k), abs=1e-12)
    assert ev.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError):
        ev.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        ev.pass_at_k(4, 1, 5)


def test_majority_vote_with_ties_and_missing_answers():
    assert ev.majority_answer(["3", None, "4", " 4", "3"]) == 0  # tie 3 vs 4: first seen wins
    assert ev.majority_answer(["3", "4", "4"]) == 1
    assert ev.majority_answer([None, None]) is None
    assert ev.maj_at_k(["5", "7", "7", "5", "5"], [True, False, False, True, True], k=3) == 0.0  # first 3: 7 wins
    assert ev.maj_at_k(["5", "7", "7", "5", "5"], [True, False, False, True, True], k=5) == 1.0


def test_diversity_and_repetition():
    assert ev.distinct_ngram_ratio(["a b c", "a b d"], n=2) == pytest.approx(3 / 4)  # (a b) twice, (b c), (b d)


def test_summarize_hand_computed():
    r1 = ev.ProblemSamples(True, 1.0, "Answer: 3", correct=[True, False, True, True], answers=["3", "4", "3", "3"],
                           texts=["a b", "a c", "a b", "a b"], formats=[1, 1, 0, 1])
    r2 = ev.ProblemSamples(False, 0.5, "Answer: 99", correct=[False, False, False, True], answers=["1", "1", None, "2"],
                           texts=["x", "y", "z", "w"], formats=[1, 0, 0, 0])
    m = ev.summarize([r1, r2], k=4)
    assert m["pass@1"] == 0.5 and m["format_rate"] == 0.75
    assert m["mean_length"] == pytest.approx((9 + 10) / 2)
    assert m["pass@k"] == pytest.approx(1.0)  # each problem has a correct sample among its 4
    assert m["maj@k"] == pytest.approx(0.5)  # problem 1 votes 3 (right), problem 2 votes 1 (wrong)
    assert m["sample_accuracy"] == pytest.approx((0.75 + 0.25) / 2)
    assert m["distinct_answers"] == pytest.approx((2 / 4 + 2 / 4) / 2)
    k2 = ev.summarize([r1, r2], k=2)
    assert k2["pass@k"] == pytest.approx((brute_pass_at_k(r1.correct, 2) + brute_pass_at_k(r2.correct, 2)) / 2)


def test_hacking_signs():
    first = {"mean_length": 20.0, "pass@1": 0.5, "repetition_share": 0.0}
    latest = {"mean_length": 40.0, "pass@1": 0.505, "repetition_share": 0.3}
    h = ev.hacking_signs(first, latest)
    assert h["length_hack"] == 1.0 and h["repetition_rise"] == 1.0 and h["length_growth"] == pytest.approx(1.0)
    ok = ev.hacking_signs(first, {"mean_length": 40.0, "pass@1": 0.8, "repetition_share": 0.0})
    assert ok["length_hack"] == 0.0 and ok["repetition_rise"] == 0.0
