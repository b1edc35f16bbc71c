"""The launcher's GRPO update in the grouped layout against the flat one, in one run.

    python -m experiments.bench.stage_layout                    # quickstart's GRPO stage, 2 repetitions each
    python -m experiments.bench.stage_layout --quick            # smoke run (the tiny variant)
    python -m experiments.bench.stage_layout --json /tmp/layout.json

Runs experiments/configs/quickstart.py through experiments.launch with its cold start and rejection stages cut
to a minimum, and its GRPO stage (32 problems x 8 answers, token_budget 4096: minibatches of 5 groups / 42 rows)
for --iterations iterations with filter_zero_variance off, so every iteration trains all 256 rows whatever the
barely trained policy scores. The runs alternate batch_layout=flat and auto (grouped) --reps times; each reports
the median over its iterations after the first (which compiles) of time/train (the update's wall seconds),
train_tokens_per_s and time/logprobs (the reference pass, grouped too, plus the flat sampler / trainer mismatch check
on one minibatch's rows). Prints grouped / flat ratios of the medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from experiments import launch
from experiments.bench import common
from rl.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_once(layout: str, iterations: int, quick: bool, workdir: str) -> dict:
    cfg = os.path.join(ROOT, "experiments/configs/quickstart.py") + (":variant=tiny" if quick else "")
    args = ["--config", cfg, "--workdir", workdir, "--config.eval.initial=false", "--config.eval.every=1000",
            "--config.stages[0].epochs=1", "--config.stages[1].rounds=1", "--config.stages[1].n_problems=8",
            f"--config.stages[2].iterations={iterations}", "--config.stages[2].filter_zero_variance=off",
            f"--config.stages[2].batch_layout={layout}", "--config.log.progress=false"]
    if launch.main(args) != 0:
        raise RuntimeError(f"the {layout} run failed")
    recs = [r for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
            if r["phase"] == "train" and "train/grouped" in r]
    timed = recs[1:] or recs
    return {"layout": layout, "grouped": recs[0]["train/grouped"], "iterations": len(recs),
            "train_s": statistics.median(r["time/train"] for r in timed),
            "train_tokens_per_s": statistics.median(r["train_tokens_per_s"] for r in timed),
            "logprobs_s": statistics.median(r["time/logprobs"] for r in timed),
            "optimizer_steps": recs[-1]["optimizer_steps"], "rows": recs[-1]["n_samples"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    common.add_json_arg(ap)
    args = ap.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for layout in ("flat", "auto"):
                runs.append(run_once(layout, args.iterations, args.quick, os.path.join(tmp, f"{layout}{rep}")))
    med = lambda lay, k: statistics.median(r[k] for r in runs if r["layout"] == lay)  # noqa: E731
    out = {"runs": runs, "machine": common.machine_info(),
           "train_s_ratio": med("auto", "train_s") / med("flat", "train_s"),
           "tokens_per_s_ratio": med("auto", "train_tokens_per_s") / med("flat", "train_tokens_per_s"),
           "logprobs_s_ratio": med("auto", "logprobs_s") / med("flat", "logprobs_s")}
    common.print_table(["layout", "grouped", "update s (median)", "train tok/s", "logprob passes s", "steps / iteration",
                        "rows"],
                       [[r["layout"], r["grouped"], f"{r['train_s']:.3f}", f"{r['train_tokens_per_s']:.0f}",
                         f"{r['logprobs_s']:.3f}", r["optimizer_steps"], r["rows"]] for r in runs])
    print(f"grouped / flat: update time {out['train_s_ratio']:.3f}x, train tokens/s {out['tokens_per_s_ratio']:.3f}x, "
          f"logprob passes {out['logprobs_s_ratio']:.3f}x")
    common.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
