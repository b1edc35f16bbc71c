"""Quickstart, the README's main job: a tiny MoE policy on 2 CPU cores, cold start -> rejection sampling -> GRPO.

    python -m experiments.launch --config experiments/configs/quickstart.py --workdir runs/quickstart

Task: two-digit addition with column steps in the English format ("Step 1: 4+8=12 ... Answer: 82"); every byte is
a token. The cold start is deliberately partial (5 epochs over 2000 worked solutions: the format is learned, the
arithmetic only about 20% of the time), so there is headroom; rejection sampling (4 rounds of 512 problems x 8
samples, 2 epochs on the policy's own verified answers) and GRPO (180 iterations, outcome reward, KL 0.02 to the
policy GRPO starts from) improve on that. Ends with a table of held-out (test split) pass@1 / pass@k / format rate
after each stage; same seed, same numbers. Measured (seed 0, 2 cores, 304 s): test pass@1 0.211 after the cold
start, 0.227 after rejection sampling, 0.383 after GRPO (+17.2 points over the cold start; validation 0.172 ->
0.344).

Variants (config arg): variant=full (default, ~5-10 min on 2 cores) | tiny (seconds; the tests use it); seed=N.
    python -m experiments.launch --config experiments/configs/quickstart.py:variant=tiny,seed=1 --workdir runs/qs_tiny
"""
from experiments.configs.common import SMALL_MOE, TWO_DIGIT_ADDITION, base_config, check_variant, parse_arg, stage, tiny_variant


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    variant = check_variant(args, ("full", "tiny"))
    c = base_config(args)
    # model: a small MoE (4 experts, top-2, every layer); byte vocabulary
    c.model.update(SMALL_MOE)
    c.tasks.update(TWO_DIGIT_ADDITION)
    c.sampling.update(dict(max_new_tokens=64))
    c.eval.update(dict(every=20, k=8, n_val=64, n_test=128, temperature=0.6))
    # reward: the verified answer only (0/1). The format is learned in the cold start (format rate ~1.0) and still
    # logged; as a reward term its tiny differences inside all-wrong groups become full-size advantages once GRPO
    # divides by the group std. A process term (w_process > 0) gets hacked: the policy learns to write true but
    # irrelevant arithmetic steps while its answers get worse.
    c.reward.update(dict(w_outcome=1.0, w_process=0.0, w_format=0.0))
    c.checkpoint.update(dict(keep=2, every=5))
    c.run.update(dict(reward_workers=1))
    c.stages = [
        stage("sft", "cold_start", epochs=5, batch_size=32, n_problems=2000, lr=3e-3, warmup_steps=10),
        # rejection sampling sets GRPO up: 4 rounds of 512 problems x 8 samples, up to 4 distinct verified answers
        # per problem, 2 epochs at lr 1e-3 lift the sample accuracy at T 0.7 from ~0.12 to ~0.25 (greedy pass@1
        # barely moves); GRPO then has signal in most groups and takes test pass@1 0.23 -> 0.38. With the older
        # 2 rounds x 128 problems, 1 epoch at 3e-4, GRPO started at ~0.12 sample accuracy and gained 3-6 points.
        stage("rejection", "rejection", rounds=4, n_problems=512, samples=8, temperature=0.7, epochs=2, batch_size=32,
              lr=1e-3, warmup_steps=3, max_keep_per_problem=4),
        stage("grpo", "grpo", iterations=180, n_prompts=32, samples=8, temperature_start=0.7, temperature_end=0.5,
              lr=2e-4, warmup_steps=10, epochs=1, token_budget=4096, clip_low=0.2, clip_high=0.28, kl_coef=0.02, agg="token-mean",
              filter_zero_variance=True),
    ]
    if variant == "tiny":
        tiny_variant(c)
        c.stages[1].update(dict(epochs=1, lr=3e-4, max_keep_per_problem=2))  # the tests' tiny run, as before
    return c


def get_sweep(arg=None):
    """GRPO clip-higher and learning rate, three seeds: python -m experiments.sweep --config experiments/configs/quickstart.py --workdir runs/qs_sweep"""
    return {"axes": {"stages[2].clip_high": [0.2, 0.28], "stages[2].lr": [1e-4, 2e-4]}, "seeds": [0, 1, 2]}
