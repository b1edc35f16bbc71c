"""The LoRA train step of smollm2_grpo.py with the low-rank backward written out against JAX's own rule, one run.

    python -m experiments.bench.lora_backward --json /tmp/bench/lora_backward.json    # ~3 min on 2 cores; make pretrained
    python -m experiments.bench.lora_backward --model FOLDER --reps 1                  # smoke run on a tiny checkpoint

models/layers.py computes a LoRA target's low-rank term s (x A) B through `low_rank_update`, a custom_vjp whose
backward is three plain products (dxA = dY B^T, dA = x^T dxA, dB = (xA)^T dY). The peer is the same chain with
JAX's own transpose rule (`(x @ a) @ b` differentiated by JAX), from which XLA's CPU backend formed dB from the
[tokens, out] output gradient transposed: a strided copy per target and layer. Both steps are the recipe's GRPO step
(recipe_compile.train_step_program's settings: LoRA rank 16 on the 7 attention and MLP projections, clip 0.2 / 0.28,
k3 KL, chunked logits) on one group of 8 answers (a 96-token prompt, 128 answer tokens) of SmolLM2-135M-Instruct in
float32, compiled in this process, then timed alternately (ours, the peer, --reps times), so both see the same load.
Reported: the median seconds per step of each, their ratio, and the largest difference between the two steps' new
adapters after the first step (float rounding: the products are the same, their order differs).
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from experiments.bench import common
from experiments.bench.recipe_compile import LORA, MODEL, grouped_batch
from experiments.eval import resolve_model
from models import hf, layers, lora
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_train_step


def jax_rule(x_MI, a_IR, b_RO):
    """The low-rank chain without a custom backward: JAX's transpose rule decides the products."""
    return (x_MI @ a_IR) @ b_RO


def build(cfg, base, chain):
    """(step function, its first state) with `chain` as the low-rank term; the step is traced (and compiled) here,
    while layers.low_rank_update is `chain`."""
    written_out = layers.low_rank_update
    layers.low_rank_update = chain
    try:
        loss = LossConfig(mode="grpo", kl_kind="k3", clip_low=0.2, clip_high=0.28)
        optim = OptimConfig(grad_clip=1.0)
        adapters = lora.init(base, cfg, jax.random.key(1))
        adapters = jax.tree.map(lambda x: x + 0.01, adapters)  # B != 0: every gradient is non-trivial
        state = init_train_state(cfg, loss, optim, jax.random.key(0), params={"lora": adapters})
        step = make_train_step(cfg, loss, optim)
        batch, hp = grouped_batch(1, cfg.vocab_size), {"lr": jnp.float32(1e-5), "kl_coef": jnp.float32(0.01)}
        state, _ = step(state, batch, hp, base)  # compiles; the state is donated, so each side keeps its own
        common.block(state)
    finally:
        layers.low_rank_update = written_out
    return (lambda s: step(s, batch, hp, base)[0]), state


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL, help="a pretrained name, a .gguf file or a Hugging Face folder")
    ap.add_argument("--reps", type=int, default=3)
    common.add_json_arg(ap)
    args = ap.parse_args(argv)
    cfg, base = hf.load(resolve_model(args.model), dtype="float32")
    cfg = cfg.replace(logits_chunk=32, remat=False, scan_layers=True, lora=dict(LORA))
    sides = {"written out": build(cfg, base, layers.low_rank_update), "JAX's rule": build(cfg, base, jax_rule)}
    first = {k: jax.tree.leaves(s[1]["params"]) for k, s in sides.items()}
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(*first.values()))
    states = {k: s[1] for k, s in sides.items()}
    times = {k: [] for k in sides}
    for _ in range(args.reps):
        for k, (fn, _) in sides.items():
            t0 = time.perf_counter()
            states[k] = fn(states[k])
            common.block(states[k])
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["written out"] / med["JAX's rule"]
    common.print_table(["low-rank backward", "step s (median)", "every step s"],
                       [[k, round(med[k], 2), ", ".join(f"{t:.2f}" for t in times[k])] for k in sides])
    print(f"written out / JAX's rule: {ratio:.3f}; largest adapter difference after one step {diff:.2e}")
    res = {"seconds": times, "median_s": med, "ratio": ratio, "adapter_max_abs_diff": diff,
           "machine": common.machine_info(), "jax": jax.__version__}
    common.write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
