"""PPO with a value head on the policy, GAE, and the KL to the cold-start policy in the per-token reward.

    python -m experiments.launch --config experiments/configs/ppo_arith.py --workdir runs/ppo_arith

Same task and cold start as quickstart (two-digit addition); the RL stage is PPO instead of GRPO: the value head
(a linear map of the final hidden state) is trained with a clipped value loss, advantages come from GAE
(gamma 1, lambda 0.95) and are whitened, and the KL penalty (k1, adaptive towards 0.01) is subtracted from the
token rewards. Variants: variant=full (default) | tiny (tests); seed=N.
"""
from experiments.configs.common import SMALL_MOE, TWO_DIGIT_ADDITION, base_config, check_variant, parse_arg, stage, tiny_variant


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    variant = check_variant(args, ("full", "tiny"))
    c = base_config(args)
    c.model.update(SMALL_MOE)
    c.tasks.update(TWO_DIGIT_ADDITION)
    c.sampling.update(dict(max_new_tokens=64))
    c.eval.update(dict(every=10, k=8, n_val=64, n_test=128))
    # a small format term, as this config has always run: PPO whitens its GAE advantages over the whole batch, not
    # per group, so format differences in an all-wrong group stay small next to a right answer's
    c.reward.update(dict(w_format=0.1))
    c.stages = [
        stage("sft", "cold_start", epochs=1, batch_size=32, n_problems=600, lr=3e-3, warmup_steps=5),
        stage("ppo", "ppo", iterations=60, n_prompts=16, samples=4, lr=1e-3, epochs=2, token_budget=4096,
              kl_kind="k1", kl_place="reward", kl_coef=0.05, kl_adaptive=True, kl_target=0.01, gamma=1.0, lam=0.95,
              value_coef=0.5, value_clip=0.2),
    ]
    if variant == "tiny":
        tiny_variant(c)
    return c
