"""experiments/claims.py: reading sweep directories, per-seed finals, curves, samples-to-target, on hand-made runs."""
import json
import math

import numpy as np
import pytest

from experiments import claims


def _write_run(d, seed, finals, evals, train):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"seed": seed}))
    (d / "summary.json").write_text(json.dumps({"eval": {k: {"pass@1": v} for k, v in finals.items()},
                                                "hacking": {"grpo": {"flagged": ["length_growth"]}}}))
    recs = [{"step": s, "phase": "train", "stage": "grpo", "n_samples": n} for s, n in train]
    recs += [{"step": s, "phase": "eval", "stage": "grpo", "validation/pass@1": v} for s, v in evals]
    recs.sort(key=lambda r: (r["step"], r["phase"] == "eval"))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture
def sweep(tmp_path):
    for w, base in (("0.0", 0.2), ("0.2", 0.4)):
        for seed in (1, 0):
            _write_run(tmp_path / f"process_weight={w}" / f"seed{seed}", seed,
                       {"cold_start": 0.1, "grpo": base + 0.1 * seed}, [(1, base), (2, base + 0.1 * seed)],
                       [(1, 100), (2, 100)])
    (tmp_path / "_shared" / "seed0").mkdir(parents=True)  # the shared cold start is not an arm
    (tmp_path / "process_weight=0.5" / "seed0").mkdir(parents=True)  # unfinished: no summary.json
    return tmp_path


def test_load_sweep_finals_and_description(sweep):
    arms = claims.load_sweep(str(sweep))
    assert list(arms) == ["process_weight=0.0", "process_weight=0.2"]
    assert [r.seed for r in arms["process_weight=0.2"]] == [0, 1]
    fin = claims.final(arms, "grpo")
    assert fin == {"process_weight=0.0": [0.2, pytest.approx(0.3)], "process_weight=0.2": [0.4, 0.5]}
    m, sd = claims.mean_sd(fin["process_weight=0.2"])
    assert m == pytest.approx(0.45) and sd == pytest.approx(np.std([0.4, 0.5], ddof=1))
    assert claims.describe({"a": [0.4, 0.5]})["a"] == "0.450 +- 0.071 (n=2: 0.400, 0.500)"
    assert claims.final(arms, "rejection")["process_weight=0.0"] == [0.2, pytest.approx(0.3)]  # falls back to the last
    assert "| process_weight=0.2 | 0.450 +- 0.071" in claims.markdown_table(fin, "pass@1")
    assert claims.load_sweep(str(sweep), label="all")["all"][0].seed == 0
    assert claims.hacking_flags(arms["process_weight=0.0"][0]) == {"grpo": ["length_growth"]}


def test_curve_and_samples_to_reach(sweep):
    runs = claims.load_sweep(str(sweep))["process_weight=0.2"]
    steps, mean, sd = claims.curve(runs, "validation/pass@1", phase="eval")
    np.testing.assert_allclose(steps, [1, 2])
    np.testing.assert_allclose(mean, [0.4, 0.45])
    np.testing.assert_allclose(sd, [0.0, np.std([0.4, 0.5], ddof=1)])
    assert claims.samples_to_reach(runs[1].records, 0.45) == 200  # seed 1 reaches 0.5 at its second eval
    assert claims.samples_to_reach(runs[1].records, 0.4) == 100  # ... and 0.4 at its first, after one unit
    assert math.isnan(claims.samples_to_reach(runs[0].records, 0.45))  # seed 0 stays at 0.4
    assert claims.stage_values(runs[0], "grpo", "n_samples") == [100.0, 100.0]
