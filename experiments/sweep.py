"""Run a config's sweep (grid x seeds), one launcher run per point, then a results table, results.csv and plots.

    python -m experiments.sweep --config experiments/configs/quickstart.py[:arg] --workdir runs/qs_sweep \
        [--metric pass@1] [--stage grpo] [--dry_run] [--config.a.b=value ...]

The config file's `get_sweep(arg=None)` returns {"axes": {"<field path>": [values...], ...}, "seeds": [0, 1, ...]};
the grid is the product of the axes, each point run once per seed in workdir/<point name>/seed<k> by
`python -m experiments.launch` (a separate process each, so a crash costs one point; finished points are skipped
when the sweep is started again, so a sweep resumes like a run). Extra --config.* overrides apply to every point.

Outputs in workdir: results.csv (one row per run: the axis values, seed, every stage's summary metrics and the
wall time), results.md (the table printed at the end: mean +- std over seeds per point) and <metric>.png (the
metric after each stage, one line per grid point, error bars over seeds).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import re
import subprocess
import sys

import numpy as np

from experiments import launch

METRICS = ("pass@1", "pass@k", "maj@k", "format_rate", "mean_length")


def grid(sweep: dict) -> list[dict]:
    """Points of the grid: a list of {path: value} (one empty point when there are no axes)."""
    axes = sweep.get("axes", {}) or {}
    if not isinstance(axes, dict):
        raise ValueError("get_sweep()['axes'] must map field paths to lists of values")
    keys = list(axes)
    for k in keys:
        if not isinstance(axes[k], (list, tuple)) or not axes[k]:
            raise ValueError(f"sweep axis {k!r} needs a non-empty list of values")
    return [dict(zip(keys, vals)) for vals in itertools.product(*(axes[k] for k in keys))]


def point_name(point: dict) -> str:
    if not point:
        return "base"
    parts = []
    for k, v in point.items():
        short = re.sub(r"[^A-Za-z0-9_.@-]+", "_", f"{k.split('.')[-1]}={v}")
        parts.append(short)
    return ",".join(parts)


def run_point(config_spec: str, workdir: str, point: dict, seed: int, extra: list[tuple[str, str]], dry_run: bool) -> int:
    cmd = [sys.executable, "-m", "experiments.launch", "--config", config_spec, "--workdir", workdir,
           f"--config.seed={seed}"]
    cmd += [f"--config.{k}={v}" for k, v in point.items()]
    cmd += [f"--config.{k}={v}" for k, v in extra]
    if dry_run:
        cmd.append("--dry_run")
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def collect(rows_in: list[dict]) -> tuple[list[dict], list[str]]:
    """Flatten each run's summary.json into one CSV row; returns rows and the stage names in order."""
    rows, stages = [], []
    for r in rows_in:
        path = os.path.join(r["workdir"], "summary.json")
        row = {k: v for k, v in r.items() if k != "workdir"}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                s = json.load(f)
            for st, vals in s["eval"].items():
                if st not in stages:
                    stages.append(st)
                for m in METRICS:
                    row[f"{st}/{m}"] = vals.get(m)
            row["wall_seconds"] = s.get("wall_seconds")
            row["status"] = "ok"
        else:
            row["status"] = "failed"
        rows.append(row)
    return rows, stages


def write_csv(path: str, rows: list[dict]) -> None:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def table(rows: list[dict], axes: list[str], stages: list[str], metric: str) -> str:
    """Markdown table: one line per grid point, mean +- std over seeds of `metric` after each stage."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(a) for a in axes), []).append(r)
    head = axes + [f"{s} {metric}" for s in stages] + ["seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, rs in groups.items():
        cells = [str(k) for k in key]
        for s in stages:
            vals = [r.get(f"{s}/{metric}") for r in rs if r.get(f"{s}/{metric}") is not None]
            cells.append(f"{np.mean(vals):.3f} ± {np.std(vals):.3f}" if vals else "-")
        cells.append(str(len(rs)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(path: str, rows: list[dict], axes: list[str], stages: list[str], metric: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(a) for a in axes), []).append(r)
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(len(stages))
    for key, rs in groups.items():
        means, stds = [], []
        for s in stages:
            vals = [r.get(f"{s}/{metric}") for r in rs if r.get(f"{s}/{metric}") is not None]
            means.append(np.mean(vals) if vals else np.nan)
            stds.append(np.std(vals) if vals else 0.0)
        label = ", ".join(f"{a.split('.')[-1]}={k}" for a, k in zip(axes, key)) or "base"
        ax.errorbar(x, means, yerr=stds, marker="o", capsize=3, label=label)
    ax.set_xticks(x, stages)
    ax.set_ylabel(f"held-out {metric}")
    ax.set_xlabel("after stage")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--metric", default="pass@1", choices=METRICS)
    ap.add_argument("--dry_run", action="store_true", help="validate every point, run nothing")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    extra = []
    for a in rest:
        if not a.startswith("--config.") or "=" not in a:
            ap.error(f"unknown argument {a!r} (extra overrides look like --config.a.b=value)")
        k, _, v = a[len("--config.") :].partition("=")
        extra.append((k, v))
    module, arg = launch.load_config_file(args.config)
    if not hasattr(module, "get_sweep"):
        ap.error(f"{args.config} has no get_sweep()")
    sweep = module.get_sweep(arg)
    points = grid(sweep)
    seeds = list(sweep.get("seeds", [0])) or [0]
    axes = list((sweep.get("axes") or {}).keys())
    os.makedirs(args.workdir, exist_ok=True)
    runs, failed = [], 0
    for point in points:
        for seed in seeds:
            wd = os.path.join(args.workdir, point_name(point), f"seed{seed}")
            done = os.path.exists(os.path.join(wd, "summary.json"))
            if not done:
                rc = run_point(args.config, wd, point, seed, extra, args.dry_run)
                failed += rc != 0
            runs.append({**point, "seed": seed, "workdir": wd})
    if args.dry_run:
        print(f"{len(runs)} runs validated" + (f", {failed} failed" if failed else ""))
        return 1 if failed else 0
    rows, stages = collect(runs)
    write_csv(os.path.join(args.workdir, "results.csv"), rows)
    text = table(rows, axes, stages, args.metric)
    with open(os.path.join(args.workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    if stages:
        plot(os.path.join(args.workdir, f"{args.metric}.png"), rows, axes, stages, args.metric)
    print(f"results in {os.path.join(args.workdir, 'results.csv')}" + (f" ({failed} runs failed)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
