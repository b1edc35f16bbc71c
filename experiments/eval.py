"""Evaluate a run's checkpoint, finished or still running, on any split or task mix.

    python -m experiments.eval --workdir runs/quickstart [--ckpt best|last|N] [--split test] [--n 128] [--k 8]
        [--temperature 0.6] [--mix add:1.0] [--seed 0] [--samples 2]

Loads the policy with rl.runs.load_policy (best | last | a global unit N; without --ckpt the best policy when
the run kept one and the last checkpoint otherwise, saying which: `resolve_ckpt`; read-only, so a running run is not
disturbed), draws the problems from the run's own task config (or `--mix`, a task mix spec as in tasks.mix) and
evaluates them exactly as the trainer does (rl.evaluation.evaluate: greedy pass@1 with its standard error and
95 % Wilson interval, pass@k, maj@k, format rate, length; per task family for mixed problem sets). Prints a
table and writes workdir/evals/<ckpt>-<split>[-<mix>][-tools].json with the samples (prompt, response, extracted
answer, gold, reward parts) in the .samples.jsonl beside it. The table is rl.metrics.results_table's (pass@k and
maj@k only when k > 0, headed with their sampling temperature; words when n < 64). Runs on one device whatever
the run's mesh was.
`--tools` draws every answer, greedy and k-sample, with the sandboxed Python tool (docs/tools.md;
`--max-turns`, `--tool-output-tokens`, `--tool-timeout` as a stage's `tools` section): pass@1 and pass@k then are
the tool-using ones, pass@1_no_tools the plain greedy one, with the tool metrics (calls per answer, errors) beside
them, and each tool answer's record lists its turns. `--mix` takes any mix spec, reasoning-gym families too
(`--mix "gym@countdown:1,gym@chain_sum:1"`, per-family rows gym/countdown, gym/chain_sum; needs
`pip install -e '.[gym]'`).

A pretrained model, no run directory (a named model, a .gguf file or a Hugging Face folder):

    python -m experiments.eval --model smollm2-135m-instruct --mix add --difficulty 2 --n 256 --k 4 \
        --temperature 0.8 --max-new-tokens 256 --out runs/eval_smollm2/add

The problems come from `--mix` (any task mix: add, word, word_zh, gsm8k@FILE, ...; `--lang` sets the reward's and
the prompts' language), each prompt is a system turn asking for steps and a final `Answer:` line plus the question
as the user turn, through the checkpoint's chat template; the table is the same, and --out receives summary.json
and samples.jsonl. `python -m experiments.eval --write-gsm8k FILE --n 256` writes a GSM8K-format JSONL file
(question, reasoning lines, `#### answer`) from the project's English word-problem generator, for `gsm8k@FILE`.

With the Python tool (the same rl.evaluation code path as a run whose RL stage has `tools`; the system turn is then
rewards.python_tool.TOOL_SYSTEM_PROMPT, which shows the call markers and one example, unless --system is given):

    python -m experiments.eval --model smollm2-135m-instruct --mix tool_mul --difficulty 3 --tools --max-turns 2 \
        --n 32 --k 0 --max-new-tokens 128 --out runs/eval_smollm2/tool_mul
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import jax

import prm
from models import hf, pretrained
from models.tokenizer import HFTokenizer
from rewards.python_tool import TOOL_SYSTEM_PROMPT, chat_markers
from rl import config_validation as cv
from rl import compile_cache, context, rollout, runs, setup, tasks
from rl import evaluation as ev
from rl import metrics as mlib
from rl.checkpoint import CheckpointError
from rl.config_validation import ConfigError
from rl.run import summary_entry
from rl.tasks.render import ANSWER_LINE_SYSTEM_PROMPT
from rl.tool_rollout import ToolsConfig

SPLITS = ("train", "validation", "test")


def resolve_ckpt(workdir: str, ckpt: str = "") -> tuple[str, str]:
    """(which checkpoint, why): `ckpt` as given; none given, "best" when the run kept a best policy
    (rl.runs.find_policy finds one), else "last", the reason saying which and why."""
    if ckpt:
        return ckpt, ""
    try:
        runs.find_policy(workdir, "best")
        return "best", "the best policy by validation pass@1 (--ckpt last takes the newest checkpoint)"
    except CheckpointError:
        return "last", ("the last checkpoint, since the run kept no best policy (checkpoint.keep_best off, or no "
                        "validation evaluation yet)")


def open_run(workdir: str, ckpt: str, *, mix: str = "", split: str = "test", n: int = 0):
    """(ctx, params, checkpoint description): a RunContext of the run's config on one device with an in-process
    reward pool, the problems of `split` (n of them; `mix` replaces the run's task mix) in ctx.val / ctx.test /
    ctx.train, and the loaded policy."""
    cfg, _, params, _ = runs.load_policy(workdir, ckpt)
    path, step, meta = runs.find_policy(workdir, ckpt)
    compile_cache.enable(cfg.run.compile_cache)  # the run's programs, or a previous eval's, read back
    t = cfg.tasks
    # --mix replaces the run's mix and its explicit split sources; the evaluation split not asked for gets one
    # problem (the stages need train)
    tasks = dict(mix=mix, train_source="", val_source="", test_source="") if mix else {}
    field = {"train": "n_train", "validation": "n_val", "test": "n_test"}[split]
    counts = {other: 1 for other in ("n_val", "n_test") if other != field}
    counts[field] = n or getattr(t, field)
    ev = cfg.eval.replace(n_val=counts["n_val"], n_test=counts["n_test"])
    cfg = cfg.replace(tasks=t.replace(**tasks, **counts), eval=ev, mesh=cv.MeshSection(),
                      run=cfg.run.replace(reward_workers=0))
    ctx = context.build_context(cfg, workdir, with_services=False)
    ctx.scorer = rollout.Scorer(setup.make_reward_pool(cfg))
    where = f"{path}: {runs.policy_name(meta, step)}"  # one numbering: "grpo unit 40 = checkpoint 82 (...)"
    return ctx, params, where


def problems_of(ctx, split: str):
    return {"train": ctx.train, "validation": ctx.val, "test": ctx.test}[split]


# ---- a pretrained model without a run ----------------------------------------------------------------------------
SYSTEM_PROMPT = ANSWER_LINE_SYSTEM_PROMPT


def resolve_model(spec: str) -> str:
    """A .gguf file or a Hugging Face folder: `spec` itself when it exists, else the named pretrained model's file
    (models.pretrained). ValueError naming the spec otherwise."""
    if os.path.exists(spec):
        return spec
    return str(pretrained.resolve(spec))


def open_pretrained(path: str, *, mix: str, n: int, lang: str = "en", difficulty: int = 1, max_new_tokens: int = 256,
                    max_prompt_len: int = 0, batch_rows: int = 64, seed: int = 0, out_dir: str = "",
                    system: str = SYSTEM_PROMPT):
    """(ctx, params): a RunContext on one device over n test problems of `mix` with the model at `path` (its
    weights by models.hf.load, its tokenizer and chat template by HFTokenizer.from_pretrained) and an in-process
    reward pool; the evaluation settings are a default run config's with these fields set. The sampler pads every
    prompt to max_prompt_len (0: the longest prompt's length rounded up to 32)."""
    cfg = cv.RunConfig(seed=seed, model=cv.ModelSection(hf_path=path, system_prompt=system),
                       run=cv.RunSection(reward_workers=0),
                       tasks=cv.TasksSection(mix=mix, lang=lang, difficulty=difficulty, n_test=n, n_val=1, n_train=1,
                                             max_prompt_len=max_prompt_len or 4096),
                       sampling=cv.SamplingSection(max_new_tokens=max_new_tokens, batch_rows=batch_rows))
    compile_cache.enable(cfg.run.compile_cache)  # a second evaluation of the model reads its programs back
    model_cfg, params = hf.load(path)
    tok = HFTokenizer.from_pretrained(path)
    if tok.chat_template is None:
        raise ValueError(f"{path}: no chat template")
    _, _, test = setup.load_problems(cfg)
    ctx = context.RunContext(cfg=cfg, workdir=out_dir, model_cfg=model_cfg, tok=tok, mesh=None, rules=None,
                            row_multiple=1, train=[], val=[], test=list(test))
    lengths = [len(tok.encode(ctx.prompt(p))) for p in ctx.test]
    if not max_prompt_len:  # the sampler pads every prompt to tasks.max_prompt_len: keep it tight
        max_prompt_len = -(-max(lengths) // 32) * 32
        ctx.cfg = cfg.replace(tasks=cfg.tasks.replace(max_prompt_len=max_prompt_len))
    too_long = [p for p, n in zip(ctx.test, lengths) if n > max_prompt_len]
    if too_long:
        raise ValueError(f"--max-prompt-len ({max_prompt_len}) is too small for {len(too_long)} prompts, e.g. "
                         f"{too_long[0].question[:80]!r}")
    if max_prompt_len + max_new_tokens > model_cfg.max_seq_len:
        raise ValueError(f"--max-new-tokens ({max_new_tokens}) + the prompt width ({max_prompt_len}) exceed the "
                         f"model's context ({model_cfg.max_seq_len})")
    ctx.scorer = rollout.Scorer(setup.make_reward_pool(cfg))
    return ctx, params


def write_gsm8k_file(path: str, n: int, seed: int = 0, difficulty: int = 1) -> int:
    """n English template word problems (rl.tasks `word`) as GSM8K JSONL lines: {"question", "answer": reasoning
    lines + "\n#### <answer>"}; returns n."""
    problems = tasks.load_mix("word", n=n, seed=seed, split="test", difficulty=difficulty)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for p in problems:
            steps = "\n".join(p.steps or ())
            f.write(json.dumps({"question": p.question, "answer": f"{steps}\n#### {p.answer}".lstrip()},
                               ensure_ascii=False) + "\n")
    return len(problems)


def tools_config(args) -> ToolsConfig | None:
    """The --tools flags as a stage's tools section (None without --tools); FieldErrors names a bad value."""
    if not args.tools:
        return None
    return ToolsConfig(kind="python", max_turns=args.max_turns, max_output_tokens=args.tool_output_tokens,
                       timeout_s=args.tool_timeout)


TOOL_COLUMNS = ("pass@1_tools", "pass@1_tools_se", "pass@1_no_tools", "tools/calls_per_sample",
                "tools/samples_with_call", "tools/errors", "tools/tokens")


def print_metrics(label: str, m: dict, temperature: float) -> dict:
    """Print the pass@1 +- SE [95 % interval] / pass@k / maj@k table (rl.metrics.results_table: pass@k only when
    k > 0, with its temperature; and per family, and with tools the tool columns) of evaluate's metrics; returns
    the summary entry."""
    entry = summary_entry(m)
    print(mlib.results_table({label: entry}, int(m["k"]), temperature, row_header="checkpoint"))
    fams = sorted({key.split("/", 1)[1] for key in entry if key.startswith("n_problems/")})
    if fams:
        print(mlib.format_table({f: {c: entry.get(f"{c}/{f}") for c in ("pass@1", "pass@1_se", "format_rate")}
                                 for f in fams}, ["pass@1", "pass@1_se", "format_rate"], row_header="family"))
    if "pass@1_tools" in m:
        print(mlib.format_table({label: {c: m[c] for c in TOOL_COLUMNS}}, list(TOOL_COLUMNS), row_header="with tools"))
    return entry


def main_pretrained(args) -> int:
    """--model: evaluate a pretrained model on args.mix (see the module docstring)."""
    t0 = time.perf_counter()
    try:
        tools = tools_config(args)
        system = args.system if args.system is not None else TOOL_SYSTEM_PROMPT if tools else SYSTEM_PROMPT
        path = resolve_model(args.model)
        ctx, params = open_pretrained(path, mix=args.mix or "add", n=args.n or 256, lang=args.lang,
                                      difficulty=args.difficulty, max_new_tokens=args.max_new_tokens,
                                      max_prompt_len=args.max_prompt_len, batch_rows=args.batch_rows, seed=args.seed,
                                      out_dir=args.out, system=system)
        if tools:  # the tool turn's markers render now (bounded, models/chat_template.py), not mid-evaluation
            chat_markers(ctx.tok)
    except (OSError, ValueError) as e:  # FieldErrors is a ValueError; chat_template.TemplateLimit is one too
        print(f"eval error: {e}", file=sys.stderr)
        return 2
    k = max(args.k, 0)
    temp = args.temperature or 1.0
    print(f"model {path}\nevaluating {len(ctx.test)} test problems of {ctx.cfg.tasks.mix} (difficulty "
          f"{args.difficulty}, lang {args.lang}): greedy + {k} samples at T={temp}, up to {args.max_new_tokens} new "
          f"tokens" + (f"; then greedy with the Python tool (up to {tools.max_turns} calls)" if tools else ""),
          flush=True)
    samples: list = []
    try:
        m = ev.evaluate(ctx, params, ctx.test, jax.random.key(args.seed), k, temp, samples_out=samples,
                        n_show=max(args.samples, k, 1 if tools else 0), tools=tools)
    finally:
        ctx.scorer.close()
    entry = print_metrics(f"{os.path.basename(path.rstrip('/'))} ({ctx.cfg.tasks.mix})", m, temp)
    wall = time.perf_counter() - t0
    print(f"wall time {wall:.0f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump({"model": path, "mix": ctx.cfg.tasks.mix, "difficulty": args.difficulty, "lang": args.lang,
                       "system": ctx.cfg.model.system_prompt, "k": k, "temperature": temp, "seed": args.seed,
                       "max_new_tokens": args.max_new_tokens, "tools": tools.to_dict() if tools else None,
                       "wall_seconds": wall, "metrics": m, "summary": entry},
                      f, indent=2)
        with open(os.path.join(args.out, "samples.jsonl"), "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(s, ensure_ascii=False) + "\n")
        print(f"written {os.path.join(args.out, 'summary.json')} and samples.jsonl")
    return 0


def main(argv: list[str] | None = None) -> int:
    prm.install()  # the PRM wing's config section, reward term and objective (a run may ask for a PRM: prm.path)
    ap = argparse.ArgumentParser(prog="python -m experiments.eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", help="a run directory (or --model)")
    ap.add_argument("--model", default="", help="a pretrained model instead of a run: a name (smollm2-135m-instruct), "
                    "a .gguf file or a Hugging Face folder")
    ap.add_argument("--ckpt", default="", help="best | last | a global unit number (default: best when the run "
                    "kept a best policy, else last)")
    ap.add_argument("--split", default="test", choices=SPLITS)
    ap.add_argument("--n", type=int, default=0, help="problems (default: the run's count for that split)")
    ap.add_argument("--k", type=int, default=-1, help="samples per problem for pass@k / maj@k (default: the run's)")
    ap.add_argument("--temperature", type=float, default=0.0, help="of the k samples (default: the run's)")
    ap.add_argument("--mix", default="", help="a task mix spec instead of the run's tasks.mix, e.g. add:1.0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=2, help="samples per problem written to the .samples.jsonl")
    pre = ap.add_argument_group("with --model")
    pre.add_argument("--out", default="", help="folder for summary.json and samples.jsonl")
    pre.add_argument("--lang", default="en", choices=("en", "zh"), help="the answers' language (reward, metrics)")
    pre.add_argument("--difficulty", type=int, default=2, help="of generated families (add: digits)")
    pre.add_argument("--system", default=None, help="the system turn (default: SYSTEM_PROMPT, with --tools "
                     "TOOL_SYSTEM_PROMPT; '' = none: the user turn then carries the layout instruction, as in a run "
                     "without model.system_prompt)")
    pre.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=256)
    pre.add_argument("--max-prompt-len", dest="max_prompt_len", type=int, default=0,
                     help="prompt width in tokens (every prompt is padded to it; 0: the longest, rounded up to 32)")
    pre.add_argument("--batch-rows", dest="batch_rows", type=int, default=64, help="rows per sampler call")
    pre.add_argument("--write-gsm8k", dest="write_gsm8k", default="",
                     help="write --n GSM8K-format problems from the word generator to this JSONL file and exit")
    tl = ap.add_argument_group("the Python tool (docs/tools.md)")
    tl.add_argument("--tools", action="store_true", help="also evaluate greedy answers that may call the tool")
    tl.add_argument("--max-turns", dest="max_turns", type=int, default=2, help="tool calls allowed per answer")
    tl.add_argument("--tool-output-tokens", dest="tool_output_tokens", type=int, default=32,
                    help="tokens of one tool output (markers included; they count against the new tokens)")
    tl.add_argument("--tool-timeout", dest="tool_timeout", type=float, default=5.0, help="seconds per tool call")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    if args.write_gsm8k:
        print(f"wrote {write_gsm8k_file(args.write_gsm8k, args.n or 256, args.seed)} problems to {args.write_gsm8k}")
        return 0
    if bool(args.model) == bool(args.workdir):
        ap.error("give exactly one of --workdir and --model")
    if args.model:
        return main_pretrained(args)

    try:
        tools = tools_config(args)
        which, why = resolve_ckpt(args.workdir, args.ckpt)
        ctx, params, where = open_run(args.workdir, which, mix=args.mix, split=args.split, n=args.n)
    except (CheckpointError, ConfigError, ValueError) as e:
        print(f"eval error: {e}", file=sys.stderr)
        return 2
    e = ctx.cfg.eval
    k = e.k if args.k < 0 else args.k
    temp = args.temperature or e.temperature
    probs = problems_of(ctx, args.split)
    print(f"checkpoint {where}" + (f"\nno --ckpt given: {why}" if why else ""))
    print(f"evaluating {len(probs)} {args.split} problems of {ctx.cfg.tasks.mix}: greedy"
          + (f" + {k} samples at T={temp}" if k > 0 else " only (--k 0)"), flush=True)
    samples: list = []
    try:
        m = ev.evaluate(ctx, params, probs, jax.random.key(args.seed), k, temp, samples_out=samples,
                        n_show=args.samples, tools=tools)
    finally:
        ctx.scorer.close()
    entry = print_metrics(f"{which} ({args.split})", m, temp)
    out_dir = os.path.join(args.workdir, "evals")
    os.makedirs(out_dir, exist_ok=True)
    name = f"{which}-{args.split}" + (f"-{re.sub(r'[^A-Za-z0-9_.@-]+', '_', args.mix)}" if args.mix else "")
    name += "-tools" if tools else ""
    with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
        json.dump({"checkpoint": where, "split": args.split, "mix": ctx.cfg.tasks.mix, "k": k,
                   "temperature": temp, "seed": args.seed, "tools": tools.to_dict() if tools else None, "metrics": m,
                   "summary": entry}, f, indent=2)
    with open(os.path.join(out_dir, name + ".samples.jsonl"), "w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(f"written {os.path.join(out_dir, name + '.json')} and {name}.samples.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
