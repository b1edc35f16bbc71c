"""Quickstart, the README's main job: a tiny MoE policy on 2 CPU cores, cold start -> rejection sampling -> GRPO.

    python -m experiments.launch --config experiments/configs/quickstart.py --workdir runs/quickstart
    python -m experiments.sweep --config experiments/configs/quickstart.py:sweep=seeds --workdir runs/qs_seeds \
        --init_from none --parallel 1          # the headline's three seeds (make demo-seeds)

Task: two-digit addition (800 training problems, 128 validation, 512 test; every byte is a token). The cold-start
data mixes two styles, as human-written data does: 40% worked solutions with column steps ("Step 1: 4+8=12 ...
Answer: 82") and 60% the answer line alone ("Answer: 82"). SFT runs 40 epochs, until validation pass@1 is flat: the
policy imitates both styles, and greedy decoding takes the majority one, bare answers, which a two-layer model
gets right about 1 time in 12. Rejection sampling (2 rounds of 512 problems x 8 samples at T 1.0, verified
answers kept, 2 epochs at lr 1e-3) then GRPO (60 iterations of 32 problems x 8 samples, outcome reward only, KL
0.02 to the policy GRPO starts from) learn to write the steps because the verifier pays for correct answers and
the steps are what makes them correct: held-out pass@1 rises by 20+ points over the cold start. The GRPO stage is
one update off-policy, as every default GRPO / PPO run: with run.overlap on and max_staleness 1 (both defaults)
batch u + 1 is sampled while batch u is scored, before update u, and the clipped ratio against the sampler's
logprobs corrects for it; `--config.run.overlap=false` samples each batch right before its update (exactly
on-policy, slower). The measured seeds are in README.md / BENCHMARKS.md; the table a run prints gives every
stage's pass@1 with its standard error and 95% interval.

Variants (config arg): variant=full (default; its run time on 2 cores: README.md) | tiny (seconds; the tests use it);
seed=N; sweep=grpo (get_sweep: GRPO clip-higher x learning rate, 3 seeds) | seeds (no axes: seeds 0, 1, 2).
    python -m experiments.launch --config experiments/configs/quickstart.py:variant=tiny,seed=1 --workdir runs/qs_tiny
"""
from experiments.configs.common import (MIXED_COLD_START, MIXED_N_TRAIN, SMALL_MOE, TWO_DIGIT_ADDITION, ConfigError,
                                        base_config, check_variant, parse_arg, stage, tiny_variant)

ARGS = {"variant": "full", "seed": 0, "sweep": "grpo"}
SEEDS = [0, 1, 2]


def get_config(arg=None):
    args = parse_arg(arg, ARGS)
    variant = check_variant(args, ("full", "tiny"))
    c = base_config(args)
    c.model.update(SMALL_MOE)  # 2 layers, d_model 64, 4 experts top-2 in every layer; byte vocabulary
    c.tasks.update(TWO_DIGIT_ADDITION)
    c.tasks.update(dict(n_train=MIXED_N_TRAIN, n_val=128, n_test=512))  # 512 test problems: SE <= 2.2 points
    c.sampling.update(dict(max_new_tokens=64))
    # validation every 8 units: the cold start's curve (is it flat?) and GRPO's; pass@k / maj@k with 4 samples
    c.eval.update(dict(every=8, k=4, n_val=128, n_test=512, temperature=0.6))
    # reward: the verified answer only (0/1). A format term's tiny differences inside all-wrong groups become
    # full-size advantages once GRPO divides by the group std; a process term gets hacked (true but irrelevant
    # arithmetic steps): BENCHMARKS.md's tuning notes.
    c.reward.update(dict(w_outcome=1.0, w_process=0.0, w_format=0.0))
    c.checkpoint.update(dict(keep=2, every=10))
    c.run.update(dict(reward_workers=1))
    c.stages = [
        stage("sft", "cold_start", **MIXED_COLD_START),
        stage("rejection", "rejection", rounds=2, n_problems=512, samples=8, temperature=1.0, epochs=2, batch_size=32,
              lr=1e-3, warmup_steps=3, max_keep_per_problem=4),
        stage("grpo", "grpo", iterations=60, n_prompts=32, samples=8, temperature_start=0.7, temperature_end=0.5,
              lr=2e-4, warmup_steps=10, epochs=1, token_budget=4096, clip_low=0.2, clip_high=0.28, kl_coef=0.02,
              agg="token-mean", filter_zero_variance="drop"),
    ]
    if variant == "tiny":
        tiny_variant(c)
        c.stages[1].update(dict(epochs=1, lr=3e-4, max_keep_per_problem=2, temperature=0.7))  # the tests' tiny run
        c.stages[0].direct_share = 0.0  # a few-second cold start must learn the worked format to give RL signal
    return c


def get_sweep(arg=None):
    """sweep=grpo: GRPO clip-higher and learning rate after one shared cold start per seed; sweep=seeds: the main
    job itself, seeds 0, 1, 2 (python -m experiments.sweep --config experiments/configs/quickstart.py:sweep=seeds
    --workdir runs/qs_seeds --init_from none)."""
    args = parse_arg(arg, ARGS)
    if args["sweep"] == "seeds":
        return {"axes": {}, "seeds": SEEDS}
    if args["sweep"] != "grpo":
        raise ConfigError(f"config arg sweep must be grpo or seeds, got {args['sweep']!r}")
    return {"axes": {"stages[2].clip_high": [0.2, 0.28], "stages[2].lr": [1e-4, 2e-4]}, "seeds": SEEDS}
