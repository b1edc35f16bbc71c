"""GRPO from a pretrained Hugging Face checkpoint on GSM8K: bf16, the chat template, an fsdp / expert mesh for 8 devices.

    python -m experiments.launch --config experiments/configs/qwen_gsm8k.py --workdir runs/qwen_gsm8k \
        --config.model.hf_path=checkpoints/Qwen2.5-Math-1.5B-Instruct      # any local qwen2/qwen3/qwen3_moe/... folder
    python -m experiments.launch --config experiments/configs/qwen_gsm8k.py:variant=moe,data=data/gsm8k \
        --workdir runs/qwen_moe --config.model.hf_path=checkpoints/Qwen3-30B-A3B
    python -m experiments.launch --config experiments/configs/qwen_gsm8k.py:variant=tiny --workdir runs/qwen_tiny

The checkpoint folder (config.json, *.safetensors, tokenizer.json, tokenizer_config.json with its chat template) is
read by models.hf.load, sharded over the mesh; nothing is downloaded. Data: GSM8K's own files, `data/train.jsonl`
and `data/test.jsonl` ({"question", "answer": "... #### 72"}): the official test set is the test split as given
(tasks.test_source), train and validation come from the train file by question hash (8/9, 1/9). Every prompt is one
user turn through the checkpoint's chat template (rl/tasks/render.py's render_user_message).

Recipe (DeepSeekMath / DAPO-style GRPO for a pretrained model): groups of 8 answers per problem at temperature 1.0,
ratio clip 0.2 below / 0.28 above (clip-higher), a small k3 KL to the starting policy (0.001), lr 1e-6 with a short
warmup, token-mean loss, groups with equal rewards dropped, outcome reward only (the verified final answer). bf16
compute with float32 master weights (model.param_dtype): an update of lr 1e-6 is below bf16's resolution for most
weights, so bf16 storage would lose it (tests/test_bf16.py shows it). Router, softmax, logprobs and losses are
float32 whatever the compute dtype. Before any compute the launcher prints the memory plan per device
(rl/memory_plan.py) and refuses a config that does not fit run.device_memory_gib (default: the device's own limit).

Memory plan per device (rl/memory_plan.py, run.device_memory_gib=80): full with a Qwen2.5-Math-1.5B-shaped model
13.4 GiB (the float32 logits of the train step are the largest part, 8.7 GiB); moe with a Qwen3-30B-A3B-shaped model
93 GiB (float32 master weights, Adam moments and the KL reference are 65.5 GiB of it), so it runs on 8 x 141 GiB
(H200) and is refused on 80 GiB devices, naming the optimizer state: there, set model.param_dtype=bfloat16 (which
loses small updates, see above) or use more devices.

Variants: variant=full (dense checkpoint, mesh fsdp=8) | moe (expert=4 x fsdp=2, e.g. Qwen3-30B-A3B) | tiny (tests:
a tiny random qwen3 checkpoint with a byte-level BPE tokenizer and a ChatML template, 80 + 16 GSM8K-style problems,
all made in a temporary folder; a short cold start then GRPO, on one CPU device); seed=N; data=DIR (GSM8K folder).
"""
from __future__ import annotations

import os

from experiments.configs.common import base_config, check_variant, parse_arg, stage
from experiments.configs.fixtures import make_tiny_files

def get_config(arg=None):
    args = parse_arg(arg, {"variant": "full", "seed": 0, "data": "data/gsm8k"})
    variant = check_variant(args, ("full", "moe", "tiny"))
    c = base_config(args)
    c.model.update(dict(hf_path=f"checkpoints/{'Qwen3-30B-A3B' if variant == 'moe' else 'Qwen2.5-Math-1.5B-Instruct'}",
                        chat_template=True, dtype="bfloat16", param_dtype="float32", remat=True, max_seq_len=1536))
    c.mesh.update(dict(fsdp=2, expert=4) if variant == "moe" else dict(fsdp=8))
    c.tasks.update(dict(mix=f"gsm8k@{args['data']}/train.jsonl", test_source=f"gsm8k@{args['data']}/test.jsonl",
                        lang="en", n_train=7000, n_val=256, n_test=1319, max_prompt_len=512))
    c.sampling.update(dict(max_new_tokens=1024, batch_rows=256))
    c.eval.update(dict(every=20, k=4, n_val=256, n_test=1319, temperature=1.0))
    c.reward.update(dict(w_outcome=1.0, w_format=0.0))
    c.checkpoint.update(dict(keep=2, every=10))
    c.stages = [
        stage("grpo", "grpo", iterations=200, n_prompts=64, samples=8, temperature_start=1.0, temperature_end=1.0,
              temperature_kind="constant", lr=1e-6, warmup_steps=10, end_lr_fraction=1.0, clip_low=0.2,
              clip_high=0.28, kl_coef=0.001, kl_kind="k3", agg="token-mean", filter_zero_variance="drop",
              token_budget=16 * 1536, grad_clip=1.0),
    ]
    if variant == "moe":  # ~30 B parameters: fewer rows per step and per sampler call (the memory plan's figures)
        c.sampling.batch_rows = 64
        c.stages[0].token_budget = 4 * 1536
    if variant == "tiny":
        tiny(c)
    return c


def tiny(c):
    """Seconds on one CPU device: the tiny files, a cold start that teaches the answer layout (so GRPO groups have
    reward variance), two GRPO iterations; bf16 compute and float32 master weights as in the full run."""
    folder = make_tiny_files()
    c.model.update(dict(hf_path=os.path.join(folder, "model"), max_seq_len=112, remat=False))
    c.mesh.update(dict(data=1, fsdp=1, expert=1, tensor=1))
    c.tasks.update(dict(mix=f"gsm8k@{folder}/train.jsonl", test_source=f"gsm8k@{folder}/test.jsonl", n_train=64,
                        n_val=4, n_test=8, max_prompt_len=80))
    c.sampling.update(dict(max_new_tokens=32, batch_rows=16))
    c.eval.update(dict(every=0, k=2, n_val=4, n_test=8, initial=False))
    c.reward.update(dict(w_format=0.5))
    c.checkpoint.every = 1
    c.log.update(dict(tensorboard=False, progress=False))
    c.run.update(dict(reward_workers=0))
    c.stages = [stage("sft", "cold_start", epochs=6, batch_size=16, n_problems=64, lr=3e-3, warmup_steps=2),
                stage("grpo", "grpo", iterations=2, n_prompts=4, samples=4, temperature_start=1.0, temperature_end=1.0,
                      temperature_kind="constant", lr=1e-3, clip_low=0.2, clip_high=0.28, kl_coef=0.001,
                      token_budget=16 * 112)]
