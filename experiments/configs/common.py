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
from schema import key_values

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
    try:
        items = key_values(arg, "config arg", "key=value (e.g. variant=tiny,seed=3)")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for k, v in items:
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


# no warmup: three iterations are too few to finish one, and the lr must reach its end fraction
_TINY_RL = dict(iterations=3, n_prompts=4, samples=4, token_budget=1024, temperature_start=1.0, temperature_end=1.0,
                warmup_steps=0)
TINY_STAGES = {  # tiny_variant's fields of each stage kind
    "sft": dict(epochs=10, n_problems=64, batch_size=16, lr=1e-2, warmup_steps=0),
    "rejection": dict(rounds=1, n_problems=8, samples=4, min_format=0.5, warmup_steps=0),
    "grpo": _TINY_RL, "ppo": _TINY_RL,
}


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
        s.update(TINY_STAGES[s.kind])


# ----------------------------------------------------------------------------------- the claim ablations
# The cold start of the quickstart and of every claim_*.py ablation: 800 two-digit additions, 60% of the
# demonstrations written as the bare answer line (SFT direct_share), 40 epochs: validation pass@1 (greedy, which
# answers in the bare style) is flat at ~0.06-0.11 from epoch ~24 on (BENCHMARKS.md has the curve). With 2400
# problems the bare style keeps improving (0.11 at epoch 20, 0.33 at epoch 24: the direct sum is being learned), so
# the cold start would have no plateau within a demo's time.
MIXED_COLD_START = dict(epochs=40, batch_size=32, n_problems=800, lr=3e-3, warmup_steps=10, direct_share=0.6)
MIXED_N_TRAIN = 800  # tasks.n_train of these runs: the RL stages draw from the same problems
# The claims' RL stage: short GRPO on the same problems, outcome reward, small KL to the cold start.
CLAIM_GRPO = dict(iterations=60, n_prompts=16, samples=8, temperature_start=1.0, temperature_end=0.7, lr=2e-4,
                  warmup_steps=5, epochs=1, token_budget=4096, clip_low=0.2, clip_high=0.28, kl_coef=0.02,
                  agg="token-mean", filter_zero_variance="drop")
CLAIM_SEEDS = [0, 1, 2]


def claim_config(args: dict, stages: tuple[str, ...] = ("sft", "grpo"), **grpo):
    """The base of the claim_*.py ablations (REPRODUCING.md): the quickstart policy and its mixed-style cold start,
    then the listed stages ("sft", "rejection", "grpo"), the GRPO stage with `grpo` overrides. Everything but the
    stages after the cold start is the same in every claim file, so one cold start per seed serves them all
    (`python -m experiments.sweep ... --init_from runs/claims/<first sweep>/_shared/seed{seed}`).
    variant=tiny: the tests' seconds-long version."""
    c = base_config(args)
    c.model.update(SMALL_MOE)
    c.tasks.update(TWO_DIGIT_ADDITION)
    c.tasks.update(dict(n_train=MIXED_N_TRAIN, n_val=128, n_test=256))
    c.sampling.update(dict(max_new_tokens=64))
    c.eval.update(dict(every=10, k=0, n_val=128, n_test=256, temperature=0.6))
    c.reward.update(dict(w_outcome=1.0, w_process=0.0, w_format=0.0))
    c.checkpoint.update(dict(keep=1, every=10))
    c.run.update(dict(reward_workers=1))
    c.stages = []
    for kind in stages:
        if kind == "sft":
            c.stages.append(stage("sft", "cold_start", **MIXED_COLD_START))
        elif kind == "rejection":
            c.stages.append(stage("rejection", "rejection", rounds=3, n_problems=256, samples=8, temperature=1.0,
                                  epochs=1, batch_size=32, lr=1e-3, warmup_steps=3, max_keep_per_problem=4))
        elif kind == "grpo":
            c.stages.append(stage("grpo", "grpo", **{**CLAIM_GRPO, **grpo}))
        else:
            raise ConfigError(f"claim stage kinds are sft, rejection, grpo; got {kind!r}")
    if check_variant(args, ("full", "tiny")) == "tiny":
        tiny_variant(c)
        c.eval.update(dict(every=0, k=0))
        tiny = {"sft": dict(direct_share=MIXED_COLD_START["direct_share"]),
                "grpo": dict(curriculum=dict(samples=(2, 4, 4))) if "curriculum" in grpo else {}}
        for s in c.stages:
            s.update(tiny.get(s.kind, {}))
    return c
