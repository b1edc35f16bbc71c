"""Supervised fine-tuning pieces: the masked cross-entropy and batches with the loss on answers only.

Used by the cold-start SFT stage and by rejection-sampling rounds (kept samples become SFT data).
The train step in `rl/train_step.py` with `LossConfig(mode="sft")` consumes the batches built here:

    batch = build_sft_batch(prompt_texts, solution_texts, ByteTokenizer(), max_len=256)
    state, metrics = train_step(state, batch)

Layout: each row is BOS + prompt + solution + EOS, right-padded; `loss_mask[:, t] = 1` exactly on
the solution tokens and the EOS (token t predicted from position t - 1), never on the prompt, and never on a tool's
output inside a solution (`<py>...</py><out>...</out>`, or a chat template's tool turn): the mask is
rewards.python_tool.tool_output_mask, the sampler's rule, so SFT (cold start, rejection sampling) and RL train on
the same tokens and no demonstration teaches the model to predict what the tool returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rewards.python_tool import byte_markers, default_markers, tool_output_mask
from rl.losses import sft_loss

__all__ = ["sft_loss", "build_sft_batch", "build_sft_batch_from_ids"]


def build_sft_batch_from_ids(prompt_ids: Sequence[Sequence[int]], answer_ids: Sequence[Sequence[int]],
                             max_len: int, pad_id: int = 0,
                             answer_masks: Sequence[Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Concatenate prompt and answer ids per row into `[B, max_len]` int32 arrays.

    Rows longer than `max_len` are cut at the end (the prompt is kept whole when it fits, so some
    answer tokens remain to learn from). `answer_masks` (per answer id, 0 = no loss: a tool's output) multiplies
    the loss mask. Returns tokens, attn_mask, loss_mask.
    """
    if len(prompt_ids) != len(answer_ids):
        raise ValueError(f"prompt_ids ({len(prompt_ids)}) and answer_ids ({len(answer_ids)}) differ in length")
    if answer_masks is not None and [len(m) for m in answer_masks] != [len(a) for a in answer_ids]:
        raise ValueError("answer_masks must have one entry per answer id of every row")
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    n = len(prompt_ids)
    tokens = np.full((n, max_len), pad_id, np.int32)
    attn = np.zeros((n, max_len), np.int32)
    loss = np.zeros((n, max_len), np.int32)
    for row, (p, a) in enumerate(zip(prompt_ids, answer_ids)):
        seq = (list(p) + list(a))[:max_len]
        n_prompt = min(len(p), max_len)
        tokens[row, : len(seq)] = seq
        attn[row, : len(seq)] = 1
        # Position 0 has no prediction, so it never carries loss even with an empty prompt.
        loss[row, max(n_prompt, 1): len(seq)] = 1
        if answer_masks is not None:
            loss[row, n_prompt: len(seq)] *= np.asarray(answer_masks[row], np.int32)[: len(seq) - n_prompt]
    return {"tokens": tokens, "attn_mask": attn, "loss_mask": loss}


def build_sft_batch(prompts: Sequence[str], answers: Sequence[str], tokenizer, max_len: int) -> dict[str, np.ndarray]:
    """Text version: prompt encoded with BOS, answer with a trailing EOS (so the model learns to stop); no loss on
    a tool's output in an answer (tool_output_mask)."""
    p_ids = [tokenizer.encode(p, add_bos=True, add_eos=False) for p in prompts]
    a_ids = [tokenizer.encode(a, add_bos=False, add_eos=True) for a in answers]
    masks = None
    if any(byte_markers().call_end in a for a in answers):  # the call markers are the same for every tokenizer
        markers = default_markers(tokenizer)
        masks = [tool_output_mask(tokenizer, list(p) + list(a), markers)[len(p):] for p, a in zip(p_ids, a_ids)]
    return build_sft_batch_from_ids(p_ids, a_ids, max_len, pad_id=tokenizer.PAD, answer_masks=masks)
