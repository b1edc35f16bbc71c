"""Workload W1 from PEERS.md: one full GRPO step (sample -> reward -> logprob -> update), side by side with TRL.

    python -m experiments.bench.w1                           # KL 0 and 0.04, 3 timed steps each, then the TRL peer
    python -m experiments.bench.w1 --reps 3 --wait_quiet 900 --json runs/bench/w1.json
    python -m experiments.bench.w1 --steps 1 --quick --no_peer   # smoke run (fewer prompts and tokens)

W1 exactly as PEERS.md states it: MoE decoder, 4 layers, d_model 256, 4 heads / 2 KV heads of 64,
8 experts top-2 (SwiGLU width 512, no shared expert, dropless), vocab 512, untied, float32, random
init; 8 prompts x 8 samples, prompts up to 32 tokens, 64 new tokens, temperature 1.0; reward =
the last integer of the decoded response equals the gold answer; one AdamW update on the whole
batch of 64 sequences, with a reference policy at KL weight 0.04 and without one (weight 0).

Phases of one step, each timed (wall and process CPU seconds) after a full untimed warm-up step (which holds the
compiles):
  sampling   models.sampling.generate (KV cache, all 64 rows, stops when every row hit EOS); its logprobs are
             the behaviour policy (old_logp), so no old-logprob pass runs
  reward     host: decode (byte ids 3..258; other ids print nothing), last-integer regex
  logprob    reference-policy logprobs (KL 0.04 only)
  update     rl.train_step: GRPO loss (+ k3 KL) + router losses, AdamW, one step on 64 rows
             (gradient accumulated over --microbatches slices of whole prompts, default 2: the same
             update in less activation memory; --microbatches 1 computes the 64 rows at once)
The batch is the sampler's output as is, in the grouped layout (models/shared_prompt.py): the reference pass and
the update compute each of the 8 prompts once for its 8 answers, not 8 times; --layout flat builds the 64 rows of
prompt + answer instead (same loss and gradients, 29% more token-passes).
Each KL setting runs in its own subprocess so its peak resident memory (ru_maxrss) is its own, with the allocator
as the launcher runs it (models/cpu/allocator.py: glibc's huge-page malloc tunable, and the heap the compiler freed
handed back after each compile; --allocator default runs without both).

The peer: right after our measurement the script runs the TRL harness (../shared/peers/trl/trl_w1.py, by path,
with the python of its venv: `bash ../shared/peers/trl/setup.sh` makes /tmp/peer-trl-venv) on the same workload
(with its own default allocator: the huge-page tunable made it slower) and prints ours / TRL ratios from the two
measurements of this run: time per step (target <= 0.5 at KL 0.04), CPU seconds per step, sampling tokens/s
(target >= 2) and peak memory (target < 1). It never divides by a stored figure; without the harness or its venv
it says so and reports our figures alone. --wait_quiet S waits (at most S seconds) before each measurement for the
1-minute load average to drop below --quiet_load; the load at the start and end of every measurement is printed
and written to --json.

The step, its timing and FLOP counts (measure_step; the counts are models/flops.py's), the subprocess per KL
setting (run_ours), the peer (run_peer), the repetitions with their ratios and report (run_pairs) and the shared
options (add_pair_args) take the model, prompts, reward and peer options as arguments: experiments/bench/w2.py runs
W2 (the same step on SmolLM2-135M-Instruct) through them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import common
from experiments.bench.common import print_table
from experiments.bench.model_step import active_params
from models import flops, sampling
from models.config import ModelConfig
from models.cpu import allocator
from rl import advantages
from rl.logprobs import make_logprob_fn
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_train_step

W1_MODEL = dict(vocab_size=512, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512,
                n_experts=8, experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None,
                max_seq_len=128, dtype="float32", param_dtype="float32", tie_embeddings=False)
N_PROMPTS, N_SAMPLES, PROMPT_LEN, NEW_TOKENS = 8, 8, 32, 64
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

    lengths = rng.integers(16, max_len + 1, size=n)
    ids = np.zeros((n, max_len), np.int32)
    mask = np.zeros((n, max_len), np.int32)
    for b, n_tok in enumerate(lengths):
        ids[b, max_len - n_tok] = 1
        ids[b, max_len - n_tok + 1:] = rng.integers(3, vocab, size=n_tok - 1)
        mask[b, max_len - n_tok:] = 1
    return ids, mask, rng.integers(0, 100, size=n)


def to_train_layout(prompts, prompt_mask, responses, lengths, n_samples, logprobs=None):
    """Left-padded prompts + responses -> right-padded [B*K, P+N] tokens, attn_mask, loss_mask (and the sampler's
    logprobs at the response positions, the behaviour policy's old_logp, when given)."""

    rows, p_len = responses.shape[0], prompts.shape[1]
    total = p_len + responses.shape[1]
    tokens = np.zeros((rows, total), np.int32)
    attn = np.zeros((rows, total), np.int32)
    loss = np.zeros((rows, total), np.int32)
    old = np.zeros((rows, total), np.float32)
    for r in range(rows):
        b = r // n_samples
        real = prompts[b][prompt_mask[b] > 0]
        n_p, n_r = len(real), int(lengths[r])
        tokens[r, :n_p] = real
        tokens[r, n_p:n_p + n_r] = responses[r, :n_r]
        attn[r, :n_p + n_r] = 1
        loss[r, n_p:n_p + n_r] = 1
        if logprobs is not None:
            old[r, n_p:n_p + n_r] = logprobs[r, :n_r]
    return (tokens, attn, loss) if logprobs is None else (tokens, attn, loss, old)


def run_setting(kl: float, steps: int, quick: bool, microbatches: int = 2, layout: str = "grouped") -> dict:
    """W1's policy (random init) and prompts, measured by measure_step."""


    n_prompts, new_tokens = (4, 16) if quick else (N_PROMPTS, NEW_TOKENS)
    cfg = ModelConfig(**W1_MODEL)
    prompts, pmask, gold = make_prompts(np.random.default_rng(0), n_prompts, PROMPT_LEN, cfg.vocab_size)

    def rewards(resp, lengths):
        return np.array([last_int_reward(decode(resp[r, :lengths[r]]), int(gold[r // N_SAMPLES]))
                         for r in range(resp.shape[0])], np.float32)

    return measure_step(cfg, None, prompts, pmask, rewards, kl=kl, steps=steps, new_tokens=new_tokens,
                        microbatches=microbatches, layout=layout)


def measure_step(cfg, params, prompts, pmask, rewards_fn, *, kl: float, steps: int, new_tokens: int,
                 n_samples: int = N_SAMPLES, microbatches: int = 2, layout: str = "grouped", eos_id=2,
                 pad_id: int = 0) -> dict:
    """One GRPO step of `cfg` (from `params`, or a random init when None) on the LEFT-padded prompts, timed per phase
    after an untimed warm-up step; the medians of `steps` timed steps, FLOPs / MFU against this process's matmul
    peak (before and after) and its peak RSS. rewards_fn(tokens [R, N], lengths [R]) -> float32 [R]."""


    allocator.trim_after_compiles()  # as the launcher runs (MATHRL_TRIM=0, i.e. --allocator default: not)
    n_prompts = prompts.shape[0]
    loss_cfg = LossConfig(mode="grpo", kl_kind="k3")
    optim = OptimConfig()
    hparams = {"lr": jnp.float32(1e-6), "kl_coef": jnp.float32(kl)}
    state = init_train_state(cfg, loss_cfg, optim, jax.random.PRNGKey(0), params=params)
    del params  # the state holds them (the step donates it)
    ref_params = jax.tree.map(jnp.copy, state["params"]) if kl > 0 else None
    n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
    step_fn = make_train_step(cfg, loss_cfg, optim, microbatches=microbatches)
    logprob_fn = make_logprob_fn(cfg)
    peak_before = common.matmul_peak_gflops()

    def one_step(state, key):
        t = {}
        cpu0 = time.process_time()
        t0, c0 = time.perf_counter(), time.process_time()
        out = common.block(sampling.generate(state["params"], cfg, jnp.asarray(prompts), key,
                                             prompt_mask=jnp.asarray(pmask), num_samples=n_samples,
                                             max_new_tokens=new_tokens, temperature=1.0, eos_id=eos_id,
                                             pad_id=pad_id))
        t["sampling"], t["cpu_sampling"] = time.perf_counter() - t0, time.process_time() - c0
        t0 = time.perf_counter()
        resp, lengths, logp = np.asarray(out.tokens), np.asarray(out.lengths), np.asarray(out.logprobs)
        rewards = np.asarray(rewards_fn(resp, lengths), np.float32)
        adv = advantages.grpo(jnp.asarray(rewards), n_samples)
        attn = (np.arange(resp.shape[1])[None] < lengths[:, None]).astype(np.int32)
        if layout == "grouped":  # the sampler's output as is, each prompt computed once (models/shared_prompt.py)
            batch = {"prompt_tokens": prompts, "prompt_mask": pmask, "tokens": resp, "attn_mask": attn,
                     "loss_mask": attn, "old_logp": logp * attn}
            prompt_kw = {"prompt_tokens": prompts, "prompt_mask": pmask}
            model_tokens = int(pmask.sum() + attn.sum())
        else:
            tokens, attn_flat, loss_mask, old_logp = to_train_layout(prompts, pmask, resp, lengths, n_samples, logp)
            batch = {"tokens": tokens, "attn_mask": attn_flat, "loss_mask": loss_mask, "old_logp": old_logp}
            prompt_kw, model_tokens = {}, int(attn_flat.sum())
        # The sampler's logprobs are the behaviour policy: no old-logprob pass.
        batch["advantages"] = adv
        t["reward"] = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        if ref_params is not None:
            batch["ref_logp"] = common.block(logprob_fn(ref_params, batch["tokens"], batch["attn_mask"], 1.0,
                                                        **prompt_kw))
        t["logprob"], t["cpu_logprob"] = time.perf_counter() - t0, time.process_time() - c0
        t0, c0, sys0 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
        state, metrics = common.block(step_fn(state, batch, hparams))
        t["update"], t["cpu_update"] = time.perf_counter() - t0, time.process_time() - c0
        # The kernel's share of the update's CPU time (backing the pages of fresh step buffers; BENCHMARKS.md W2)
        t["sys_update"] = resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys0
        t["total"] = t["sampling"] + t["reward"] + t["logprob"] + t["update"]
        t["cpu_total"] = time.process_time() - cpu0
        t["generated_tokens"] = int(lengths.sum())
        t["train_tokens"] = model_tokens  # token-passes the model computes (grouped: each prompt once)
        # The grouped layout's useful update FLOPs (the flat layout computes the prompts K times: not useful work).
        t["update_flops"] = flops.grouped_update_flops(cfg, pmask, attn, n_samples)
        decode = flops.grouped_decode_flops(cfg, pmask, lengths, n_samples)
        t["floor_flops"] = flops.step_floor_flops(t["update_flops"], decode, kl)
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
    peak_after = common.matmul_peak_gflops()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    rows = n_prompts * n_samples
    active = active_params(cfg)
    # The step's model FLOPs in the one convention (models/flops.py): sampling, the reference pass, the update.
    step_flops = statistics.median(r["floor_flops"] for r in runs)
    peak = max(peak_before["peak_gflops"], peak_after["peak_gflops"])
    update_gflops = statistics.median(r["update_flops"] / r["update"] for r in runs) / 1e9
    floor_s = med["floor_flops"] / (peak * 1e9)  # the step at the matmul peak of this run
    # Per CPU-second (process CPU time, all threads): the load-independent reading on a shared machine.
    peak_cpu = max(peak_before["peak_gflops_per_cpu_s"], peak_after["peak_gflops_per_cpu_s"])
    update_gflops_cpu = statistics.median(r["update_flops"] / r["cpu_update"] for r in runs) / 1e9
    # Per user CPU-second: without the kernel's page work, the XLA program's own efficiency
    update_gflops_user = statistics.median(r["update_flops"] / max(r["cpu_update"] - r["sys_update"], 1e-9)
                                           for r in runs) / 1e9
    return dict(kl=kl, rows=rows, new_tokens=new_tokens, steps=steps, microbatches=microbatches, layout=layout,
                compile_and_first_step_s=compile_s,
                seconds=med, all_totals=[r["total"] for r in runs],
                sampling_tok_s=med["generated_tokens"] / med["sampling"],
                sampling_tok_s_all_slots=rows * new_tokens / med["sampling"],
                model_gflops_per_s=step_flops / med["total"] / 1e9, peak_gflops=peak,
                mfu=step_flops / med["total"] / 1e9 / peak,
                update_gflops_per_s=update_gflops, update_mfu=update_gflops / peak,
                floor_s=floor_s, step_over_floor=med["total"] / floor_s,
                update_gflop_per_cpu_s=update_gflops_cpu, update_mfu_per_cpu_s=update_gflops_cpu / peak_cpu,
                update_mfu_per_user_cpu_s=update_gflops_user / peak_cpu,
                peak_gflop_per_cpu_s=peak_cpu,
                peak_gflops_before_after=[peak_before["peak_gflops"], peak_after["peak_gflops"]],
                n_params=int(n_params), active_params=int(active), peak_rss_mib=common.peak_rss_mib(),
                heap_trims=allocator.trim_stats(),
                machine=common.machine_info())


def _default_peer() -> str:
    # ../shared relative to the repository root (this file is experiments/bench/w1.py).
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(os.path.dirname(root), "shared", "peers", "trl", "trl_w1.py")


def child_args(args) -> list[str]:
    """W1's options that its measuring subprocess takes (--_child KL is added by run_ours)."""
    return ["--steps", str(args.steps), "--microbatches", str(args.microbatches),
            "--layout", args.layout] + (["--quick"] if args.quick else [])


def peer_workload(args) -> list[str]:
    """W1's shape in the TRL harness's options."""
    n_prompts, new_tokens = (4, 16) if args.quick else (N_PROMPTS, NEW_TOKENS)
    return ["--prompts-per-step", str(n_prompts), "--num-generations", str(N_SAMPLES),
            "--max-completion", str(new_tokens)]


ALLOCATORS = ("hugepages", "heap_reuse", "default")


def allocator_env(name: str) -> dict:
    """Our child's environment: "hugepages" as the launcher runs (models/cpu/allocator.py: the huge-page tunable,
    heap trimmed after each compile), "heap_reuse" that plus the opt-in heap-reuse tunables (MATHRL_HEAP_REUSE=1),
    "default" glibc as is and no trimming."""
    if name == "hugepages":
        return allocator.tuned_env({k: v for k, v in os.environ.items() if k != allocator.HEAP_REUSE})
    if name == "heap_reuse":
        return allocator.tuned_env({**os.environ, allocator.HEAP_REUSE: "1"})
    return {**os.environ, allocator.TRIM_OPT_OUT: "0"}


def run_ours(kl: float, args, module: str = "experiments.bench.w1", extra: list[str] | None = None) -> dict:
    """One KL setting in its own subprocess (`python -m module --_child KL` + extra, default W1's child_args; its
    peak RSS is its own), with the load average around it."""

    cmd = [sys.executable, "-m", module, "--_child", str(kl)] + (child_args(args) if extra is None else extra)
    wait = common.wait_quiet(args.wait_quiet, args.quiet_load) if args.wait_quiet else None
    load_start = common.load1()

    # Our process runs with the allocator setting the launcher uses (models/cpu/allocator.py); the peer keeps its
    # default, with which it ran faster (BENCHMARKS.md).
    env = allocator_env(args.allocator)
    res = common.run_phase(cmd, f"{module} child (kl={kl})", env=env)
    res.update(load_start=load_start, load_end=common.load1(), wait=wait,
               glibc_tunables=env.get("GLIBC_TUNABLES", ""))
    return res


def run_peer(args, workload: list[str] | None = None, tag: str = "w1") -> dict | None:
    """The TRL harness (../shared/peers/trl/trl_w1.py) by path with its own venv's python, right after our
    measurement, on `workload` (its options for the model and shape; default W1's peer_workload); None (and a
    message) when the harness or its venv is absent."""

    if args.no_peer:
        return None
    missing = [p for p in (args.peer, args.peer_python) if not os.path.exists(p)]
    if missing:
        print(f"[{tag}] peer skipped: {', '.join(missing)} not found (set up the TRL venv with "
              f"`bash ../shared/peers/trl/setup.sh`, or pass --peer / --peer_python)", flush=True)
        return None
    betas = ",".join(str(k) for k in args.kl)
    cmd = [args.peer_python, args.peer, "--betas", betas, "--steps", str(args.peer_steps or args.steps),
           "--warmup", "1", "--retries", "0", "--wait-quiet", "0", "--skip-generate"]
    cmd += peer_workload(args) if workload is None else workload
    wait = common.wait_quiet(args.wait_quiet, args.quiet_load) if args.wait_quiet else None
    load_start = common.load1()
    print(f"[{tag}] running the peer: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        print(f"[{tag}] peer failed (exit code {proc.returncode}); no ratios", flush=True)
        return None
    out = json.loads(lines[-1])
    settings = []
    for r in out["results"]:
        if r.get("kind") != "grpo" or "error" in r:
            continue
        own = (r.get("contention") or {}).get("own_cpu_per_wall")
        settings.append(dict(
            kl=r["beta"], step_s=r["step_s_median"], step_s_all=r["step_s_all"],
            cpu_s_per_step=r["step_s_median"] * own if own else None,
            sampling_tok_s=r["gen_kept_tok_per_s"], sampling_tok_s_all_slots=r["gen_tok_per_s"],
            sampling_s=r["gen_s_median"], train_s=r["train_s_median"], peak_rss_mib=r["peak_rss_mib"],
            foreign_cpu_frac=(r.get("contention") or {}).get("foreign_cpu_frac")))
    return dict(name=f"TRL {out['versions'].get('trl')} GRPOTrainer (torch {out['versions'].get('torch')})",
                settings=settings, load_start=load_start, load_end=common.load1(), wait=wait, wall_s=wall,
                versions=out["versions"], command=" ".join(cmd))


def ratios(ours: list[dict], peer: dict | None) -> list[dict]:
    """ours / TRL per KL setting, from the two measurements of this run (never a stored figure)."""
    if not peer:
        return []
    by_kl = {round(float(s["kl"]), 6): s for s in peer["settings"]}
    rows = []
    for r in ours:
        t = by_kl.get(round(float(r["kl"]), 6))
        if t is None:
            continue
        cpu = r["seconds"]["cpu_total"] / t["cpu_s_per_step"] if t.get("cpu_s_per_step") else None
        rows.append(dict(kl=r["kl"], time=r["seconds"]["total"] / t["step_s"], cpu_time=cpu,
                         sampling=r["sampling_tok_s"] / t["sampling_tok_s"],
                         memory=r["peak_rss_mib"] / t["peak_rss_mib"]))
    return rows


def add_pair_args(ap, steps: int = 3, microbatches: int = 2) -> None:
    """The options of a side-by-side run (ours, then the TRL peer) that W1 and W2 share."""

    ap.add_argument("--steps", type=int, default=steps, help="timed steps per KL setting (after one warm-up step)")
    ap.add_argument("--kl", type=float, nargs="*", default=[0.0, 0.04], help="KL weights to run")
    ap.add_argument("--microbatches", type=int, default=microbatches,
                    help="gradient-accumulation slices of the update, whole prompts each (one AdamW step either way)")
    ap.add_argument("--allocator", choices=ALLOCATORS, default="hugepages",
                    help="our process's malloc as the launcher runs it (huge pages, heap trimmed after each compile: "
                         "models/cpu/allocator.py), that plus the opt-in heap reuse (MATHRL_HEAP_REUSE=1), or as is")
    ap.add_argument("--compare_allocator", choices=ALLOCATORS, default=None,
                    help="also run ours at the last --kl with this allocator right after, and print the ratios")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of the pair (ours, then the peer)")
    ap.add_argument("--peer", default=_default_peer(), help="the TRL harness, run by path (default: ../shared)")
    ap.add_argument("--peer_python", default="/tmp/peer-trl-venv/bin/python", help="python of the peer's venv")
    ap.add_argument("--peer_steps", type=int, default=None, help="timed peer steps (default: --steps)")
    ap.add_argument("--no_peer", action="store_true", help="measure this project only")
    ap.add_argument("--wait_quiet", type=float, default=0.0,
                    help="before each measurement wait up to this many seconds for the load average to drop")
    ap.add_argument("--quiet_load", type=float, default=1.5, help="load average counted as quiet")
    ap.add_argument("--md", default=None, help="also append the Markdown tables to this file")
    common.add_json_arg(ap)
    ap.add_argument("--_child", type=float, default=None, help=argparse.SUPPRESS)


def run_pairs(args, name: str, command: str, ours, peer, extra_json: dict | None = None) -> list[dict]:
    """--reps repetitions of ours(kl) for every KL setting, then peer(), each followed by its report and the
    ratios of that one repetition; writes --json. Returns the repetitions."""

    reps = []
    for rep in range(args.reps):
        mine = [ours(kl) for kl in args.kl]
        other = compare_allocator(args, ours, mine[-1])
        theirs = peer()
        reps.append(dict(ours=mine, peer=theirs, ratios=ratios(mine, theirs), allocator_ab=other))
        report(reps[-1], args, rep, name)
    common.write_json(args.json, dict(
        command=command, machine=reps[0]["ours"][0]["machine"], microbatches=args.microbatches, steps=args.steps,
        **(extra_json or {}),
        reps=[dict(ours=[_ours_json(r) for r in rep["ours"]], peer=rep["peer"], ratios=rep["ratios"],
                   allocator_ab=rep["allocator_ab"]) for rep in reps]))
    return reps


def compare_allocator(args, ours, mine: dict) -> dict | None:
    """With --compare_allocator: ours at the last KL again under that allocator, right after `mine` (the same
    setting under --allocator); the ratios of the update and the step (ours / the other) and both runs' figures."""
    if not args.compare_allocator:
        return None
    chosen, args.allocator = args.allocator, args.compare_allocator
    try:
        other = ours(args.kl[-1])
    finally:
        args.allocator = chosen
    out = dict(kl=args.kl[-1], allocator=chosen, other_allocator=args.compare_allocator,
               update_ratio=mine["seconds"]["update"] / other["seconds"]["update"],
               step_ratio=mine["seconds"]["total"] / other["seconds"]["total"],
               peak_rss_ratio=mine["peak_rss_mib"] / other["peak_rss_mib"], other=_ours_json(other))
    print(f"[allocator] KL {out['kl']:g}: {chosen} / {args.compare_allocator}: update {out['update_ratio']:.3f}x, "
          f"step {out['step_ratio']:.3f}x, peak RSS {out['peak_rss_ratio']:.3f}x (update {mine['seconds']['update']:.2f}"
          f" vs {other['seconds']['update']:.2f} s; its system CPU {mine['seconds'].get('sys_update', 0):.2f} vs "
          f"{other['seconds'].get('sys_update', 0):.2f} s)", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--quick", action="store_true", help="4 prompts x 8 samples, 16 new tokens (smoke run)")
    ap.add_argument("--layout", choices=("grouped", "flat"), default="grouped",
                    help="update / reference batch: each prompt once for its 8 answers (grouped) or 64 full rows")
    args = ap.parse_args(argv)
    if args._child is not None:
        print(json.dumps(run_setting(args._child, args.steps, args.quick, args.microbatches, args.layout)))
        return
    run_pairs(args, "W1", "python -m experiments.bench.w1 " + " ".join(sys.argv[1:] if argv is None else argv),
              lambda kl: run_ours(kl, args), lambda: run_peer(args))


def _ours_json(r: dict) -> dict:
    s = r["seconds"]
    return dict(kl=r["kl"], step_s=s["total"], cpu_s_per_step=s["cpu_total"], step_s_all=r["all_totals"],
                sampling_tok_s=r["sampling_tok_s"], sampling_tok_s_all_slots=r["sampling_tok_s_all_slots"],
                peak_rss_mib=r["peak_rss_mib"], phases_s={k: s[k] for k in ("sampling", "reward", "logprob", "update")},
                phases_cpu_s={k: s.get(f"cpu_{k}") for k in ("sampling", "logprob", "update")},
                update_sys_cpu_s=s.get("sys_update"),
                mfu=r["mfu"], peak_gflops=r["peak_gflops"], model_gflops_per_s=r["model_gflops_per_s"],
                update_mfu=r.get("update_mfu"), update_gflops_per_s=r.get("update_gflops_per_s"),
                floor_s=r.get("floor_s"), step_over_floor=r.get("step_over_floor"),
                update_mfu_per_cpu_s=r.get("update_mfu_per_cpu_s"),
                update_mfu_per_user_cpu_s=r.get("update_mfu_per_user_cpu_s"), peak_gflop_per_cpu_s=r.get("peak_gflop_per_cpu_s"),
                peak_gflops_before_after=r.get("peak_gflops_before_after"), mean_reward=r["seconds"].get("mean_reward"),
                generated_tokens=r["seconds"].get("generated_tokens"), train_tokens=r["seconds"].get("train_tokens"),
                compile_and_first_step_s=r["compile_and_first_step_s"], load_start=r["load_start"],
                load_end=r["load_end"], wait=r["wait"], glibc_tunables=r["glibc_tunables"], heap_trims=r.get("heap_trims"))


def report(rep, args, index: int, name: str = "W1"):

    out = [f"{name}, repetition {index + 1} of {args.reps}"]
    print(out[0])
    rows = []
    for r in rep["ours"]:
        s = r["seconds"]
        rows.append([f"ours, KL {r['kl']:g}", s["total"], r.get("floor_s"), r.get("step_over_floor"), s["cpu_total"],
                     s["sampling"], s["logprob"], s["update"], r["sampling_tok_s"], r["peak_rss_mib"], r["mfu"],
                     r.get("update_mfu"), r["peak_gflops"], f"{r['load_start']} / {r['load_end']}"])
    floors = {round(float(r["kl"]), 6): r.get("floor_s") for r in rep["ours"]}
    peer = rep["peer"]
    for t in (peer or {}).get("settings", []):
        floor = floors.get(round(float(t["kl"]), 6))
        rows.append([f"TRL, KL {t['kl']:g}", t["step_s"], floor, t["step_s"] / floor if floor else "-",
                     t["cpu_s_per_step"], t["sampling_s"], "-", t["train_s"], t["sampling_tok_s"], t["peak_rss_mib"],
                     "-", "-", "-", f"{peer['load_start']} / {peer['load_end']}"])
    out.append(print_table(["run", "s/step", "floor s (our step's FLOPs at the peak)", "step / floor", "CPU s/step",
                            "sampling s", "ref logprob s", "update s",
                            "sampling tok/s", "peak RSS MiB", "step MFU", "update MFU", "matmul peak GFLOP/s",
                            "load start / end"],
                           rows))
    if rep["ratios"]:
        print()
        out.append(print_table(
            ["KL", "time ours/TRL (target <= 0.5 at KL 0.04)", "CPU time ours/TRL", "sampling tok/s ours/TRL (>= 2)",
             "peak memory ours/TRL (< 1)"],
            [[f"{x['kl']:g}", x["time"], x["cpu_time"], x["sampling"], x["memory"]] for x in rep["ratios"]]))
    info = rep["ours"][0]["machine"]
    note = (f"\nmachine: {info}; params {rep['ours'][0]['n_params']:,}, active/token "
            f"{rep['ours'][0]['active_params']:,}; our GLIBC_TUNABLES {rep['ours'][0]['glibc_tunables'] or '(none)'}; "
            f"update in {args.microbatches} accumulated microbatches; "
            f"timed steps per setting: {args.steps} (median), after a warm-up step of "
            f"{', '.join('%.1f' % r['compile_and_first_step_s'] for r in rep['ours'])} s (compiles)"
            + (f"; peer: {peer['name']}, CPU s/step = its median step x its own CPU/wall over the timed steps"
               if peer else ""))
    print(note, flush=True)
    if args.md:
        with open(args.md, "a") as f:
            f.write("\n\n".join(out) + "\n" + note + "\n")


if __name__ == "__main__":
    main()
