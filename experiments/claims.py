"""Reading the claim ablations' sweeps (REPRODUCING.md): arms, seeds, curves and the numbers each verdict rests on.

    from experiments import claims
    arms = claims.load_sweep("runs/claims/process_reward")           # {point name: [Run(seed, summary, records)]}
    arms.update(claims.load_sweep("runs/claims/cold_start_zero", label="zero"))   # a one-point sweep under a label
    claims.final(arms, "grpo")                   # {arm: [held-out pass@1 of each seed after stage "grpo"]}
    claims.curve(arms["process_weight=0.2"], "validation/pass@1")   # (steps, mean, sample std) over seeds
    claims.describe(claims.final(arms, "grpo"))  # "0.512 +- 0.031 (n=3: 0.49, 0.50, 0.55)" per arm
    claims.samples_to_reach(run.records, 0.6)    # sampled answers spent before validation pass@1 first >= 0.6

A sweep directory is what experiments/sweep.py writes: <point>/seed<k>/ with summary.json and metrics.jsonl
(plus _shared/, the shared cold start, skipped here). Everything is plain Python over those files, so the
notebooks under notebooks/ and the tests use the same functions; "+-" is the sample standard deviation (ddof=1).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np

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
        runs = [r for r in (load_run(os.path.join(pdir, s)) for s in sorted(os.listdir(pdir))
                            if s.startswith("seed")) if r is not None]
        if runs:
            out.setdefault(label or point, []).extend(sorted(runs, key=lambda r: r.seed))
    return out


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
