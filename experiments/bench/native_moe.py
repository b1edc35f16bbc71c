"""The native CPU kernels (models/cpu/native_kernels.py) against XLA's ops, on W1's shapes, in one process.

    python -m experiments.bench.native_moe                      # ~1 min
    python -m experiments.bench.native_moe --json runs/bench/native_moe.json

Four tables, each arm interleaved with the others (arm A, arm B, arm A, arm B ...; best and median of --reps
calls):
  decode_loop  the sampler's loop as it meets the experts: --steps steps x 4 layers, each layer its own weights
               (4 x 12 MiB, more than a small VM's usable cache), 64 rows x top-2: native vs windowed
  forward      the expert FFN alone at 256 / 1,088 / 4,352 tokens (W1's prefill, a quarter and all of its
               grouped update's tokens): native vs windowed vs blocked
  fwd_bwd      value and gradient of sum(y^2) in x and the weights at 2,176 / 4,352 tokens (one of W1's two
               update microbatches, both): native vs blocked, with the largest relative difference of the gradients
  attention    the sampler's cached attention (models/layers.py dot_product_attention, T = 1) over --steps steps x
               4 layers, each layer its own [64, 2, 64, 96] keys and values: native kernel vs XLA's batched products
GFLOP/s count 2 x N x k x 3 x D x F per forward (3 x that for forward + backward, as the blocked path does it).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import common
from models import layers, moe_kernels
from models.cpu import native_kernels, windowed

E, D, F, K = 8, 256, 512, 2  # W1: 8 experts top-2, d_model 256, SwiGLU width 512


def expert_params(rng, layers: int):
    return [{n: jnp.asarray(rng.standard_normal(s, np.float32) * 0.05)
             for n, s in (("w_gate", (E, D, F)), ("w_up", (E, D, F)), ("w_down", (E, F, D)))} for _ in range(layers)]


def routing(rng, n: int):
    return (jnp.asarray(np.stack([rng.permutation(E)[:K] for _ in range(n)]).astype(np.int32)),
            jnp.ones((n, K), bool))


ARMS = {"native": native_kernels.expert_ffn,
        "windowed": lambda p, x, e, v: windowed.experts_windowed(p, x, e, v, None),
        "blocked": lambda p, x, e, v: moe_kernels.experts_blocked(p, x, e, v, None)}


def interleaved(fns: dict, args, reps: int) -> dict:
    """{arm: (best s, median s)}, the arms' calls alternating after one warm-up call each."""
    for f in fns.values():
        common.block(f(*args))
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, f in fns.items():
            t0 = time.perf_counter()
            common.block(f(*args))
            times[name].append(time.perf_counter() - t0)
    return {name: (min(t), float(np.median(t))) for name, t in times.items()}


def decode_loop(rng, steps: int, reps: int) -> list[dict]:
    layers = expert_params(rng, 4)
    experts, valid = routing(rng, 64)
    x = jnp.asarray(rng.standard_normal((64, D), np.float32))

    def loop(fn):
        def body(_, h):
            for p in layers:
                h = h + 0.01 * fn(p, h, experts, valid).sum(1)
            return h
        return jax.jit(lambda h: jax.lax.fori_loop(0, steps, body, h))

    res = interleaved({name: loop(ARMS[name]) for name in ("native", "windowed")}, (x,), reps)
    per = steps * len(layers)
    return [{"arm": name, "ms_per_layer_step": best / per * 1e3, "median_ms": med / per * 1e3}
            for name, (best, med) in res.items()]


def attention(rng, steps: int, reps: int) -> list[dict]:
    B, N, KV, H, S = 64, 4, 2, 64, 96  # W1: 64 rows, 4 query heads on 2 kv heads of 64, 32 + 64 cache slots
    caches = [(jnp.asarray(rng.standard_normal((B, KV, H, S), np.float32)),
               jnp.asarray(rng.standard_normal((B, KV, S, H), np.float32))) for _ in range(4)]
    mask = jnp.asarray(rng.random((B, 1, S)) < 0.8)
    q = jnp.asarray(rng.standard_normal((B, 1, N, H), np.float32))

    def loop(native: bool):
        def body(_, q):
            for k, v in caches:
                q = q + 0.01 * layers.dot_product_attention(q, k, v, mask, keys_slots_last=True, use_kernel=native)
            return q
        return jax.jit(lambda q: jax.lax.fori_loop(0, steps, body, q))

    fns = {"native": loop(True), "xla": loop(False)}
    res = interleaved(fns, (q,), reps)
    diff = float(jnp.abs(fns["native"](q) - fns["xla"](q)).max())
    per = steps * len(caches)
    return [{"arm": name, "ms_per_layer_step": best / per * 1e3, "median_ms": med / per * 1e3,
             "max_abs_diff_vs_xla": diff} for name, (best, med) in res.items()]


def forward(rng, sizes, reps: int) -> list[dict]:
    p = expert_params(rng, 1)[0]
    rows = []
    for n in sizes:
        x = jnp.asarray(rng.standard_normal((n, D), np.float32))
        experts, valid = routing(rng, n)
        res = interleaved({name: jax.jit(f) for name, f in ARMS.items()}, (p, x, experts, valid), reps)
        flops = 2 * n * K * 3 * D * F
        rows += [{"tokens": n, "arm": name, "ms": best * 1e3, "median_ms": med * 1e3, "gflops": flops / best / 1e9}
                 for name, (best, med) in res.items()]
    return rows


def fwd_bwd(rng, sizes, reps: int) -> list[dict]:
    p = expert_params(rng, 1)[0]
    rows = []
    for n in sizes:
        x = jnp.asarray(rng.standard_normal((n, D), np.float32))
        experts, valid = routing(rng, n)

        def grad_of(fn):
            return jax.jit(jax.grad(lambda p, x: jnp.sum(fn(p, x, experts, valid) ** 2), argnums=(0, 1)))

        fns = {name: grad_of(ARMS[name]) for name in ("native", "blocked")}
        res = interleaved(fns, (p, x), reps)
        a, b = (jax.tree.leaves(fns[name](p, x)) for name in ("native", "blocked"))
        diff = max(float(jnp.abs(u - v).max() / jnp.abs(v).max()) for u, v in zip(a, b))
        flops = 3 * 2 * n * K * 3 * D * F
        rows += [{"tokens": n, "arm": name, "ms": best * 1e3, "median_ms": med * 1e3, "gflops": flops / best / 1e9,
                  "max_rel_diff_vs_blocked": diff} for name, (best, med) in res.items()]
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=64, help="decode steps of the decode_loop table")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="smoke run: small sizes, 2 reps")
    common.add_json_arg(ap)
    args = ap.parse_args(argv)
    if not native_kernels.available():
        raise SystemExit("the native CPU kernels could not be built here (see the warning); nothing to compare")
    rng = np.random.default_rng(0)
    reps = 2 if args.quick else args.reps
    steps = 4 if args.quick else args.steps
    out = {"decode_loop": decode_loop(rng, steps, reps),
           "attention": attention(rng, steps, reps),
           "forward": forward(rng, (64,) if args.quick else (256, 1088, 4352), reps),
           "fwd_bwd": fwd_bwd(rng, (128,) if args.quick else (2176, 4352), reps),
           "matmul_peak": common.matmul_peak_gflops(sizes=(512,) if args.quick else (1024, 2048)),
           "machine": common.machine_info()}
    print(f"decode loop ({steps} steps x 4 layers, 64 rows): ms per layer-step, best / median")
    for r in out["decode_loop"]:
        print(f"  {r['arm']:9s} {r['ms_per_layer_step']:.3f} / {r['median_ms']:.3f}")
    print(f"decode attention ({steps} steps x 4 layers, [64, 2, 64, 96] cache): ms per layer-step, best / median")
    for r in out["attention"]:
        print(f"  {r['arm']:9s} {r['ms_per_layer_step']:.3f} / {r['median_ms']:.3f}  max abs diff {r['max_abs_diff_vs_xla']:.1e}")
    for table in ("forward", "fwd_bwd"):
        print(f"{table}: ms best / median, GFLOP/s")
        for r in out[table]:
            extra = f"  max rel diff {r['max_rel_diff_vs_blocked']:.1e}" if "max_rel_diff_vs_blocked" in r else ""
            print(f"  {r['tokens']:5d} {r['arm']:9s} {r['ms']:8.2f} / {r['median_ms']:8.2f}  {r['gflops']:6.0f}{extra}")
    print(f"matmul peak (same run): {out['matmul_peak']}")
    common.write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
