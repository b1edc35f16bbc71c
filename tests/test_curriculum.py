"""Difficulty-stratified sampling (rl/curriculum.py) against hand-computed buckets and counts."""
import numpy as np
import pytest

from rl import curriculum as cur


def test_buckets_from_pass_rates():
    cfg = cur.CurriculumConfig(easy_above=0.7, hard_below=0.3, samples=(8, 16, 32))
    rates = np.array([np.nan, 0.0, 0.3, 0.31, 0.69, 0.7, 1.0])
    np.testing.assert_array_equal(cur.assign_buckets(rates, cfg), [1, 2, 2, 1, 1, 0, 0])


def test_record_is_an_ema_and_counts_samples():
    s = cur.init_state(4)
    s = cur.record(s, [1, 2], [4, 0], [8, 8], decay=0.5)
    assert s["pass_rate"][1] == pytest.approx(0.5) and s["pass_rate"][2] == 0.0 and np.isnan(s["pass_rate"][0])
    s = cur.record(s, [1], [8], [8], decay=0.5)
    assert s["pass_rate"][1] == pytest.approx(0.75)  # 0.5 * 0.5 + 0.5 * 1.0
    np.testing.assert_array_equal(s["n_seen"], [0, 16, 8, 0])


def test_refresh_schedule_and_pick_samples_per_bucket():
    cfg = cur.CurriculumConfig(samples=(8, 16, 32), refresh_every=3)
    s = cur.init_state(6)
    assert cur.due_refresh(s, 0, 3)
    s = cur.record(s, [0, 1, 2, 3, 4, 5], [8, 8, 4, 4, 0, 0], [8] * 6)
    s = cur.refresh(s, 0, cfg)
    assert cur.bucket_counts(s) == {"easy": 2, "medium": 2, "hard": 2}
    assert not cur.due_refresh(s, 2, 3) and cur.due_refresh(s, 3, 3)
    ids, ks = cur.pick(s, cfg, n_prompts=6, seed=0, iteration=0)
    np.testing.assert_array_equal(ids, [0, 1, 2, 3, 4, 5])  # all picked, sorted by bucket then id
    np.testing.assert_array_equal(ks, [8, 8, 16, 16, 32, 32])


def test_pick_is_deterministic_and_respects_weights():
    cfg = cur.CurriculumConfig(weights=(0.0, 0.0, 1.0))
    s = cur.init_state(10)
    s["bucket"][:] = cur.EASY
    s["bucket"][[3, 7]] = cur.HARD
    a = cur.pick(s, cfg, n_prompts=2, seed=5, iteration=4)
    b = cur.pick(s, cfg, n_prompts=2, seed=5, iteration=4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(np.sort(a[0]), [3, 7])  # only the hard problems carry weight
    with pytest.raises(ValueError, match="only 10 exist"):
        cur.pick(s, cfg, n_prompts=11, seed=0, iteration=0)


def test_config_validation():
    with pytest.raises(ValueError, match=r"hard_below \(0.5\) must be <= easy_above \(0.2\)"):
        cur.CurriculumConfig(easy_above=0.2, hard_below=0.5)
    with pytest.raises(ValueError, match="samples"):
        cur.CurriculumConfig(samples=(8, 0, 4))
