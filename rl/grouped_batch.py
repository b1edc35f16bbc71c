"""The grouped training layout for the launcher's RL updates: each prompt computed once for its K answers.

    layout = grouped_batch.plan(ks, max_rows, row_multiple, prompt_len, answer_len, pad_id)   # None: stay flat
    mb = grouped_batch.to_grouped(rows_of_flat_batch, resp_start, layout)                       # whole groups

A flat RL batch (rl.rollout.build_batch) holds each answer as its own row, BOS + prompt + answer right-padded to
prompt_len + answer_len, so a train step runs every prompt K times. `to_grouped` rewrites whole groups into the
layout of models/shared_prompt.py, which the train step (rl.train_step) and make_logprob_fn (rl.logprobs) take as they are:
prompt_tokens / prompt_mask [G, prompt_len] (left-padded, the sampler's form) and the answers [G*K, answer_len],
where every per-token array moves from row position resp_start + t to answer column t (the flat layout's
logprob at position j is that of token j; the grouped one's at column t that of answer token t). Per-row arrays
([rows], e.g. temperature) stay as they are. The losses are the flat batch's up to float rounding
(tests/test_grouped_batch.py). On quickstart's GRPO stage the update took 0.75x the flat layout's time and the
reference pass 0.82x, in the same run (experiments/bench/stage_layout.py, BENCHMARKS.md).

`plan` says whether a batch can use it: every group the same size K (the curriculum's mixed K stays flat), at
least one whole group per minibatch, and the minibatch's groups a multiple of the mesh's batch shards.
Minibatches are then drawn over whole groups instead of rows (rl.train_loop.train_on).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from rl import rollout


@dataclasses.dataclass(frozen=True)
class GroupedLayout:
    k: int  # answers per prompt
    groups: int  # groups per minibatch (every minibatch is padded to it: one compiled shape)
    prompt_len: int  # P: BOS + prompt, left-padded
    answer_len: int  # C: the sampler's max_new_tokens
    pad_id: int


def plan(ks, max_rows: int, row_multiple: int, prompt_len: int, answer_len: int, pad_id: int) -> GroupedLayout | None:
    """The grouped layout for a batch of groups of sizes `ks` whose minibatches hold at most `max_rows` rows, or
    None when the batch must stay flat (mixed group sizes, or a group larger than a minibatch)."""
    ks = np.asarray(ks)
    if ks.size == 0 or np.any(ks != ks[0]):
        return None
    k = int(ks[0])
    groups = (int(max_rows) // k) // int(row_multiple) * int(row_multiple)
    if groups < 1:
        return None
    return GroupedLayout(k=k, groups=groups, prompt_len=int(prompt_len), answer_len=int(answer_len), pad_id=int(pad_id))


def group_rows(group_ids, k: int) -> np.ndarray:
    """Row indices of the groups `group_ids` (group g = rows g*k ... g*k + k - 1), group by group."""
    g = np.asarray(group_ids, np.int64)
    return (g[:, None] * k + np.arange(k)[None]).reshape(-1)


def to_grouped(batch: dict, resp_start, layout: GroupedLayout) -> dict:
    """Flat rows of whole groups (each group's K rows contiguous and sharing one prompt) in the grouped layout,
    padded to `layout.groups` groups.

    batch: [rows, T] token arrays (tokens, attn_mask, loss_mask and any per-token floats: old_logp, ref_logp,
    advantages, old_values, returns ...), [rows] per-row arrays (temperature, per-sequence advantages), with
    T = prompt_len + answer_len; resp_start [rows]: each row's first answer position (len(BOS + prompt)).
    Padding groups' answer rows are rl.rollout.pad_rows' rows and their prompts have every mask 0: no loss term and
    no router statistic.
    """
    lay = layout
    P, C, K = lay.prompt_len, lay.answer_len, lay.k
    tokens = np.asarray(batch["tokens"])
    rows, T = tokens.shape
    if rows % K:
        raise ValueError(f"{rows} rows are not whole groups of {K}")
    G = rows // K
    if G > lay.groups:
        raise ValueError(f"{G} groups, more than the {lay.groups} a grouped minibatch holds")
    if T != P + C:
        raise ValueError(f"flat rows have {T} columns, expected prompt_len + answer_len = {P + C}")
    start = np.asarray(resp_start, np.int64)
    if start.shape != (rows,) or np.any(start < 1) or np.any(start > P):
        raise ValueError(f"resp_start must be [rows] values in 1..{P}, got {start}")
    first = start[::K]
    # Each group's rows must share the prompt: compare them with the group's first row.
    prompt_part = np.where(np.arange(T)[None] < start[:, None], tokens, -1).reshape(G, K, T)
    if np.any(start.reshape(G, K) != first[:, None]) or np.any(prompt_part != prompt_part[:, :1]):
        raise ValueError("a group's rows do not share one prompt (rows of a group must be contiguous)")

    Gp = lay.groups
    prompt_tokens = np.full((Gp, P), lay.pad_id, np.int32)
    prompt_mask = np.zeros((Gp, P), np.int32)
    for g in range(G):
        s = int(first[g])
        prompt_tokens[g, P - s:] = tokens[g * K, :s]
        prompt_mask[g, P - s:] = 1

    take = start[:, None] + np.arange(C)[None]  # [rows, C] row positions of the answer columns (all < T)
    answers = {}
    for name, v in batch.items():
        v = np.asarray(v)
        if v.ndim >= 2 and v.shape[:2] == (rows, T):
            answers[name] = np.take_along_axis(v, take.reshape(take.shape + (1,) * (v.ndim - 2)), axis=1)
        elif v.shape[:1] == (rows,):
            answers[name] = v
        else:
            raise ValueError(f"batch[{name!r}] has shape {v.shape}: neither [rows, T, ...] nor [rows, ...]")
    return {"prompt_tokens": prompt_tokens, "prompt_mask": prompt_mask, **rollout.pad_rows(answers, Gp * K)}


def chunked_logprobs(fn, params, batch: dict, resp_start, layout: GroupedLayout, temperature):
    """rl.rollout.chunked's flat [rows, T] results, computed in the grouped layout: `fn` is one of
    rl.logprobs.make_logprob_fn's functions (logprobs, or (logprobs, values) with with_values=True), called on
    `layout.groups` whole groups at a time (one compiled shape). Each answer token's value lands at its flat
    position; prompt positions and positions past a row's end are 0 (every caller masks them)."""
    tokens = np.asarray(batch["tokens"])
    rows, T = tokens.shape
    start = np.asarray(resp_start, np.int64)
    temp = np.broadcast_to(np.asarray(temperature, np.float32), (rows,))
    outs = None
    per = layout.groups * layout.k
    for s in range(0, rows, per):
        idx = np.arange(s, min(rows, s + per))
        g = to_grouped({"tokens": tokens[idx], "attn_mask": np.asarray(batch["attn_mask"])[idx],
                        "temperature": temp[idx]}, start[idx], layout)
        res = fn(params, g["tokens"], g["attn_mask"], g["temperature"], prompt_tokens=g["prompt_tokens"],
                 prompt_mask=g["prompt_mask"])
        res = res if isinstance(res, tuple) else (res,)
        outs = outs or [np.zeros((rows, T), np.float32) for _ in res]
        pos = start[idx][:, None] + np.arange(layout.answer_len)[None]
        for o, r in zip(outs, res):
            o[idx[:, None], pos] = np.asarray(r, np.float32)[: len(idx)] * g["attn_mask"][: len(idx)]
    return tuple(outs) if len(outs) > 1 else outs[0]
