"""Rollouts: prompts -> sampler -> reward workers -> scored batches, with sampling and scoring overlapped.

Pieces (used by the trainer's rejection and RL stages, and by evaluation):

  encode_prompts(tok, texts)           LEFT-padded prompt ids for the sampler
  sample(gen, params, texts, ks, ...)  K_i samples of prompt i through the sampler's slots (continuous
                                       batching) or in fixed-size calls (static), prompts padded to
                                       max_prompt_len: the sampler compiles once per run
  build_batch(prompt_ids, samples, T)  train-step rows: BOS + prompt + response (+EOS), right-padded to T;
                                       loss_mask on the response tokens, the sampler's logprobs beside them
                                       (and, when sampled with return_routes, its expert choices: `routes`)
  even_minibatches(order, max_rows)    an epoch's rows split into near-equal minibatches (sizes differ by <= 1)
  pad_rows(batch, rows)                append empty rows (masks 0) up to a fixed row count: one compiled shape
  chunked(fn, params, batch, rows)     a forward (logprobs, values) over fixed-size row chunks
  pending_tree / _meta / _template / _load   the batches sampled ahead (bounded staleness) in a checkpoint
  Scorer                               submits a batch to the reward pool's worker processes and returns
                                       at once, so the main thread samples the next batch while this
                                       one is scored (the producer / consumer overlap)

A scored rollout keeps everything the train step and the metrics need (`Samples`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import numpy as np

from rewards.task_score import target_of


def round_up(n: int, m: int) -> int:
    return ((int(n) + m - 1) // m) * m


def encode_prompts(tok, texts: Sequence[str], multiple: int = 8, max_len: int | None = None):
    """LEFT-padded [B, P] ids and mask (BOS + prompt bytes); P rounded up to `multiple`."""
    ids = [tok.encode(t, add_bos=True) for t in texts]
    longest = max(len(x) for x in ids)
    if max_len is not None and longest > max_len:
        raise ValueError(f"a prompt has {longest} tokens, more than tasks.max_prompt_len={max_len}")
    P = round_up(longest, multiple)
    if max_len is not None:
        P = min(P, max(max_len, longest))
    arr = np.full((len(ids), P), tok.PAD, np.int32)
    mask = np.zeros((len(ids), P), np.int32)
    for i, x in enumerate(ids):
        arr[i, P - len(x) :] = x
        mask[i, P - len(x) :] = 1
    return arr, mask, ids


@dataclass
class Samples:
    """Sampled answers: row r answers prompt `prompt_index[r]`; rows of one prompt are contiguous."""

    prompt_index: np.ndarray  # [N] int64
    tokens: np.ndarray  # [N, max_new] int32 (pad after EOS)
    logprobs: np.ndarray  # [N, max_new] float32 (sampler's, 0 after end)
    lengths: np.ndarray  # [N] int32, incl. EOS
    texts: list[str]
    group_sizes: np.ndarray  # [n_prompts] samples per prompt, in prompt order
    scores: list[dict] = field(default_factory=list)  # filled by the reward pool
    routes: np.ndarray | None = None  # [N, P + max_new, n_moe_layers, k] int32 by sampler cache slot (-1 = none)

    def split(self, first: int) -> tuple["Samples", "Samples"]:
        """(the first `first` rows of every prompt's group, the rest), each a Samples of its own (groups of equal
        size: e.g. one call that drew each prompt's greedy answer and its k samples)."""
        sizes = np.asarray(self.group_sizes)
        if not np.all(sizes == sizes[0]) or not 0 < first < sizes[0]:
            raise ValueError(f"split({first}) needs equal groups larger than {first}, got sizes {sizes.tolist()}")
        head = (np.arange(len(self.texts)) % sizes[0]) < first

        def part(sel, k):
            return Samples(prompt_index=self.prompt_index[sel], tokens=self.tokens[sel], logprobs=self.logprobs[sel],
                           lengths=self.lengths[sel], texts=[t for t, s in zip(self.texts, sel) if s],
                           group_sizes=np.full_like(sizes, k),
                           routes=None if self.routes is None else self.routes[sel])

        return part(head, first), part(~head, sizes[0] - first)


def sample(
    generate: Callable,
    params,
    model_cfg,
    tok,
    prompt_texts: Sequence[str],
    ks: Sequence[int],
    key: jax.Array,
    *,
    temperature: float | Sequence[float],
    max_new_tokens: int,
    top_p: float = 1.0,
    top_k: int = 0,
    max_prompt_len: int,
    rows_per_call: int = 128,
    return_routes: bool = False,
    generate_slots: Callable | None = None,
) -> Samples:
    """Draw ks[i] answers for prompt i; row r of the result answers prompt row_prompt[r] (a prompt's rows together)
    at `temperature` (one value, or one per row: sum(ks) values; 0 = greedy).

    With `generate_slots` (models.slot_sampling.generate_slots, continuous batching; not for return_routes) the rows
    go through `rows_per_call` slots, each distinct prompt prefilled once per refill, and row r draws from
    fold_in(key, r). Otherwise (static batching) every prompt is repeated ks[i] times and the rows go to `generate`
    in calls of exactly `rows_per_call` rows (the last call padded), call c with fold_in(key, c). Prompts are
    left-padded to `max_prompt_len` either way, so the sampler compiles once per run whatever the batch, K or eval
    size. return_routes: also keep the sampler's expert choices (models.sampling.generate), for routing replay.
    """
    ks = np.asarray(ks, np.int64)
    n = len(prompt_texts)
    if ks.shape != (n,):
        raise ValueError(f"ks must have one entry per prompt ({n}), got shape {ks.shape}")
    prompts, pmask, _ = encode_prompts(tok, prompt_texts, multiple=max_prompt_len, max_len=max_prompt_len)
    row_prompt = np.repeat(np.arange(n), ks)
    R = len(row_prompt)
    temps = np.broadcast_to(np.asarray(temperature, np.float32), (R,)).copy()
    kw = dict(max_new_tokens=int(max_new_tokens), top_p=float(top_p), top_k=int(top_k), eos_id=list(tok.stop_ids),
              pad_id=tok.PAD)
    routes = []
    if generate_slots is not None and not return_routes and R:
        o = generate_slots(params, model_cfg, prompts, key, row_prompt=row_prompt, prompt_mask=pmask,
                           slots=int(rows_per_call), temperature=temps, **kw)
        t, lp, ln = (np.asarray(x) for x in jax.device_get((o.tokens, o.logprobs, o.lengths)))
        toks, lps, lens = [t], [lp], [ln]
    else:
        toks, lps, lens = [], [], []
        for c, start in enumerate(range(0, R, rows_per_call)):
            sel = row_prompt[start : start + rows_per_call]
            real = len(sel)
            sel = np.concatenate([sel, np.full((rows_per_call - real,), sel[-1])])
            t_call = np.concatenate([temps[start:start + real], np.zeros((rows_per_call - real,), np.float32)])
            o = generate(params, model_cfg, prompts[sel], jax.random.fold_in(key, c), prompt_mask=pmask[sel],
                         num_samples=1, temperature=t_call, **kw, **({"return_routes": True} if return_routes else {}))
            t, lp, ln = (np.asarray(x) for x in jax.device_get((o.tokens, o.logprobs, o.lengths)))
            toks.append(t[:real])
            lps.append(lp[:real])
            lens.append(ln[:real])
            if return_routes:
                routes.append(np.asarray(jax.device_get(o.routes))[:real])
    tokens = np.concatenate(toks, 0).astype(np.int32)
    return Samples(
        prompt_index=row_prompt, tokens=tokens, logprobs=np.concatenate(lps, 0).astype(np.float32),
        lengths=np.concatenate(lens, 0).astype(np.int32), texts=[tok.decode(row) for row in tokens], group_sizes=ks,
        routes=np.concatenate(routes, 0).astype(np.int32) if return_routes else None,
    )


def build_batch(prompt_ids: Sequence[Sequence[int]], samples: Samples, length: int, pad_id: int = 0) -> dict:
    """Rows BOS + prompt + response for the train step, right-padded to `length` (fixed: one compile).

    Returns tokens, attn_mask, loss_mask [N, T] int32, sample_logp [N, T] float32 (the sampler's
    logprobs placed on the response tokens) and resp_start [N] (index of the first response token); with
    samples.routes also routes [N, T, n_moe_layers, k] int32, the sampler's experts of every prompt and response
    token at its row position (-1 = none: padding, each row's last token).
    """
    N, M = samples.tokens.shape
    plens = np.array([len(prompt_ids[p]) for p in samples.prompt_index], np.int64)
    T = int(length)
    if int((plens + samples.lengths).max()) > T:
        raise ValueError(f"a prompt + response has {int((plens + samples.lengths).max())} tokens, more than {T}")
    tokens = np.full((N, T), pad_id, np.int32)
    attn = np.zeros((N, T), np.int32)
    loss = np.zeros((N, T), np.int32)
    slp = np.zeros((N, T), np.float32)
    routes = None
    if samples.routes is not None:
        W = samples.routes.shape[1] - M  # the sampler's (left-padded) prompt width
        routes = np.full((N, T, *samples.routes.shape[2:]), -1, np.int32)
    for r in range(N):
        p = prompt_ids[samples.prompt_index[r]]
        L = int(samples.lengths[r])
        P = len(p)
        tokens[r, :P] = p
        tokens[r, P : P + L] = samples.tokens[r, :L]
        attn[r, : P + L] = 1
        loss[r, P : P + L] = 1
        slp[r, P : P + L] = samples.logprobs[r, :L]
        if routes is not None:
            routes[r, :P] = samples.routes[r, W - P : W]
            routes[r, P : P + L] = samples.routes[r, W : W + L]
    out = {"tokens": tokens, "attn_mask": attn, "loss_mask": loss, "sample_logp": slp, "resp_start": plens}
    if routes is not None:
        out["routes"] = routes
    return out


class Scorer:
    """Producer / consumer front of the reward pool (rewards.pool.RewardPool).

    `submit` queues a batch of (text, problem) pairs with the pool's worker processes (each problem scored by
    its own family's reward, rewards.task_score) and returns a handle at once, so the
    caller samples the next batch while this one is scored; `result(handle)` waits for the list of
    reward dicts (in submit order). With `reward_workers=0` the pool scores inside `submit`.
    """

    def __init__(self, pool):
        self.pool = pool

    def submit(self, texts: list[str], problems, n_tokens=None):
        """Queue `texts[i]` scored against `problems[i]` (rl.tasks.Problem: each carries its own reward)."""
        targets = [target_of(p.reward, p.answer, p.check) for p in problems]
        return self.pool.submit_batch(list(texts), targets, None if n_tokens is None else [int(x) for x in n_tokens])

    @staticmethod
    def result(handle) -> list[dict]:
        return handle.result()

    def close(self) -> None:
        self.pool.close()


def even_minibatches(order: np.ndarray, max_rows: int) -> list[np.ndarray]:
    """Split the row indices `order` into ceil(n / max_rows) consecutive parts whose sizes differ by at most 1.

    Every optimizer step then sees about the same number of rows: no tiny last minibatch getting a
    full-size update.
    """
    order = np.asarray(order)
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    n = len(order)
    if n == 0:
        return []
    n_parts = -(-n // max_rows)
    return [p for p in np.array_split(order, n_parts)]


def length_grouped_minibatches(order: np.ndarray, lengths: np.ndarray, max_rows: int, rng: np.random.Generator,
                               window: int = 8) -> list[np.ndarray]:
    """even_minibatches' parts (same count and sizes), but of rows of similar length: the shuffled `order` is cut
    into windows of `window` minibatches' worth of rows, each window sorted by `lengths[row]` and split, and the
    minibatches are returned in a random order. A minibatch's columns can then be trimmed to its longest row
    (trim_columns), while every epoch still visits every row once, in batches that differ from epoch to epoch."""
    order = np.asarray(order)
    sizes = [len(p) for p in even_minibatches(np.arange(len(order)), max_rows)]
    out, start = [], 0
    for w in range(0, len(sizes), window):
        ws = sizes[w:w + window]
        chunk = order[start:start + sum(ws)]
        start += sum(ws)
        chunk = chunk[np.argsort(np.asarray(lengths)[chunk], kind="stable")]
        out += np.split(chunk, np.cumsum(ws)[:-1])
    return [out[j] for j in rng.permutation(len(out))]


def column_bucket(needed: int, seq_len: int, n_buckets: int) -> int:
    """The narrowest of `n_buckets` widths (seq_len x i / n_buckets, rounded up to a multiple of 8, at most
    seq_len) that holds `needed` columns: a few compiled shapes instead of one per length."""
    for i in range(1, n_buckets + 1):
        share = -(-seq_len * i // n_buckets)  # ceil(seq_len * i / n_buckets)
        width = min(seq_len, -(-share // 8) * 8)
        if width >= needed:
            return width
    return seq_len


def row_lengths(attn_mask: np.ndarray) -> np.ndarray:
    """Per row, one past the last attended position (0 for an empty row)."""
    a = np.asarray(attn_mask) != 0
    return np.where(a.any(1), a.shape[1] - np.argmax(a[:, ::-1], axis=1), 0)


def trim_columns(batch: dict, cols: int) -> dict:
    """`batch` with every [rows, T, ...] array cut to its first `cols` positions. Exact for right-padded rows no
    longer than `cols`: causal attention never looks ahead and every loss and router term is masked."""
    t = int(np.shape(batch["tokens"])[1])
    return {k: (np.asarray(v)[:, :cols] if np.ndim(v) >= 2 and np.shape(v)[1] == t else v) for k, v in batch.items()}


def epoch_minibatches(n: int, max_rows: int, rng: np.random.Generator,
                      lengths: np.ndarray | None = None) -> list[np.ndarray]:
    """One epoch's minibatches of row indices over a fresh permutation of n rows: even_minibatches, or
    length_grouped_minibatches when `lengths` (row_lengths) is given."""
    order = rng.permutation(n)
    if lengths is None:
        return even_minibatches(order, max_rows)
    return length_grouped_minibatches(order, lengths, max_rows, rng)


def take_minibatch(batch: dict, idx: np.ndarray, rows: int, length_buckets: int = 0,
                   lengths: np.ndarray | None = None) -> dict:
    """Rows `idx` of `batch`, padded to `rows` (pad_rows); with `length_buckets` > 0 also cut to the narrowest
    column_bucket width holding the longest of them (`lengths`: row_lengths of the whole batch)."""
    mb = pad_rows({k: np.asarray(v)[idx] for k, v in batch.items()}, rows)
    if length_buckets:
        seq_len = int(np.shape(batch["tokens"])[1])
        mb = trim_columns(mb, column_bucket(int(lengths[idx].max()), seq_len, length_buckets))
    return mb


def pad_rows(batch: dict, rows: int) -> dict:
    """`batch` with empty rows appended up to `rows` (all masks 0: a query whose keys are all masked gets a finite
    uniform softmax, models/layers.py; float fields 0; routes -1, i.e. none recorded). Empty rows change no loss
    term and no metric, the router statistics included (they are not dispatched to any expert)."""
    n = int(batch["tokens"].shape[0])
    if n > rows:
        raise ValueError(f"batch has {n} rows, more than the {rows} it should be padded to")
    if n == rows:
        return batch
    out = {k: np.concatenate([np.asarray(v), np.zeros((rows - n,) + np.shape(v)[1:], np.asarray(v).dtype)])
           for k, v in batch.items()}
    if "temperature" in out:
        out["temperature"][n:] = 1.0
    if "routes" in out:
        out["routes"][n:] = -1
    return out


def chunked(fn: Callable, params, batch: dict, rows: int, *args):
    """`fn(params, tokens, attn_mask, *args)` over fixed-size row chunks (one compile); host float32 results
    for the real rows. Row-aligned array arguments in `args` (e.g. per-row temperatures) are chunked too."""
    n = int(batch["tokens"].shape[0])
    outs = []
    for s in range(0, n, rows):
        part = pad_rows({"tokens": batch["tokens"][s : s + rows], "attn_mask": batch["attn_mask"][s : s + rows]}, rows)
        real = min(rows, n - s)
        extra = [np.concatenate([a[s : s + rows], np.ones((rows - real,) + a.shape[1:], a.dtype)])
                 if isinstance(a, np.ndarray) and a.shape[:1] == (n,) else a for a in args]
        o = fn(params, part["tokens"], part["attn_mask"], *extra)
        o = o if isinstance(o, tuple) else (o,)
        outs.append([np.asarray(x, np.float32)[:real] for x in o])
    res = [np.concatenate([o[i] for o in outs], 0) for i in range(len(outs[0]))]
    return tuple(res) if len(res) > 1 else res[0]


def rows_for_budget(token_budget: int, seq_len: int, multiple: int = 1) -> int:
    """Rows per train step for a token budget at a fixed padded length, a multiple of the mesh's batch axes."""
    r = max(1, int(token_budget) // int(seq_len))
    return max(multiple, (r // multiple) * multiple)


# ---- batches sampled ahead, in checkpoints --------------------------------------------------------------------------
# A pending batch is {"arrays": {name: array}, "unit": iteration, "temperature": float, "version": updates done when
# it was sampled}; the arrays go in the checkpoint's tree under "u<unit>", the rest in its JSON meta.
def pending_tree(batches: list[dict]) -> dict:
    return {f"u{b['unit']}": b["arrays"] for b in batches}


def pending_meta(batches: list[dict]) -> list[dict]:
    return [{"shapes": {k: [list(v.shape), str(v.dtype)] for k, v in b["arrays"].items()}, "unit": b["unit"],
             "temperature": b["temperature"], "version": b["version"]} for b in batches]


def pending_template(meta) -> dict:
    """Zero arrays in the tree structure `pending_tree` wrote for `meta` (a dict: one batch, the layout from before
    bounded staleness)."""
    zeros = lambda b: {k: np.zeros(shape, dtype) for k, (shape, dtype) in b["shapes"].items()}
    return zeros(meta) if isinstance(meta, dict) else {f"u{b['unit']}": zeros(b) for b in meta}


def pending_load(tree, meta, default_version: int = 0) -> list[dict]:
    """The pending batches of a restored checkpoint ([] when there are none)."""
    if not meta:
        return []
    if isinstance(meta, dict):  # one batch, stored without a version
        meta, tree = [meta], {f"u{meta['unit']}": tree}
    return [{"arrays": {k: np.asarray(v) for k, v in tree[f"u{b['unit']}"].items()}, "unit": b["unit"],
             "temperature": b["temperature"], "version": b.get("version", default_version)} for b in meta]
