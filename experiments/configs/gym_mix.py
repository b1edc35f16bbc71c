"""GRPO on a mix of three reasoning-gym families, graded by our own verifier: per-family held-out lift.

    pip install -e '.[gym]'      # reasoning-gym==0.1.25, the generators only (rl/tasks/gym.py)
    python -m experiments.launch --config experiments/configs/gym_mix.py --workdir runs/gym_mix/seed0
    python -m experiments.family_table runs/gym_mix/seed0 runs/gym_mix/seed1 runs/gym_mix/seed2

The quickstart policy (2 layers, d_model 64, 4 experts top-2, byte vocabulary) on three families at small settings,
so that a two-layer byte model has something to learn in minutes:
    basic_arithmetic   "Calculate -3 * 7." (two one-digit terms, + - *; gold recomputed exactly, rl/tasks/gym.py)
    chain_sum          "State the final answer to the following arithmetic problem: 41 - 7 =" (two terms of 1-2 digits)
    countdown          "Find a way to make 21 using all of these numbers: 7, 3. ..." (two numbers up to 20, target <= 100)
Their items have no worked steps, so the cold start is SFT on the generators' gold answers alone (the answer line:
"Answer: 21", "Answer: 7*3"), 3 x 400 problems, 10 epochs in minibatches of 8; then 80 GRPO iterations on the same
mix (32 prompts x 8 samples, outcome reward only: our grader's 0/1). Each problem is scored by its family's grader
(rewards/gym_check.py: numbers through rewards.verify, countdown by an exact walk of the parsed expression: each
number at most once, all of them, equal to the target). The test split (128 problems per family, greedy) is
evaluated after each stage: `family_table` prints cold start vs GRPO per family (REPRODUCING.md has three seeds).

Variants: variant=full (default, ~5 min on 2 idle cores) | tiny (the tests' seconds-long run); seed=N.
"""
from experiments.configs.common import SMALL_MOE, base_config, check_variant, parse_arg, stage, tiny_variant

FAMILIES = (
    "gym@basic_arithmetic@min_terms=2,max_terms=2,min_digits=1,max_digits=1,allow_negation=false,operators=+|-|*",
    "gym@chain_sum@min_terms=2,max_terms=2,min_digits=1,max_digits=2",
    "gym@countdown@min_numbers=2,max_numbers=2,min_value=1,max_value=20,min_target=1,max_target=100",
)
MIX = ",".join(f"{f}:1" for f in FAMILIES)


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    variant = check_variant(args, ("full", "tiny"))
    c = base_config(args)
    c.model.update(dict(SMALL_MOE, max_seq_len=168))  # countdown prompts reach ~125 bytes
    c.tasks.update(dict(mix=MIX, lang="en", n_train=1200, n_val=96, n_test=384, max_prompt_len=136))
    c.sampling.update(dict(max_new_tokens=32))  # "Answer: 7*3 - 2" and a little room
    c.eval.update(dict(every=0, k=0, n_val=96, n_test=384, initial=False))
    c.reward.update(dict(w_outcome=1.0, w_process=0.0, w_format=0.0))
    c.checkpoint.update(dict(keep=1, every=10))
    c.run.update(dict(reward_workers=1))
    c.stages = [
        stage("sft", "cold_start", epochs=10, n_problems=1200, batch_size=8, lr=1.5e-3, warmup_steps=10),
        stage("grpo", "grpo", iterations=80, n_prompts=32, samples=8, temperature_start=1.0, temperature_end=0.7,
              lr=3e-4, warmup_steps=5, epochs=1, token_budget=4096, clip_low=0.2, clip_high=0.28, kl_coef=0.02,
              agg="token-mean", filter_zero_variance="drop"),
    ]
    if variant == "tiny":
        tiny_variant(c)
        c.model.update(dict(max_seq_len=168))
        c.tasks.update(dict(mix=MIX, n_train=64, n_val=6, n_test=6, max_prompt_len=136))
        c.eval.update(dict(every=0, k=0, n_val=6, n_test=6))
    return c
