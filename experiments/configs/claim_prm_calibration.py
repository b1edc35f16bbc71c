"""Claim 8 (REPRODUCING.md): calibrating the process reward model (temperature or Platt scaling) lowers its ECE and
changes how useful it is as a reward.

    python -m experiments.launch --config experiments/configs/claim_prm_calibration.py --workdir runs/claim_prm_cal

The PRMs come from experiments/configs/prm_arith.py's pipeline, one per seed (its ECE raw / temperature / Platt
per seed is the first half of the claim); this file is the second half: the same cold start as that pipeline's
policy, then a short GRPO with the seed's own PRM as the process reward (prm.path holds "{seed}"). The PRM
terms are stage fields, so one cold start per seed serves every arm: stages[1].prm_weight (w, default 0.2: + w x
the weakest calibrated step probability of each response) with PRM step rewards (stages[1].step_rewards, weight
0.1, prm.steps), and stages[1].prm_calibration, the map the PRM's probabilities go through (none |
temperature | platt, all three stored in the checkpoint by train_prm). w=0 is the baseline: no PRM reward term, the PRM
still scores every batch (prm/score logged).

    for s in 0 1 2; do python -m experiments.train_prm --config experiments/configs/prm_arith.py:seed=$s \\
        --workdir runs/claims/prm_calibration/prm/seed$s; done
    python -m experiments.sweep --config experiments/configs/claim_prm_calibration.py \\
        --workdir runs/claims/prm_calibration/grpo --parallel 2
    python -m experiments.sweep --config experiments/configs/claim_prm_calibration.py:w=0 \\
        --workdir runs/claims/prm_calibration/grpo_base --parallel 2 \\
        --init_from runs/claims/prm_calibration/grpo/_shared/seed{seed}

Variants: variant=full (default) | tiny (tests and the notebook's fresh-clone run, with prm_arith.py:variant=tiny's
PRM: pass --config.prm.path); seed=N; w=... (the PRM weight; 0 = the baseline); calibration=... (a single
point).
"""
from experiments.configs import prm_arith
from experiments.configs.common import CLAIM_SEEDS, check_variant, parse_arg, stage
from rewards.combine import PRM_CALIBRATIONS as CALIBRATIONS

PRM_PATH = "runs/claims/prm_calibration/prm/seed{seed}/prm"  # train_prm's deployed PRM checkpoint of each seed
GRPO = dict(iterations=30, n_prompts=16, samples=8, temperature_start=1.0, temperature_end=0.8, lr=2e-4,
            warmup_steps=5, kl_coef=0.02, clip_high=0.28, token_budget=4096, step_reward_weight=0.1)
TINY_GRPO = dict(iterations=3, n_prompts=4, samples=4, token_budget=1024, temperature_end=1.0, warmup_steps=0)


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "w": 0.2, "calibration": "platt"})
    tiny = check_variant(args, ("full", "tiny")) == "tiny"
    w = float(args["w"])
    c = prm_arith.get_config(f"variant={'tiny' if tiny else 'full'},seed={int(args['seed'])}")  # its cold start
    c.prm.update(dict(path=PRM_PATH, weight=0.0, steps=True))  # the PRM reward terms are the stage's
    c.eval.update(dict(every=2 if tiny else 5, k=0))  # a validation curve; greedy only, so eval never reads the PRM
    c.checkpoint.update(dict(keep=1, every=10))
    c.stages.append(stage("grpo", "grpo", **{**GRPO, **(TINY_GRPO if tiny else {})}, prm_weight=w,
                          prm_calibration=str(args["calibration"]) if w else "", step_rewards=w > 0))
    return c


def get_sweep(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "w": 0.2, "calibration": "platt"})
    return {"axes": {"stages[1].prm_calibration": list(CALIBRATIONS)} if float(args["w"]) else {},
            "seeds": CLAIM_SEEDS}
