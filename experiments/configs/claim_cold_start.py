"""Claim 1 (REPRODUCING.md): a cold start is necessary: GRPO from the random policy vs GRPO after the cold start.

    python -m experiments.launch --config experiments/configs/claim_cold_start.py --workdir runs/claim_cold_start
    python -m experiments.sweep --config experiments/configs/claim_cold_start.py:arm=cold --workdir runs/claims/cold_start_cold
    python -m experiments.sweep --config experiments/configs/claim_cold_start.py:arm=zero --workdir runs/claims/cold_start_zero

arm=cold: the claims' mixed-style cold start, then 60 GRPO iterations; arm=zero: the same 60 GRPO iterations from
the random initialisation (R1-Zero without a pretrained base). Same reward (verified answer only), same seeds.
Variants: variant=full (default) | tiny (tests); seed=N.
"""
from experiments.configs.common import CLAIM_SEEDS, ConfigError, claim_config, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "arm": "cold"})
    if args["arm"] not in ("cold", "zero"):
        raise ConfigError(f"arm must be cold or zero, got {args['arm']!r}")
    return claim_config(args, stages=("sft", "grpo") if args["arm"] == "cold" else ("grpo",))


def get_sweep(arg=None):
    """Three seeds of one arm (run it once per arm: :arm=cold and :arm=zero)."""
    return {"axes": {}, "seeds": CLAIM_SEEDS}
