"""Where W1's model time goes on CPU: fwd+bwd of the W1 policy and of its MoE layer alone, per MoE variant.

    python -m experiments.bench.profile_w1                      # all parts, current models/moe.py
    python -m experiments.bench.profile_w1 --parts model moe    # subset
    python -m experiments.bench.profile_w1 --block 64           # blocked MoE with a given row block
    python -m experiments.bench.profile_w1 --parts bandwidth decode_moe   # is the decode MoE bound by weight reads?
    python -m experiments.bench.profile_w1 --parts decode_loop            # the MoE layers as the sampler's loop runs them

Each part is a jitted jax.value_and_grad of a scalar loss (mean log-softmax of the logits for the model; sum of
squares for the MoE layer) on W1 shapes: a [rows, 96] batch (default 16 rows = one of the 4 update microbatches of
experiments/bench/w1.py). Reports the median wall and process-CPU seconds per call, and GFLOP per CPU-second against
the float32 matmul's GFLOP per CPU-second measured in the same run (a load-independent MFU: on this shared machine
wall seconds are inflated by other jobs, CPU seconds much less so). "dense" replaces the MoE layer by a dense SwiGLU
of the same active width (k x F), the floor any dispatch scheme can reach.

"bandwidth" and "decode_moe" ask whether sampling is bound by reading expert weights: the machine's read bandwidth
(a jitted sum over a 64 MiB array, and NumPy's), one MoE layer's forward at W1's decode shape (64 rows x 1 token,
top-2 of 8 experts: every expert is used, so all its weights are read once per step), and as a peer in the same run
the same routed rows through per-expert NumPy matmuls (BLAS). Each gives the weight bytes read per second; the
bandwidth is the floor's denominator: all experts' bytes / bandwidth is the least one decode step's MoE can take.

"decode_loop" runs the model's MoE layers the way the sampler's while loop meets them: --decode_steps steps, each
through every MoE layer with its own weights (W1: 4 x 12 MiB, more than a small VM's last-level cache, so each
layer's weights come from memory), against the same loop with the first layer's weights in every layer (12 MiB,
cache-resident), and the per-expert NumPy peer over the same cycled weights. The gap between the first two is what
the single-layer "decode_moe" figure does not show.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import common
from experiments.bench.model_step import forward_flops_per_token
from experiments.bench.w1 import W1_MODEL
from models import layer_stack, moe, transformer
from models.layers import swiglu
from models.config import ModelConfig

SEQ = 96


def timed(fn, *args, reps: int):
    common.block(fn(*args))
    walls, cpus = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        common.block(fn(*args))
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def read_bandwidth_gbs(mib: int = 64, reps: int = 5) -> dict:
    """Best GB/s of reading a float32 array of `mib` MiB: a jitted jnp.sum and NumPy's sum."""
    a_np = np.ones(mib * 2**20 // 4, np.float32)
    a = jnp.asarray(a_np)
    best = {}
    for name, fn, arr in (("jax", jax.jit(jnp.sum), a), ("numpy", np.sum, a_np)):
        best[name] = a_np.nbytes / min(common.time_call(fn, arr, reps=reps)[1]) / 1e9
    return best


def numpy_experts(p_np, x_ND, experts_NK, weights_NK):
    """The same routed SwiGLU experts with one BLAS matmul per expert and projection (the peer)."""
    y = np.zeros_like(x_ND)
    for e in range(p_np["w_gate"].shape[0]):
        tok, slot = np.nonzero(experts_NK == e)
        if tok.size == 0:
            continue
        xe = x_ND[tok]
        g, u = xe @ p_np["w_gate"][e], xe @ p_np["w_up"][e]
        h = g / (1.0 + np.exp(-g)) * u
        y[tok] += (h @ p_np["w_down"][e]) * weights_NK[tok, slot, None]
    return y


def weight_read_table(params, cfg, parts, reps, moe_layer) -> dict:
    """The "bandwidth" / "decode_moe" parts: weight bytes read per second of one decode step's MoE layer, ours
    against per-expert NumPy matmuls on the same rows, and the floor set by the machine's read bandwidth."""
    if "bandwidth" not in parts and "decode_moe" not in parts:
        return {}
    out = {"read_gb_s": read_bandwidth_gbs()}
    print(f"read bandwidth: jax {out['read_gb_s']['jax']:.1f} GB/s, numpy {out['read_gb_s']['numpy']:.1f} GB/s")
    if "decode_moe" not in parts:
        return out
    p = layer_stack.per_layer(params, cfg)["block_0"]["moe"]
    x = jax.random.normal(jax.random.PRNGKey(4), (64, 1, cfg.d_model), jnp.float32)
    expert_bytes = sum(p[k].size * p[k].dtype.itemsize for k in ("w_gate", "w_up", "w_down"))
    fwd = jax.jit(lambda p, x: moe_layer(p, x, cfg)[0])
    ours_s, _ = timed(fwd, p, x, reps=reps * 20)
    _, weights_NK, experts_NK = moe.route(p["router"], x[:, 0], cfg.experts_per_token, cfg.norm_topk_prob)
    weights_NK, experts_NK = np.asarray(weights_NK), np.asarray(experts_NK)
    p_np = {k: np.asarray(p[k]) for k in ("w_gate", "w_up", "w_down")}
    x_np = np.asarray(x[:, 0])
    np.testing.assert_allclose(numpy_experts(p_np, x_np, experts_NK, weights_NK), np.asarray(fwd(p, x))[:, 0],
                               rtol=2e-3, atol=2e-4)  # same computation: the comparison is fair
    numpy_s, _ = common.time_call(numpy_experts, p_np, x_np, experts_NK, weights_NK, reps=reps * 20)
    bandwidth = max(out["read_gb_s"].values())
    floor_s = expert_bytes / (bandwidth * 1e9)
    out.update(expert_mib=expert_bytes / 2**20, experts_used=int(len(np.unique(experts_NK))), ours_s=ours_s,
               numpy_s=numpy_s, floor_s=floor_s, ours_gb_s=expert_bytes / ours_s / 1e9,
               numpy_gb_s=expert_bytes / numpy_s / 1e9, ours_over_numpy=ours_s / numpy_s, ours_over_floor=ours_s / floor_s)
    common.print_table(
        ["one decode step's MoE layer (64 rows, top-2 of 8)", "ms", "expert weights GB/s", "x the floor"],
        [["ours (jitted moe_layer forward)", ours_s * 1e3, out["ours_gb_s"], out["ours_over_floor"]],
         ["per-expert NumPy matmuls, same rows (peer)", numpy_s * 1e3, out["numpy_gb_s"], numpy_s / floor_s],
         [f"floor: {out['expert_mib']:.1f} MiB at the read bandwidth", floor_s * 1e3, bandwidth, 1.0]])
    print(f"experts used {out['experts_used']} of {cfg.n_experts}; ours / NumPy {out['ours_over_numpy']:.2f}x")
    return out


def _numpy_route(w_router, x_ND, k: int, norm_topk_prob: bool):
    """NumPy top-k routing (the peer's): weights [N, k] and expert ids [N, k], as moe.route computes them."""
    logits = x_ND @ w_router
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    experts = np.argsort(-probs, axis=1)[:, :k]
    weights = np.take_along_axis(probs, experts, axis=1)
    return (weights / weights.sum(axis=1, keepdims=True) if norm_topk_prob else weights), experts


def decode_loop_table(params, cfg, parts, reps, moe_layer, steps: int) -> dict:
    """The "decode_loop" part: ms per MoE layer and decode step with each layer's own weights (cycled), with one
    layer's weights everywhere (cached), and the NumPy peer on the cycled weights; all at 64 rows x 1 token."""
    if "decode_loop" not in parts:
        return {}
    blocks = layer_stack.per_layer(params, cfg)
    moes = [blocks[f"block_{i}"]["moe"] for i in range(cfg.n_layers) if "moe" in blocks[f"block_{i}"]]
    n = len(moes)
    x0 = jax.random.normal(jax.random.PRNGKey(5), (64, 1, cfg.d_model), jnp.float32)

    def loop(layers, x):
        def body(_, x):
            for p in layers:  # tanh keeps the chained activations bounded; the chain keeps XLA from hoisting a layer
                x = jnp.tanh(x + moe_layer(p, x, cfg)[0])
            return x
        return jax.lax.fori_loop(0, steps, body, x)

    run = jax.jit(loop)
    cycled_s, _ = timed(run, moes, x0, reps=reps)
    cached_s, _ = timed(run, [moes[0]] * n, x0, reps=reps)
    names = ("router", "w_gate", "w_up", "w_down")
    moes_np = [{k: np.asarray(p[k]) for k in names} for p in moes]

    def numpy_loop(x_ND):
        for _ in range(steps):
            for p in moes_np:
                w, e = _numpy_route(p["router"], x_ND, cfg.experts_per_token, cfg.norm_topk_prob)
                x_ND = np.tanh(x_ND + numpy_experts(p, x_ND, e, w))
        return x_ND

    x_np = np.asarray(x0[:, 0])
    w, e = _numpy_route(moes_np[0]["router"], x_np, cfg.experts_per_token, cfg.norm_topk_prob)
    np.testing.assert_allclose(numpy_experts(moes_np[0], x_np, e, w), np.asarray(moe_layer(moes[0], x0, cfg)[0])[:, 0],
                               rtol=2e-3, atol=2e-4)  # the peer routes and computes as our layer does
    numpy_s, _ = common.time_call(numpy_loop, x_np, reps=reps)
    per = lambda s: s / (steps * n) * 1e3  # ms per layer and step
    layer_bytes = sum(moes[0][k].size * moes[0][k].dtype.itemsize for k in names[1:])
    layer_mib = layer_bytes / 2**20
    out = {"steps": steps, "moe_layers": n, "layer_weight_mib": layer_mib, "cycled_ms": per(cycled_s),
           "cached_ms": per(cached_s), "numpy_cycled_ms": per(numpy_s),
           "cycled_over_cached": cycled_s / cached_s, "cycled_over_numpy": cycled_s / numpy_s}
    gbs = lambda ms: layer_bytes / (ms * 1e-3) / 1e9  # expert weight bytes read per second
    common.print_table(
        [f"decode loop: {steps} steps x {n} MoE layers, 64 rows", "ms per layer-step", "expert weights GB/s"],
        [[f"ours, each layer's own weights ({n} x {layer_mib:.0f} MiB)", out["cycled_ms"], gbs(out["cycled_ms"])],
         [f"ours, layer 0's weights in every layer ({layer_mib:.0f} MiB)", out["cached_ms"], gbs(out["cached_ms"])],
         ["per-expert NumPy matmuls, own weights (peer)", out["numpy_cycled_ms"], gbs(out["numpy_cycled_ms"])]])
    print(f"cycled / cached {out['cycled_over_cached']:.2f}x; ours / NumPy (cycled) {out['cycled_over_numpy']:.2f}x")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--block", type=int, default=None, help="row block of the blocked MoE (default: its heuristic)")
    ap.add_argument("--impl", default="auto")
    ap.add_argument("--parts", nargs="*",
                    default=["model", "moe", "dense", "decode", "bandwidth", "decode_moe", "decode_loop"])
    ap.add_argument("--decode_steps", type=int, default=64, help="decode steps of the decode_loop part")
    common.add_json_arg(ap)
    args = ap.parse_args(argv)
    cfg = ModelConfig(**W1_MODEL)
    params = transformer.init(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (args.rows, SEQ), 3, cfg.vocab_size, jnp.int32)
    n_tok = args.rows * SEQ
    # Only the MFU parts need the matmul peak (a few seconds to measure); the weight-read parts have their own floor.
    peak = common.matmul_peak_gflops() if {"model", "moe", "dense", "decode"} & set(args.parts) else None
    rows = []
    if args.block or args.impl != "auto":
        orig = moe.moe_layer
        moe_layer = lambda p, x, c, **kw: orig(p, x, c, impl=args.impl, block_size=args.block, **kw)
        transformer.moe_layer = moe_layer
    else:
        moe_layer = moe.moe_layer

    if "model" in args.parts:
        def loss(p):
            logits, aux = transformer.forward(p, tokens, cfg)
            return jnp.mean(jax.nn.log_softmax(logits)) + aux["router_aux_loss"].sum()
        f = jax.jit(jax.value_and_grad(loss))
        w, c = timed(f, params, reps=args.reps)
        flops = 3 * n_tok * forward_flops_per_token(cfg, (SEQ + 1) / 2)
        rows.append(["model fwd+bwd", w, c, flops / 1e9, flops / c / 1e9 / peak["peak_gflops_per_cpu_s"]])
        fwd = jax.jit(lambda p: transformer.forward(p, tokens, cfg)[0])
        w, c = timed(fwd, params, reps=args.reps)
        rows.append(["model fwd", w, c, flops / 3e9, flops / 3 / c / 1e9 / peak["peak_gflops_per_cpu_s"]])
    x = jax.random.normal(jax.random.PRNGKey(2), (args.rows, SEQ, cfg.d_model), jnp.float32)
    moe_flops = 3 * n_tok * 2 * 3 * cfg.d_model * cfg.expert_ff * cfg.experts_per_token
    if "moe" in args.parts:
        p = layer_stack.per_layer(params, cfg)["block_0"]["moe"]
        f = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(moe_layer(p, x, cfg)[0] ** 2), argnums=(0, 1)))
        w, c = timed(f, p, x, reps=args.reps)
        rows.append(["1 MoE layer fwd+bwd", w, c, moe_flops / 1e9, moe_flops / c / 1e9 / peak["peak_gflops_per_cpu_s"]])
    if "dense" in args.parts:
        F = cfg.expert_ff * cfg.experts_per_token
        k = jax.random.split(jax.random.PRNGKey(3), 3)
        pd = {"w_gate": jax.random.normal(k[0], (cfg.d_model, F)) * 0.05,
              "w_up": jax.random.normal(k[1], (cfg.d_model, F)) * 0.05,
              "w_down": jax.random.normal(k[2], (F, cfg.d_model)) * 0.05}
        f = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(swiglu(p, x) ** 2), argnums=(0, 1)))
        w, c = timed(f, pd, x, reps=args.reps)
        rows.append(["dense SwiGLU (k*F) fwd+bwd", w, c, moe_flops / 1e9,
                     moe_flops / c / 1e9 / peak["peak_gflops_per_cpu_s"]])
    if "decode" in args.parts:
        B, L = 64, 128
        cache = transformer.init_cache(cfg, B, L)
        tok = jnp.full((B, 1), 5, jnp.int32)
        valid = jnp.ones((B, L), bool)
        step = jax.jit(lambda p, c, i: transformer.forward(p, tok, cfg, cache=c, cache_index=i, kv_valid=valid))
        w, c = timed(step, params, cache, jnp.int32(60), reps=args.reps * 4)
        flops = B * forward_flops_per_token(cfg, 61)
        rows.append(["decode step B=64 (1 token)", w, c, flops / 1e9, flops / c / 1e9 / peak["peak_gflops_per_cpu_s"]])
    if rows:
        common.print_table(["part", "wall s", "CPU s", "GFLOP", "MFU per CPU-s"], rows)
    weights = weight_read_table(params, cfg, args.parts, args.reps, moe_layer)
    decode_loop = decode_loop_table(params, cfg, args.parts, args.reps, moe_layer, args.decode_steps)
    common.write_json(args.json, {"parts": {r[0]: dict(zip(("wall_s", "cpu_s", "gflop", "mfu_per_cpu_s"), r[1:]))
                                            for r in rows}, "matmul_peak": peak, "rows": args.rows,
                                  "weight_reads": weights, "decode_loop": decode_loop, "machine": common.machine_info()})
    peak_text = f"matmul peak {peak['peak_gflops']:.0f} GFLOP/s wall, {peak['peak_gflops_per_cpu_s']:.0f} GFLOP/CPU-s; " if peak else ""
    print(f"{peak_text}"
          f"rows {args.rows} x {SEQ}; block {args.block}; impl {args.impl}; load {common.machine_info()['loadavg']}")


if __name__ == "__main__":
    main()
