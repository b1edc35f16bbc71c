"""Workload W1 from PEERS.md: one full GRPO step (sample -> reward -> logprob -> update), vs TRL and Tunix.

    python -m experiments.bench.w1                    # KL 0 and KL 0.04, 3 timed steps each
    python -m experiments.bench.w1 --steps 1 --quick  # smoke run (fewer prompts and tokens)
    python -m experiments.bench.w1 --md /tmp/bench/w1.md

W1 exactly as PEERS.md states it: MoE decoder, 4 layers, d_model 256, 4 heads / 2 KV heads of 64,
8 experts top-2 (SwiGLU width 512, no shared expert, dropless), vocab 512, untied, float32, random
init; 8 prompts x 8 samples, prompts up to 32 tokens, 64 new tokens, temperature 1.0; reward =
the last integer of the decoded response equals the gold answer; one AdamW update on the whole
batch of 64 sequences, with a reference policy at KL weight 0.04 and without one (weight 0).

Phases of one step, each timed after a full untimed warm-up step (which holds the compiles):
  sampling   models.sampling.generate (KV cache, all 64 rows, stops when every row hit EOS)
  reward     host: decode (byte ids 3..258; other ids print nothing), last-integer regex
  logprob    reference-policy logprobs (KL 0.04 only; KL 0 needs none: one on-policy update
             uses old_logp = stop_gradient(logp), the same number the sampler would give)
  update     rl.train_step: GRPO loss (+ k3 KL) + router losses, AdamW, one step on 64 rows
             (gradient accumulated over --microbatches row slices, default 4: same update, ~1/3
             of the activation memory; --microbatches 1 computes the 64 rows at once)
Each KL setting runs in its own subprocess so its peak resident memory (ru_maxrss) is its own.
Ratios vs the peers are peer seconds / our seconds (above 1 = we are faster).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

W1_MODEL = dict(vocab_size=512, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512,
                n_experts=8, experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None,
                max_seq_len=128, dtype="float32", param_dtype="float32", tie_embeddings=False)
N_PROMPTS, N_SAMPLES, PROMPT_LEN, NEW_TOKENS = 8, 8, 32, 64
PEERS = {  # PEERS.md, 2-core 24 GiB machine: (s/step KL 0, s/step KL 0.04, sampling tok/s, peak GiB)
    "TRL 1.16.0": (4.2, 4.5, 1950, 1.7),
    "Tunix 0.1.7 (MoE)": (13.6, 15.2, 1100, 4.7),
    "Tunix 0.1.7 (dense, same active size)": (None, 5.6, 1720, 2.4),
}
_INT = re.compile(r"-?\d+")


def last_int_reward(text: str, gold: int) -> float:
    found = _INT.findall(text)
    return float(bool(found) and int(found[-1]) == gold)


def decode(ids) -> str:
    """Byte ids (3..258) to text; specials and ids past the byte range are dropped; stops at EOS."""
    out = bytearray()
    for i in ids:
        i = int(i)
        if i == 2:
            break
        if 3 <= i < 259:
            out.append(i - 3)
    return out.decode("utf-8", errors="replace")


def make_prompts(rng, n, max_len, vocab):
    """Left-padded random prompts of 16..max_len tokens (BOS first) and random gold integers."""
    import numpy as np

    lengths = rng.integers(16, max_len + 1, size=n)
    ids = np.zeros((n, max_len), np.int32)
    mask = np.zeros((n, max_len), np.int32)
    for b, n_tok in enumerate(lengths):
        ids[b, max_len - n_tok] = 1
        ids[b, max_len - n_tok + 1:] = rng.integers(3, vocab, size=n_tok - 1)
        mask[b, max_len - n_tok:] = 1
    return ids, mask, rng.integers(0, 100, size=n)


def to_train_layout(prompts, prompt_mask, responses, lengths, n_samples):
    """Left-padded prompts + responses -> right-padded [B*K, P+N] tokens, attn_mask, loss_mask."""
    import numpy as np

    rows, p_len = responses.shape[0], prompts.shape[1]
    total = p_len + responses.shape[1]
    tokens = np.zeros((rows, total), np.int32)
    attn = np.zeros((rows, total), np.int32)
    loss = np.zeros((rows, total), np.int32)
    for r in range(rows):
        b = r // n_samples
        real = prompts[b][prompt_mask[b] > 0]
        n_p, n_r = len(real), int(lengths[r])
        tokens[r, :n_p] = real
        tokens[r, n_p:n_p + n_r] = responses[r, :n_r]
        attn[r, :n_p + n_r] = 1
        loss[r, n_p:n_p + n_r] = 1
    return tokens, attn, loss


def run_setting(kl: float, steps: int, quick: bool, microbatches: int = 4) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from experiments.bench import common
    from experiments.bench.model_step import active_params
    from models import sampling
    from models.config import ModelConfig
    from rl import advantages
    from rl.train_step import LossConfig, OptimConfig, init_train_state, make_logprob_fn, make_train_step

    n_prompts, new_tokens = (2, 16) if quick else (N_PROMPTS, NEW_TOKENS)
    cfg = ModelConfig(**W1_MODEL)
    loss_cfg = LossConfig(mode="grpo", kl_kind="k3")
    optim = OptimConfig()
    hparams = {"lr": jnp.float32(1e-6), "kl_coef": jnp.float32(kl)}
    state = init_train_state(cfg, loss_cfg, optim, jax.random.PRNGKey(0))
    ref_params = jax.tree.map(jnp.copy, state["params"]) if kl > 0 else None
    n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
    step_fn = make_train_step(cfg, loss_cfg, optim, microbatches=microbatches)
    logprob_fn = make_logprob_fn(cfg)
    rng = np.random.default_rng(0)
    prompts, pmask, gold = make_prompts(rng, n_prompts, PROMPT_LEN, cfg.vocab_size)
    peak_before = common.matmul_peak_gflops()["peak_gflops"]

    def one_step(state, key):
        t = {}
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        out = common.block(sampling.generate(state["params"], cfg, jnp.asarray(prompts), key,
                                             prompt_mask=jnp.asarray(pmask), num_samples=N_SAMPLES,
                                             max_new_tokens=new_tokens, temperature=1.0))
        t["sampling"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        resp, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        rewards = np.array([last_int_reward(decode(resp[r, :lengths[r]]), int(gold[r // N_SAMPLES]))
                            for r in range(resp.shape[0])], np.float32)
        tokens, attn, loss_mask = to_train_layout(prompts, pmask, resp, lengths, N_SAMPLES)
        adv = advantages.grpo(jnp.asarray(rewards), N_SAMPLES)
        batch = {"tokens": tokens, "attn_mask": attn, "loss_mask": loss_mask, "advantages": adv}
        t["reward"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if ref_params is not None:
            batch["ref_logp"] = common.block(logprob_fn(ref_params, tokens, attn, 1.0))
        t["logprob"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        state, metrics = common.block(step_fn(state, batch, hparams))
        t["update"] = time.perf_counter() - t0
        t["total"] = sum(t.values())
        t["cpu_total"] = time.process_time() - cpu0
        t["generated_tokens"] = int(lengths.sum())
        t["train_tokens"] = int(attn.sum())
        t["mean_reward"] = float(rewards.mean())
        t["loss"] = float(metrics["loss/total"])
        return state, t

    key = jax.random.PRNGKey(1)
    t0 = time.perf_counter()
    state, _ = one_step(state, key)  # compiles everything
    compile_s = time.perf_counter() - t0
    runs = []
    for i in range(steps):
        state, t = one_step(state, jax.random.fold_in(key, i + 1))
        runs.append(t)
    peak_after = common.matmul_peak_gflops()["peak_gflops"]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rows = n_prompts * N_SAMPLES
    active = active_params(cfg)
    # 2 x active per sampled token, 6 x per trained token, 2 x per reference-logprob token.
    flops = 2 * active * med["generated_tokens"] + (6 + (2 if kl > 0 else 0)) * active * med["train_tokens"]
    peak = max(peak_before, peak_after)
    return dict(kl=kl, rows=rows, new_tokens=new_tokens, steps=steps, microbatches=microbatches, compile_and_first_step_s=compile_s,
                seconds=med, all_totals=[r["total"] for r in runs],
                sampling_tok_s=med["generated_tokens"] / med["sampling"],
                sampling_tok_s_all_slots=rows * new_tokens / med["sampling"],
                model_gflops_per_s=flops / med["total"] / 1e9, peak_gflops=peak, mfu=flops / med["total"] / 1e9 / peak,
                n_params=int(n_params), active_params=int(active), peak_rss_mib=common.peak_rss_mib(),
                machine=common.machine_info())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per KL setting (after one warm-up step)")
    ap.add_argument("--quick", action="store_true", help="2 prompts x 8 samples, 16 new tokens (smoke run)")
    ap.add_argument("--kl", type=float, nargs="*", default=[0.0, 0.04], help="KL weights to run")
    ap.add_argument("--microbatches", type=int, default=4,
                    help="gradient-accumulation slices of the 64-row update (one AdamW step either way)")
    ap.add_argument("--md", default=None, help="also append the Markdown tables to this file")
    ap.add_argument("--_child", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child is not None:
        print(json.dumps(run_setting(args._child, args.steps, args.quick, args.microbatches)))
        return
    results = []
    for kl in args.kl:
        cmd = [sys.executable, "-m", "experiments.bench.w1", "--_child", str(kl), "--steps", str(args.steps),
               "--microbatches", str(args.microbatches)]
        cmd += ["--quick"] if args.quick else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if proc.returncode:
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"W1 child (kl={kl}) failed with exit code {proc.returncode}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    report(results, args)


def report(results, args):
    from experiments.bench.common import print_table

    out = []
    rows = []
    for r in results:
        s = r["seconds"]
        rows.append([f"KL {r['kl']:g}", s["total"], s["cpu_total"], s["sampling"], s["reward"], s["logprob"], s["update"],
                     r["sampling_tok_s"], r["sampling_tok_s_all_slots"], r["peak_rss_mib"] / 1024,
                     r["model_gflops_per_s"], r["peak_gflops"], r["mfu"]])
    out.append(print_table(["setting", "s/step", "CPU s/step", "sampling s", "reward s", "logprob s", "update s",
                            "sample tok/s (generated)", "sample tok/s (64x64 slots)", "peak GiB",
                            "model GFLOP/s", "matmul peak GFLOP/s", "MFU"], rows))
    ratio_rows = []
    by_kl = {r["kl"]: r for r in results}
    for name, (s0, s04, tok_s, gib) in PEERS.items():
        ours0, ours04 = by_kl.get(0.0), by_kl.get(0.04)
        ratio_rows.append([
            name,
            s0 / ours0["seconds"]["total"] if (s0 and ours0) else None,
            s04 / ours04["seconds"]["total"] if (s04 and ours04) else None,
            (ours04 or ours0)["sampling_tok_s"] / tok_s,
            gib / ((ours04 or ours0)["peak_rss_mib"] / 1024),
        ])
    print()
    out.append(print_table(["peer", "speed-up KL 0 (peer s / ours)", "speed-up KL 0.04", "sampling tok/s ratio (ours / peer)",
                            "memory ratio (peer / ours)"], ratio_rows))
    info = results[0]["machine"]
    note = (f"\nmachine: {info}; params {results[0]['n_params']:,}, active/token {results[0]['active_params']:,}; "
            f"update in {args.microbatches} accumulated microbatches; "
            f"timed steps per setting: {args.steps} (median), after a warm-up step of "
            f"{', '.join('%.1f' % r['compile_and_first_step_s'] for r in results)} s (compiles)")
    print(note)
    if args.md:
        with open(args.md, "a") as f:
            f.write("\n\n".join(out) + "\n" + note + "\n")


if __name__ == "__main__":
    main()
