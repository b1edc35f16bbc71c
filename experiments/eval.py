"""Evaluate a run's checkpoint, finished or still running, on any split or task mix.

    python -m experiments.eval --workdir runs/quickstart --ckpt best [--split test] [--n 128] [--k 8]
        [--temperature 0.6] [--mix add:1.0] [--seed 0] [--samples 2]

Loads the policy with rl.checkpoint.load_policy (best | last | a global unit N; read-only, so a running run is not
disturbed), draws the problems from the run's own task config (or `--mix`, a task mix spec as in tasks.mix) and
evaluates them exactly as the trainer does (rl.evaluation.evaluate: greedy pass@1 with its standard error and
95 % Wilson interval, pass@k, maj@k, format rate, length; per task family for mixed problem sets). Prints a
table and writes workdir/evals/<ckpt>-<split>[-<mix>].json with the samples (prompt, response, extracted answer,
gold, reward parts) in the .samples.jsonl beside it. Runs on one device whatever the run's mesh was.
`--mix` takes any mix spec, reasoning-gym families too (`--mix "gym@countdown:1,gym@chain_sum:1"`, per-family rows
gym/countdown, gym/chain_sum; needs `pip install -e '.[gym]'`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

SPLITS = ("train", "validation", "test")


def open_run(workdir: str, ckpt: str, *, mix: str = "", split: str = "test", n: int = 0):
    """(ctx, params, checkpoint description): a RunContext of the run's config on one device with an in-process
    reward pool, the problems of `split` (n of them; `mix` replaces the run's task mix) in ctx.val / ctx.test /
    ctx.train, and the loaded policy."""
    import ml_collections

    from rl import checkpoint as ck
    from rl import config_validation as cv
    from rl import context, prefix, rollout

    cfg, _, params, _ = ck.load_policy(workdir, ckpt)
    path, step, meta = ck.find_policy(workdir, ckpt)
    cfg = {k: v for k, v in json.loads(json.dumps(cfg)).items() if k != prefix.RECORD_KEY}  # the config, not the record
    t = cfg["tasks"]
    if mix:
        t["mix"] = mix
        for key in ("train_source", "val_source", "test_source"):  # explicit split sources give way to --mix
            if key in t:
                t[key] = ""
    field = {"train": "n_train", "validation": "n_val", "test": "n_test"}[split]
    if n:
        t[field] = n
    for other in ("n_val", "n_test"):  # the evaluation splits not asked for: one problem (the stages need train)
        if other != field:
            t[other] = 1
    cfg["eval"]["n_val"], cfg["eval"]["n_test"] = t["n_val"], t["n_test"]
    cfg["mesh"] = {k: 1 for k in cfg["mesh"]}
    cfg["run"]["reward_workers"] = 0
    cv.validate(ml_collections.ConfigDict(cfg))
    ctx = context.build_context(cfg, workdir, with_services=False)
    ctx.scorer = rollout.Scorer(context.make_reward_pool(cfg))
    where = f"{path}: {ck.policy_name(meta, step)}"  # one numbering: "grpo unit 40 = checkpoint 82 (...)"
    return ctx, params, where


def problems_of(ctx, split: str):
    return {"train": ctx.train, "validation": ctx.val, "test": ctx.test}[split]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--ckpt", default="best", help="best | last | a global unit number")
    ap.add_argument("--split", default="test", choices=SPLITS)
    ap.add_argument("--n", type=int, default=0, help="problems (default: the run's count for that split)")
    ap.add_argument("--k", type=int, default=-1, help="samples per problem for pass@k / maj@k (default: the run's)")
    ap.add_argument("--temperature", type=float, default=0.0, help="of the k samples (default: the run's)")
    ap.add_argument("--mix", default="", help="a task mix spec instead of the run's tasks.mix, e.g. add:1.0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=2, help="samples per problem written to the .samples.jsonl")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    import jax

    from rl import evaluation as ev
    from rl import metrics as mlib
    from rl.checkpoint import CheckpointError
    from rl.config_validation import ConfigError
    from rl.run import summary_entry

    try:
        ctx, params, where = open_run(args.workdir, args.ckpt, mix=args.mix, split=args.split, n=args.n)
    except (CheckpointError, ConfigError, ValueError) as e:
        print(f"eval error: {e}", file=sys.stderr)
        return 2
    e = ctx.cfg["eval"]
    k = e["k"] if args.k < 0 else args.k
    temp = args.temperature or e["temperature"]
    probs = problems_of(ctx, args.split)
    print(f"checkpoint {where}\nevaluating {len(probs)} {args.split} problems of {ctx.cfg['tasks']['mix']}: greedy "
          f"+ {k} samples at T={temp}", flush=True)
    samples: list = []
    try:
        m = ev.evaluate(ctx, params, probs, jax.random.key(args.seed), k, temp, samples_out=samples,
                        n_show=args.samples)
    finally:
        ctx.scorer.close()
    entry = summary_entry(m)
    cols = ["pass@1", "pass@1_se", "pass@k", "maj@k", "format_rate", "mean_length"]
    row = {**entry, "n": m["n_problems"], "95% CI": "[{:.3f}, {:.3f}]".format(*entry["pass@1_ci95"])}
    print(mlib.format_table({f"{args.ckpt} ({args.split})": row}, cols + ["95% CI", "n"], row_header="checkpoint"))
    fams = sorted({key.split("/", 1)[1] for key in entry if key.startswith("n_problems/")})
    if fams:
        print(mlib.format_table({f: {c: entry.get(f"{c}/{f}") for c in ("pass@1", "pass@1_se", "format_rate")}
                                 for f in fams}, ["pass@1", "pass@1_se", "format_rate"], row_header="family"))
    out_dir = os.path.join(args.workdir, "evals")
    os.makedirs(out_dir, exist_ok=True)
    name = f"{args.ckpt}-{args.split}" + (f"-{re.sub(r'[^A-Za-z0-9_.@-]+', '_', args.mix)}" if args.mix else "")
    with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
        json.dump({"checkpoint": where, "split": args.split, "mix": ctx.cfg["tasks"]["mix"], "k": k,
                   "temperature": temp, "seed": args.seed, "metrics": m, "summary": entry}, f, indent=2)
    with open(os.path.join(out_dir, name + ".samples.jsonl"), "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"written {os.path.join(out_dir, name + '.json')} and {name}.samples.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
