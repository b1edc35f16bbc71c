"""Claim 3 (REPRODUCING.md): a format reward of 0.05-0.1 fixes the format without costing accuracy.

    python -m experiments.launch --config experiments/configs/claim_format_reward.py --workdir runs/claim_format
    python -m experiments.sweep --config experiments/configs/claim_format_reward.py --workdir runs/claims/format_reward

After the claims' cold start (whose bare-answer demonstrations score below 1 on rewards.format: no steps), GRPO with
reward = verified answer + w x format score, w in {0, 0.05, 0.1, 0.3} (the stage's format_weight). Compare the
format rate and validation pass@1. Variants: variant=full (default) | tiny (tests); seed=N; w=... (a single point).
"""
from experiments.configs.common import CLAIM_SEEDS, claim_config, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "w": 0.1})
    return claim_config(args, format_weight=float(args["w"]))


def get_sweep(arg=None):
    return {"axes": {"stages[1].format_weight": [0.0, 0.05, 0.1, 0.3]}, "seeds": CLAIM_SEEDS}
