"""Process reward model on the arithmetic mix (issue 15): a cold-start policy, its PRM, then GRPO with the PRM.

    python -m experiments.train_prm --config experiments/configs/prm_arith.py --workdir runs/prm
    python -m experiments.launch --config experiments/configs/prm_arith.py:variant=grpo_prm --workdir runs/prm_grpo

Task: two-digit addition, subtraction and multiplication by a digit with column steps in the English format
("Step 1: 1+2=3 ... Step 3: 71+62=133\nAnswer: 133"); a byte-level policy (the quickstart's small MoE) gets a
cold start of 8 epochs over 3000 worked solutions. get_config() is that launcher config; train_prm runs it in
workdir/policy and then the PRM pipeline of get_prm_config() (prm/train.py PRMConfig): the policy's own
samples, labels from the exact checker on corrupted gold solutions, Math-Shepherd Monte Carlo labels on the
samples, their mix, and the exact labels on the samples as the reference; one PRM per label source, initialised
from the policy; calibration on validation samples; step AUROC / ECE / first-error F1 and best-of-N on test
samples. The model's max_seq_len (160) leaves room for MC rollouts from a whole prompt + partial solution.

variant=grpo_prm: the same cold start, then GRPO with the PRM checkpoint runs/prm/prm (prm.path) as a process
reward (prm.weight 0.2 x the weakest calibrated step probability of each response, scored on the trainer side)
and as step rewards at step ends (prm.steps); evaluation adds PRM best-of-k reranking (prm@k).
variant=tiny / tiny_grpo_prm: the same, seconds-long (tests); seed=N. The PRM pipeline's own fields are in
get_prm_config (the table they produce: REPRODUCING.md, "Process reward model (issue 15)").
"""
import ml_collections

from experiments.configs.common import SMALL_MOE, base_config, check_variant, parse_arg, stage, tiny_variant

VARIANTS = ("full", "grpo_prm", "tiny", "tiny_grpo_prm")
ARITH_MIX = dict(mix="add:1.0,sub:1.0,mul:1.0", lang="en", difficulty=2, n_train=3000, n_val=64, n_test=200,
                 max_prompt_len=32)


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    variant = check_variant(args, VARIANTS)
    c = base_config(args)
    c.model.update(SMALL_MOE)
    c.model.max_seq_len = 160  # prompt + partial solution (96 tokens) + a 64-token MC rollout
    c.tasks.update(ARITH_MIX)
    c.sampling.update(dict(max_new_tokens=64, batch_rows=128))
    c.eval.update(dict(every=0, k=0, n_val=64, n_test=128, temperature=1.0, initial=False))
    c.reward.update(dict(w_outcome=1.0, w_process=0.0, w_format=0.0))
    c.log.update(dict(tensorboard=False, progress=False))
    c.run.update(dict(reward_workers=0))
    c.stages = [stage("sft", "cold_start", epochs=8, batch_size=32, n_problems=3000, lr=3e-3, warmup_steps=10)]
    if variant.endswith("grpo_prm"):
        c.prm.update(dict(path="runs/prm/prm", weight=0.2, steps=True))  # the PRM wing's section (prm/config.py)
        c.eval.update(dict(k=8, temperature=0.7))
        c.run.reward_workers = 1
        c.stages.append(stage("grpo", "grpo_prm", iterations=40, n_prompts=16, samples=8, temperature_start=1.0,
                              temperature_end=0.8, lr=2e-4, warmup_steps=5, kl_coef=0.02, clip_high=0.28,
                              token_budget=4096, step_rewards=True, step_reward_weight=0.1))
    if variant.startswith("tiny"):
        tiny_variant(c)
        c.model.max_seq_len = 96  # 64-token rows + 32-token rollouts
    return c


def get_prm_config(arg=None):
    """The PRM pipeline's fields (prm.train.PRMConfig; experiments/train_prm.py reads them)."""
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    variant = check_variant(args, VARIANTS)
    p = ml_collections.ConfigDict(dict(
        sources="prior,corrupted,mc,mix,exact", deploy="auto", init="policy", likelihood=True, n_problems=300,
        samples=2, n_gold=600, temperature=0.7, mc_rollouts=4, n_calib=48, calib_samples=4, n_test=96,
        eval_samples=8, best_of_n=(4, 16, 64), agg="min", steps=200, batch_size=32, lr=1e-4, warmup_steps=20,
        select_every=20, seeds=(0,)))
    if variant.startswith("tiny"):
        p.update(dict(n_problems=8, samples=2, n_gold=16, mc_rollouts=2, n_calib=4, calib_samples=2, n_test=4,
                      eval_samples=2, best_of_n=(2, 4), steps=3, batch_size=8, warmup_steps=0, score_rows=16))
    return p
