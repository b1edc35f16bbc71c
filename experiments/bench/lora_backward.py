"""The LoRA train step of smollm2_grpo.py: the low-rank term as 2-D products against einsums over the weights' dims.

    python -m experiments.bench.lora_backward --json /tmp/bench/lora_backward.json    # ~3 min on 2 cores; make pretrained
    python -m experiments.bench.lora_backward --model FOLDER --reps 1                  # smoke run on a tiny checkpoint

models/layers.project computes a LoRA target's low-rank term s (x A) B as 2-D products ([tokens, in] x [in, r] x
[r, out], x and the adapters reshaped). The peer is the formulation before it (until 0eac9bc): einsums over the
weights' own dims ("BTD,DNH->BTNH" and so on), whose backward made XLA's CPU backend form dB from the [tokens, out]
output gradient transposed, a strided copy per target and layer (jax.profiler: ~1 s of a 7 s step). Both steps are the recipe's GRPO step
(recipe_compile.train_step_program's settings: LoRA rank 16 on the 7 attention and MLP projections, clip 0.2 / 0.28,
k3 KL, chunked logits) on one group of 8 answers (a 96-token prompt, 128 answer tokens) of SmolLM2-135M-Instruct in
float32, compiled in this process, then timed alternately (ours, the peer, --reps times), so both see the same load.
Reported: the median seconds per step of each, their ratio, and the largest difference between the two steps' new
adapters after the first step (float rounding: the same products, summed in another order).
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


def einsum_project(spec: str, x, w):
    """layers.project as it was before the 2-D products: the low-rank term as einsums over the weights' dims."""
    if not isinstance(w, layers.LowRank):
        return jnp.einsum(spec, x, w.astype(x.dtype))
    ins, rest = spec.split(",")
    w_dims, out = rest.split("->")
    contracted = "".join(d for d in w_dims if d in ins)
    kept = "".join(d for d in ins if d not in contracted)
    f32 = jnp.float32
    xa = jnp.einsum(f"{ins},{contracted}R->{kept}R", x.astype(f32), w.a.astype(f32))
    update = jnp.einsum(f"{kept}R,R{w_dims[len(contracted):]}->{out}", xa, w.b.astype(f32))
    base = jnp.einsum(spec, x, w.w.astype(x.dtype), preferred_element_type=f32)
    return (base + update * jnp.asarray(w.scale, f32)).astype(x.dtype)


def build(cfg, base, project):
    """(step function, its first state) with `project` as layers.project; the step is traced (and compiled) here,
    while layers.project is `project`."""
    current = layers.project
    layers.project = project
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
        layers.project = current
    return (lambda s: step(s, batch, hp, base)[0]), state


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=MODEL, help="a pretrained name, a .gguf file or a Hugging Face folder")
    ap.add_argument("--reps", type=int, default=3)
    common.add_json_arg(ap)
    args = ap.parse_args(argv)
    cfg, base = hf.load(resolve_model(args.model), dtype="float32")
    cfg = cfg.replace(logits_chunk=32, remat=False, scan_layers=True, lora=dict(LORA))
    sides = {"2-D products": build(cfg, base, layers.project), "einsums": build(cfg, base, einsum_project)}
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
    ratio = med["2-D products"] / med["einsums"]
    common.print_table(["low-rank term", "step s (median)", "every step s"],
                       [[k, round(med[k], 2), ", ".join(f"{t:.2f}" for t in times[k])] for k in sides])
    print(f"2-D products / einsums: {ratio:.3f}; largest adapter difference after one step {diff:.2e}")
    res = {"seconds": times, "median_s": med, "ratio": ratio, "adapter_max_abs_diff": diff,
           "machine": common.machine_info(), "jax": jax.__version__}
    common.write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
