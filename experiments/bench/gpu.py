"""GPU benchmark: train-step model FLOPs utilisation of a ~1B-active MoE in bf16, and decode tokens/s at batch 256.

    python -m experiments.bench.gpu --json /tmp/bench/gpu.json    # on one GPU; under 5 minutes on an H200
    python -m experiments.bench.gpu --smoke                       # tiny config on the CPU in seconds (a test runs it)

Model (GPU run): vocabulary 32,768, d_model 2048, 16 layers, 16 query / 4 KV heads of 128, every block MoE with
8 SwiGLU experts of width 3584, top-2, dropless (ragged_dot), untied embeddings: 3.12 B parameters, 1.01 B active
per token (models.config.active_params_per_token). Compute in bfloat16 (cfg.dtype), parameters and Adam moments in
float32 (cfg.param_dtype), router and logits in float32.

Phases, in this order, in one process:
  peak    the device's bf16 matmul ceiling: best TFLOP/s of a jitted square bf16 matmul (8192, float32 accumulation)
          over several repetitions, measured just before and after the train phase (the best of the two is used);
  train   rl.train_step.make_train_step in GRPO mode (policy loss, entropy, router losses, AdamW with gradient
          clipping) on batch x seq random tokens (a 64-token prompt, the rest response), jitted and donated; the median
          of the timed steps after one compile step. MFU = model FLOPs/s / peak, model FLOPs per step = tokens x
          models.flops.train_flops over the batch (the one convention of every bench: 2 x active matmul weights
          per token, the LM head on every position, causal attention pairs, 3 x forward for full fine-tuning; LoRA's
          frozen base gets dX only). Before it, the step is compiled
          (lower + compile) with the layers unrolled and scanned (model.scan_layers; the same stacked params; not
          in --smoke);
  decode  models.sampling.generate on batch 256 prompts of 64 tokens, 256 new tokens each, temperature 1, EOS off
          (eos_id=-1, every row decodes every token), parameters cast to bf16; tokens/s = 256 x 256 / seconds of the
          second call (the first compiles). Prefill of the prompts is included. Then the same rows through
          continuous batching (models/slot_sampling.generate_slots, 256 slots): equal work, so the ratio is what
          the slot machinery (ring cache, refills, host harvest) costs on the device.
--json PATH writes every figure; --capacity-factor CF switches the MoE to capacity dispatch for a comparison.
"""
from __future__ import annotations

import os

# On a GPU, let XLA take most of the memory (the default 75% is tight for the train state plus activations).
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.bench import common  # noqa: E402
from models import sampling, slot_sampling  # noqa: E402
from models import flops  # noqa: E402
from models.config import ModelConfig, active_params_per_token, num_params  # noqa: E402
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_train_step  # noqa: E402

GPU_MODEL = dict(vocab_size=32768, d_model=2048, n_layers=16, n_heads=16, n_kv_heads=4, head_dim=128, d_ff=3584,
                 n_experts=8, experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None,
                 max_seq_len=2048, dtype="bfloat16", param_dtype="float32", tie_embeddings=False)
SMOKE_MODEL = dict(vocab_size=259, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                   n_experts=4, experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None,
                   max_seq_len=128, dtype="bfloat16", param_dtype="float32", tie_embeddings=False)
# 8 x 1024 tokens per step: about 50 GiB of float32 params, Adam moments and gradients plus ~25 GiB of activations
# (attention scores are materialised per layer), well inside an H200's 139 GiB; --batch 16 doubles the activations.
GPU_RUN = dict(batch=8, seq=1024, prompt=64, steps=5, decode_batch=256, decode_prompt=64, decode_new=256,
               peak_n=8192, peak_reps=10, compare_unrolled=True)
SMOKE_RUN = dict(batch=2, seq=32, prompt=8, steps=2, decode_batch=8, decode_prompt=8, decode_new=8, peak_n=256,
                 peak_reps=3, compare_unrolled=False)


def _block(tree):
    return jax.block_until_ready(tree)


def bf16_matmul_peak(n: int, reps: int) -> dict:
    """Best TFLOP/s of a jitted [n, n] x [n, n] bf16 matmul (float32 accumulation, bf16 result): 2 n^3 per call."""
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    mm = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    _block(mm(a, b))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        _block(mm(a, b))
        times.append(time.perf_counter() - t0)
    return {"n": n, "tflops": 2.0 * n ** 3 / min(times) / 1e12, "best_s": min(times)}


def _train_batch(cfg, batch: int, seq: int, prompt: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    loss_mask = np.ones((batch, seq), np.float32)
    loss_mask[:, :prompt] = 0.0
    return {"tokens": jnp.asarray(rng.integers(3, cfg.vocab_size, size=(batch, seq)), jnp.int32),
            "attn_mask": jnp.ones((batch, seq), jnp.int32), "loss_mask": jnp.asarray(loss_mask),
            "advantages": jnp.asarray(rng.normal(size=(batch,)), jnp.float32)}


def phase_train(cfg, run: dict) -> tuple[dict, dict]:
    """Times the GRPO train step; returns (figures, final params)."""
    loss_cfg, optim_cfg = LossConfig(mode="grpo"), OptimConfig(grad_clip=1.0)
    state = init_train_state(cfg, loss_cfg, optim_cfg, jax.random.key(0))
    step = make_train_step(cfg, loss_cfg, optim_cfg)
    hparams = {"lr": jnp.float32(1e-5), "kl_coef": jnp.float32(0.0)}
    batches = [_train_batch(cfg, run["batch"], run["seq"], run["prompt"], seed) for seed in range(2)]
    compile_s = {}
    for name, scan in (("unrolled", False), ("scanned", True)) if run["compare_unrolled"] else ():
        # the same stacked params either way
        t0 = time.perf_counter()
        make_train_step(cfg.replace(scan_layers=scan), loss_cfg, optim_cfg).lower(state, batches[0], hparams).compile()
        compile_s[name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    state, metrics = _block(step(state, batches[0], hparams))
    compile_s_first = time.perf_counter() - t0
    times = []
    for i in range(run["steps"]):
        t0 = time.perf_counter()
        state, metrics = _block(step(state, batches[(i + 1) % 2], hparams))
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    tokens = run["batch"] * run["seq"]
    step_flops = flops.train_flops(cfg, tokens, run["batch"] * run["seq"] * (run["seq"] + 1) / 2)  # causal pairs
    out = {"batch": run["batch"], "seq": run["seq"], "tokens_per_step": tokens, "step_s": sec, "all_step_s": times,
           "compile_plus_first_s": compile_s_first, "compile_s": compile_s, "tokens_per_s": tokens / sec,
           "model_flops_per_step": step_flops,
           "model_tflops_per_s": step_flops / sec / 1e12, "loss": float(metrics["loss/total"]),
           "skipped": int(metrics["skipped"]) if "skipped" in metrics else None}
    return out, state["params"]


def _timed_decode(gen, n: int) -> tuple[float, float]:
    """(seconds of the first call, which compiles; seconds of the second) of gen(key), every row n tokens long."""
    t0 = time.perf_counter()
    _block(gen(jax.random.key(1)))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = _block(gen(jax.random.key(2)))
    sec = time.perf_counter() - t0
    if int(out.lengths.min()) != n:
        raise RuntimeError(f"every row must decode all {n} tokens, shortest {int(out.lengths.min())}")
    return compile_s, sec


def phase_decode(cfg, params, run: dict) -> dict:
    dcfg = cfg.replace(param_dtype="bfloat16")
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)  # decode reads bf16 weights
    b, n = run["decode_batch"], run["decode_new"]
    rng = np.random.default_rng(5)
    prompts = jnp.asarray(rng.integers(3, cfg.vocab_size, size=(b, run["decode_prompt"])), jnp.int32)

    def gen(key):
        return sampling.generate(params, dcfg, prompts, key, max_new_tokens=n, temperature=1.0, eos_id=-1)

    compile_s, sec = _timed_decode(gen, n)
    res = {"batch": b, "prompt": run["decode_prompt"], "new_tokens": n, "seconds": sec,
           "compile_plus_first_s": compile_s, "tokens_per_s": b * n / sec}

    def slots(key):  # the same rows through continuous batching (models/slot_sampling.py): what the slots cost
        return slot_sampling.generate_slots(params, dcfg, prompts, key, row_prompt=np.arange(b), slots=b,
                                            max_new_tokens=n, temperature=1.0, eos_id=-1)

    compile_s, sec = _timed_decode(slots, n)
    res["continuous"] = {"seconds": sec, "compile_plus_first_s": compile_s, "tokens_per_s": b * n / sec}
    return res


def _memory() -> dict:
    stats = jax.local_devices()[0].memory_stats() or {}
    return {k: stats[k] / 2 ** 30 for k in ("peak_bytes_in_use", "bytes_limit") if k in stats}


def run(smoke: bool = False, capacity_factor: float | None = None, overrides: dict | None = None) -> dict:
    model = {**(SMOKE_MODEL if smoke else GPU_MODEL), "capacity_factor": capacity_factor}
    cfg = ModelConfig(**model)
    opts = {**(SMOKE_RUN if smoke else GPU_RUN), **(overrides or {})}
    if not smoke and jax.default_backend() == "cpu":
        raise RuntimeError("the full benchmark needs a GPU (the default backend is the CPU); use --smoke on a CPU")
    started = time.perf_counter()
    device = jax.local_devices()[0]
    res = {"device": getattr(device, "device_kind", str(device)), "backend": jax.default_backend(),
           "jax": jax.__version__, "smoke": smoke, "model": model, "run": opts,
           "params": num_params(cfg), "active_params_per_token": active_params_per_token(cfg)}
    peak_before = bf16_matmul_peak(opts["peak_n"], opts["peak_reps"])
    res["train"], params = phase_train(cfg, opts)
    peak_after = bf16_matmul_peak(opts["peak_n"], opts["peak_reps"])
    res["peak"] = {"before": peak_before, "after": peak_after,
                   "tflops": max(peak_before["tflops"], peak_after["tflops"])}
    res["train"]["mfu"] = res["train"]["model_tflops_per_s"] / res["peak"]["tflops"]
    res["memory_after_train_gib"] = _memory()
    res["decode"] = phase_decode(cfg, params, opts)
    res["memory_gib"] = _memory()
    res["wall_s"] = time.perf_counter() - started
    return res


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.3f} M"


def report(res: dict) -> None:
    tr, dec, pk = res["train"], res["decode"], res["peak"]
    cmd = "python -m experiments.bench.gpu" + (" --smoke" if res["smoke"] else "")
    print(f"## GPU benchmark{' (--smoke, CPU)' if res['smoke'] else ''}: "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print(f"Command: `{cmd}`  ")
    print(f"Device: {res['device']} ({res['backend']}), jax {res['jax']}; model {_count(res['params'])} parameters, "
          f"{_count(res['active_params_per_token'])} active per token, compute {res['model']['dtype']}, "
          f"parameters {res['model']['param_dtype']}; whole run {res['wall_s']:.0f} s\n")
    rows = [
        ["bf16 matmul peak (same run)", f"{pk['tflops']:.1f} TFLOP/s",
         f"n={pk['before']['n']}: {pk['before']['tflops']:.1f} before, {pk['after']['tflops']:.1f} after the train phase"],
        ["train step (GRPO, AdamW)", f"{tr['step_s'] * 1e3:.1f} ms / step",
         f"{tr['batch']} x {tr['seq']} tokens, {tr['tokens_per_s']:,.0f} tokens/s, compile + first step "
         f"{tr['compile_plus_first_s']:.1f} s"],
    ] + ([["train step compile", f"{tr['compile_s']['scanned']:.1f} s scanned",
           f"{tr['compile_s']['unrolled']:.1f} s with the layers unrolled (model.scan_layers=False), same params"]]
         if tr["compile_s"] else []) + [
        ["model FLOPs utilisation", f"{100 * tr['mfu']:.1f}%",
         f"{tr['model_tflops_per_s']:.1f} model TFLOP/s / {pk['tflops']:.1f} peak"],
        [f"decode, batch {dec['batch']}", f"{dec['tokens_per_s']:,.0f} tokens/s",
         f"{dec['new_tokens']} new tokens after {dec['prompt']}-token prompts in {dec['seconds']:.2f} s (prefill "
         f"included); compile + first call {dec['compile_plus_first_s']:.1f} s"],
        [f"decode, {dec['batch']} continuous-batching slots", f"{dec['continuous']['tokens_per_s']:,.0f} tokens/s",
         f"the same rows through models/slot_sampling.py (refills of {slot_sampling.REFILL}); compile + first call "
         f"{dec['continuous']['compile_plus_first_s']:.1f} s"],
    ]
    mem = res.get("memory_gib") or {}
    if "peak_bytes_in_use" in mem:
        rows.append(["peak device memory", f"{mem['peak_bytes_in_use']:.1f} GiB",
                     f"of {mem.get('bytes_limit', float('nan')):.1f} GiB available to XLA"])

    common.print_table(["figure", "value", "how"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny config on whatever backend (the CPU in tests)")
    common.add_json_arg(ap)
    ap.add_argument("--capacity-factor", type=float, default=None, help="capacity dispatch instead of dropless")
    for name in ("batch", "seq", "steps", "decode_batch", "decode_new"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"override {name}")
    args = ap.parse_args(argv)
    overrides = {k: getattr(args, k) for k in ("batch", "seq", "steps", "decode_batch", "decode_new")
                 if getattr(args, k) is not None}
    res = run(args.smoke, args.capacity_factor, overrides)
    report(res)
    common.write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
