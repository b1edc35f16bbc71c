"""Cold-start SFT epoch time with and without length buckets (stage field length_buckets), on the R1 pipeline's
mixed demonstrations (math 50 %, code 25 %, instructions 25 %: rows of ~85, ~250 and ~430 bytes in 544 columns).

    python -m experiments.bench.sft_buckets [--rows 256] [--buckets 4] [--reps 3] [--json out.json]

Both arms run the same rows through the same jitted SFT train step (experiments/configs/r1_pipeline.py's model):
`padded` cuts every minibatch of 32 to the full 544 columns (length_buckets 0), `bucketed` groups rows of similar
length and cuts each minibatch to the narrowest of N widths (rl.rollout.length_grouped_minibatches /
column_bucket / trim_columns, as rl.train_loop.train_on does). Each width is compiled before timing; the arms
alternate rep by rep, so machine load moves both; the figure is the ratio of the median epoch times.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench.common import add_json_arg, machine_info, write_json
from experiments.configs import r1_pipeline
from models.tokenizer import ByteTokenizer
from rl import config_validation as cv
from rl import rollout
from rl.setup import build_model_cfg, load_problems
from rl.sft import build_sft_batch
from rl.tasks import render_prompt, render_solution
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_train_step


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=256, help="demonstrations per epoch")
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)

    add_json_arg(ap)
    args = ap.parse_args(argv)

    cfg = cv.validate(r1_pipeline.get_config())
    model_cfg = build_model_cfg(cfg)
    seq_len, rows_per_step, lang = model_cfg.max_seq_len, 32, cfg.tasks.lang
    probs = load_problems(cfg)[0][: args.rows]  # the run's training problems, as its cold start takes them
    batch = build_sft_batch([render_prompt(p, lang) for p in probs], [render_solution(p, lang) for p in probs],
                            ByteTokenizer(), seq_len)
    lengths = rollout.row_lengths(batch["attn_mask"])
    loss_cfg, optim = LossConfig(mode="sft"), OptimConfig()
    step = make_train_step(model_cfg, loss_cfg, optim)
    hp = {"lr": jnp.float32(1e-3), "kl_coef": jnp.float32(0.0)}
    rng = np.random.default_rng(0)

    def plan(bucketed: bool):  # one epoch's device minibatches, as rl.train_loop.train_on builds them
        n_buckets = args.buckets if bucketed else 0
        parts = rollout.epoch_minibatches(len(lengths), rows_per_step, rng, lengths if bucketed else None)
        return [{k: jnp.asarray(v) for k, v in rollout.take_minibatch(batch, idx, rows_per_step, n_buckets,
                                                                     lengths).items()} for idx in parts]

    state = init_train_state(model_cfg, loss_cfg, optim, jax.random.key(0))

    def epoch(mbs):
        nonlocal state
        t0 = time.perf_counter()
        for mb in mbs:
            state, m = step(state, mb, hp)
        jax.block_until_ready(m["loss/total"])
        return time.perf_counter() - t0

    widths = sorted({rollout.column_bucket(int(n), seq_len, args.buckets) for n in lengths})
    for w in set(widths) | {seq_len}:  # compile every shape before timing
        epoch([{k: jnp.asarray(v[:rows_per_step, :w]) for k, v in batch.items()}])
    times = {"padded": [], "bucketed": []}
    cols = {"padded": 0, "bucketed": 0}
    for _ in range(args.reps):
        for arm in ("padded", "bucketed"):
            mbs = plan(arm == "bucketed")
            cols[arm] = sum(int(mb["tokens"].shape[1]) for mb in mbs)
            times[arm].append(epoch(mbs))
    med = {a: statistics.median(t) for a, t in times.items()}
    res = {"rows": args.rows, "seq_len": seq_len, "buckets": args.buckets, "widths": widths,
           "row_length_mean": float(lengths.mean()), "epoch_s": med, "epoch_s_each": times,
           "columns_per_epoch": cols, "speedup": med["padded"] / med["bucketed"]}
    print(f"{args.rows} rows (mean length {lengths.mean():.0f} of {seq_len}), minibatches of {rows_per_step}, "
          f"widths {widths}")
    for arm in times:
        print(f"  {arm:9s} epoch {med[arm]:6.2f} s (each: {', '.join(f'{t:.2f}' for t in times[arm])}), "
              f"{cols[arm]} columns x {rows_per_step} rows")
    print(f"  speedup {res['speedup']:.2f}x (same run, arms alternating)")
    write_json(args.json, {**res, "machine": machine_info()})
    return res


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
