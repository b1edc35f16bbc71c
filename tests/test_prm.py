"""Tests for the process reward model (rewards/prm.py) and its data (rewards/prm_data.py).

Metric kernels are checked against independent float64 NumPy / pure-Python references written here; the
learning test trains a tiny PRM for a few seconds and checks held-out AUROC is clearly above chance."""
import math
import random

import numpy as np
import pytest

from rewards import prm
from rewards.parse import step_spans
from rewards.prm_data import (CORRUPTIONS, corrupt_steps, encode_windows, step_end_tokens,
                              token_ids)
from rewards.steps import check_steps

TINY = dict(n_train=60, n_calib=40, n_test=40, max_len=64, d_model=32, n_layers=1, n_heads=2, d_ff=64,
            train_steps=6, batch_size=8, warmup_steps=2, score_batch=16)


# ---- config ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("n_train", 0), ("max_len", 4), ("corrupt_prob", 1.5), ("zh_fraction", -0.1),
                                         ("learning_rate", 0.0), ("lm_coef", float("nan")), ("mix", ""),
                                         ("batch_size", True), ("d_model", 30)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        prm.PRMConfig(**{field: value})


def test_config_round_trip_and_unknown_field():
    cfg = prm.PRMConfig(**TINY)
    assert prm.PRMConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="bogus"):
        prm.PRMConfig.from_dict({"bogus": 1})


# ---- data -----------------------------------------------------------------------------------------------------------
def test_dataset_labels_agree_with_check_steps_and_splits_are_disjoint():
    data = prm.build_dataset(prm.PRMConfig(**TINY), seed=3)
    assert set(data) == {"train", "calib", "test"}
    kinds = set()
    for name, split in (("train", "train"), ("calib", "validation"), ("test", "test")):
        for e in data[name]:
            assert e.split == split
            assert list(e.labels) == check_steps(e.text)
            assert len(e.labels) == len(step_spans(e.text)) > 0
            kinds.add(e.kind)
            if e.kind == "clean":
                assert all(label in (1.0, None) for label in e.labels)
    assert {"clean", *CORRUPTIONS} <= kinds
    labels = [label for e in data["train"] for label in e.labels if label is not None]
    assert 0.0 in labels and 1.0 in labels
    ids = {name: {e.problem_id for e in data[name]} for name in data}
    assert not ids["train"] & ids["test"] and not ids["train"] & ids["calib"] and not ids["calib"] & ids["test"]


def test_dataset_is_deterministic_in_the_seed():
    cfg = prm.PRMConfig(**TINY)
    a, b, c = prm.build_dataset(cfg, 1), prm.build_dataset(cfg, 1), prm.build_dataset(cfg, 2)
    assert a == b
    assert a["train"] != c["train"]


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_each_corruption_breaks_its_step(kind):
    steps = ("7+5=12", "2+3+1=6", "48+399=447")
    broken = 0
    for seed in range(20):
        new_steps, _, i = corrupt_steps(steps, "447", kind, False, random.Random(seed))
        assert new_steps[:i] == steps[:i] and new_steps[i + 1:] == steps[i + 1:]
        broken += check_steps("\n".join(f"Step {k + 1}: {s}" for k, s in enumerate(new_steps)))[i] == 0.0
    assert broken == 20


def test_propagation_carries_the_wrong_value_forward():
    steps, answer = ("Pens: 4*12=48 dollars", "Total: 48+399=447 dollars"), "447"
    for seed in range(10):
        new_steps, new_answer, i = corrupt_steps(steps, answer, "digit", True, random.Random(seed))
        old = steps[i].split("=")[1].split()[0]
        new = new_steps[i].split("=")[1].split()[0]
        if i == 0:
            assert new_steps[1].startswith(f"Total: {new}+399=")
        assert (old == answer) == (new_answer == new)


# ---- tokens and windows ---------------------------------------------------------------------------------------------
def test_step_end_tokens_point_at_the_last_byte_of_each_step():
    text = "问题：3+4\n解答：\n步骤一：3+4=7\n步骤二：7×2=14 \ud800\nStep 3: 14-1=13\n答案：13"
    spans = step_spans(text)
    ids = token_ids(text)
    raw = text.encode("utf-8", errors="replace")
    assert ids[0] == 1 and list(ids[1:] - 3) == list(raw)
    for (_, end), tok in zip(spans, step_end_tokens(text, spans)):
        prefix = text[:end].encode("utf-8", errors="replace")
        assert tok == len(prefix) and ids[tok] - 3 == prefix[-1]


def test_windows_cover_every_step_with_context():
    text = "".join(f"Step {i}: {i}+{i}={2 * i}\n" for i in range(1, 60)) + "Answer: 118"
    max_len = 64
    w = encode_windows([text], max_len)
    ids = token_ids(text)
    ends = step_end_tokens(text, step_spans(text))
    assert w.tokens.shape[1] == max_len and len(w.window[0]) == len(ends) == 59
    for e, win, pos in zip(ends, w.window[0], w.pos[0]):
        assert w.tokens[win, pos] == ids[e] and w.mask[win, pos] == 1
        assert pos >= min(e, max_len // 2)  # at least half a window (or the whole prefix) of context
        start = e - pos
        np.testing.assert_array_equal(w.tokens[win, :pos + 1], ids[start:e + 1])


# ---- metrics vs independent references ------------------------------------------------------------------------------
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
    assert prm.ece(p, y) == pytest.approx(_ece_reference(list(p), list(y)), abs=1e-12)
    assert prm.ece(np.full(300, 0.7), np.r_[np.ones(210), np.zeros(90)]) == pytest.approx(0.0, abs=1e-12)
    assert prm.ece([], []) == 0.0


def test_auroc_and_brier_match_references():
    rng = np.random.default_rng(1)
    s = np.round(rng.normal(size=200), 1)  # rounded: many ties
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-2 * s))).astype(float)
    pos, neg = s[y == 1], s[y == 0]
    pairs = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
    assert prm.auroc(s, y) == pytest.approx(pairs, abs=1e-12)
    assert prm.auroc(s, np.ones(200)) == 0.5
    p = 1 / (1 + np.exp(-s))
    assert prm.brier(p, y) == pytest.approx(sum((a - b) ** 2 for a, b in zip(p, y)) / 200, abs=1e-12)


def test_temperature_scaling_fixes_overconfidence_and_keeps_calibrated_logits():
    rng = np.random.default_rng(2)
    z = rng.normal(0.0, 2.0, size=20000)
    y = (rng.uniform(size=z.size) < 1 / (1 + np.exp(-z))).astype(float)
    assert prm.fit_temperature(z, y) == pytest.approx(1.0, abs=0.08)  # calibrated data: T ~ 1
    over = 3.0 * z  # overconfident logits
    t = prm.fit_temperature(over, y)
    assert t == pytest.approx(3.0, rel=0.08)
    assert prm.nll(over, y, t) < prm.nll(over, y) - 0.05
    assert prm.ece(1 / (1 + np.exp(-over / t)), y) < prm.ece(1 / (1 + np.exp(-over)), y)
    # The fitted T is the minimum of the NLL: compare with a dense float64 grid written here.
    grid = np.exp(np.linspace(np.log(0.5), np.log(10), 4001))
    nlls = [np.mean(np.logaddexp(0, over / g) - y * over / g) for g in grid]
    assert prm.nll(over, y, t) <= min(nlls) + 1e-9
    assert prm.fit_temperature([], []) == 1.0


# ---- model ----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_prm():
    return prm.train(prm.PRMConfig(**TINY), seed=0)


def test_train_reports_metrics(tiny_prm):
    m = tiny_prm.metrics
    for key in ("test_accuracy", "test_auroc", "test_ece_before", "test_ece_after", "test_brier_before",
                "test_brier_after", "temperature"):
        assert math.isfinite(m[key])
    assert 0.05 <= tiny_prm.temperature <= 100
    assert m["calib_nll_after"] <= m["calib_nll_before"] + 1e-9  # T fitted on the calibration split


def test_score_steps_shapes_and_hostile_input(tiny_prm):
    texts = ["Step 1: 3+4=7\nStep 2: 7*2=15\nAnswer: 15", "步骤一：3+4=7\n答案：7", "", "no steps here",
             b"Step 1: 1+1=2\xff\xfe", None, 12345, "\x00" * 1000, "Step 1: 1+1=2\ud800\n" * 3,
             "Step 1: 9+9=18\n" * 5000]
    out = prm.score_steps(tiny_prm, texts)
    assert len(out) == len(texts)
    assert len(out[0]) == 2 and len(out[1]) == 1 and len(out[4]) == 1 and len(out[8]) == 3
    assert out[2] == out[3] == out[5] == out[6] == out[7] == []
    clipped = tiny_prm.cfg.max_chars
    assert len(out[9]) == len(step_spans(("Step 1: 9+9=18\n" * 5000)[:clipped]))
    for row in out:
        assert all(0.0 <= p <= 1.0 and math.isfinite(p) for p in row)
    assert prm.score_steps(tiny_prm, None) == [] and prm.score_steps(tiny_prm, []) == []
    single = prm.score_steps(tiny_prm, texts[0])  # a bare string is a batch of one
    assert len(single) == 1 and single[0] == pytest.approx(out[0], abs=1e-5)
    assert prm.process_rewards(tiny_prm, texts[:3], default=0.25) == pytest.approx(
        [sum(out[0]) / 2, out[1][0], 0.25], abs=1e-5)
    # A step's score depends only on the prefix up to it (causal encoder).
    a = prm.score_steps(tiny_prm, ["Step 1: 3+4=7\nStep 2: 7*2=14", "Step 1: 3+4=7\nStep 2: 7*2=99"])
    assert a[0][0] == pytest.approx(a[1][0], abs=1e-6)


def test_save_load_round_trip(tiny_prm, tmp_path):
    path = tmp_path / "prm.npz"
    prm.save(tiny_prm, path)
    back = prm.load(path)
    assert back.cfg == tiny_prm.cfg and back.temperature == tiny_prm.temperature
    assert back.metrics == tiny_prm.metrics
    texts = ["Step 1: 12+30=42\nStep 2: 42-7=35\nAnswer: 35", "步骤一：6*7=42\n答案：42"]
    assert prm.score_steps(back, texts) == prm.score_steps(tiny_prm, texts)
    bad = tmp_path / "bad.npz"
    np.savez(bad, __meta__=np.array('{"format": "other"}'))
    with pytest.raises(ValueError, match="not a PRM file"):
        prm.load(bad)


def test_training_is_deterministic(tiny_prm):
    again = prm.train(prm.PRMConfig(**TINY), seed=0)
    assert again.temperature == tiny_prm.temperature
    texts = ["Step 1: 12+30=42\nStep 2: 42-7=35\nAnswer: 35"]
    assert prm.score_steps(again, texts) == prm.score_steps(tiny_prm, texts)


def test_training_fits_the_training_steps():
    """The optimiser, loss and label placement work together: a small model memorises a few solutions."""
    cfg = prm.PRMConfig(**{**TINY, "n_train": 12, "train_steps": 40, "batch_size": 16, "learning_rate": 0.01,
                           "lm_coef": 0.0, "warmup_steps": 4})
    data = prm.build_dataset(cfg, 5)
    base = prm.train(prm.PRMConfig(**{**cfg.to_dict(), "train_steps": 0}), 5, data=data)
    fitted = prm.train(cfg, 5, data=data)
    train_z, train_y = prm._labelled(data["train"], prm._raw_step_logits(fitted.params, [e.text for e in data["train"]],
                                                                         cfg))
    assert 0.0 in train_y and 1.0 in train_y
    assert prm.nll(train_z, train_y) < 0.5 * prm.nll(np.zeros_like(train_z), train_y)
    assert prm.auroc(train_z, train_y) > 0.9
    assert base.metrics["test_auroc"] == 0.5  # untrained: zero head, every logit equal


@pytest.mark.slow
def test_default_prm_beats_chance_on_held_out_steps():
    """The default config (about a minute on an idle 2-core CPU, a few under load) on the test split.
    Measured (seed 0): AUROC 0.66, accuracy 0.72 with 69% correct steps; ECE small before and after."""
    model = prm.train(prm.PRMConfig(), seed=0)
    m = model.metrics
    assert m["test_n"] > 1000
    assert m["test_auroc"] > 0.6
    assert m["test_accuracy"] >= m["test_frac_correct"] - 0.01  # at least the majority-class rate
    assert m["test_ece_after"] < 0.08
