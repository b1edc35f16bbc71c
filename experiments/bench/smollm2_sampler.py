"""Our sampler on a real pretrained model (SmolLM2-135M-Instruct, GGUF) against transformers' `generate`, one run.

    python -m experiments.bench.smollm2_sampler --json runs/bench/smollm2_sampler.json
    python -m experiments.bench.smollm2_sampler --rows 8 --new-tokens 16 --reps 1 --no-peer     # smoke run
    python -m experiments.bench.smollm2_sampler --profile 25                                    # + where decode goes

The model: `--model` (a name models.pretrained resolves, default smollm2-135m-instruct, or a .gguf file / Hugging
Face folder), loaded by models.hf.load in float32. The batch: --rows (64) chat prompts of two-digit addition (the
project's `add` generator through the model's chat template with experiments.eval's system prompt), left-padded to
one width. Timed after one warm-up (compile) call each, median of --reps:

  prefill    models.sampling.generate with max_new_tokens=1: the prefill of every prompt plus one sampled token;
             prefill tokens/s = real (unpadded) prompt tokens / seconds
  full       max_new_tokens = --new-tokens (128) at temperature 1, no top-k / top-p, eos_id=-1 (every row runs the
             full length); decode tokens/s = rows x (N - 1) / (full - prefill)

Then the peer, in the same run (unless --no-peer): experiments/bench/hf_generate_peer.py with --peer-python (a venv
with torch + transformers + gguf; default /work/venv-ref/bin/python) on the same file and the same prompt ids, timed
the same way; the script prints ours / transformers' ratios for prefill and decode (target: decode >= 2x). It never
divides by a stored figure. The 1-minute load average is printed (and written to --json) before and after each
side: the machine is shared, and a ratio is only meaningful when both sides saw the same load.
--profile N adds jax.profiler's top N XLA operations of one full call (common.trace_ops).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from experiments.bench import common
from experiments.eval import SYSTEM_PROMPT, resolve_model
from models import hf, sampling
from models.tokenizer import HFTokenizer
from rl import tasks

PEER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_generate_peer.py")


def chat_prompts(tok, rows: int, seed: int = 0) -> list[str]:
    """`rows` two-digit addition problems through the chat template, with the eval's system prompt."""
    problems = tasks.load_mix("add", n=rows, seed=seed, split="test", difficulty=2)
    return [tok.render_chat_template([{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": p.question}]) for p in problems]


def decode_rate(rows: int, new_tokens: int, full_s: float, prefill_s: float):
    """Tokens/s of the decode steps: the full call's time less the prefill call's; None when the difference is not
    positive (a tiny model, where decoding is within the prefill's noise: not measurable this way)."""
    return rows * (new_tokens - 1) / (full_s - prefill_s) if full_s > prefill_s else None


def measure_ours(params, cfg, ids, mask, tok, new_tokens: int, reps: int) -> dict:
    def run(n):
        return sampling.generate(params, cfg, ids, jax.random.key(0), prompt_mask=mask, num_samples=1,
                                 max_new_tokens=n, temperature=1.0, top_p=1.0, top_k=0, eos_id=-1, pad_id=tok.PAD)

    load = [common.load1()]
    p, p_all = common.time_call(run, 1, reps=reps)
    f, f_all = common.time_call(run, new_tokens, reps=reps)
    load.append(common.load1())
    rows, prompt_tokens = ids.shape[0], int(mask.sum())
    return {"system": f"mathrl models.sampling.generate (JAX {jax.__version__}, float32)", "rows": rows,
            "prompt_width": int(ids.shape[1]), "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
            "prefill_s": p_all, "full_s": f_all, "prefill_s_median": p, "full_s_median": f,
            "prefill_tok_per_s": prompt_tokens / p, "decode_tok_per_s": decode_rate(rows, new_tokens, f, p),
            "total_tok_per_s": rows * new_tokens / f, "load_before_after": load}


def run_peer(python: str, model_path: str, ids, mask, pad_id: int, new_tokens: int, reps: int) -> dict:
    """hf_generate_peer.py in `python`'s venv on the same prompt ids; {"error": ...} when it cannot run."""
    if not os.access(python, os.X_OK):
        return {"error": f"no peer python at {python} (a venv with torch + transformers + gguf: --peer-python)"}
    if not model_path.endswith(".gguf"):
        return {"error": f"the peer loads a .gguf file; {model_path} is not one"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"ids": np.asarray(ids).tolist(), "mask": np.asarray(mask).tolist(), "pad_id": int(pad_id)}, f)
    load = [common.load1()]
    try:
        proc = subprocess.run([python, PEER, "--gguf", model_path, "--prompts", f.name, "--new-tokens",
                               str(new_tokens), "--reps", str(reps)], capture_output=True, text=True, cwd="/")
    finally:
        os.unlink(f.name)
    load.append(common.load1())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": f"peer exited {proc.returncode}: {proc.stderr[-1500:]}"}
    return {**json.loads(lines[-1][len("RESULT "):]), "load_before_after": load}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.bench.smollm2_sampler",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a pretrained name, a .gguf file or a folder")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--new-tokens", dest="new_tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-peer", dest="peer", action="store_false")
    ap.add_argument("--peer-python", dest="peer_python", default="/work/venv-ref/bin/python")
    ap.add_argument("--wait-quiet", dest="wait_quiet", type=float, default=0.0,
                    help="wait at most this many seconds for the load average to drop before each side")
    ap.add_argument("--profile", type=int, default=0, help="print the top N XLA ops of one full call")
    common.add_json_arg(ap)
    a = ap.parse_args(argv)

    path = resolve_model(a.model)
    cfg, params = hf.load(path)
    tok = HFTokenizer.from_pretrained(path)
    ids, mask = tok.encode_batch(chat_prompts(tok, a.rows), pad_left=True, add_bos=True)
    print(f"model {path}: {cfg.n_layers} layers, d_model {cfg.d_model}, vocab {cfg.vocab_size}; {a.rows} prompts "
          f"of width {ids.shape[1]} ({int(mask.sum())} real tokens), {a.new_tokens} new tokens", flush=True)
    info = common.machine_info()
    waits = {}
    if a.wait_quiet:
        waits["ours"] = common.wait_quiet(a.wait_quiet)
    ours = measure_ours(params, cfg, ids, mask, tok, a.new_tokens, a.reps)
    peer = None
    if a.peer:
        if a.wait_quiet:
            waits["peer"] = common.wait_quiet(a.wait_quiet)
        peer = run_peer(a.peer_python, path, ids, mask, tok.PAD, a.new_tokens, a.reps)
    rows = [[ours["system"], ours["prefill_tok_per_s"], ours["decode_tok_per_s"] or "n/a", ours["full_s_median"],
             str(ours["load_before_after"])]]
    ratios = {}
    if peer and "error" not in peer:
        rows.append([peer["system"], peer["prefill_tok_per_s"], peer["decode_tok_per_s"] or "n/a", peer["full_s_median"],
                     str(peer["load_before_after"])])
        ratios = {"prefill": ours["prefill_tok_per_s"] / peer["prefill_tok_per_s"],
                  "decode": (ours["decode_tok_per_s"] / peer["decode_tok_per_s"]
                             if ours["decode_tok_per_s"] and peer["decode_tok_per_s"] else None),
                  "full_call_time": ours["full_s_median"] / peer["full_s_median"]}
    print(f"\nSmolLM2 sampling, {a.rows} rows x {a.new_tokens} new tokens ({time.strftime('%Y-%m-%d %H:%M')}, "
          f"{info['nproc']} CPUs, load {info['loadavg']})")
    common.print_table(["system", "prefill tok/s", "decode tok/s", "full call s", "load before/after"], rows)
    if ratios:
        decode = f"{ratios['decode']:.2f}x" if ratios["decode"] else "n/a"
        print(f"ours / transformers: prefill {ratios['prefill']:.2f}x, decode {decode} "
              f"(target >= 2), full-call time {ratios['full_call_time']:.2f}x")
    elif peer:
        print(f"peer: {peer['error']}")
    profile = []
    if a.profile:
        fn = jax.jit(lambda p: sampling.generate(p, cfg, ids, jax.random.key(0), prompt_mask=mask,
                                                 max_new_tokens=a.new_tokens, eos_id=-1, pad_id=tok.PAD))
        profile = common.trace_ops(fn, params, top=a.profile, reps=1)
        common.print_table(["op", "ms", "robust ms", "runs", "from"], [list(r[:4]) + [r[4][-60:]] for r in profile])
    common.write_json(a.json, {"bench": "smollm2_sampler", "model": path, "machine": info, "waits": waits,
                               "ours": ours, "peer": peer, "ratios": ratios, "profile": profile})
    return 0


if __name__ == "__main__":
    sys.exit(main())
