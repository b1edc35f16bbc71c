"""Claim 4 (REPRODUCING.md): difficulty-stratified sampling (8 / 16 / 32 samples for easy / medium / hard problems)
reaches the same accuracy with 20-30% fewer samples than a uniform count.

    python -m experiments.launch --config experiments/configs/claim_curriculum.py --workdir runs/claim_curriculum
    python -m experiments.sweep --config experiments/configs/claim_curriculum.py --workdir runs/claims/curriculum

After the claims' cold start, GRPO with 16 problems per iteration and either a uniform 16 samples each or the
curriculum (re-bucketed by pass rate every 5 iterations, 8 / 16 / 32 samples). The comparison is validation
pass@1 against the cumulative number of sampled answers (`n_samples` in metrics.jsonl).
Variants: variant=full (default) | tiny (tests); seed=N.
"""
from experiments.configs.common import CLAIM_SEEDS, claim_config, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    return claim_config(args, samples=16, curriculum=dict(enabled=False, samples=(8, 16, 32), refresh_every=5))


def get_sweep(arg=None):
    return {"axes": {"stages[1].curriculum.enabled": [False, True]}, "seeds": CLAIM_SEEDS}
