"""Per-family table of a multi-family run (the R1 pipeline) over its stages and seeds, from summary.json files.

    python -m experiments.family_table runs/r1/seed0 runs/r1/seed1 runs/r1/seed2 [--md out.md]

One row per stage, one column per family found in the runs: held-out test pass@1 (math: verified answer; code:
every hidden test passes; instructions: every constraint met; gym/<generator>: our grader of that reasoning-gym
family accepts the answer, rl/tasks/gym.py) as mean +- sample sd over the runs with each run's value, then the
language consistency of all answers. It answers the R1 pipeline's question from the numbers: did reasoning RL
(math + code) cost instruction following, and did the all-scenario stage restore it?
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from rl.stages.common import FAMILIES


def load(workdirs: list[str]) -> list[dict]:
    out = []
    for w in workdirs:
        with open(os.path.join(w, "summary.json"), encoding="utf-8") as f:
            out.append(json.load(f)["eval"])
    return out


def cell(vals: list[float]) -> str:
    v = np.asarray(vals, np.float64)
    sd = f" +- {v.std(ddof=1):.3f}" if len(v) > 1 else ""
    return f"{v.mean():.3f}{sd} ({', '.join(f'{x:.3f}' for x in v)})"


def families(evals: list[dict]) -> list[str]:
    """The families with a per-family pass@1 in any eval: math, code, instructions first, then gym/<generator>."""
    found = {key.split("/", 1)[1] for e in evals for m in e.values() for key in m if key.startswith("pass@1/")}
    found.discard("")
    return [f for f in FAMILIES if f in found] + sorted(found - set(FAMILIES))


def table(evals: list[dict]) -> str:
    """Markdown: stages (in run order, those every run evaluated) x families + language consistency."""
    stages = [s for s in evals[0] if all(s in e for e in evals)]
    fams = families(evals)
    head = ["stage"] + [f"{f} pass@1" for f in fams] + ["language consistency"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in stages:
        row = [s]
        for f in fams:
            vals = [e[s].get(f"pass@1/{f}") for e in evals]
            row.append(cell(vals) if all(v is not None for v in vals) else "-")
        row.append(cell([e[s]["language_consistency"] for e in evals]))
        lines.append("| " + " | ".join(row) + " |")
    n = {f: evals[0][stages[0]].get(f"n_problems/{f}") for f in fams} if stages else {}
    sizes = ", ".join(f"{f} {int(v)}" for f, v in n.items() if v)
    return "\n".join(lines) + f"\n\nmean +- sample sd over {len(evals)} run(s) (each run's value); test problems per run: {sizes}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workdirs", nargs="+")
    ap.add_argument("--md", default=None, help="also write the table to this file")
    args = ap.parse_args(argv)
    missing = [w for w in args.workdirs if not os.path.exists(os.path.join(w, "summary.json"))]
    if missing:
        print(f"no summary.json in {', '.join(missing)} (unfinished runs?)", file=sys.stderr)
        return 2
    text = table(load(args.workdirs))
    print(text)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
