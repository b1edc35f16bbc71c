"""Show what a run's policy writes: sample from a checkpoint of a finished or running run.

    python -m experiments.sample --workdir runs/quickstart [--ckpt best|last|N] --prompt "12+35" [--prompt ...]
    python -m experiments.sample --workdir runs/quickstart --split validation --n 3     # held-out problems, graded
        [--k 2] [--temperature 0.7] [--raw] [--seed 0]

Each --prompt is a question put into the run's prompt template (`--raw`: the text is the whole prompt). Without
--prompt, the first --n problems of --split are shown with their gold answer and reward parts. For each prompt
the greedy answer and --k samples at --temperature are printed in full with the extracted final answer. The
policy comes from rl.runs.load_policy (read-only; without --ckpt the best policy when the run kept one, else
the last checkpoint, as experiments.eval); sampling runs on one device with the run's
sampling settings (max_new_tokens, top_p, top_k).
"""
from __future__ import annotations

import argparse
import sys

import jax

import prm
from experiments.eval import open_run, problems_of, resolve_ckpt
from rewards.parse import extract_answer
from rl.checkpoint import CheckpointError
from rl.config_validation import ConfigError
from rl.tasks.base import Problem


def main(argv: list[str] | None = None) -> int:
    prm.install()  # the PRM wing's config section, reward term and objective (a run may ask for a PRM: prm.path)
    ap = argparse.ArgumentParser(prog="python -m experiments.sample", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--ckpt", default="", help="best | last | a global unit number (default: best when the run "
                    "kept a best policy, else last)")
    ap.add_argument("--prompt", action="append", default=[], help="a question (repeat for several)")
    ap.add_argument("--raw", action="store_true", help="use each --prompt verbatim as the model's prompt")
    ap.add_argument("--split", default="validation", choices=("train", "validation", "test"))
    ap.add_argument("--n", type=int, default=3, help="problems of --split when no --prompt is given")
    ap.add_argument("--k", type=int, default=2, help="samples per prompt besides the greedy answer")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)

    try:
        which, why = resolve_ckpt(args.workdir, args.ckpt)
        ctx, params, where = open_run(args.workdir, which, split=args.split, n=0 if args.prompt else args.n)
    except (CheckpointError, ConfigError, ValueError) as e:
        print(f"sample error: {e}", file=sys.stderr)
        return 2
    print(f"checkpoint {where}" + (f"\nno --ckpt given: {why}" if why else ""))
    if args.prompt:
        probs = [Problem(id=f"prompt-{i}", question=q, answer="?", steps=None, difficulty=1, source="user")
                 for i, q in enumerate(args.prompt)]
        prompts = list(args.prompt) if args.raw else [ctx.prompt(p) for p in probs]
    else:
        probs = problems_of(ctx, args.split)[: args.n]
        prompts = [ctx.prompt(p) for p in probs]
    try:
        key = jax.random.key(args.seed)
        greedy = ctx.sample(params, prompts, [1] * len(prompts), jax.random.fold_in(key, 0), temperature=0.0)
        many = (ctx.sample(params, prompts, [args.k] * len(prompts), jax.random.fold_in(key, 1),
                           temperature=args.temperature) if args.k else None)
        texts = [[greedy.texts[i]] + (many.texts[i * args.k:(i + 1) * args.k] if many else []) for i in range(len(probs))]
        graded = not args.prompt
        scores = ctx.scorer.result(ctx.scorer.submit([t for ts in texts for t in ts],
                                                     [p for p, ts in zip(probs, texts) for _ in ts])) if graded else []
    finally:
        ctx.scorer.close()
    j = 0
    for i, (p, prompt) in enumerate(zip(probs, prompts)):
        head = f"=== {p.id}" + (f" ({args.split} {i}), gold {p.answer!r}" if graded else "")
        print(f"\n{head}\n--- prompt\n{prompt}")
        for s, text in enumerate(texts[i]):
            kind = "greedy" if s == 0 else f"sample {s} (T={args.temperature})"
            print(f"--- {kind}\n{text}\n    -> answer {extract_answer(text)!r}", end="")
            if graded:
                sc = scores[j]
                print(f", solved {int(sc['solved'] > 0.5)}, reward {sc['total']:.3f} (outcome {sc['outcome']:.1f}, "
                      f"format {sc['format']:.2f}, process {sc['process']:.2f})", end="")
            print()
            j += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
