"""Demo of the policy: a small random-init MoE model samples K answers for a few prompts.

    python -m experiments.demo_sample                    # defaults: K=4, 48 new tokens
    python -m experiments.demo_sample --k 8 --new 64 --temperature 0.8 --top-p 0.95

The weights are random, so the text is byte noise; the point is the pipeline (tokenizer ->
left-padded batch -> jitted prefill + KV-cache decode with K samples per prompt -> decode)
and the sampling speed, printed as tokens/s (first call includes compilation; the second is
the steady state). Runs in well under a minute on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from models import sampling, transformer
from models.config import ModelConfig
from models.tokenizer import ByteTokenizer
from rl.setup import backend_kernels

PROMPTS = [
    "问题：计算 12 + 30。\n解答：\n",
    "Question: What is 7 * 8?\nSolution:\n",
    "问题：解方程 2x + 3 = 11。\n解答：\n",
]

DEMO_CONFIG = dict(
    vocab_size=ByteTokenizer.vocab_size, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
    d_ff=256, n_experts=4, experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None,
    max_seq_len=256, dtype="float32", param_dtype="float32", tie_embeddings=False,
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4, help="samples per prompt")
    ap.add_argument("--new", type=int, default=48, help="max new tokens")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    backend_kernels()  # the backend's kernels, as a run uses them (the native CPU kernels on a CPU host)

    tok = ByteTokenizer()
    cfg = ModelConfig(**DEMO_CONFIG)
    params = transformer.init(cfg, jax.random.PRNGKey(args.seed))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    ids, mask = tok.encode_batch(PROMPTS, pad_left=True)
    print(f"model: {n_params / 1e6:.2f} M parameters (random init), {cfg.n_experts} experts top-"
          f"{cfg.experts_per_token}; {len(PROMPTS)} prompts x K={args.k} samples, up to {args.new} new tokens")

    kwargs = dict(prompt_mask=mask, num_samples=args.k, max_new_tokens=args.new,
                  temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    for attempt, label in enumerate(("first call (includes compile)", "second call (compiled)")):
        key = jax.random.PRNGKey(args.seed * 1000 + attempt + 1)
        start = time.perf_counter()
        out = jax.block_until_ready(sampling.generate(params, cfg, ids, key, **kwargs))
        sec = time.perf_counter() - start
        n_tok = int(np.asarray(out.lengths).sum())
        print(f"{label}: {n_tok} tokens in {sec:.2f} s = {n_tok / sec:,.0f} tokens/s")

    texts = tok.decode_batch(out.tokens, out.lengths)
    lengths = np.asarray(out.lengths)
    logprobs = np.asarray(out.logprobs).sum(axis=1)
    for b, prompt in enumerate(PROMPTS):
        print("\n" + "=" * 60 + f"\nprompt {b}: {prompt!r}")
        for k in range(args.k):
            row = b * args.k + k
            print(f"  sample {k} ({lengths[row]} tokens, sum logprob {logprobs[row]:.1f}): {texts[row][:80]!r}")


if __name__ == "__main__":
    main()
