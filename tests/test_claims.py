"""experiments/claims.py: reading sweep directories, per-seed finals, curves, samples-to-target, on hand-made runs."""
import json
import math

import numpy as np
import pytest

from experiments import claims


def _write_run(d, seed, finals, evals, train):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"seed": seed, "tasks": {"n_train": 50}, "stages": [
        {"name": "cold_start", "kind": "sft"}, {"name": "rejection", "kind": "rejection", "rounds": 2, "n_problems": 50,
                                                "samples": 4}, {"name": "grpo", "kind": "grpo"}]}))
    (d / "summary.json").write_text(json.dumps({"eval": {k: {"pass@1": v} for k, v in finals.items()},
                                                "hacking": {"grpo": {"flagged": ["length_growth"]}}}))
    recs = [{"step": s, "phase": "train", "stage": "grpo", "unit": str(s - 1), "n_samples": n, "kl": 0.01 * s * (seed + 1)}
            for s, n in train]
    recs += [{"step": s, "phase": "eval", "stage": "grpo", "unit": str(s - 1), "validation/pass@1": v} for s, v in evals]
    recs.insert(0, {"step": 0, "phase": "eval", "stage": "initial", "validation/pass@1": 0.0})
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
    steps, mean, sd = claims.curve(runs, "validation/pass@1", phase="eval")  # global steps, the initial eval too
    np.testing.assert_allclose(steps, [0, 1, 2])
    np.testing.assert_allclose(mean, [0.0, 0.4, 0.45])
    np.testing.assert_allclose(sd, [0.0, 0.0, np.std([0.4, 0.5], ddof=1)])
    assert claims.samples_to_reach(runs[1].records, 0.45) == 200  # seed 1 reaches 0.5 at its second eval
    assert claims.samples_to_reach(runs[1].records, 0.4) == 100  # ... and 0.4 at its first, after one unit
    assert math.isnan(claims.samples_to_reach(runs[0].records, 0.45))  # seed 0 stays at 0.4
    assert claims.stage_values(runs[0], "grpo", "n_samples") == [100.0, 100.0]


def test_stage_curve_samples_curve_and_spread(sweep):
    runs = claims.load_sweep(str(sweep))["process_weight=0.2"]
    x, mean, sd = claims.stage_curve(runs, "grpo", "validation/pass@1")
    np.testing.assert_allclose(x, [1, 2])  # units done in the stage; the initial eval is another stage
    np.testing.assert_allclose(mean, [0.4, 0.45])
    x, mean, sd = claims.samples_curve(runs, "grpo")
    np.testing.assert_allclose(x, [100, 200])  # the first eval follows one unit of 100 samples
    np.testing.assert_allclose(mean, [0.4, 0.45])
    np.testing.assert_allclose(sd, [0.0, np.std([0.4, 0.5], ddof=1)])
    assert claims.spread(runs, "grpo", "kl") == pytest.approx([0.005, 0.01])  # std of (0.01, 0.02) and (0.02, 0.04)
    assert math.isnan(claims.spread(runs, "grpo", "missing")[0])


def test_plots_draw_one_artist_per_arm(sweep):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2)
    runs = claims.load_sweep(str(sweep))
    for arm, rs in runs.items():
        claims.plot_band(a, *claims.stage_curve(rs, "grpo", "validation/pass@1"), label=arm)
    claims.plot_finals(b, claims.final(runs, "grpo"))
    assert len(a.lines) == 2 and len(a.collections) == 2  # a line and a band per arm
    assert len(b.patches) == 2 and [t.get_text() for t in b.get_xticklabels()] == list(runs)
    plt.close(fig)


def test_collect_takes_the_first_alternative_with_runs(sweep):
    arms = claims.collect(str(sweep), {"base": ("missing/point", "process_weight=0.0"), "w=0.2": "process_weight=0.2",
                                       "unfinished": "process_weight=0.5", "absent": "nowhere"})
    assert list(arms) == ["base", "w=0.2"]  # arms with no finished run are left out
    assert [r.seed for r in arms["base"]] == [0, 1]
    assert claims.load_point(str(sweep / "nowhere")) == []


def test_report_and_is_full(sweep, tmp_path):
    arms = claims.load_sweep(str(sweep))
    text = claims.report(arms, "claim 2")
    assert text.startswith("claim 2: process_weight=0.0 (2 seeds), process_weight=0.2 (2 seeds)\n| arm |")
    assert claims.report({}, "claim 4") == "claim 4: not run"
    assert not claims.is_full(arms)  # two seeds, no test evaluation
    assert claims.is_full(arms, seeds=2, n_test=0) and not claims.is_full({}, seeds=0, n_test=0)


def test_save_figure_writes_the_png(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    claims.save_figure(fig, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000 and not plt.get_fignums()


def test_samples_spent_counts_rejection_rounds_and_rl_samples(sweep):
    run = claims.load_sweep(str(sweep))["process_weight=0.0"][0]
    assert claims.samples_spent(run, "rejection") == 2 * 50 * 4  # rounds x n_problems x samples
    assert claims.samples_spent(run, "grpo") == 200  # the RL stage's logged n_samples
    assert claims.samples_spent(run) == 400 + 200
