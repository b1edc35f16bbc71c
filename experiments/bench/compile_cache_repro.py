"""Why reading the LoRA train step back from JAX's persistent compilation cache took more than 20 GB: a reproduction.

    python -m experiments.bench.compile_cache_repro --leaves 100 200 400 --json /tmp/cache_repro.json

The program is the shape of the train step's non-finite skip before it was fixed: n parameter leaves, one flag
`finite = all(isfinite(leaf) for every leaf)`, and every leaf selected by `where(finite, new, old)`. XLA's fusion
duplicates the n-input AND of the flag into each of the n select fusions, so the program holds O(n^2) instructions
(the SmolLM2 LoRA step: ~1,260 leaves, 1.6 M `and` ops, a 41 MB executable). Each size is compiled with the cache on
in a fresh process (`compile`), then read back in another fresh process (`load`); both record wall seconds and peak
RSS above the process's baseline. `--select cond` runs the fixed form (one lax.cond over the whole tree,
rl/train_step.py), whose size grows linearly.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

from rl import compile_cache


def _program(n: int, select: str):
    def step(tree):
        new = [x * 1.001 + 1.0 for x in tree]
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in new]))
        if select == "where":
            return [jnp.where(finite, a, b) for a, b in zip(new, tree)]
        return jax.lax.cond(finite, lambda: new, lambda: list(tree))

    tree = [jnp.ones((16, 8 + i % 5), jnp.float32) for i in range(n)]
    return jax.jit(step), tree


def _child(n: int, select: str, cache: str) -> dict:
    """Compile (or load from the cache) the program of n leaves in this process; seconds and peak RSS."""
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    compile_cache.enable(cache)
    fn, tree = _program(n, select)
    t0 = time.perf_counter()
    compiled = fn.lower(tree).compile()
    seconds = time.perf_counter() - t0
    jax.block_until_ready(compiled(tree))
    st = compile_cache.stats()
    return {"seconds": round(seconds, 2), "peak_rss_above_start_mib": round(
        (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, 1),
        "hlo_chars": len(compiled.as_text()), "cache_hits": st["cache_hits"]}


def run_size(n: int, select: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        out = {"leaves": n, "select": select}
        for phase in ("compile", "load"):
            cmd = [sys.executable, "-m", "experiments.bench.compile_cache_repro", "--child", str(n), select, cache]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[phase] = json.loads(res.stdout.strip().splitlines()[-1])
        files = [os.path.join(cache, f) for f in os.listdir(cache)]
        out["cache_entry_mib"] = round(max(os.path.getsize(f) for f in files) / 2**20, 2)
    return out


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leaves", type=int, nargs="+", default=[100, 200, 400])
    p.add_argument("--select", nargs="+", default=["where", "cond"], choices=["where", "cond"])
    p.add_argument("--json", default="")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(int(args.child[0]), args.child[1], args.child[2])))
        return []
    rows = []
    for select in args.select:
        for n in args.leaves:
            r = run_size(n, select)
            rows.append(r)
            print(f"{select:5s} {n:5d} leaves: compile {r['compile']['seconds']:7.1f} s, "
                  f"{r['compile']['peak_rss_above_start_mib']:7.0f} MiB; load {r['load']['seconds']:6.1f} s, "
                  f"{r['load']['peak_rss_above_start_mib']:7.0f} MiB (cache hits {r['load']['cache_hits']}); "
                  f"entry {r['cache_entry_mib']} MiB, HLO {r['compile']['hlo_chars'] / 1e6:.1f} M chars", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"jax": jax.__version__, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
