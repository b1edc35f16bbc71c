"""Sampler / trainer mismatch on the MoE quickstart policy (issue 14): sample in bfloat16, train in float32.

    python -m experiments.sweep --config experiments/configs/mismatch_moe.py --workdir runs/mismatch_moe
    python -m experiments.launch --config experiments/configs/mismatch_moe.py --workdir runs/mm_one   # one arm (plain)
    python -m experiments.mismatch_report runs/mismatch_moe --png docs/figures/mismatch_moe.png

The quickstart's policy and task (a 4-expert top-2 MoE in every layer, two-digit addition with column steps),
the quickstart's cold start (5 epochs over 2,000 worked solutions; no rejection round) and 50 GRPO iterations (16
problems x 8 samples, each batch sampled with the parameters it trains on: max_staleness 0) whose sampler runs the
model in bfloat16 (stages[1].sampler_dtype) while the train step runs it in float32, so every batch is
slightly off-policy: the logprobs differ by rounding, and some tokens take other experts in the sampler than in
the trainer. The sweep crosses routing replay (R3: the train step uses the sampler's experts) with truncated
importance sampling (TIS, cap 2: each token's loss weighted by min(trainer / sampler probability, 2)), three seeds
each. Every arm records the sampler's routes, so router/replay_disagreement (the share of token-layer routes the
trainer's router chooses differently) is logged in all four; mismatch/* compares the sampler with the trainer on the
same parameters (numerics only), offpolicy/* (TIS arms) with the parameters at the start of the update.

The sweep runs the cold start once per seed (workdir/_shared) and every arm from its end.
Variants: variant=full (default; about 45 minutes for the 12 runs on a busy 2-core machine) | tiny (tests).
"""
from experiments.configs.common import SMALL_MOE, TWO_DIGIT_ADDITION, base_config, check_variant, parse_arg, stage, tiny_variant


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0})
    variant = check_variant(args, ("full", "tiny"))
    c = base_config(args)
    c.model.update(SMALL_MOE)  # float32 compute: the trainer's dtype
    c.tasks.update(TWO_DIGIT_ADDITION)
    c.sampling.update(dict(max_new_tokens=64))
    # held-out accuracy over time: validation every 10 GRPO iterations (greedy pass@1), test at each stage end
    c.eval.update(dict(every=10, k=4, n_val=64, n_test=128, temperature=0.6, initial=False))
    c.reward.update(dict(w_outcome=1.0, w_process=0.0, w_format=0.0))  # the verified answer only, as the quickstart
    c.checkpoint.update(dict(keep=1, every=20))
    c.log.update(dict(tensorboard=False))
    c.run.update(dict(reward_workers=1))
    c.stages = [
        stage("sft", "cold_start", epochs=5, batch_size=32, n_problems=2000, lr=3e-3, warmup_steps=10),
        # max_staleness 0: every batch is sampled with the parameters it trains on, so the only gap between the
        # sampler and the trainer is numerical (bf16 against float32), the thing this experiment measures
        stage("grpo", "grpo", iterations=50, n_prompts=16, samples=8, max_staleness=0, temperature_start=0.7, temperature_end=0.7,
              temperature_kind="constant", lr=3e-4, warmup_steps=5, token_budget=4096, clip_low=0.2, clip_high=0.28,
              kl_coef=0.02, agg="token-mean", filter_zero_variance="drop", sampler_dtype="bfloat16",
              record_routes=True, routing_replay=False, tis_cap=0.0),
    ]
    if variant == "tiny":
        tiny_variant(c)
        c.eval.initial = False
    return c


def get_sweep(arg=None):
    """GRPO plain / +R3 / +TIS / both, three seeds (12 runs)."""
    return {"axes": {"stages[1].routing_replay": [False, True], "stages[1].tis_cap": [0.0, 2.0]}, "seeds": [0, 1, 2]}
