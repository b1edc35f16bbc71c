"""Tool-integrated RL: 3-4 digit multiplication the tiny policy cannot do in its head, solved by asking Python.

    python -m experiments.launch --config experiments/configs/tool_arith.py --workdir runs/tool_arith
    python -m experiments.launch --config experiments/configs/tool_arith.py:arm=notools --workdir runs/tool_arith_nt

arm=tools (default): a cold start on tool demonstrations (rl/tasks/tool_arith.py's tool_mul: "<py>print(a*b)</py>
<out>c</out> Answer: c"), then GRPO whose rollouts call the sandboxed Python tool (stage field `tools`,
rl/tool_rollout.py; docs/tools.md). Evaluation reports pass@1 with tools (`pass@1_tools`) beside the tool-free
greedy `pass@1`. arm=notools: the same problems (mul_cols: the same generator draws) with partial-product column
demonstrations and GRPO without tools. Variants: variant=full (default) | tiny (tests); seed=N.

Results (both arms, seeds 0 / 1 / 2): REPRODUCING.md, "Tool use: 3-4 digit products with a sandboxed Python tool".
"""
from experiments.configs.common import ConfigError, base_config, check_variant, parse_arg, stage, tiny_variant

ARMS = ("tools", "notools")
TOOLS = dict(kind="python", max_turns=2, max_output_tokens=24, timeout_s=5.0)


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "arm": "tools"})
    variant = check_variant(args, ("full", "tiny"))
    if args["arm"] not in ARMS:
        raise ConfigError(f"arm must be one of {'|'.join(ARMS)}, got {args['arm']!r}")
    tools = args["arm"] == "tools"
    c = base_config(args)
    c.model.update(dict(vocab_size=259, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=256,
                        n_experts=8, experts_per_token=2, moe_every=2, n_shared_experts=0, max_seq_len=224))
    mix = "tool_mul:1.0" if tools else "mul_cols:1.0"
    c.tasks.update(dict(mix=mix, lang="en", difficulty=3, n_train=4000, n_val=128, n_test=256, max_prompt_len=32))
    c.sampling.update(dict(max_new_tokens=80 if tools else 192))
    c.eval.update(dict(every=10, k=4, n_val=128, n_test=256, temperature=0.6))
    c.reward.update(dict(w_format=0.0))
    c.checkpoint.update(dict(keep=2, every=10))
    c.stages = [
        # 3 epochs teach the call (the code copied from the question) but not copying the tool's output into the
        # answer line (pass@1 with tools 0 after them): 10 epochs
        stage("sft", "cold_start", epochs=10, batch_size=64, n_problems=2000, lr=2e-3, warmup_steps=20),
        stage("grpo", "grpo", iterations=20, n_prompts=16, samples=8, lr=5e-4, warmup_steps=5, temperature_start=1.0,
              temperature_end=0.7, clip_high=0.28, kl_coef=0.02, token_budget=8192,
              tools=dict(TOOLS) if tools else dict(kind="")),
    ]
    if variant == "tiny":
        tiny_variant(c)
        # the column method's worked solutions run to 113 tokens with EOS at difficulty 1; the tool call's to 64
        c.model.update(dict(max_seq_len=128 if tools else 160))
        c.tasks.update(dict(mix=mix, difficulty=1, max_prompt_len=32))
        c.sampling.update(dict(max_new_tokens=64 if tools else 128))
        c.stages[0].update(dict(epochs=20))
        c.stages[1].update(dict(iterations=2))
    return c
