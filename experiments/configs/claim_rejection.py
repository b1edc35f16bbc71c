"""Claim 7 (REPRODUCING.md): rejection-sampling rounds (keep verified, well-formed answers) then RL, vs RL alone, vs
rejection sampling alone.

    python -m experiments.launch --config experiments/configs/claim_rejection.py --workdir runs/claim_rejection
    python -m experiments.sweep --config experiments/configs/claim_rejection.py:arm=both --workdir runs/claims/rejection_both
    python -m experiments.sweep --config experiments/configs/claim_rejection.py:arm=rl --workdir runs/claims/rejection_rl
    python -m experiments.sweep --config experiments/configs/claim_rejection.py:arm=rejection --workdir runs/claims/rejection_only

After the claims' cold start: arm=both runs 3 rejection rounds (256 problems x 8 samples at T 1.0, at most 4
distinct verified answers per problem, one epoch each) then 60 GRPO iterations; arm=rl the GRPO stage alone;
arm=rejection the rejection rounds alone. Compare held-out pass@1 per stage and the sampled answers each spent.
Variants: variant=full (default) | tiny (tests); seed=N.
"""
from experiments.configs.common import CLAIM_SEEDS, ConfigError, claim_config, parse_arg

ARMS = {"both": ("sft", "rejection", "grpo"), "rl": ("sft", "grpo"), "rejection": ("sft", "rejection")}


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "arm": "both"})
    if args["arm"] not in ARMS:
        raise ConfigError(f"arm must be one of {', '.join(ARMS)}, got {args['arm']!r}")
    return claim_config(args, stages=ARMS[args["arm"]])


def get_sweep(arg=None):
    """Three seeds of one arm (run it once per arm)."""
    return {"axes": {}, "seeds": CLAIM_SEEDS}
