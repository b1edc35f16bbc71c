"""Model step benchmark: train-step MFU and KV-cache decoding vs recomputing the prefix.

    python -m experiments.bench.model_step            # full run (several minutes on 2 cores)
    python -m experiments.bench.model_step --quick    # smoke run
    python -m experiments.bench.model_step --md /tmp/bench/model_step.md   # also write Markdown

Reference config (REFERENCE below): byte vocabulary 259, d_model 512, 4 layers, every block
MoE with 8 experts top-2 (SwiGLU expert width d_ff 1024, no shared expert), 8 heads of 64
with 4 KV heads, untied embeddings, float32, sequence 256.

Phases, each in its own subprocess so its peak resident memory (ru_maxrss) is its own:
  train      jitted jax.value_and_grad of next-token cross-entropy (+ router losses) and an
             SGD update, batch TRAIN_BATCH x 256. Run twice: dropless MoE (ragged_dot) and
             capacity-factor MoE (capacity 1.25, dense per-expert einsums). MFU = model
             FLOPs/s / the float32 matmul peak measured in the same subprocess (best of a
             measurement before and after the timed steps: load lowers MFU, never raises it).
             Model FLOPs = 3 x forward; forward = 2 x active matmul weights per token
             (attention projections, router, top-2 experts, unembedding) + causal attention
             (2 x 2 x T_ctx x n_heads x head_dim, T_ctx = mean causal context).
  decode     models.sampling.generate, batch 64, prompt 32, 256 new tokens, temperature 1,
             EOS disabled (eos_id=-1) so every row decodes all 256 tokens.
  recompute  naive baseline: each new token is a full uncached forward over the whole prefix
             (prompt + tokens so far), same batch. One step is timed at the first, middle and
             last prefix lengths; a quadratic a + bL + cL^2 (linear layers + attention) through
             those three points gives every step's time, summed over all 256 steps (stated in the
             output): running all 256 exact-length steps would take about an hour here.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import common
from models import flops, sampling, transformer
from models.config import ModelConfig

REFERENCE = dict(
    vocab_size=259, d_model=512, n_layers=4, n_heads=8, n_kv_heads=4, head_dim=64, d_ff=1024,
    n_experts=8, experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None,
    max_seq_len=512, dtype="float32", param_dtype="float32", tie_embeddings=False,
)
SEQ = 256
TRAIN_BATCH = 8
DECODE_BATCH, PROMPT_LEN, NEW_TOKENS = 64, 32, 256
CAPACITY = 1.25
QUICK = dict(train_batch=2, train_reps=2, decode_batch=8, new_tokens=32, recompute_points=3)
FULL = dict(train_batch=TRAIN_BATCH, train_reps=3, decode_batch=DECODE_BATCH, new_tokens=NEW_TOKENS,
            recompute_points=3)


# ----------------------------------------------------------------------------------------
# FLOP accounting
# ----------------------------------------------------------------------------------------
def forward_flops_per_token(cfg, context: float) -> float:
    """Model FLOPs of one token's forward pass attending to `context` keys, LM head included (models.flops, the one
    convention: 2 x matmul weights, embedding lookup free, q.k and p.v per key)."""
    return flops.forward_flops(cfg, 1.0, context)


def active_params(cfg) -> int:
    """Matmul weights touched per token, LM head included; not the embedding table (a lookup) nor norms."""
    return int(flops.body_weights(cfg) + flops.head_weights(cfg))


# ----------------------------------------------------------------------------------------
# Phases (run in subprocesses)
# ----------------------------------------------------------------------------------------
def _setup(capacity_factor=None):
    cfg = ModelConfig(**{**REFERENCE, "capacity_factor": capacity_factor})
    params = jax.block_until_ready(transformer.init(cfg, jax.random.PRNGKey(0)))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    return cfg, params, n_params


def phase_train(opts, capacity_factor):
    cfg, params, n_params = _setup(capacity_factor)
    rss_after_init = common.current_rss_mib()
    peak_before = common.matmul_peak_gflops()
    batch = opts["train_batch"]
    tokens = jax.random.randint(jax.random.PRNGKey(1), (batch, SEQ + 1), 3, cfg.vocab_size, jnp.int32)

    def loss_fn(p, tokens):
        logits, aux = transformer.forward(p, tokens[:, :-1], cfg)
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()
        router = cfg.router_aux_coef * aux["router_aux_loss"].sum() + cfg.router_z_coef * aux["router_z_loss"].sum()
        return nll + router, aux["dropped_fraction"]

    @jax.jit
    def step(p, tokens):
        (loss, dropped), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, tokens)
        return jax.tree.map(lambda w, g: w - 1e-3 * g, p, grads), loss, dropped

    t0 = time.perf_counter()
    params, loss, dropped = common.block(step(params, tokens))
    compile_s = time.perf_counter() - t0
    times = []
    cpu0 = time.process_time()
    for _ in range(opts["train_reps"]):
        t0 = time.perf_counter()
        params, loss, dropped = common.block(step(params, tokens))
        times.append(time.perf_counter() - t0)
    cpu_per_step = (time.process_time() - cpu0) / opts["train_reps"]
    peak_after = common.matmul_peak_gflops()
    sec = sorted(times)[len(times) // 2]
    n_tok = batch * SEQ
    step_flops = flops.train_flops(cfg, n_tok, batch * SEQ * (SEQ + 1) / 2)  # models/flops.py: causal, 3 x forward
    peak = max(peak_before["peak_gflops"], peak_after["peak_gflops"])
    peak_cpu = max(peak_before["peak_gflops_per_cpu_s"], peak_after["peak_gflops_per_cpu_s"])
    return dict(
        phase=f"train ({'dropless' if capacity_factor is None else f'capacity {capacity_factor}'})",
        tokens=n_tok, seconds=sec, all_seconds=times, compile_s=compile_s, tokens_per_s=n_tok / sec,
        model_gflops_per_s=step_flops / sec / 1e9, peak_gflops=peak, peak_before=peak_before["peak_gflops"],
        peak_after=peak_after["peak_gflops"], mfu=step_flops / sec / 1e9 / peak, loss=float(loss),
        mfu_cpu=step_flops / cpu_per_step / 1e9 / peak_cpu,
        dropped_fraction=float(jnp.mean(dropped)), n_params=int(n_params), active_params=active_params(cfg),
        cpu_s=cpu_per_step,
        rss_after_init_mib=rss_after_init, peak_rss_mib=common.peak_rss_mib(),
    )


def phase_decode(opts):
    cfg, params, n_params = _setup()
    rss_after_init = common.current_rss_mib()
    b, n = opts["decode_batch"], opts["new_tokens"]
    prompts = jax.random.randint(jax.random.PRNGKey(2), (b, PROMPT_LEN), 3, cfg.vocab_size, jnp.int32)
    run = lambda key: sampling.generate(params, cfg, prompts, key, max_new_tokens=n, temperature=1.0, eos_id=-1)
    t0 = time.perf_counter()
    out = common.block(run(jax.random.PRNGKey(0)))
    compile_s = time.perf_counter() - t0
    times = []
    cpu0 = time.process_time()
    for i in range(2):
        t0 = time.perf_counter()
        out = common.block(run(jax.random.PRNGKey(i + 1)))
        times.append(time.perf_counter() - t0)
    cpu_s = (time.process_time() - cpu0) / 2
    assert int(out.lengths.min()) == n, "every row must decode all tokens"
    sec = min(times)
    return dict(phase="decode, KV cache", batch=b, new_tokens=n, seconds=sec, all_seconds=times,
                compile_plus_first_s=compile_s, tokens_per_s=b * n / sec, cpu_s=cpu_s,
                rss_after_init_mib=rss_after_init, peak_rss_mib=common.peak_rss_mib())


def phase_recompute(opts):
    """Naive decoding: token t costs one uncached forward over the PROMPT_LEN + t prefix."""
    cfg, params, n_params = _setup()
    rss_after_init = common.current_rss_mib()
    b, n = opts["decode_batch"], opts["new_tokens"]

    @jax.jit
    def naive_step(params, seq, key):
        logits, _ = transformer.forward(params, seq, cfg)
        tok, logp = sampling.choose_tokens(logits[:, -1], jax.random.split(key, seq.shape[0]),
                                           jnp.float32(1.0), jnp.float32(1.0), 0)
        return jnp.concatenate([seq, tok[:, None]], axis=1), logp

    # Prefix lengths to time: first, last and middle of the run. Each is compiled first, then timed once.
    lengths = np.unique(np.linspace(PROMPT_LEN, PROMPT_LEN + n - 1, opts["recompute_points"]).round().astype(int))
    measured, measured_cpu = {}, {}
    for length in lengths:
        seq = jax.random.randint(jax.random.PRNGKey(3), (b, int(length)), 3, cfg.vocab_size, jnp.int32)
        compiled = naive_step.lower(params, seq, jax.random.PRNGKey(4)).compile()
        cpu0 = time.process_time()
        sec, _ = common.time_call(compiled, params, seq, jax.random.PRNGKey(4), reps=1, warmup=0)
        measured[int(length)] = sec
        measured_cpu[int(length)] = time.process_time() - cpu0
    xs = np.array(sorted(measured), dtype=np.float64)
    ys = np.array([measured[int(x)] for x in xs])
    steps = np.arange(PROMPT_LEN, PROMPT_LEN + n, dtype=np.float64)  # prefix length when generating token t
    # cost(L) = a + b L + c L^2 (linear layers + attention) through the measured points; linear if only two.
    coeffs = np.polyfit(xs, ys, deg=min(2, len(xs) - 1))
    total = float(np.polyval(coeffs, steps).sum())
    ys_cpu = np.array([measured_cpu[int(x)] for x in xs])
    total_cpu = float(np.polyval(np.polyfit(xs, ys_cpu, deg=min(2, len(xs) - 1)), steps).sum())
    return dict(phase="decode, recompute prefix (extrapolated)", batch=b, new_tokens=n, seconds=total,
                tokens_per_s=b * n / total, cpu_s=total_cpu, measured_step_seconds={str(k): v for k, v in measured.items()},
                rss_after_init_mib=rss_after_init, peak_rss_mib=common.peak_rss_mib())


# ----------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------
def _run_phase_subprocess(name: str, quick: bool) -> dict:
    cmd = [sys.executable, "-m", "experiments.bench.model_step", "--phase", name] + (["--quick"] if quick else [])
    print(f"[model_step] running {name} ...", file=sys.stderr, flush=True)
    return common.run_phase(cmd, f"phase {name}")


def _run_phase(name: str, quick: bool) -> dict:
    opts = QUICK if quick else FULL
    if name == "train_dropless":
        return phase_train(opts, None)
    if name == "train_capacity":
        return phase_train(opts, CAPACITY)
    if name == "decode":
        return phase_decode(opts)
    if name == "recompute":
        return phase_recompute(opts)
    raise ValueError(f"--phase: unknown phase {name!r}")


PHASES = ("train_dropless", "train_capacity", "decode", "recompute")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small batches / few tokens: a smoke run")
    ap.add_argument("--phase", choices=PHASES, help="run one phase in this process and print its JSON")
    ap.add_argument("--md", help="also write the Markdown report to this path")
    ap.add_argument("--json", default=None, help="also write every phase's figures as JSON to this path")
    args = ap.parse_args(argv)

    if args.phase:
        print(json.dumps(_run_phase(args.phase, args.quick)))
        return

    info_start = common.machine_info()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    res = {name: _run_phase_subprocess(name, args.quick) for name in PHASES}
    info_end = common.machine_info()
    common.write_json(args.json, {"phases": res, "machine_start": info_start, "machine_end": info_end,
                                  "quick": args.quick})
    opts = QUICK if args.quick else FULL

    lines = []
    out = lambda s="": (print(s, flush=True), lines.append(s))
    cmd = "python -m experiments.bench.model_step" + (" --quick" if args.quick else "")
    out(f"## model_step{' (--quick)' if args.quick else ''}: {started}")
    out()
    out(f"Command: `{cmd}`  ")
    out(f"Machine: nproc={info_start['nproc']}, backend={info_start['backend']}, jax {info_start['jax']}, "
        f"load average (1/5/15 min) at start {info_start['loadavg']}, at end {info_end['loadavg']}  ")
    tr = res["train_dropless"]
    out(f"Config: {json.dumps(REFERENCE)}; {tr['n_params'] / 1e6:.1f} M parameters, "
        f"{tr['active_params'] / 1e6:.1f} M active matmul weights per token; train batch "
        f"{opts['train_batch']} x {SEQ}; decode batch {opts['decode_batch']}, prompt {PROMPT_LEN}, "
        f"{opts['new_tokens']} new tokens")
    out()
    rows = []
    for name in ("train_dropless", "train_capacity"):
        r = res[name]
        rows.append([r["phase"], f"{r['tokens_per_s']:,.0f} tok/s", f"{r['model_gflops_per_s']:.1f}",
                     f"{r['peak_gflops']:.1f}", f"{100 * r['mfu']:.1f}%", f"{100 * r['mfu_cpu']:.1f}%",
                     f"{r['seconds']:.2f}",
                     f"{r['cpu_s']:.2f}", f"{r['dropped_fraction']:.3f}",
                     f"{r['peak_rss_mib']:.0f} ({r['rss_after_init_mib']:.0f})"])
    headers = ["train step", "throughput", "model GFLOP/s", "matmul peak GFLOP/s (same run)", "MFU",
               "MFU per CPU-s", "s / step", "CPU s / step", "dropped frac", "peak RSS MiB (after init)"]
    out(common.format_table(headers, rows))
    out()
    dec, rec = res["decode"], res["recompute"]
    rows = [[dec["phase"], f"{dec['tokens_per_s']:,.0f}", f"{dec['seconds']:.2f}", f"{dec['cpu_s']:.1f}",
             "measured (best of 2)",
             f"{dec['peak_rss_mib']:.0f} ({dec['rss_after_init_mib']:.0f})"],
            [rec["phase"], f"{rec['tokens_per_s']:,.0f}", f"{rec['seconds']:.1f}", f"{rec['cpu_s']:.1f}",
             "one full forward timed at prefix lengths " + ", ".join(
                 f"{k}: {v:.3f}s" for k, v in rec["measured_step_seconds"].items())
             + f"; a + bL + cL^2 through them, summed over all {rec['new_tokens']} steps",
             f"{rec['peak_rss_mib']:.0f} ({rec['rss_after_init_mib']:.0f})"]]
    out(common.format_table(["decoding", "tokens/s", "seconds", "CPU s", "how", "peak RSS MiB (after init)"], rows))
    out()
    best_mfu = max(res["train_dropless"]["mfu"], res["train_capacity"]["mfu"])
    speedup = dec["tokens_per_s"] / rec["tokens_per_s"]
    rows = [["MFU, dropless", f"{100 * res['train_dropless']['mfu']:.1f}%", ">= 30%"],
            [f"MFU, capacity {CAPACITY}", f"{100 * res['train_capacity']['mfu']:.1f}%", ">= 30%"],
            ["capacity / dropless train speed", f"{res['train_capacity']['tokens_per_s'] / tr['tokens_per_s']:.2f}x", ""],
            ["KV-cache / recompute decode speed", f"{speedup:.1f}x", ">= 10x"],
            ["KV-cache / recompute decode CPU time", f"{rec['cpu_s'] / dec['cpu_s']:.1f}x", ""]]
    out(common.format_table(["ratio", "value", "target"], rows))
    out()
    if args.quick:
        out("(--quick is a smoke run with small batches: the targets apply to the full run.)")
    out(f"Targets: MFU >= 30%: {'met' if best_mfu >= 0.30 else 'NOT met'} (best {100 * best_mfu:.1f}%); "
        f"cached decoding >= 10x recompute: {'met' if speedup >= 10 else 'NOT met'} ({speedup:.1f}x).")
    out()
    out("Notes: MFU = model FLOPs/s over the best float32 jnp matmul GFLOP/s measured in the same subprocess "
        "just before and after the timed steps (sizes 1024 and 2048); model FLOPs = 3 x forward, forward = "
        "2 x active matmul weights per token + causal attention (mean context (T+1)/2). 'CPU s' is process CPU "
        "time over all threads: on a shared machine wall time exceeds CPU time / nproc by the share other "
        "processes took. 'MFU per CPU-s' divides model FLOPs per CPU-second of the train step by the matmul's "
        "best FLOPs per CPU-second: it does not depend on the share of the cores this run got. Decode times include the prefill of the 32-token prompts. Peak RSS is the whole "
        "subprocess high-water mark (JAX runtime, parameters, XLA compilation and the run); the figure in "
        "brackets is the resident size right after creating the parameters. Decoding uses the dropless MoE "
        "(exact against a full forward); recompute uses the same model.")
    if args.md:
        os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
        with open(args.md, "w") as f:
            f.write("\n".join(lines) + "\n")
    return res


if __name__ == "__main__":
    main()
