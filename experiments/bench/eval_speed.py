"""A recipe's evaluation, timed: static against continuous batching, float32 against bfloat16 sampling, one run.

    python -m experiments.bench.eval_speed --json experiments/bench/results/eval_speed_latest.json   # ~15 min
    python -m experiments.bench.eval_speed --config experiments/configs/smollm2_grpo.py:variant=tiny --quick

The workload is the run's own evaluation of its initial policy (rl.run's Loop.evaluate): for smollm2_grpo.py 32
validation + 256 test problems, each a greedy answer and 4 samples at T 0.7, up to 128 new tokens, through the
recipe's chat template, sampler slots (sampling.batch_rows) and reward pool. Each setting (sampling.batching x
sampling.dtype) runs in its own process, twice: the first evaluation includes compiling the sampler, the second is
warm. Reported per setting: seconds of each evaluation, generated tokens (real ones, up to each answer's end) per
second of sampling, and the pass@1 it measured (the settings sample different random streams and precisions, so
pass@1 agrees within its standard error, not digit for digit). Ratios are against the static float32 setting of the
same run.
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

from experiments import launch
from experiments.bench import common
from rl import config_validation as cv
from rl import context, evaluation, rollout

SETTINGS = (("static", "float32"), ("continuous", "float32"), ("continuous", "bfloat16"))


def _child(config: str, batching: str, dtype: str, quick: bool) -> dict:
    c = launch.get_config(config)
    c.sampling.update(dict(batching=batching, dtype="" if dtype == "float32" else dtype))
    c.run.compile_cache = "off"
    if quick:
        c.eval.update(dict(n_val=4, n_test=8))
    cfg = cv.validate(c)
    with tempfile.TemporaryDirectory() as work:
        ctx = context.build_context(cfg, work)
        try:
            params = ctx.policy_weights(ctx.init_params())
            sampled = {"tokens": 0, "seconds": 0.0}
            inner = rollout.sample

            def timed(*a, **kw):  # counts the sampler's seconds and real tokens inside the evaluation
                t0 = time.perf_counter()
                out = inner(*a, **kw)
                sampled["seconds"] += time.perf_counter() - t0
                sampled["tokens"] += int(out.lengths.sum())
                return out

            rollout.sample = timed
            runs = []
            for rep in range(2):
                sampled.update(tokens=0, seconds=0.0)
                t0, res = time.perf_counter(), {}
                for j, (split, probs) in enumerate((("validation", ctx.val[:cfg.eval.n_val]),
                                                    ("test", ctx.test[:cfg.eval.n_test]))):
                    key = jax.random.fold_in(ctx.key("eval", 1, 0), j)
                    res[split] = evaluation.evaluate(ctx, params, probs, key, cfg.eval.k, cfg.eval.temperature)
                runs.append({"seconds": round(time.perf_counter() - t0, 1),
                             "sample_seconds": round(sampled["seconds"], 1), "tokens": sampled["tokens"],
                             "tokens_per_s": round(sampled["tokens"] / max(sampled["seconds"], 1e-9), 1),
                             "test_pass@1": res["test"]["pass@1"], "test_pass@k": res["test"].get("pass@k")})
            rollout.sample = inner
        finally:
            ctx.close()
    return {"batching": batching, "dtype": dtype, "slots": cfg.sampling.batch_rows, "cold": runs[0], "warm": runs[1],
            "problems": cfg.eval.n_val + cfg.eval.n_test, "k": cfg.eval.k}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m experiments.bench.eval_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="experiments/configs/smollm2_grpo.py")
    ap.add_argument("--quick", action="store_true", help="4 + 8 problems (smoke run)")
    ap.add_argument("--settings", nargs="+", default=[f"{b}/{d}" for b, d in SETTINGS],
                    help="batching/dtype pairs, e.g. continuous/float32")
    ap.add_argument("--json", default="")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(_child(a.config, a.child[0], a.child[1], a.quick)), flush=True)
        return {}
    info = common.machine_info()
    rows = []
    for setting in a.settings:
        batching, dtype = setting.split("/")
        cmd = [sys.executable, "-m", "experiments.bench.eval_speed", "--config", a.config, "--child", batching, dtype,
               "x"] + (["--quick"] if a.quick else [])
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=os.getcwd())
        line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{setting} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
        rows.append(json.loads(line[len("RESULT "):]))
        r = rows[-1]
        print(f"{setting:22s} cold {r['cold']['seconds']:7.1f} s, warm {r['warm']['seconds']:7.1f} s "
              f"(sampling {r['warm']['sample_seconds']:.1f} s, {r['warm']['tokens_per_s']:.0f} tok/s), "
              f"test pass@1 {r['warm']['test_pass@1']:.3f}", flush=True)
    base = next((r for r in rows if (r["batching"], r["dtype"]) == ("static", "float32")), None)
    if base:
        for r in rows:
            r["warm_speedup"] = round(base["warm"]["seconds"] / r["warm"]["seconds"], 2)
            r["tokens_per_s_ratio"] = round(r["warm"]["tokens_per_s"] / base["warm"]["tokens_per_s"], 2)
    out = {"config": a.config, "machine": info, "rows": rows}
    common.print_table(["sampler", "eval s (cold)", "eval s (warm)", "tok/s", "x static f32", "test pass@1"],
                       [[f"{r['batching']} / {r['dtype']}", r["cold"]["seconds"], r["warm"]["seconds"],
                         r["warm"]["tokens_per_s"], r.get("tokens_per_s_ratio"), r["warm"]["test_pass@1"]]
                        for r in rows])
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
