"""Continuous batching: a fixed array of slots decodes a queue of rows, and a finished row's slot takes the next one.

    out = generate_slots(params, cfg, prompts_UP, key, prompt_mask=mask_UP, row_prompt=rows_N, slots=64,
                         max_new_tokens=128, temperature=0.7, eos_id=eos, pad_id=pad)
    out.tokens [N, max_new_tokens], out.logprobs [N, max_new_tokens], out.lengths [N]: row r continues prompt
    row_prompt[r] (e.g. np.repeat(np.arange(U), K): K answers per prompt, a GRPO group's rows together)

A static batch (models/sampling.py) runs every row until its longest one ends, so answers that stop early leave their
row idle, and each of the K copies of a prompt is prefilled again. Here the device holds S slots, each serving one row
at a time:
  refill   up to REFILL slots at once take the next rows of the queue: their prompts (each distinct prompt once, in a
           batch of 1, 2, 4, ... prompts: one compiled program per size used) are prefilled and copied into the slots'
           KV caches, which are reset (the previous row's tokens become invalid), and each slot samples its first token
  decode   a jitted while_loop of one-token steps over all S slots until enough slots have finished for the next
           refill (or every slot, once the queue is empty); finished slots idle until then
  harvest  the host copies a finished slot's tokens, logprobs and length to its row's place in the output
The KV cache is a ring of L = P + max_new_tokens slots per row shared by all rows: decode step t writes slot t mod L
of every row, and a refilled row's prompt fills the L - ... slots just before it, so a row never overwrites its own
tokens; attention sees a row's valid slots whatever their order (transformer.forward(causal=False)), and rotary
positions are each row's own.

Row r samples with the random stream fold_in(fold_in(key, r), i) for its token i, whichever slot serves it and
whenever: a row's tokens do not depend on how the queue was scheduled (up to float rounding of a different batch), and
they are models.sampling.generate's for the same rows in one call with the same key (tests/test_slot_sampling.py).
Behaviour logprobs are the sampler's, as in generate. Routes (MoE routing replay) are not recorded here: callers that
need them use generate.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from models import transformer
from models.layers import cache_layout
from models.sampling import SampleOutput, check_args, choose_tokens, prefill

REFILL = 8  # slots refilled per refill call (fewer when fewer rows wait)
MIN_SLOTS = 8  # with the queue empty, the tail halves the slot array down to this many slots


class _State(NamedTuple):
    cache: dict  # transformer.init_cache(cfg, S, L): the ring
    kv_valid: jax.Array  # [S, L] bool
    t: jax.Array  # decode steps so far: the next write slot is t mod L
    row: jax.Array  # [S] int32 row served (-1: none)
    pos: jax.Array  # [S] int32 rotary position of the token fed next
    n: jax.Array  # [S] int32 tokens generated
    temp: jax.Array  # [S] float32 the row's sampling temperature (0 = greedy)
    done: jax.Array  # [S] bool: finished or empty
    prev: jax.Array  # [S] int32 the token fed next
    tokens: jax.Array  # [S, N] int32
    logprobs: jax.Array  # [S, N] float32


class _Sampling(NamedTuple):
    key: jax.Array
    top_p: jax.Array
    top_k: jax.Array
    eos_ids: jax.Array
    pad_id: jax.Array


def _row_keys(key, rows, steps):
    """fold_in(fold_in(key, row), step) for each (row, step)."""
    per_row = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, rows)
    return jax.vmap(jax.random.fold_in)(per_row, steps)


def _is_eos(tok, eos_ids):
    return jnp.any(tok[:, None] == eos_ids[None, :], axis=-1)


@partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _init(cfg, slots: int, max_new_tokens: int, prompt_len: int, pad_id):
    S, N, L = slots, max_new_tokens, prompt_len + max_new_tokens
    return _State(cache=transformer.init_cache(cfg, S, L), kv_valid=jnp.zeros((S, L), bool), t=jnp.int32(0),
                  row=jnp.full((S,), -1, jnp.int32), pos=jnp.zeros((S,), jnp.int32), n=jnp.zeros((S,), jnp.int32),
                  temp=jnp.zeros((S,), jnp.float32), done=jnp.ones((S,), bool), prev=jnp.zeros((S,), jnp.int32),
                  tokens=jnp.full((S, N), pad_id, jnp.int32), logprobs=jnp.zeros((S, N), jnp.float32))


@partial(jax.jit, static_argnames=("cfg", "mesh", "rules"), donate_argnums=(1,))
def _refill(params, s: _State, sp: _Sampling, prompts_UP, mask_UP, slot_F, src_F, rows_F, temp_F, *, cfg, mesh,
            rules):
    """Prefill U prompts and start them in slots slot_F (S = no slot: padding), slot f taking prompt src_F[f] as row
    rows_F[f] at temperature temp_F[f]: its ring row gets the prompt's keys and values in the P slots before the
    write slot, nothing else valid; its first token is sampled from the prompt's last logits."""
    S, L = s.kv_valid.shape
    F, P, N = slot_F.shape[0], prompts_UP.shape[1], s.tokens.shape[1]
    last_U1V, _, aux = prefill(params, prompts_UP, mask_UP, P, cfg=cfg, mesh=mesh, rules=rules)
    ring_P = (s.t - P + jnp.arange(P, dtype=jnp.int32)) % L  # the P ring slots before write slot t
    keys_axis = 3 if cache_layout() == "keys_slots_last" else 2

    def place(old, new_UP, axis):  # old: the ring [S, ..., L (at axis), ...]; new: [U, ..., P (at axis), ...]
        idx = [slice(None)] * old.ndim
        idx[axis] = ring_P
        rows = jnp.zeros((F, *old.shape[1:]), old.dtype).at[tuple(idx)].set(
            jnp.take(new_UP, src_F, axis=0).astype(old.dtype))
        return old.at[slot_F].set(rows, mode="drop")

    cache = {"k": tuple(place(o, n, keys_axis) for o, n in zip(s.cache["k"], aux["cache"]["k"])),
             "v": tuple(place(o, n, 2) for o, n in zip(s.cache["v"], aux["cache"]["v"]))}
    mask_FP = jnp.take(mask_UP.astype(bool), src_F, axis=0)
    valid_FL = jnp.zeros((F, L), bool).at[:, ring_P].set(mask_FP)
    tok_F, logp_F = choose_tokens(jnp.take(last_U1V[:, 0], src_F, axis=0),
                                  _row_keys(sp.key, rows_F, jnp.zeros_like(rows_F)), temp_F, sp.top_p, sp.top_k)
    set_ = lambda x, v: x.at[slot_F].set(v, mode="drop")  # noqa: E731
    return s._replace(
        cache=cache, kv_valid=set_(s.kv_valid, valid_FL), row=set_(s.row, rows_F),
        pos=set_(s.pos, jnp.sum(mask_FP, axis=1, dtype=jnp.int32)), n=set_(s.n, jnp.ones_like(rows_F)),
        temp=set_(s.temp, temp_F),
        done=set_(s.done, _is_eos(tok_F, sp.eos_ids) | (N <= 1)), prev=set_(s.prev, tok_F),
        tokens=set_(s.tokens, jnp.full((F, N), sp.pad_id, jnp.int32).at[:, 0].set(tok_F)),
        logprobs=set_(s.logprobs, jnp.zeros((F, N), jnp.float32).at[:, 0].set(logp_F)))


@partial(jax.jit, static_argnames=("cfg", "mesh", "rules"), donate_argnums=(1,))
def _decode(params, s: _State, sp: _Sampling, need, *, cfg, mesh, rules):
    """One-token steps over every slot until at least `need` slots are finished (or all are)."""
    S, L = s.kv_valid.shape
    N = s.tokens.shape[1]

    def cond(s):
        return jnp.any(~s.done) & (jnp.sum(s.done) < need)

    def body(s):
        live = ~s.done
        slot = s.t % L
        kv_valid = s.kv_valid.at[:, slot].set(True)  # every row, so no row's attention is fully masked
        logits_S1V, aux = transformer.forward(params, s.prev[:, None], cfg, positions=s.pos[:, None],
                                              attn_mask=live[:, None], cache=s.cache, cache_index=slot,
                                              kv_valid=kv_valid, mesh=mesh, rules=rules, causal=False)
        tok, logp = choose_tokens(logits_S1V[:, 0], _row_keys(sp.key, jnp.maximum(s.row, 0), s.n), s.temp, sp.top_p,
                                  sp.top_k)
        col = jnp.where(live, s.n, N)  # finished slots write out of range: dropped
        tokens = s.tokens.at[jnp.arange(S), col].set(tok, mode="drop")
        logprobs = s.logprobs.at[jnp.arange(S), col].set(logp, mode="drop")
        n = s.n + live.astype(jnp.int32)
        done = s.done | (live & (_is_eos(tok, sp.eos_ids) | (n >= N)))
        return s._replace(cache=aux["cache"], kv_valid=kv_valid, t=s.t + 1, pos=s.pos + live.astype(jnp.int32),
                          n=n, done=done, prev=jnp.where(live, tok, s.prev), tokens=tokens, logprobs=logprobs)

    return jax.lax.while_loop(cond, body, s)


@jax.jit  # not donated: the smaller arrays cannot reuse the larger ones' buffers
def _compact(s: _State, keep) -> _State:
    """The slots `keep` of state s (a smaller slot array: the rows still running, in slot order)."""
    take = lambda x: jnp.take(x, keep, axis=0)  # noqa: E731
    return s._replace(cache=jax.tree.map(take, s.cache), kv_valid=take(s.kv_valid), row=take(s.row),
                      pos=take(s.pos), n=take(s.n), temp=take(s.temp), done=take(s.done), prev=take(s.prev), tokens=take(s.tokens),
                      logprobs=take(s.logprobs))


def _bucket(n: int, cap: int) -> int:
    """The smallest power of two >= n (at most cap): one compiled prefill per size used."""
    b = 1
    while b < n:
        b *= 2
    return min(b, cap)


def generate_slots(params, cfg, prompts, key, *, row_prompt, prompt_mask=None, slots: int = 64,
                   max_new_tokens: int = 64, temperature=1.0, top_p=1.0, top_k=0, eos_id=2, pad_id=0, mesh=None,
                   rules=None, refill: int = REFILL) -> SampleOutput:
    """Continuations of LEFT-padded prompts [U, P] (prompt_mask as in sampling.generate), row r of the output
    continuing prompt row_prompt[r] at temperature (one value, or one per row: e.g. a greedy answer and k samples of
    each prompt in one call, the prompt prefilled once for all of them), through `slots` slots (see the module
    docstring). Returns SampleOutput(tokens
    [N, max_new_tokens], logprobs, lengths) in row order, as sampling.generate's for the same rows."""
    row_prompt = np.asarray(row_prompt, np.int64)
    prompts, prompt_mask, eos_ids = check_args(cfg, prompts, prompt_mask, 1, max_new_tokens, 0.0, top_p, top_k,
                                               eos_id)
    temps = np.broadcast_to(np.asarray(temperature, np.float32), row_prompt.shape) \
        if np.ndim(temperature) == 0 or np.shape(temperature) == row_prompt.shape else None
    if temps is None or not np.all(np.isfinite(temps)) or np.any(temps < 0):
        raise ValueError(f"temperature must be one value >= 0 or one per row ({len(row_prompt)}), got {temperature!r}")
    U, P = prompts.shape
    if row_prompt.ndim != 1 or not len(row_prompt) or row_prompt.min() < 0 or row_prompt.max() >= U:
        raise ValueError(f"row_prompt must be a non-empty list of prompt indices in [0, {U}), got {row_prompt!r}")
    S, N, F = int(slots), int(max_new_tokens), int(min(refill, slots))
    if S < 1 or F < 1:
        raise ValueError(f"slots and refill must be >= 1, got {slots}, {refill}")
    sp = _Sampling(key=key, top_p=jnp.asarray(top_p, jnp.float32),
                   top_k=jnp.asarray(top_k, jnp.int32), eos_ids=eos_ids, pad_id=jnp.asarray(pad_id, jnp.int32))
    static = dict(cfg=cfg, mesh=mesh, rules=rules)
    view = transformer.decode_view(params, cfg)  # the per-layer view decoding runs on, once per call
    prompts_np, mask_np = np.asarray(prompts), np.asarray(prompt_mask)
    R = len(row_prompt)
    out_tok = np.full((R, N), int(pad_id), np.int32)
    out_lp = np.zeros((R, N), np.float32)
    out_len = np.zeros((R,), np.int32)
    s = _init(cfg, S, N, P, jnp.asarray(pad_id, jnp.int32))
    served = np.full((S,), -1, np.int64)  # host copy: the row each slot holds (-1: none, or harvested)
    next_row = 0
    while True:
        done, row = (np.asarray(x) for x in jax.device_get((s.done, s.row)))
        finished = [i for i in range(S) if done[i] and served[i] >= 0]
        if finished:  # harvest
            tok, lp, n = (np.asarray(x) for x in jax.device_get((s.tokens, s.logprobs, s.n)))
            for i in finished:
                out_tok[served[i]], out_lp[served[i]], out_len[served[i]] = tok[i], lp[i], n[i]
                served[i] = -1
        free = [i for i in range(S) if done[i]]
        while free and next_row < R:  # refill, F slots per call
            take = free[:F]
            free = free[len(take):]
            rows = np.arange(next_row, min(next_row + len(take), R))
            next_row += len(rows)
            uniq, src = np.unique(row_prompt[rows], return_inverse=True)
            B = _bucket(len(uniq), F)
            pick = np.concatenate([uniq, np.full((B - len(uniq),), uniq[0])])
            slot_F = np.full((F,), S, np.int32)
            slot_F[:len(rows)] = take[:len(rows)]
            src_F = np.zeros((F,), np.int32)
            src_F[:len(rows)] = src
            rows_F = np.zeros((F,), np.int32)
            rows_F[:len(rows)] = rows
            temp_F = np.zeros((F,), np.float32)
            temp_F[:len(rows)] = temps[rows]
            served[take[:len(rows)]] = rows
            s = _refill(params, s, sp, jnp.asarray(prompts_np[pick]), jnp.asarray(mask_np[pick]), jnp.asarray(slot_F),
                        jnp.asarray(src_F), jnp.asarray(rows_F), jnp.asarray(temp_F), **static)
        if next_row >= R and (served < 0).all():
            break
        live = int((served >= 0).sum())
        if next_row >= R and S > MIN_SLOTS and live <= S // 2:  # the queue is empty: the tail runs on fewer slots
            S //= 2
            keep = np.concatenate([np.nonzero(served >= 0)[0], np.nonzero(served < 0)[0]])[:S]
            s, served = _compact(s, jnp.asarray(keep, jnp.int32)), served[keep]
        # decode until the next refill has enough free slots; with the queue empty, until half the slots are done
        # (then the tail moves to half as many), or all of them at the smallest slot array
        need = (S - live + min(F, R - next_row)) if next_row < R else (S - S // 2 if S > MIN_SLOTS else S)
        s = _decode(view, s, sp, jnp.int32(need), **static)
    return SampleOutput(tokens=jnp.asarray(out_tok), logprobs=jnp.asarray(out_lp), lengths=jnp.asarray(out_len))
