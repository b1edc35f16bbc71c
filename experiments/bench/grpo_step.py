"""GRPO train-step benchmark: tokens/s and MFU of rl.train_step (policy + k3 KL + router losses).

    python -m experiments.bench.grpo_step             # both shapes, 5 timed steps each
    python -m experiments.bench.grpo_step --quick     # smoke run
    python -m experiments.bench.grpo_step --md /tmp/bench/grpo_step.md

Shapes (float32, dropless MoE, random init):
  w1         the W1 policy of PEERS.md (4 layers, d_model 256, 8 experts top-2, vocab 512), one
             update on 64 rows x 96 tokens (32 prompt + 64 response), every token real.
  reference  experiments/bench/model_step.py's REFERENCE model (d_model 512, vocab 259), 8 x 256,
             so the GRPO step's MFU can be set against that plain cross-entropy step.
The batch carries old_logp, ref_logp and token advantages; the step computes logits once, the
clipped surrogate (clip-higher 0.28), k3 KL at weight 0.04, entropy, router load-balancing and
z losses, the AdamW update with global-norm clipping and the non-finite guard. The reference
forward (make_logprob_fn) is timed too. MFU = model FLOPs/s over the float32 matmul peak measured
in the same run (best of before and after the timed steps); model FLOPs = 3 x forward FLOPs for
the step and 1 x for the logprob pass, forward FLOPs from model_step.forward_flops_per_token.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from experiments.bench import common
from experiments.bench.model_step import REFERENCE, active_params, forward_flops_per_token
from models.config import ModelConfig
from rl.logprobs import make_logprob_fn
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_train_step

W1 = dict(vocab_size=512, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512,
          n_experts=8, experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None,
          max_seq_len=128, dtype="float32", param_dtype="float32", tie_embeddings=False)
SHAPES = {"w1": (W1, 64, 96, 32), "reference": (None, 8, 256, 32)}  # (model, rows, seq, prompt_len)


def bench_shape(name: str, reps: int, quick: bool, microbatches: int = 1) -> dict:
    model, rows, seq, prompt_len = SHAPES[name]
    if quick:
        rows, seq = max(rows // 8, 2), min(seq, 64)
    cfg = ModelConfig(**(model or REFERENCE))
    loss_cfg = LossConfig(mode="grpo", clip_high=0.28, kl_kind="k3")
    optim = OptimConfig()
    hparams = {"lr": jax.numpy.float32(1e-5), "kl_coef": jax.numpy.float32(0.04)}
    state = init_train_state(cfg, loss_cfg, optim, jax.random.PRNGKey(0))
    step = make_train_step(cfg, loss_cfg, optim, microbatches=microbatches)
    logprob_fn = make_logprob_fn(cfg)
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, cfg.vocab_size, size=(rows, seq)).astype(np.int32)
    attn = np.ones((rows, seq), np.int32)
    loss_mask = attn.copy()
    loss_mask[:, :prompt_len] = 0
    ref = np.asarray(logprob_fn(state["params"], tokens, attn, 1.0))
    batch = {"tokens": tokens, "attn_mask": attn, "loss_mask": loss_mask, "ref_logp": ref,
             "old_logp": ref + 0.01 * rng.normal(size=ref.shape).astype(np.float32) * loss_mask,
             "advantages": np.repeat(rng.normal(size=(rows, 1)), seq, axis=1).astype(np.float32)}
    peak_before = common.matmul_peak_gflops()["peak_gflops"]

    t0 = time.perf_counter()
    state, m = common.block(step(state, batch, hparams))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        state, m = common.block(step(state, batch, hparams))
        times.append(time.perf_counter() - t0)
    lp_s, _ = common.time_call(logprob_fn, state["params"], tokens, attn, 1.0, reps=reps)
    peak_after = common.matmul_peak_gflops()["peak_gflops"]

    sec = statistics.median(times)
    n_tok = rows * seq
    fwd = n_tok * forward_flops_per_token(cfg, (seq + 1) / 2)
    peak = max(peak_before, peak_after)
    return dict(shape=name if microbatches == 1 else f"{name} ({microbatches} microbatches)", rows=rows, seq=seq, step_s=sec, all_step_s=times, compile_s=compile_s,
                tokens_per_s=n_tok / sec, step_gflops=3 * fwd / sec / 1e9, step_mfu=3 * fwd / sec / 1e9 / peak,
                logprob_s=lp_s, logprob_tokens_per_s=n_tok / lp_s, logprob_mfu=fwd / lp_s / 1e9 / peak,
                peak_gflops=peak, active_params=active_params(cfg), peak_rss_mib=common.peak_rss_mib(),
                loss=float(m["loss/total"]), kl=float(m["kl"]), router_aux=float(m["loss/router_aux"]),
                skipped=int(m["skipped"]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--microbatches", type=int, default=1, help="gradient-accumulation slices per step")
    ap.add_argument("--md", default=None, help="also append the Markdown table to this file")

    common.add_json_arg(ap)
    args = ap.parse_args(argv)

    results = [bench_shape(s, 2 if args.quick else args.reps, args.quick, args.microbatches) for s in args.shapes]
    rows = [[r["shape"], f"{r['rows']}x{r['seq']}", r["step_s"], r["tokens_per_s"], r["step_gflops"], r["step_mfu"],
             r["logprob_tokens_per_s"], r["logprob_mfu"], r["peak_gflops"], r["compile_s"], r["peak_rss_mib"]]
            for r in results]
    table = common.print_table(["shape", "batch", "step s", "step tok/s", "step GFLOP/s", "step MFU",
                                "logprob tok/s", "logprob MFU", "matmul peak GFLOP/s", "compile s", "peak RSS MiB"], rows)
    note = f"machine: {common.machine_info()}; median of {2 if args.quick else args.reps} timed steps"
    print(note)
    if args.md:
        with open(args.md, "a") as f:
            f.write(table + "\n" + note + "\n")
    common.write_json(args.json, {"shapes": results, "machine": common.machine_info()})
    return results


if __name__ == "__main__":
    main()
