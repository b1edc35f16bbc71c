"""The transformers side of experiments/bench/smollm2_sampler.py: `generate` on a GGUF file, timed.

    /work/venv-ref/bin/python experiments/bench/hf_generate_peer.py --gguf FILE --prompts prompts.json \
        --new-tokens 128 --reps 3

Run with the python of a venv holding torch (CPU) + transformers + gguf, never imported by the project (it imports
only torch, transformers and the standard library). transformers dequantizes the GGUF file to float32 (as
../shared/peers/trl/trl_w1.py --gguf does); the prompts are the token ids and mask our benchmark wrote (so both
sides decode exactly the same left-padded batch). Timed, after one warm-up call each: `generate` with 1 new token
(the prefill, plus one sampled token) and with --new-tokens new tokens (min_new_tokens = max_new_tokens: every row
runs the full length, as our eos_id=-1), sampling at temperature 1 without top-k / top-p, KV cache on. Prints one
line `RESULT {json}`: the medians, prefill tokens/s and decode tokens/s (rows x (N - 1) tokens over the difference
of the two medians).

    ... hf_generate_peer.py --gguf FILE --prompts prompts.json --serve

--serve: the same model and batch, timed on request, so the benchmark can interleave its own calls with these
(both sides then see the same load on a shared machine). Prints `READY {json}` (the system, the load time) once the
model is loaded, then for each line `N` read from stdin runs `generate` with N new tokens and prints `TIME seconds`;
exits at the end of stdin. The caller does its own warm-up calls.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import transformers


def timed(fn, reps: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompts", required=True, help="JSON file {'ids': [[...]], 'mask': [[...]], 'pad_id': int}")
    ap.add_argument("--new-tokens", dest="new_tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--serve", action="store_true", help="time generate calls asked for on stdin (see above)")
    a = ap.parse_args(argv)

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    folder, name = os.path.dirname(os.path.abspath(a.gguf)), os.path.basename(a.gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    load_s = time.perf_counter() - t0
    spec = json.load(open(a.prompts))
    ids = torch.tensor(spec["ids"], dtype=torch.long)
    mask = torch.tensor(spec["mask"], dtype=torch.long)
    rows, width = ids.shape

    def run(n):
        kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                  use_cache=True, pad_token_id=spec["pad_id"])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        assert out.shape == (rows, width + n), out.shape

    system = (f"transformers {transformers.__version__} generate (torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, float32, KV cache)")
    torch.manual_seed(0)
    if a.serve:
        print("READY " + json.dumps({"system": system, "load_s": load_s}), flush=True)
        for line in sys.stdin:
            t0 = time.perf_counter()
            run(int(line))
            print(f"TIME {time.perf_counter() - t0}", flush=True)
        return 0
    prefill = timed(lambda: run(1), a.reps)
    full = timed(lambda: run(a.new_tokens), a.reps)
    p, f = statistics.median(prefill), statistics.median(full)
    result = {
        "system": system,
        "rows": rows, "prompt_width": width, "prompt_tokens": int(mask.sum()), "new_tokens": a.new_tokens,
        "load_s": load_s, "prefill_s": prefill, "full_s": full, "prefill_s_median": p, "full_s_median": f,
        "prefill_tok_per_s": int(mask.sum()) / p,
        "decode_tok_per_s": rows * (a.new_tokens - 1) / (f - p) if f > p else None,  # None: not measurable (as the bench's own side)
        "total_tok_per_s": rows * a.new_tokens / f,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
