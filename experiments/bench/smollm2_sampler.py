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

The peer, in the same run (unless --no-peer): experiments/bench/hf_generate_peer.py --serve with --peer-python (a
venv with torch + transformers + gguf; default /work/venv-ref/bin/python) on the same file and the same prompt ids,
timed the same way. The two sides' calls alternate (ours prefill, its prefill, ours full, its full, per repetition),
so on a shared machine both see the same load; the script prints ours / transformers' ratios for prefill and decode
(target: decode >= 2x), from the medians and from each side's fastest calls. It never divides by a stored figure.
The 1-minute load average before and after is printed and written to --json.
--profile N adds jax.profiler's top N XLA operations of one full call (common.trace_ops).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
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


OURS_SYSTEM = f"mathrl models.sampling.generate (JAX {jax.__version__}, float32)"


def ratio(ours, peer):
    return ours / peer if ours and peer else None


def summarize(system: str, ids, mask, new_tokens: int, prefill_s: list, full_s: list) -> dict:
    """One side's figures from its timings: medians, and tokens/s from the medians (and from the best calls)."""
    rows, prompt_tokens = ids.shape[0], int(mask.sum())
    p, f = statistics.median(prefill_s), statistics.median(full_s)
    return {"system": system, "rows": rows, "prompt_width": int(ids.shape[1]), "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens, "prefill_s": prefill_s, "full_s": full_s, "prefill_s_median": p,
            "full_s_median": f, "prefill_tok_per_s": prompt_tokens / p,
            "decode_tok_per_s": decode_rate(rows, new_tokens, f, p), "total_tok_per_s": rows * new_tokens / f,
            "decode_tok_per_s_best": decode_rate(rows, new_tokens, min(full_s), min(prefill_s))}


def ours_call(params, cfg, ids, mask, tok):
    """n -> seconds of one models.sampling.generate call with n new tokens (T 1, no filters, no EOS)."""

    def call(n):
        t0 = time.perf_counter()
        common.block(sampling.generate(params, cfg, ids, jax.random.key(0), prompt_mask=mask, num_samples=1,
                                       max_new_tokens=n, temperature=1.0, top_p=1.0, top_k=0, eos_id=-1,
                                       pad_id=tok.PAD))
        return time.perf_counter() - t0

    return call


def start_peer(python: str, model_path: str, ids, mask, pad_id: int, new_tokens: int, script: str = PEER):
    """(process, its READY record) of `script --serve` (hf_generate_peer.py) in `python`'s venv on the same prompt
    ids, or (None, {"error": ...}) when it cannot start."""
    if not os.access(python, os.X_OK):
        return None, {"error": f"no peer python at {python} (a venv with torch + transformers + gguf: --peer-python)"}
    if not model_path.endswith(".gguf"):
        return None, {"error": f"the peer loads a .gguf file; {model_path} is not one"}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"ids": np.asarray(ids).tolist(), "mask": np.asarray(mask).tolist(), "pad_id": int(pad_id)}, f)
    err = tempfile.TemporaryFile("w+")  # not a pipe: a chatty stderr must not block the peer
    proc = subprocess.Popen([python, script, "--gguf", model_path, "--prompts", f.name, "--new-tokens",
                             str(new_tokens), "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=err, text=True, cwd="/")
    try:
        ready = next((ln for ln in proc.stdout if ln.startswith("READY ")), None)
    finally:
        os.unlink(f.name)
    if ready is None:
        proc.wait()
        err.seek(0)
        return None, {"error": f"peer exited {proc.returncode}: {err.read()[-1500:]}"}
    return proc, json.loads(ready[len("READY "):])


def peer_call(proc):
    """n -> seconds of one `generate` call with n new tokens in the serving peer (its own timer)."""
    def call(n):
        proc.stdin.write(f"{n}\n")
        proc.stdin.flush()
        line = next((ln for ln in proc.stdout if ln.startswith("TIME ")), None)
        if line is None:
            raise RuntimeError(f"peer exited {proc.wait()} during a {n}-token call")
        return float(line[len("TIME "):])

    return call


def measure_interleaved(calls: dict, new_tokens: int, reps: int) -> tuple[dict, list, dict]:
    """Times every side's prefill (1 new token) and full (new_tokens) calls, alternating sides call by call, after
    one warm-up (compile) call of each: {side: ([prefill s], [full s])}, the load before / after, and {side: error}
    for a side that failed (it is dropped; the others go on)."""
    times = {side: ([], []) for side in calls}
    errors = {}

    def each_side(fn):
        for side in list(calls):
            try:
                fn(side)
            except (RuntimeError, OSError, ValueError) as e:  # the peer process died or spoke nonsense
                errors[side] = f"{type(e).__name__}: {e}"
                calls.pop(side)
                times.pop(side)

    each_side(lambda side: (calls[side](1), calls[side](new_tokens)))
    load = [common.load1()]
    for rep in range(reps):
        for i, n in enumerate((1, new_tokens)):
            each_side(lambda side: times[side][i].append(calls[side](n)))
        print(f"repetition {rep + 1}: " + ", ".join(f"{side} {p[-1]:.2f} s + {f[-1]:.2f} s"
                                                    for side, (p, f) in times.items()), flush=True)
    load.append(common.load1())
    return times, load, errors


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
                    help="wait at most this many seconds for the load average to drop before measuring")
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
    waits = {"both": common.wait_quiet(a.wait_quiet)} if a.wait_quiet else {}
    calls = {"ours": ours_call(params, cfg, ids, mask, tok)}
    peer, proc = None, None
    if a.peer:
        proc, ready = start_peer(a.peer_python, path, ids, mask, tok.PAD, a.new_tokens)
        if proc is None:
            peer = ready
        else:
            calls["peer"] = peer_call(proc)
    try:
        times, load, errors = measure_interleaved(calls, a.new_tokens, a.reps)
    finally:
        if proc is not None:
            proc.stdin.close()
            proc.wait()
    if "ours" in errors:
        raise RuntimeError(errors["ours"])
    ours = {**summarize(OURS_SYSTEM, ids, mask, a.new_tokens, *times["ours"]), "load_before_after": load}
    if "peer" in times:
        peer = {**summarize(ready["system"], ids, mask, a.new_tokens, *times["peer"]), "load_s": ready["load_s"],
                "load_before_after": load}
    elif proc is not None:
        peer = {"error": errors.get("peer", "peer failed")}
    rows = [[ours["system"], ours["prefill_tok_per_s"], ours["decode_tok_per_s"] or "n/a", ours["full_s_median"]]]
    ratios = {}
    if peer and "error" not in peer:
        rows.append([peer["system"], peer["prefill_tok_per_s"], peer["decode_tok_per_s"] or "n/a",
                     peer["full_s_median"]])
        ratios = {"prefill": ours["prefill_tok_per_s"] / peer["prefill_tok_per_s"],
                  "decode": ratio(ours["decode_tok_per_s"], peer["decode_tok_per_s"]),
                  "full_call_time": ours["full_s_median"] / peer["full_s_median"],
                  "decode_best_calls": ratio(ours["decode_tok_per_s_best"], peer["decode_tok_per_s_best"])}
    print(f"\nSmolLM2 sampling, {a.rows} rows x {a.new_tokens} new tokens ({time.strftime('%Y-%m-%d %H:%M')}, "
          f"{info['nproc']} CPUs, load {info['loadavg']})")
    common.print_table(["system", "prefill tok/s", "decode tok/s", "full call s, median"], rows)
    print(f"calls alternating between the sides; load before / after: {load}")
    if ratios:
        fmt = lambda r: f"{r:.2f}x" if r else "n/a"  # noqa: E731
        print(f"ours / transformers: prefill {ratios['prefill']:.2f}x, decode {fmt(ratios['decode'])} "
              f"(target >= 2; {fmt(ratios['decode_best_calls'])} from each side's fastest calls), "
              f"full-call time {ratios['full_call_time']:.2f}x")
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
