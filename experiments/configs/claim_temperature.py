"""Claim 6 (REPRODUCING.md): temperature annealing (1.0 -> 0.7 over the run) vs a constant temperature.

    python -m experiments.launch --config experiments/configs/claim_temperature.py --workdir runs/claim_temperature
    python -m experiments.sweep --config experiments/configs/claim_temperature.py --workdir runs/claims/temperature

After the claims' cold start, GRPO sampling at a constant 1.0, a constant 0.7, or linearly annealed from 1.0 to
0.7 (the trainer takes its logprobs at each batch's sampling temperature). Compare validation pass@1, the share of
groups with reward variance (kept_groups) and the entropy. Variants: variant=full (default) | tiny; seed=N.
"""
from experiments.configs.common import CLAIM_SEEDS, claim_config, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    return claim_config(args)


def get_sweep(arg=None):
    return {"axes": {"stages[1].temperature_start": [1.0, 0.7], "stages[1].temperature_end": [1.0, 0.7]},
            "seeds": CLAIM_SEEDS}
