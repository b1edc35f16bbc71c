"""prm.metrics against hand-computed values and independent float64 references written here."""
import math

import numpy as np
import pytest

from prm import metrics as pm


def test_auroc_hand_values_and_ties():
    # positives {0.35, 0.8} vs negatives {0.1, 0.4}: 3 of the 4 pairs ordered right
    assert pm.auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert pm.auroc([0.5, 0.5, 0.5], [1, 0, 1]) == pytest.approx(0.5)  # all tied: every pair counts 1/2
    assert pm.auroc([0.2, 0.2, 0.9], [0, 1, 1]) == pytest.approx(0.75)  # (1/2 + 1) / 2
    assert pm.auroc([1.0, 2.0], [1, 1]) == 0.5  # one class missing


def test_auroc_matches_pair_count_reference():
    rng = np.random.default_rng(1)
    s = np.round(rng.normal(size=300), 1)  # rounded: many ties
    y = (rng.uniform(size=300) < 1 / (1 + np.exp(-2 * s))).astype(float)
    pos, neg = s[y == 1], s[y == 0]
    pairs = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
    assert pm.auroc(s, y) == pytest.approx(pairs, abs=1e-12)


def test_ece_hand_values():
    # 15 bins: 0.1 -> bin 1, 0.2 -> bin 3, 0.9 -> bin 13, 0.95 -> bin 14, one sample each
    assert pm.ece([0.1, 0.2, 0.9, 0.95], [0, 1, 1, 1]) == pytest.approx((0.1 + 0.8 + 0.1 + 0.05) / 4)
    # 0.61 and 0.65 share bin 9: |mean(y) - mean(p)| = |0.5 - 0.63|
    assert pm.ece([0.61, 0.65], [1, 0]) == pytest.approx(0.13)
    assert pm.ece([1.0], [1]) == 0.0 and pm.ece([], []) == 0.0


def _ece_reference(p, y, n_bins=15):
    total, n = 0.0, len(p)
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        members = [i for i in range(n) if lo <= p[i] < hi or (b == n_bins - 1 and p[i] == 1.0)]
        if members:
            conf = sum(p[i] for i in members) / len(members)
            acc = sum(y[i] for i in members) / len(members)
            total += len(members) / n * abs(acc - conf)
    return total


def test_ece_matches_reference():
    rng = np.random.default_rng(0)
    p = np.concatenate([rng.uniform(size=500), [0.0, 1.0, 1 / 15, 14 / 15]])
    y = (rng.uniform(size=p.size) < p ** 2).astype(float)
    assert pm.ece(p, y) == pytest.approx(_ece_reference(list(p), list(y)), abs=1e-12)


def test_nll_brier_hand_values():
    assert pm.nll([0.0], [1.0]) == pytest.approx(math.log(2))
    assert pm.nll([2.0], [0.0], a=0.5, b=-1.0) == pytest.approx(math.log(2))  # a z + b = 0
    assert pm.brier([0.2, 0.7], [0, 1]) == pytest.approx((0.04 + 0.09) / 2)


def test_temperature_hand_value():
    # four equal logits of 1 with 3 of 4 labels good: sigmoid(1 / T) = 0.75, T = 1 / ln 3
    assert pm.fit_temperature([1, 1, 1, 1], [1, 1, 1, 0]) == pytest.approx(1 / math.log(3), rel=1e-6)
    assert pm.fit_temperature([], []) == 1.0 and pm.fit_temperature([0, 0], [1, 0]) == 1.0


def test_platt_hand_value():
    # logit 0: 1 of 4 good -> sigmoid(b) = 1/4; logit 1: 3 of 4 good -> sigmoid(a + b) = 3/4
    a, b = pm.fit_platt([0, 0, 0, 0, 1, 1, 1, 1], [1, 0, 0, 0, 1, 1, 1, 0])
    assert b == pytest.approx(-math.log(3), abs=1e-6) and a == pytest.approx(2 * math.log(3), abs=1e-6)
    assert pm.fit_platt([], []) == (1.0, 0.0)


def test_calibration_fits_minimise_the_nll_on_a_grid():
    rng = np.random.default_rng(2)
    z = rng.normal(0.0, 2.0, size=4000)
    y = (rng.uniform(size=z.size) < 1 / (1 + np.exp(-(0.4 * z - 0.7)))).astype(float)  # overconfident, biased
    t = pm.fit_temperature(z, y)
    grid_t = np.exp(np.linspace(np.log(0.5), np.log(10), 2001))
    assert pm.nll(z, y, 1 / t) <= min(np.mean(np.logaddexp(0, z / g) - y * z / g) for g in grid_t) + 1e-9
    a, b = pm.fit_platt(z, y)
    assert a == pytest.approx(0.4, abs=0.05) and b == pytest.approx(-0.7, abs=0.1)
    ga, gb = np.meshgrid(np.linspace(0.2, 0.6, 81), np.linspace(-1.0, -0.4, 61))
    best = min(np.mean(np.logaddexp(0, ai * z + bi) - y * (ai * z + bi)) for ai, bi in zip(ga.ravel(), gb.ravel()))
    assert pm.nll(z, y, a, b) <= best + 1e-9
    assert pm.nll(z, y, a, b) < pm.nll(z, y, 1 / t) < pm.nll(z, y)
    m = pm.step_metrics(z, y, {"none": {"kind": "none"}, "temperature": {"kind": "temperature", "a": 1 / t},
                               "platt": {"kind": "platt", "a": a, "b": b}})
    assert m["ece/platt"] < m["ece/none"] and m["auroc"] == pm.auroc(z, y) and m["n"] == z.size


def test_first_error_and_prediction():
    assert pm.first_error([1, 1, 0, 1]) == 2
    assert pm.first_error([1, None, 1]) == -1
    assert pm.first_error([None, 0.0]) == 1
    assert pm.predict_first_error([0.9, 0.4, 0.2], 0.5) == 1
    assert pm.predict_first_error([0.9, 0.8], 0.5) == -1
    assert pm.predict_first_error([0.9, 0.8], 0.85) == 1


def test_first_error_f1_hand_values():
    r = pm.first_error_f1(pred=[-1, 1, 2, 1], true=[-1, -1, 2, 0])  # half right on each subset
    assert (r["acc_correct"], r["acc_error"], r["f1"]) == (0.5, 0.5, 0.5)
    r = pm.first_error_f1(pred=[-1, 0, 0], true=[-1, 0, 1])  # correct 1/1, erroneous 1/2
    assert r["f1"] == pytest.approx(2 / 3) and r["n_error"] == 2 and r["n_correct"] == 1
    assert pm.first_error_f1(pred=[0], true=[-1])["f1"] == 0.0
    assert pm.first_error_f1(pred=[-1], true=[-1])["f1"] == 1.0  # no erroneous solution: the other accuracy


def test_best_threshold_separates():
    # a threshold in (0.3, 0.7] flags step 1 of the first solution and nothing in the second: F1 = 1
    assert pm.best_threshold([[0.9, 0.3], [0.8, 0.7]], [1, -1]) == 0.5
    t = pm.best_threshold([[0.9, 0.05], [0.8, 0.1]], [1, -1])
    assert 0.05 < t <= 0.1


def test_aggregate():
    assert pm.aggregate([0.5, 0.8], "min") == 0.5
    assert pm.aggregate([0.5, 0.8], "mean") == pytest.approx(0.65)
    assert pm.aggregate([0.5, 0.8], "prod") == pytest.approx(0.4)
    assert pm.aggregate([0.5, 0.8], "last") == 0.8
    assert pm.aggregate([], "min", default=0.3) == 0.3
    with pytest.raises(ValueError, match="aggregate"):
        pm.aggregate([0.5], "max")


def test_best_of_n_hand_values():
    scores, correct, clusters = [[0.2, 0.9, 0.5, 0.1]], [[True, False, True, False]], [[0, 1, 0, None]]
    r = pm.best_of_n(scores, correct, clusters, (2, 4))
    # N=2, groups (0, 1) and (2, 3): the PRM picks 1 (wrong) and 2 (right); majority: a tie goes to the cluster
    # seen first (sample 0, right), and [0, None] picks sample 2 (right); oracle: both groups hold a right one
    assert r[2] == {"prm": 0.5, "majority": 1.0, "oracle": 1.0, "groups": 2}
    # N=4: the PRM picks sample 1 (wrong); cluster 0 has two votes (sample 0, right)
    assert r[4] == {"prm": 0.0, "majority": 1.0, "oracle": 1.0, "groups": 1}
    r = pm.best_of_n([[0.5, 0.4]], [[False, False]], [[None, None]], (2,))
    assert r[2]["majority"] == 0.0 and r[2]["oracle"] == 0.0
