"""Claim 5 (REPRODUCING.md): an adaptive KL controller (target KL) is more stable than a fixed coefficient, and the
KL coefficient and the temperature should not be changed together.

    python -m experiments.launch --config experiments/configs/claim_kl_control.py --workdir runs/claim_kl
    python -m experiments.sweep --config experiments/configs/claim_kl_control.py --workdir runs/claims/kl_control

After the claims' cold start, GRPO with a fixed k3 KL coefficient 0.02 or the adaptive controller (target 0.01,
horizon 2000 samples), crossed with a constant sampling temperature (1.0) or one annealed 1.0 -> 0.7 over the
stage (the temperature changes the KL the controller sees, so annealing it moves the adaptive coefficient at the
same time). Stability: the KL's spread over iterations and validation pass@1 over time.
Variants: variant=full (default) | tiny (tests); seed=N.
"""
from experiments.configs.common import CLAIM_SEEDS, claim_config, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    return claim_config(args, kl_target=0.01, kl_horizon=2000)


def get_sweep(arg=None):
    return {"axes": {"stages[1].kl_adaptive": [False, True], "stages[1].temperature_end": [1.0, 0.7]},
            "seeds": CLAIM_SEEDS}
