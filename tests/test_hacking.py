"""rl.hacking.stage_report on hand-made metric records: each sign fires on the pattern it names, with the numbers
that triggered it, and stays quiet on a healthy stage; rl.plots draws the report's marks."""
import os

import numpy as np
import pytest

from rl import hacking, plots


def records(n=12, start=100, **series):
    """n train records; each keyword is a metric name (with '/' written as '__') and a (first, last) pair: the
    metric moves linearly between them."""
    out = []
    for i in range(n):
        r = {"step": start + i, "stage": "grpo", "phase": "train"}
        for key, (a, b) in series.items():
            r[key.replace("__", "/")] = a + (b - a) * i / (n - 1)
        out.append(r)
    return out


HEALTHY = dict(accuracy=(0.2, 0.4), response_length=(40, 44), reward__format=(0.9, 0.92), reward__process=(0.5, 0.6),
               reward__language=(0.01, 0.01), reward__repetition=(0.0, 0.0))


def thirds_mean(a, b, n=12):
    xs = [a + (b - a) * i / (n - 1) for i in range(n)]
    return np.mean(xs[:4]), np.mean(xs[-4:])


def test_healthy_stage_raises_nothing():
    rep = hacking.stage_report(records(**HEALTHY))
    assert rep["flagged"] == []
    assert rep["iterations"] == 12
    # repetition is not measured by the reward here (all zero) and there are no evals: left out, not "fine"
    assert rep["signs"]["repetition_rise"]["flag"] is None
    assert {s for s, v in rep["signs"].items() if v["flag"] is False} == {
        "length_growth", "process_over_outcome", "format_alone", "language_mixing"}
    assert "none of 4 signs" in hacking.format_report("grpo", rep)


def test_length_growth_with_flat_accuracy():
    rep = hacking.stage_report(records(**{**HEALTHY, "accuracy": (0.3, 0.305), "response_length": (40, 80)}))
    assert "length_growth" in rep["flagged"]
    s = rep["signs"]["length_growth"]
    a, b = thirds_mean(40, 80)
    assert s["numbers"]["length_start"] == pytest.approx(a) and s["numbers"]["length_end"] == pytest.approx(b)
    assert s["numbers"]["length_growth"] == pytest.approx((b - a) / a)
    assert s["steps"] == [108, 111]  # the last third: where curves.png shades it
    text = hacking.format_report("grpo", rep)
    assert "WARNING length_growth" in text and f"{a:.1f} -> {b:.1f}" in text
    # the same growth with accuracy rising is learning to reason longer, not hacking
    assert "length_growth" not in hacking.stage_report(records(**{**HEALTHY, "response_length": (40, 80)}))["flagged"]


def test_process_reward_rising_while_outcome_falls():
    rep = hacking.stage_report(records(**{**HEALTHY, "accuracy": (0.4, 0.2), "reward__process": (0.5, 0.9)}))
    assert rep["flagged"] == ["process_over_outcome"]
    n = rep["signs"]["process_over_outcome"]["numbers"]
    assert n["reward/process_end"] - n["reward/process_start"] > 0.05 and n["accuracy_end"] < n["accuracy_start"]
    # process rising with accuracy rising too: no flag
    assert hacking.stage_report(records(**{**HEALTHY, "reward__process": (0.5, 0.9)}))["flagged"] == []


def test_format_rising_alone_and_language_mixing():
    rep = hacking.stage_report(records(**{**HEALTHY, "accuracy": (0.3, 0.3), "reward__format": (0.5, 0.9),
                                          "reward__language": (0.0, 0.2)}))
    assert set(rep["flagged"]) == {"format_alone", "language_mixing"}
    assert rep["signs"]["language_mixing"]["numbers"]["reward/language_end"] == pytest.approx(thirds_mean(0, 0.2)[1])


def test_repetition_from_the_reward_or_from_validation_evals():
    rep = hacking.stage_report(records(**{**HEALTHY, "reward__repetition": (0.01, 0.3)}))
    assert rep["flagged"] == ["repetition_rise"]
    # no repetition term in the reward: the validation evals' repetitive share (baseline eval first)
    evals = [{"step": s, "phase": "eval", "validation/repetition_share": v} for s, v in ((99, 0.0), (105, 0.1),
                                                                                          (111, 0.4))]
    rep = hacking.stage_report(evals[:1] + records(**HEALTHY) + evals[1:])
    assert rep["flagged"] == ["repetition_rise"]
    assert rep["signs"]["repetition_rise"]["numbers"] == {"repetition_share_start": 0.0, "repetition_share_end": 0.4}


def test_too_few_iterations_and_missing_metrics():
    rep = hacking.stage_report(records(n=3, **HEALTHY))
    assert rep["signs"] == {} and "too few" in rep["note"] and "too few" in hacking.format_report("grpo", rep)
    rep = hacking.stage_report(records(accuracy=(0.1, 0.1)))  # only accuracy logged
    assert rep["flagged"] == [] and all(v["flag"] is None for v in rep["signs"].values())


def test_curves_mark_the_sign(tmp_path):
    recs = [{"step": 0, "stage": "initial", "phase": "eval", "validation/pass@1": 0.0}]
    recs += records(start=1, **{**HEALTHY, "accuracy": (0.3, 0.3), "response_length": (40, 90), "reward__mean": (0, 1),
                                "kl": (0, 0.1), "entropy": (2, 1)})
    rep = hacking.stage_report(recs)
    path = plots.run_curves(recs, str(tmp_path / "curves.png"), hacking={"grpo": rep})
    assert os.path.getsize(path) > 10_000
    assert plots.stage_starts(recs) == [(1, "grpo")]
    steps, mu, sd = plots.mean_band([([1, 2, 3], [1.0, 2.0, 3.0]), ([1, 2, 3, 4], [3.0, 2.0, 1.0, 0.0])])
    assert list(steps) == [1, 2, 3] and list(mu) == [2.0, 2.0, 2.0]
    assert sd[0] == pytest.approx(np.std([1.0, 3.0], ddof=1))
