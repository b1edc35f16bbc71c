"""Helpers shared by the experiment config files.

    arg = parse_arg("variant=tiny,seed=3")     # {"variant": "tiny", "seed": 3}
    c = base_config(arg)                        # every section at its defaults, seed applied
    c.stages = [stage("sft", "cold_start", epochs=2), stage("grpo", "grpo", iterations=50)]

`stage` and `default_config` come from rl/config_validation.py, where every field's default and
meaning are listed (`python -m experiments.launch --help_config` prints them).
"""
from __future__ import annotations

import ast

from rl.config_validation import ConfigError, default_config, stage  # noqa: F401  (re-exported for config files)

SMALL_MOE = dict(  # the quickstart policy: 2 layers, d_model 64, 4 experts top-2 in every layer, byte vocabulary
    vocab_size=259, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
    n_experts=4, experts_per_token=2, moe_every=1, n_shared_experts=0, max_seq_len=96,
)

TWO_DIGIT_ADDITION = dict(  # English-format two-digit addition with column steps; ~58 tokens per solution
    mix="add:1.0", lang="en", difficulty=2, n_train=2000, n_val=64, n_test=128, max_prompt_len=32,
)

TINY_MODEL = dict(  # a few-thousand-parameter MoE for tests: fast to compile and run on one CPU core
    vocab_size=259, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
    n_experts=4, experts_per_token=2, moe_every=1, n_shared_experts=0, max_seq_len=64,
)


def parse_arg(arg: str | None, allowed: dict[str, object] | None = None) -> dict:
    """'variant=tiny,seed=3' -> {"variant": "tiny", "seed": 3}; values parsed as literals when they can be.

    `allowed` maps each accepted key to its default; unknown keys raise ConfigError.
    """
    out = dict(allowed or {})
    if not arg:
        return out
    for part in arg.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ConfigError(f"config arg {part!r} must look like key=value (e.g. variant=tiny,seed=3)")
        k, v = (x.strip() for x in part.split("=", 1))
        if allowed is not None and k not in allowed:
            raise ConfigError(f"config arg {k!r} is not one of {', '.join(sorted(allowed))}")
        try:
            out[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k] = v
    return out


def base_config(args: dict):
    """default_config() with the seed from the arg applied."""
    c = default_config()
    c.seed = int(args.get("seed", 0))
    c.tasks.lang = "en"
    return c


def check_variant(args: dict, variants: tuple[str, ...]) -> str:
    v = args.get("variant", variants[0])
    if v not in variants:
        raise ConfigError(f"variant must be one of {'|'.join(variants)}, got {v!r}")
    return v


def tiny_variant(c):
    """Seconds-long version for tests that still trains every stage: tiny model, single-digit problems, a cold
    start long enough to learn the answer format, and a format term in the reward (weight 0.5) so that RL groups
    differ even before any answer is right: every RL iteration of a tiny run takes real optimizer steps."""
    c.model.update(TINY_MODEL)
    c.tasks.update(dict(mix="arith:1.0", n_train=64, n_val=8, n_test=8, difficulty=1, max_prompt_len=32))
    c.sampling.update(dict(max_new_tokens=32, batch_rows=16))
    c.eval.update(dict(every=2, k=2, n_val=8, n_test=8))
    c.reward.w_format = max(float(c.reward.w_format), 0.5)
    c.checkpoint.every = 1
    c.log.update(dict(progress=False))  # no bars (progress lines still print); TensorBoard on, as in real runs
    c.run.reward_workers = 0
    for s in c.stages:
        if s.kind == "sft":
            s.update(dict(epochs=10, n_problems=64, batch_size=16, lr=1e-2, warmup_steps=0))
        elif s.kind == "rejection":
            s.update(dict(rounds=1, n_problems=8, samples=4, min_format=0.5, warmup_steps=0))
        else:  # no warmup: three iterations are too few to finish one, and the lr must reach its end fraction
            s.update(dict(iterations=3, n_prompts=4, samples=4, token_budget=1024, temperature_start=1.0,
                          temperature_end=1.0, warmup_steps=0))
