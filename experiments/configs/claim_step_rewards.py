"""Claim 9 (REPRODUCING.md): step-level (segment) rewards vs outcome-only: the variance of the gradient estimate and
the learning speed.

    python -m experiments.launch --config experiments/configs/claim_step_rewards.py --workdir runs/claim_steps
    python -m experiments.sweep --config experiments/configs/claim_step_rewards.py --workdir runs/claims/step_rewards
    python -m experiments.bench.grad_variance --workdir runs/claims/step_rewards/_shared/seed0

After the claims' cold start, GRPO with the outcome reward only, or with step-level rewards added at each step's
end (exactly checked arithmetic steps, weight 0.1) so that the tokens of a wrong step get their own negative
credit. Learning speed: validation pass@1 over iterations; gradient variance: experiments/bench/grad_variance.py
on the cold-start policy (the per-batch policy gradient's spread over independent batches, both estimators on the
same samples). Variants: variant=full (default) | tiny (tests); seed=N.
"""
from experiments.configs.common import CLAIM_SEEDS, claim_config, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    return claim_config(args, step_reward_weight=0.1)


def get_sweep(arg=None):
    return {"axes": {"stages[1].step_rewards": [False, True]}, "seeds": CLAIM_SEEDS}
