"""The R1 pipeline in four stages over three task families: math (two-digit addition), code (function writing,
hidden tests in the sandbox) and verifiable instructions (language, length, word and list constraints).

    python -m experiments.launch --config experiments/configs/r1_pipeline.py --workdir runs/r1_pipeline

1. cold start: SFT on worked solutions of all three families (math steps, code in a ```python block, responses
   meeting their constraints);
2. reasoning RL: GRPO on math + code only (outcome = verified answer / share of hidden tests passed);
3. rejection sampling from the RL policy over all families (keep solved, well-formed answers) plus a replay of
   gold cold-start solutions, then SFT: R1's recycling step;
4. all-scenario RL: GRPO on all three families with a language-consistency reward (stage language_weight).

Every problem is scored by its own family's reward (rewards.task_score); groups stay per problem. The eval
table reports pass@1 per family (instructions: every constraint met) and language consistency after each
stage: did reasoning RL cost instruction following, and did the all-scenario stage restore it?
Variants: variant=full (default, ~15-20 min on 2 cores) | tiny (tests); seed=N; gym=NAME+NAME adds reasoning-gym
families (rl/tasks/gym.py, `pip install -e '.[gym]'`) to the mix with weight 0.25 shared among them: they join the
cold start, the rejection step and the all-scenario stage (reasoning RL stays math + code), and the per-family
table gets a gym/NAME column each.
    python -m experiments.launch --config experiments/configs/r1_pipeline.py:variant=tiny --workdir runs/r1_tiny
    python -m experiments.launch --config experiments/configs/r1_pipeline.py:gym=chain_sum+countdown --workdir runs/r1_gym
"""
from experiments.configs.common import SMALL_MOE, ConfigError, base_config, check_variant, parse_arg, stage, tiny_variant
from rl.tasks import gym

MIX = "add:0.5,code:0.25,instructions:0.25"
GYM_WEIGHT = 0.25  # of the reasoning-gym families together, next to MIX's 1.0


def with_gym(mix: str, names: str) -> str:
    """MIX plus the reasoning-gym families "countdown+chain_sum" (their default settings), GYM_WEIGHT shared."""
    fams = [n.strip() for n in str(names).split("+") if n.strip()]
    if not fams:
        return mix
    unknown = [f for f in fams if f not in gym.FAMILIES]
    if unknown:
        raise ConfigError(f"config arg gym: unknown reasoning-gym family {unknown[0]!r}; supported: "
                          f"{', '.join(gym.FAMILIES)}")
    return mix + "".join(f",gym@{f}:{GYM_WEIGHT / len(fams):g}" for f in fams)


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "gym": ""})
    variant = check_variant(args, ("full", "tiny"))
    mix = with_gym(MIX, args["gym"])
    c = base_config(args)
    c.model.update(dict(SMALL_MOE, max_seq_len=544))  # code prompts reach ~300 bytes, their solutions ~250
    c.tasks.update(dict(mix=mix, lang="en", difficulty=2, source_difficulty="code=1", n_train=1600, n_val=64, n_test=192, max_prompt_len=320))
    c.sampling.update(dict(max_new_tokens=224))
    # greedy evals at stage ends only (the per-family table); the random initial policy scores 0 everywhere
    c.eval.update(dict(every=0, k=0, n_val=64, n_test=192, initial=False))
    # outcome (per family) only: a format term's small differences inside an all-wrong group would become full-size
    # advantages under GRPO's std normalisation (docs/rewards.md); the language term is the all-scenario stage's own
    c.reward.update(dict(w_outcome=1.0, w_process=0.0, w_format=0.0))
    c.checkpoint.update(dict(keep=2, every=5))
    c.run.update(dict(reward_workers=1))
    rl = dict(n_prompts=16, samples=8, temperature_start=0.8, temperature_end=0.6, lr=2e-4, warmup_steps=3,
              token_budget=8192, clip_low=0.2, clip_high=0.28, kl_coef=0.02)
    # the cold start's 800 demonstrations (400 math, 200 code, 200 instructions) differ 4x in length: length
    # buckets keep the short math rows from paying for the code rows' padding. Minibatches of 8 (1,200 steps in
    # 12 epochs) instead of 32 (300): the same compute, test pass@1 after the cold start 0.130 vs 0.031 (seed 0)
    c.stages = [
        stage("sft", "cold_start", epochs=12, n_problems=800, batch_size=8, lr=1.5e-3, warmup_steps=10, length_buckets=4),
        stage("grpo", "reasoning_rl", families="math,code", iterations=15, **rl),
        stage("rejection", "rejection", rounds=1, n_problems=192, samples=4, temperature=0.7, epochs=1, batch_size=32,
              lr=5e-4, warmup_steps=2, max_keep_per_problem=2, gold_replay=0.5, length_buckets=4),
        stage("grpo", "all_scenario_rl", iterations=15, language_weight=0.5, **rl),
    ]
    if variant == "tiny":
        tiny_variant(c)
        c.model.update(dict(max_seq_len=544))
        c.tasks.update(dict(mix=mix, n_train=64, n_val=12, n_test=12, max_prompt_len=320, source_difficulty=""))
        c.sampling.update(dict(max_new_tokens=224, batch_rows=16))
        c.eval.update(dict(n_val=12, n_test=12))
        # the SFT and rejection stages without length buckets: 64 rows in 4 minibatches, length-sorted batches left
        # the tiny policy's RL groups without reward variance (no update); the buckets' own tests are
        # tests/test_length_buckets.py
        tiny = {"grpo": dict(iterations=2, token_budget=4096), "sft": dict(length_buckets=0),
                "rejection": dict(length_buckets=0)}
        for s in c.stages:
            s.update(tiny[s.kind])
    return c
