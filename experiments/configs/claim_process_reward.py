"""Claim 2 (REPRODUCING.md): a process reward at weight 0.1-0.3 beside the outcome reward speeds learning; above ~0.3
the policy learns to write well-formed but useless steps.

    python -m experiments.launch --config experiments/configs/claim_process_reward.py --workdir runs/claim_process
    python -m experiments.sweep --config experiments/configs/claim_process_reward.py --workdir runs/claims/process_reward

After the claims' cold start, GRPO with reward = verified answer + w x (share of the answer's exactly checked
steps that hold, rewards.steps), w in {0, 0.1, 0.2, 0.3, 0.5} (the stage's process_weight, so the cold start is
shared). Watch validation pass@1 over iterations, the process score and the hacking report (process reward rising
while accuracy falls). Variants: variant=full (default) | tiny (tests); seed=N; w=... (a single point).
"""
from experiments.configs.common import CLAIM_SEEDS, claim_config, parse_arg


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "w": 0.2})
    return claim_config(args, process_weight=float(args["w"]))


def get_sweep(arg=None):
    return {"axes": {"stages[1].process_weight": [0.0, 0.1, 0.2, 0.3, 0.5]}, "seeds": CLAIM_SEEDS}
