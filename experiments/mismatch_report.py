"""Table and curves of the sampler / trainer mismatch sweep (experiments/configs/mismatch_moe.py, issue 14).

    python -m experiments.mismatch_report runs/mismatch_moe [--png docs/figures/mismatch_moe.png] [--md out.md]

Reads every arm's metrics.jsonl and summary.json under the sweep's workdir (<point>/seed<k>/) and prints a markdown
table: per arm, the mean +- sample standard deviation (ddof=1) over seeds, then every seed's value, of
  mismatch/logp_mean_abs, mismatch/logp_max_abs, mismatch/kl   sampler vs trainer on the same parameters, mean over
                                                               the GRPO iterations
  router/replay_disagreement                                   share of token-layer routes the trainer's router
                                                               chooses differently from the sampler's, mean over
                                                               the iterations that trained
  TIS truncated                                                share of tokens whose weight hit the cap (TIS arms)
  kl (last 10)                                                 KL to the reference policy, mean of the last 10
                                                               iterations
  train accuracy (last 10)                                     sampled answers verified right, last 10 iterations
  test pass@1                                                  held-out, after GRPO (summary.json), its standard
                                                               error within the run, and its change from the
                                                               cold start
The plot has one panel per quantity over the GRPO iterations (a 5-iteration moving average; validation pass@1 at
its eval points), one line per arm: the mean over seeds with a +-1 sample-std band.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np
from matplotlib.figure import Figure
from PIL import Image  # matplotlib's own dependency: a 64-colour palette keeps the committed PNG small

CURVES = [("mismatch/kl", "sampler-trainer KL per token (log)", True),
          ("mismatch/logp_max_abs", "max |sampler - trainer| logprob (log)", True),
          ("router/replay_disagreement", "router disagreement (token-layer share)", False),
          ("kl", "KL to the reference", False),
          ("accuracy", "train sample accuracy", False),
          ("validation/pass@1", "validation pass@1 (greedy)", False)]
SMOOTH = 5  # iterations in the moving average of the per-iteration curves


def arm_name(point: str) -> str:
    replay = "routing_replay=True" in point or "routing_replay_True" in point
    tis = not re.search(r"tis_cap[=_]0\.0(\D|$)", point)
    return {(False, False): "GRPO (bf16 sampler)", (True, False): "+ R3", (False, True): "+ TIS",
            (True, True): "+ R3 + TIS"}[(replay, tis)]


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load(workdir: str, stage: str = "grpo") -> dict:
    """{arm: {seed: {"train": [records], "eval": [records], "summary": dict}}} for the finished runs."""
    arms: dict = {}
    for point in sorted(os.listdir(workdir)):
        pdir = os.path.join(workdir, point)
        if point.startswith("_") or not os.path.isdir(pdir):
            continue
        for sd in sorted(os.listdir(pdir)):
            run = os.path.join(pdir, sd)
            if not (sd.startswith("seed") and os.path.exists(os.path.join(run, "summary.json"))):
                continue
            with open(os.path.join(run, "summary.json"), encoding="utf-8") as f:
                summary = json.load(f)
            if stage not in summary.get("eval", {}):
                continue
            recs = read_jsonl(os.path.join(run, "metrics.jsonl"))
            arms.setdefault(arm_name(point), {})[int(sd[4:])] = {
                "train": [r for r in recs if r.get("phase") == "train" and r.get("stage") == stage],
                "eval": [r for r in recs if r.get("phase") == "eval" and r.get("stage") == stage],
                "summary": summary}
    return arms


def _mean_of(recs, key, last=None):
    vals = [r[key] for r in recs if isinstance(r.get(key), (int, float))]
    vals = vals[-last:] if last else vals
    return float(np.mean(vals)) if vals else float("nan")


def scalars(run: dict, stage: str = "grpo") -> dict:
    tr, ev = run["train"], run["summary"]["eval"]
    first = next(iter(ev))  # the stage before GRPO (the cold start)
    return {"mismatch mean abs dlogp": _mean_of(tr, "mismatch/logp_mean_abs"),
            "mismatch max abs dlogp": _mean_of(tr, "mismatch/logp_max_abs"),
            "mismatch KL": _mean_of(tr, "mismatch/kl"),
            "router disagreement": _mean_of(tr, "router/replay_disagreement"),
            "TIS truncated": _mean_of(tr, "offpolicy/tis_truncated_frac"),
            "KL to ref (last 10)": _mean_of(tr, "kl", last=10),
            "train acc (last 10)": _mean_of(tr, "accuracy", last=10),
            "test pass@1": float(ev[stage]["pass@1"]),
            "its s.e. (per run)": float(ev[stage].get("pass@1_se", float("nan"))),
            "test pass@1 gain": float(ev[stage]["pass@1"]) - float(ev[first]["pass@1"])}


def _fmt(x: float) -> str:
    if not np.isfinite(x):
        return "-"
    return f"{x:.2e}" if 0 < abs(x) < 1e-2 else f"{x:.3f}"


def table(arms: dict) -> str:
    order = [a for a in ("GRPO (bf16 sampler)", "+ R3", "+ TIS", "+ R3 + TIS") if a in arms]
    cols = list(scalars(next(iter(arms[order[0]].values()))))
    lines = ["| arm | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for arm in order:
        per_seed = {s: scalars(r) for s, r in sorted(arms[arm].items())}
        cells = []
        for c in cols:
            v = np.array([per_seed[s][c] for s in per_seed])
            if not np.isfinite(v).any():  # a quantity this arm does not log (TIS off)
                cells.append("-")
                continue
            sd = np.std(v, ddof=1) if len(v) > 1 else float("nan")
            cells.append(f"{_fmt(np.mean(v))} ± {_fmt(sd)}<br>(" + ", ".join(_fmt(x) for x in v) + ")")
        lines.append(f"| {arm} (seeds {','.join(map(str, per_seed))}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _smooth(y: np.ndarray, w: int) -> np.ndarray:
    """Trailing moving average over the last w points (fewer at the start)."""
    c = np.cumsum(np.insert(y, 0, 0.0))
    n = np.minimum(np.arange(1, len(y) + 1), w)
    return (c[1:] - c[np.arange(1, len(y) + 1) - n]) / n


def plot(arms: dict, path: str) -> None:
    fig = Figure(figsize=(12, 6.4))  # no pyplot: nothing global (backend, figure registry) to set or close
    axes = fig.subplots(2, 3)
    order = [a for a in ("GRPO (bf16 sampler)", "+ R3", "+ TIS", "+ R3 + TIS") if a in arms]
    for arm in order:
        for ax, (key, title, log) in zip(axes.flat, CURVES):
            series = []
            for run in arms[arm].values():
                recs = run["eval"] if key.startswith("validation/") else run["train"]
                series.append({int(r["unit"]): r[key] for r in recs
                               if isinstance(r.get(key), (int, float)) and "unit" in r})
            xs = sorted(set.intersection(*(set(p) for p in series))) if series else []
            if not xs:
                continue
            ys = np.array([[p[x] for x in xs] for p in series], np.float64)
            if not key.startswith("validation/"):
                ys = np.stack([_smooth(y, SMOOTH) for y in ys])
            mean = ys.mean(0)
            sd = ys.std(0, ddof=1) if len(ys) > 1 else np.zeros_like(mean)
            line, = ax.plot(xs, mean, label=arm, marker="o" if len(xs) < 12 else None, ms=3)
            ax.fill_between(xs, np.maximum(mean - sd, mean * 0.05 if log else -np.inf), mean + sd,
                            color=line.get_color(), alpha=0.12)
            ax.set_title(title, fontsize=9)
            if log:
                ax.set_yscale("log")
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("GRPO iteration", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"bf16 sampler, float32 trainer: mean over seeds +- 1 sample sd ({SMOOTH}-iteration moving average; "
                 "validation at its eval points)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    Image.open(path).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.mismatch_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir")
    ap.add_argument("--png", default="")
    ap.add_argument("--md", default="")
    args = ap.parse_args(argv)
    arms = load(args.workdir)
    if not arms:
        print(f"no finished arm under {args.workdir}", file=sys.stderr)
        return 1
    text = table(arms)
    print(text)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.png:
        plot(arms, args.png)
        print(f"plot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
