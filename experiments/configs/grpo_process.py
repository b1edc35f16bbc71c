"""Process-supervised GRPO: step rewards from the exact arithmetic checker (rewards.steps) instead of outcome only.

    python -m experiments.launch --config experiments/configs/grpo_process.py --workdir runs/grpo_process

Each step's arithmetic is checked exactly; the step scores of a group are normalised together and every token gets
the sum of the normalised scores of the steps ending at or after it (DeepSeekMath's process supervision).
variant=step_rewards instead adds +-0.5 per checked step (weight stages[1].step_reward_weight) on top of the outcome
advantage. Variants: variant=full (default) | step_rewards | tiny (tests); seed=N.
"""
from experiments.configs.common import base_config, check_variant, parse_arg, stage, tiny_variant


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    variant = check_variant(args, ("full", "step_rewards", "tiny"))
    c = base_config(args)
    c.model.update(dict(vocab_size=259, d_model=96, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=24, d_ff=192,
                        n_experts=4, experts_per_token=2, moe_every=1, n_shared_experts=0, max_seq_len=128))
    c.tasks.update(dict(mix="add:1.0", lang="en", difficulty=3, n_train=3000, n_val=64, n_test=128, max_prompt_len=32))
    c.sampling.update(dict(max_new_tokens=96))
    c.eval.update(dict(every=20, k=8, n_val=64, n_test=128))
    # the verified answer only (w_format 0, the default): format differences inside an all-wrong group would become
    # full-size advantages once GRPO divides by the group std (docs/rewards.md)
    c.reward.update(dict(w_outcome=1.0, w_process=0.0, w_format=0.0))
    grpo = dict(iterations=120, n_prompts=16, samples=8, lr=5e-4, kl_coef=0.02, clip_high=0.28, token_budget=6144)
    if variant == "step_rewards":
        grpo.update(step_rewards=True, step_reward_weight=0.2)
    else:
        grpo.update(process_grpo=True)
    c.stages = [
        stage("sft", "cold_start", epochs=2, batch_size=64, n_problems=1000, lr=2e-3, warmup_steps=10),
        stage("grpo", "grpo_process", **grpo),
    ]
    if variant == "tiny":
        tiny_variant(c)
    return c
