"""curves.png: the curves a researcher looks at first, for one run or a sweep (matplotlib, Agg canvas).

    run_curves(read_jsonl(workdir + "/metrics.jsonl"), workdir + "/curves.png", hacking=summary.get("hacking"))
    sweep_curves({"clip_high=0.2": [records_seed0, records_seed1], ...}, sweep_dir + "/curves.png")

One panel each, over global units (the `step` of metrics.jsonl): the supervised loss of the SFT stages (cold start,
rejection rounds: their own panel, since the RL panels have nothing to show there), validation pass@1 (every
stage), and for the RL stages reward, sampled accuracy (RL `accuracy`, rejection `sample_accuracy`), KL, entropy,
response length. Only panels with data are drawn (a run without SFT has no SFT panel; `drawn_panels`). Each panel
spans the units its metric was logged in; validation pass@1 has an error bar per evaluation, its 95 % Wilson
interval over the n validation problems (`eval_intervals`). Stage boundaries are dashed vertical lines
labelled with the stage name, a label moved down a row where it would overlap the one before (`stage_labels`); a
reward-hacking sign (rl/hacking.py) shades the units that triggered it in red on the panel of its metric. A sweep draws one line per point: the mean over seeds, and a
band of +- one sample standard deviation (ddof=1) where there are two or more seeds.
The run loop calls run_curves at every stage end (so a running run has an up-to-date figure) and at the end.
"""
from __future__ import annotations

import math

import numpy as np

from rl.metrics import wilson_interval

# (panel title, metric keys: the first one a record holds is used)
SFT_LOSS = "SFT loss (cold start, rejection rounds)"
PANELS = ((SFT_LOSS, ("loss",)), ("validation pass@1", ("validation/pass@1",)), ("reward", ("reward/mean",)),
          ("sampled accuracy", ("accuracy", "sample_accuracy")), ("KL", ("kl",)), ("entropy", ("entropy",)),
          ("response length", ("response_length",)))
STAGE_LABEL = "stage-label"  # the gid of the stage-name texts (the tests check that they do not overlap)
SIGN_PANEL = {"length_growth": "response length", "repetition_rise": "response length",
              "process_over_outcome": "reward", "format_alone": "reward", "language_mixing": "reward"}


def _value(r: dict, keys) -> float | None:
    for k in keys:
        v = r.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def supervised_stages(records: list[dict]) -> set[str]:
    """Stages whose training is supervised: SFT (train records without a reward) and rejection rounds (they keep a
    share of their samples)."""
    train = [r for r in records if r.get("phase") == "train" and r.get("stage")]
    rewarded = {r["stage"] for r in train if "reward/mean" in r and "kept_share" not in r}
    return {r["stage"] for r in train} - rewarded


def panel_series(records: list[dict], keys) -> tuple[list[int], list[float]]:
    """(steps, values) of one panel's metric, in record order (the SFT loss panel: supervised stages' train
    records only; an RL stage's `loss` is its policy loss)."""
    xs, ys = [], []
    if keys == PANELS[0][1]:
        sup = supervised_stages(records)
        records = [r for r in records if r.get("stage") in sup and r.get("phase") == "train"]
    for r in records:
        v = _value(r, keys)
        if v is not None:
            xs.append(int(r["step"]))
            ys.append(v)
    return xs, ys


def eval_intervals(records: list[dict], keys) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, values, lower, upper): each evaluation point of a pass@1 panel ("<split>/pass@1", with
    "<split>/n_problems" in the record) and its 95 % Wilson interval; empty lists for any other panel."""
    key = keys[0]
    out = ([], [], [], [])
    if not key.endswith("/pass@1"):
        return out
    n_key = key[: -len("pass@1")] + "n_problems"
    for r in records:
        v, n = _value(r, (key,)), _value(r, (n_key,))
        if v is not None and n:
            for col, x in zip(out, (int(r["step"]), v, *wilson_interval(v, int(n)))):
                col.append(x)
    return out


def drawn_panels(record_sets: list[list[dict]]) -> list[tuple[str, tuple]]:
    """The PANELS with data in any of the record sets (one run: one set; a sweep: every run's), in PANELS order."""
    return [(name, keys) for name, keys in PANELS if any(panel_series(recs, keys)[0] for recs in record_sets)]


def stage_starts(records: list[dict]) -> list[tuple[int, str]]:
    """(first step, stage name) of every stage after `initial`, in order."""
    out, seen = [], set()
    for r in records:
        st = r.get("stage")
        if st and st != "initial" and st not in seen:
            seen.add(st)
            out.append((int(r["step"]), st))
    return out


def _figure(n: int):
    """A figure with n panels (at least one), four to a row."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # matplotlib (slow to import) only when drawing
    from matplotlib.figure import Figure  # no pyplot: no global backend state, safe inside notebooks and threads

    n = max(n, 1)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.5 * cols, 3.5 * rows))
    FigureCanvasAgg(fig)  # a renderer, to measure the stage labels
    axes = list(np.asarray(fig.subplots(rows, cols)).reshape(-1))
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def _decorate(ax, title, starts, span=None):
    """Title, grid, the x range `span` (lo, hi: the units the panel's metric covers) and the stage lines in it."""
    from matplotlib.ticker import MaxNLocator  # matplotlib (slow to import) only when drawing

    if span is not None:
        ax.set_xlim(span[0] - 0.7, span[1] + 0.7)
        starts = [(x, name) for x, name in starts if span[0] - 0.5 <= x - 0.5 and x <= span[1]]  # its stages only
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.stage_starts = starts
    for x, _ in ax.stage_starts:
        ax.axvline(x - 0.5, color="0.5", ls="--", lw=0.8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("unit")
    ax.grid(alpha=0.3)


def stage_labels(fig, axes) -> None:
    """Name each panel's stage lines at its top, a label one row lower when it would overlap the label before it
    (measured with the figure's renderer, after the layout is final)."""
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        placed = []  # (row, right edge in pixels)
        for x, name in getattr(ax, "stage_starts", []):
            row = 0
            while True:
                t = ax.text(x - 0.5, 1.0 - 0.07 * row, f" {name}", transform=ax.get_xaxis_transform(), fontsize=7,
                            va="top", color="0.35", gid=STAGE_LABEL)
                box = t.get_window_extent(renderer)
                if all(r != row or box.x0 >= right + 2 for r, right in placed):
                    placed.append((row, box.x1))
                    break
                t.remove()
                row += 1


def _span(*series) -> tuple[int, int] | None:
    xs = [x for s in series for x in s]
    return (min(xs), max(xs)) if xs else None


def run_curves(records: list[dict], path: str, hacking: dict | None = None, title: str = "") -> str:
    """Draw one run's curves.png from its metrics.jsonl records; `hacking` maps stage -> stage_report."""
    fig = run_figure(records, hacking, title)
    fig.savefig(path, dpi=100)
    return path


def run_figure(records: list[dict], hacking: dict | None = None, title: str = ""):
    """The matplotlib Figure run_curves saves."""
    panels = drawn_panels([records])
    fig, axes = _figure(len(panels))
    starts = stage_starts(records)
    by_title = {}
    for ax, (name, keys) in zip(axes, panels):
        xs, ys = panel_series(records, keys)
        (line,) = ax.plot(xs, ys, marker="." if len(xs) < 40 else None, lw=1.2)
        ex, ev, lo, hi = (np.asarray(c, np.float64) for c in eval_intervals(records, keys))
        if len(ex):
            ax.errorbar(ex, ev, yerr=[ev - lo, hi - ev], fmt="none", ecolor=line.get_color(), alpha=0.5, capsize=2,
                        lw=0.8)
        _decorate(ax, name, starts, _span(xs))
        by_title[name] = ax
    if not panels:
        axes[0].text(0.5, 0.5, "no metrics logged yet", transform=axes[0].transAxes, ha="center", color="0.5")
    for stage, rep in (hacking or {}).items():
        for sign in rep.get("flagged", []):
            lo, hi = rep["signs"][sign]["steps"]
            ax = by_title.get(SIGN_PANEL.get(sign, "reward"))
            if ax is None:  # its metric was not logged
                continue
            ax.axvspan(lo - 0.5, hi + 0.5, color="red", alpha=0.12)
            ax.text(lo - 0.5, 0.02, f" {sign}", transform=ax.get_xaxis_transform(), fontsize=7, color="red")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    stage_labels(fig, axes)
    return fig


def mean_band(runs: list[tuple[list[int], list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, sample std) over runs at the steps every run logged (std 0 with one run)."""
    common = sorted(set.intersection(*[set(xs) for xs, _ in runs])) if runs else []
    vals = np.array([[dict(zip(xs, ys))[s] for s in common] for xs, ys in runs], np.float64).reshape(len(runs), -1)
    sd = vals.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(len(common))
    return np.array(common), vals.mean(axis=0) if len(runs) else np.array([]), sd


def sweep_curves(groups: dict[str, list[list[dict]]], path: str, title: str = "") -> str:
    """One line per sweep point (mean over its seeds' records) with a +- sample-std band."""
    panels = drawn_panels([r for runs in groups.values() for r in runs if r])
    fig, axes = _figure(len(panels))
    first = next((rs[0] for rs in groups.values() if rs), [])
    starts = stage_starts(first)
    for ax, (name, keys) in zip(axes, panels):
        drawn = []
        for label, runs in groups.items():
            series = [panel_series(r, keys) for r in runs if r]
            series = [s for s in series if s[0]]
            if not series:
                continue
            xs, mu, sd = mean_band(series)
            if not len(xs):
                continue
            drawn.append(xs)
            (line,) = ax.plot(xs, mu, lw=1.2, label=f"{label} (n={len(series)})")
            if len(series) > 1:
                ax.fill_between(xs, mu - sd, mu + sd, color=line.get_color(), alpha=0.2)
        _decorate(ax, name, starts, _span(*drawn))
    handles, labels = axes[0].get_legend_handles_labels()
    if not handles:
        handles, labels = next((a.get_legend_handles_labels() for a in axes if a.get_legend_handles_labels()[0]),
                               ([], []))
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.08 if handles else 0, 1, 1))
    stage_labels(fig, axes)
    fig.savefig(path, dpi=100)
    return path
