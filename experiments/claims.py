"""Reading the claim ablations' sweeps (REPRODUCING.md): arms, seeds, curves and the numbers each verdict rests on.

    from experiments import claims
    arms = claims.load_sweep("runs/claims/process_reward")           # {point name: [Run(seed, summary, records)]}
    arms.update(claims.load_sweep("runs/claims/cold_start_zero", label="zero"))   # a one-point sweep under a label
    claims.final(arms, "grpo")                   # {arm: [held-out pass@1 of each seed after stage "grpo"]}
    claims.curve(arms["process_weight=0.2"], "validation/pass@1")   # (steps, mean, sample std) over seeds
    claims.describe(claims.final(arms, "grpo"))  # "0.512 +- 0.031 (n=3: 0.49, 0.50, 0.55)" per arm
    claims.samples_to_reach(run.records, 0.6)    # sampled answers spent before validation pass@1 first >= 0.6
    arms = claims.collect("runs/claims", {"w=0": "process_reward/process_weight_0.0"})  # arms by point directory
    claims.stage_curve(arms["w=0"], "grpo", "validation/pass@1")  # x = the stage's own iterations
    claims.samples_curve(arms["w=0"], "grpo")    # x = sampled answers spent in the stage
    claims.plot_band(ax, *claims.stage_curve(...), label="w=0"); claims.plot_finals(ax, claims.final(arms, "grpo"))
    if not claims.found("runs/claims"): print(claims.no_runs("runs/claims"))   # a fresh clone: a notebook stops there

A sweep directory is what experiments/sweep.py writes: <point>/seed<k>/ with summary.json and metrics.jsonl
(plus _shared/, the shared cold start, skipped here). Everything is plain Python over those files, so the
notebooks under notebooks/ and the tests use the same functions; "+-" is the sample standard deviation (ddof=1).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import matplotlib.pyplot as plt
import numpy as np

from rl import stages
from rl.metrics import read_jsonl
from rl.plots import mean_band, panel_series


@dataclasses.dataclass
class Run:
    seed: int
    summary: dict  # summary.json
    records: list[dict]  # metrics.jsonl
    workdir: str


def load_run(workdir: str) -> Run | None:
    """One finished run (None when its summary.json is missing)."""
    path = os.path.join(workdir, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        seed = int(json.load(f)["seed"])
    return Run(seed=seed, summary=summary, records=read_jsonl(os.path.join(workdir, "metrics.jsonl")), workdir=workdir)


def load_sweep(sweep_dir: str, label: str | None = None) -> dict[str, list[Run]]:
    """{point name: finished runs sorted by seed} of a sweep directory; with `label`, every point's runs under
    that one name (for a sweep of one point, e.g. one arm of a stage-composition claim)."""
    out: dict[str, list[Run]] = {}
    if not os.path.isdir(sweep_dir):
        return out
    for point in sorted(os.listdir(sweep_dir)):
        pdir = os.path.join(sweep_dir, point)
        if point.startswith("_") or not os.path.isdir(pdir):
            continue
        runs = load_point(pdir)
        if runs:
            out.setdefault(label or point, []).extend(runs)
    for runs in out.values():
        runs.sort(key=lambda r: r.seed)
    return out


def load_point(point_dir: str) -> list[Run]:
    """The finished seed*/ runs of one sweep point, sorted by seed ([] when the directory is missing)."""
    if not os.path.isdir(point_dir):
        return []
    runs = [load_run(os.path.join(point_dir, s)) for s in sorted(os.listdir(point_dir)) if s.startswith("seed")]
    return sorted((r for r in runs if r is not None), key=lambda r: r.seed)


def final(arms: dict[str, list[Run]], stage: str, key: str = "pass@1") -> dict[str, list[float]]:
    """Held-out `key` after `stage` (summary.json), per arm and seed; an arm without that stage falls back to
    its last stage (so a rejection-only arm reports its own end)."""
    out = {}
    for arm, runs in arms.items():
        vals = []
        for r in runs:
            ev = r.summary["eval"]
            entry = ev.get(stage) or ev[list(ev)[-1]]
            vals.append(float(entry[key]))
        out[arm] = vals
    return out


def mean_sd(vals: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (nan with one value)."""
    v = np.asarray(vals, np.float64)
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else math.nan)


def describe(values: dict[str, list[float]], digits: int = 3) -> dict[str, str]:
    """'mean +- sd (n=N: v1, v2, ...)' per arm."""
    out = {}
    for arm, vals in values.items():
        m, sd = mean_sd(vals)
        each = ", ".join(f"{x:.{digits}f}" for x in vals)
        out[arm] = f"{m:.{digits}f} +- {sd:.{digits}f} (n={len(vals)}: {each})"
    return out


def markdown_table(values: dict[str, list[float]], header: str, digits: int = 3) -> str:
    """A two-column markdown table of `describe(values)`."""
    lines = [f"| arm | {header} (mean +- sd over seeds; each seed) |", "| --- | --- |"]
    lines += [f"| {arm} | {text} |" for arm, text in describe(values, digits).items()]
    return "\n".join(lines)


def curve(runs: list[Run], key: str, phase: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, sample std) of metric `key` over the seeds' records (rl.plots.mean_band); `phase` keeps
    only "train" or "eval" records."""
    series = []
    for r in runs:
        recs = [x for x in r.records if phase is None or x.get("phase") == phase]
        series.append(panel_series(recs, (key,)))
    return mean_band(series)


def stage_values(run: Run, stage: str, key: str) -> list[float]:
    """Every train-record value of `key` inside one stage, in order."""
    return [float(r[key]) for r in run.records
            if r.get("stage") == stage and r.get("phase") == "train" and isinstance(r.get(key), (int, float))]


def samples_to_reach(records: list[dict], target: float, key: str = "validation/pass@1") -> float:
    """Sampled answers (RL `n_samples`, summed over units) spent before the first eval with `key` >= target
    (nan when never reached)."""
    spent = 0
    for r in records:
        if r.get("phase") == "train":
            spent += int(r.get("n_samples", 0) or 0)
        elif r.get("phase") == "eval" and isinstance(r.get(key), (int, float)) and r[key] >= target:
            return float(spent)
    return math.nan


def hacking_flags(run: Run) -> dict[str, list[str]]:
    """{RL stage: the hacking signs flagged in summary.json}."""
    return {stage: list(rep.get("flagged", [])) for stage, rep in (run.summary.get("hacking") or {}).items()}


def stage_curve(runs: list[Run], stage: str, key: str, phase: str = "eval") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(units done inside `stage`, mean, sample std) of `key` over the seeds: the stage's records of one phase
    re-based so that x counts the stage's own iterations (an eval after unit u sits at u + 1), which lines up
    arms whose earlier stages differ in length."""
    series = []
    for r in runs:
        recs = [{**x, "step": int(x["unit"]) + 1} for x in r.records
                if x.get("stage") == stage and x.get("phase") == phase and x.get("unit") is not None]
        series.append(panel_series(recs, (key,)))
    return mean_band(series)


def samples_curve(runs: list[Run], stage: str, key: str = "validation/pass@1") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sampled answers spent in `stage` so far, mean, sample std) at each of the stage's evals: the x of an eval
    is the seeds' mean cumulative `n_samples`; evals are matched by position (every seed evaluates equally often)."""
    xs, ys = [], []
    for r in runs:
        spent, x, y = 0, [], []
        for rec in r.records:
            if rec.get("stage") != stage:
                continue
            if rec.get("phase") == "train":
                spent += int(rec.get("n_samples", 0) or 0)
            elif rec.get("phase") == "eval" and isinstance(rec.get(key), (int, float)):
                x.append(spent)
                y.append(float(rec[key]))
        xs.append(x)
        ys.append(y)
    n = min((len(y) for y in ys), default=0)
    if not n:
        return np.array([]), np.array([]), np.array([])
    vals = np.array([y[:n] for y in ys], np.float64)
    sd = vals.std(axis=0, ddof=1) if len(ys) > 1 else np.zeros(n)
    return np.array([x[:n] for x in xs], np.float64).mean(axis=0), vals.mean(axis=0), sd


def spread(runs: list[Run], stage: str, key: str) -> list[float]:
    """Per seed, the standard deviation of a train metric over the stage's iterations (its stability)."""
    values = [stage_values(r, stage, key) for r in runs]
    return [float(np.std(v)) if v else math.nan for v in values]


def plot_band(ax, x, mean, sd, label: str, **kw) -> None:
    """One arm's mean line with a +- sample-sd band."""
    (line,) = ax.plot(x, mean, label=label, **kw)
    if len(x):
        ax.fill_between(x, mean - sd, mean + sd, color=line.get_color(), alpha=0.2, linewidth=0)


def plot_finals(ax, values: dict[str, list[float]], ylabel: str = "held-out pass@1") -> None:
    """A bar per arm at its seeds' mean, +- sample sd, with every seed's value as a dot."""
    for i, (arm, vals) in enumerate(values.items()):
        m, sd = mean_sd(vals)
        ax.bar(i, m, yerr=0 if math.isnan(sd) else sd, color=f"C{i}", alpha=0.6, capsize=4)
        ax.plot([i] * len(vals), vals, "k.", markersize=6)
    ax.set_xticks(range(len(values)), list(values), rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)


def found(root) -> bool:
    """Whether `root` holds any finished run (a summary.json anywhere below it)."""
    return any("summary.json" in files for _, _, files in os.walk(root))


def no_runs(root) -> str:
    """What a claim notebook prints, and all it does, where the claim sweeps have not been run (a fresh clone)."""
    return (f"no runs found in {root}: see REPRODUCING.md (its commands write the claim sweeps there); "
            "nothing is drawn or checked")


def collect(root: str, spec: dict[str, str | tuple[str, ...]]) -> dict[str, list[Run]]:
    """{label: finished runs sorted by seed} for `label: "sweep/point"` (a point directory under `root` holding
    seed*/ runs); a tuple lists alternatives, the first with runs wins (an arm whose config equals another sweep's
    point, e.g. the outcome-only baseline every claim shares). Labels with no finished run are left out, so a
    notebook draws what has been run."""
    out = {}
    for label, paths in spec.items():
        for rel in (paths,) if isinstance(paths, str) else paths:
            runs = load_point(os.path.join(root, rel))
            if runs:
                out[label] = runs
                break
    return out


def report(arms: dict[str, list[Run]], title: str, stage: str = "grpo") -> str:
    """What a notebook prints per claim: the arms found with their seed counts, then the arm table of held-out
    pass@1 after `stage` ("not run" when the sweep has no finished run)."""
    head = f"{title}: " + (", ".join(f"{a} ({len(r)} seeds)" for a, r in arms.items()) or "not run")
    return head + ("\n" + markdown_table(final(arms, stage), "test pass@1") if arms else "")


def is_full(*groups: dict[str, list[Run]], seeds: int = 3, n_test: int = 256) -> bool:
    """True when every arm has `seeds` runs evaluated on at least `n_test` test problems: the REPRODUCING.md
    runs, on which a notebook checks its closing statements (the tests execute the notebooks on tiny sweeps)."""
    runs = [r for g in groups for rs in g.values() for r in rs]
    return bool(runs) and all(len(rs) >= seeds for g in groups for rs in g.values()) and all(
        max((x.get("test/n_problems", 0) for x in r.records if x.get("phase") == "eval"), default=0) >= n_test
        for r in runs)


def save_figure(fig, path) -> None:
    """Lay out, save (dpi 110) and display a notebook figure inline whatever the matplotlib backend, then close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    try:
        from IPython.display import display  # optional: only a notebook kernel has IPython
    except ImportError:  # outside a notebook: the file is the output
        pass
    else:
        display(fig)
    plt.close(fig)


def samples_spent(run: Run, stage: str | None = None) -> int:
    """Sampled answers the run spent after its cold start (or in one `stage`): an RL stage's logged `n_samples`,
    another stage's units x the answers a unit samples (its kind's Kind.answers of its config.json entry: a
    rejection round's n_problems x samples, SFT none)."""
    with open(os.path.join(run.workdir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    total = 0
    for s in cfg["stages"]:
        if stage is not None and s["name"] != stage:
            continue
        kind = stages.KINDS[s["kind"]]
        if kind.is_rl:  # an iteration's answers vary (curriculum, refill): counted as they were drawn
            total += int(sum(stage_values(run, s["name"], "n_samples")))
        else:
            sc = stages.parse_stage(s)
            total += sc.units * kind.answers(sc)
    return total
