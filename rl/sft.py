"""Supervised fine-tuning pieces: the masked cross-entropy and batches with the loss on answers only.

Used by the cold-start SFT stage and by rejection-sampling rounds (kept samples become SFT data).
The train step in `rl/train_step.py` with `LossConfig(mode="sft")` consumes the batches built here:

    batch = build_sft_batch(prompt_texts, solution_texts, ByteTokenizer(), max_len=256)
    state, metrics = train_step(state, batch)

Layout: each row is BOS + prompt + solution + EOS, right-padded; `loss_mask[:, t] = 1` exactly on
the solution tokens and the EOS (token t predicted from position t - 1), never on the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rl.losses import sft_loss

__all__ = ["sft_loss", "build_sft_batch", "build_sft_batch_from_ids"]


def build_sft_batch_from_ids(prompt_ids: Sequence[Sequence[int]], answer_ids: Sequence[Sequence[int]],
                             max_len: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Concatenate prompt and answer ids per row into `[B, max_len]` int32 arrays.

    Rows longer than `max_len` are cut at the end (the prompt is kept whole when it fits, so some
    answer tokens remain to learn from). Returns tokens, attn_mask, loss_mask.
    """
    if len(prompt_ids) != len(answer_ids):
        raise ValueError(f"prompt_ids ({len(prompt_ids)}) and answer_ids ({len(answer_ids)}) differ in length")
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
    return {"tokens": tokens, "attn_mask": attn, "loss_mask": loss}


def build_sft_batch(prompts: Sequence[str], answers: Sequence[str], tokenizer, max_len: int) -> dict[str, np.ndarray]:
    """Text version: prompt encoded with BOS, answer with a trailing EOS (so the model learns to stop)."""
    p_ids = [tokenizer.encode(p, add_bos=True, add_eos=False) for p in prompts]
    a_ids = [tokenizer.encode(a, add_bos=False, add_eos=True) for a in answers]
    return build_sft_batch_from_ids(p_ids, a_ids, max_len, pad_id=tokenizer.PAD)
