"""curves.png (rl/plots.py): stage labels never overlap, even for stages one unit long; the SFT stages' loss has
its own panel, and the RL panels span only the units their metric was logged in (no empty SFT units); only panels
with data are drawn, and validation pass@1 carries its 95 % Wilson interval at every evaluation."""
from rl import plots


def _records():
    recs = [{"step": 0, "stage": "initial", "phase": "eval", "validation/pass@1": 0.0}]
    for s in range(1, 4):  # a cold start of three epochs
        recs.append({"step": s, "stage": "cold_start", "phase": "train", "loss": 3.0 / s})
    recs.append({"step": 3, "stage": "cold_start", "phase": "eval", "validation/pass@1": 0.1})
    recs.append({"step": 4, "stage": "rejection", "phase": "train", "loss": 1.5, "kept_share": 0.2,
                 "reward/mean": 0.3, "sample_accuracy": 0.2})
    for s, name in ((5, "grpo_a"), (6, "grpo_b"), (7, "grpo_c")):  # three RL stages of one unit each: adjacent lines
        recs.append({"step": s, "stage": name, "phase": "train", "loss": -0.01 * s, "reward/mean": 0.1 * s,
                     "accuracy": 0.05 * s, "kl": 1e-3 * s, "entropy": 2.0, "response_length": 20.0 + s})
        recs.append({"step": s, "stage": name, "phase": "eval", "validation/pass@1": 0.02 * s})
    return recs


def _labels(fig):
    renderer = fig.canvas.get_renderer()
    out = {}
    for ax in fig.axes:
        out[ax.get_title()] = [(t.get_text().strip(), t.get_window_extent(renderer)) for t in ax.texts
                               if t.get_gid() == plots.STAGE_LABEL]
    return out


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_stage_labels_do_not_overlap_and_each_stage_is_named():
    recs = _records()
    for fig in (plots.run_figure(recs, title="t"),):
        labels = _labels(fig)
        assert [n for n, _ in labels["validation pass@1"]] == ["cold_start", "rejection", "grpo_a", "grpo_b", "grpo_c"]
        for title, ls in labels.items():
            for i in range(len(ls)):
                for j in range(i + 1, len(ls)):
                    assert not _overlap(ls[i][1], ls[j][1]), (title, ls[i][0], ls[j][0])


def test_sft_loss_has_its_own_panel_and_rl_panels_skip_the_sft_units():
    recs = _records()
    assert plots.supervised_stages(recs) == {"cold_start", "rejection"}
    assert plots.panel_series(recs, plots.PANELS[0][1]) == ([1, 2, 3, 4], [3.0, 1.5, 1.0, 1.5])  # no RL policy loss
    fig = plots.run_figure(recs)
    axes = {ax.get_title(): ax for ax in fig.axes}
    assert plots.SFT_LOSS in axes and len(axes) == len(plots.PANELS)
    lo, hi = axes["reward"].get_xlim()
    assert 3 < lo < 4 and 7 < hi < 8  # the reward panel starts at the rejection round, not at unit 0
    lo, hi = axes["KL"].get_xlim()
    assert 4 < lo < 5 and 7 < hi < 8
    lo, hi = axes[plots.SFT_LOSS].get_xlim()
    assert 0 < lo < 1 and 4 < hi < 5
    assert [n for n, _ in _labels(fig)["KL"]] == ["grpo_a", "grpo_b", "grpo_c"]  # no cold_start, rejection there


def test_sweep_curves_keep_labels_apart(tmp_path):
    recs = _records()
    path = plots.sweep_curves({"a": [recs, recs], "b": [recs]}, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").stat().st_size > 10_000 and path.endswith("c.png")


def _rl_only_records():
    """A run without SFT (GRPO from a pretrained start): evaluations with their n, RL train records."""
    recs = [{"step": 0, "stage": "initial", "phase": "eval", "validation/pass@1": 0.25, "validation/n_problems": 16}]
    for s in range(1, 5):
        recs.append({"step": s, "stage": "grpo", "phase": "train", "loss": -0.01 * s, "reward/mean": 0.1 * s,
                     "accuracy": 0.05 * s, "kl": 1e-3 * s, "entropy": 2.0, "response_length": 20.0 + s})
    recs.append({"step": 2, "stage": "grpo", "phase": "eval", "validation/pass@1": 0.0, "validation/n_problems": 16})
    recs.append({"step": 4, "stage": "grpo", "phase": "eval", "validation/pass@1": 0.5, "validation/n_problems": 16})
    return recs


def test_only_panels_with_data_and_error_bars_on_evaluations():
    import numpy as np
    from matplotlib.container import ErrorbarContainer

    recs = _rl_only_records()
    fig = plots.run_figure(recs)
    titles = [ax.get_title() for ax in fig.axes]
    assert plots.SFT_LOSS not in titles and len(fig.axes) == len(plots.PANELS) - 1  # no empty SFT panel
    assert all(ax.lines for ax in fig.axes)  # every panel drawn has a curve
    assert not any("not logged" in t.get_text() for ax in fig.axes for t in ax.texts)
    val = next(ax for ax in fig.axes if ax.get_title() == "validation pass@1")
    (bars,) = [c for c in val.containers if isinstance(c, ErrorbarContainer)]
    segs = bars.lines[2][0].get_segments()  # one vertical segment per evaluation: (x, lower) -> (x, upper)
    z = 1.96
    for seg, (x, p) in zip(segs, ((0, 0.25), (2, 0.0), (4, 0.5))):
        c, n = p * 16, 16.0  # the Wilson interval in its count form, float64
        mid = (c + z * z / 2) / (n + z * z)
        half = z / (n + z * z) * np.sqrt(c * (n - c) / n + z * z / 4)
        np.testing.assert_allclose(seg, [[x, max(mid - half, 0)], [x, mid + half]], atol=1e-9)
    assert segs[1][1][1] > 0.15  # pass@1 0 of 16 still has an upper bound well above 0 (an SE bar would be empty)
    # no other panel has error bars; a sweep draws only its panels with data too
    assert not any(c for ax in fig.axes if ax is not val for c in ax.containers)
    assert plots.drawn_panels([recs, _records()]) == list(plots.PANELS)
    assert [n for n, _ in plots.drawn_panels([recs])] == titles
