"""Multi-turn sampling that pauses at tool calls, token-in / token-out.

    out = generate_with_tools(params, cfg, prompts, key, tool_fn=tool, call_end_ids=markers.call_end_ids,
                              max_turns=4, max_new_tokens=256, eos_id=tok.stop_ids, pad_id=tok.pad_id,
                              prompt_mask=mask, num_samples=8, temperature=1.0)
    out.tokens [R, P+N]  out.policy_mask [R, P+N]  out.logprobs [R, P+N]  out.turns [R]  out.lengths [R]

Samples like models/sampling.generate (same prefill, same token choice and filters, same per-row random streams:
without a tool call the tokens are generate's), but when a row samples a token in `call_end_ids` while it has
turns left, decoding pauses, the host calls `tool_fn(row_ids)` (row_ids: list[int], the row's real prompt tokens
and everything appended so far, ending with the call-end token), appends the returned ids to the row, and the KV
cache takes them in one prefill. The ids are never decoded and re-encoded: `tokens` is exactly what was sampled
and what the tools returned. tool_fn may return None for "not a call" (a multi-token closing marker whose last
token also occurs elsewhere): nothing is appended, no turn is counted, decoding goes on.

Outputs (R = B * num_samples rows, row b*K + k is sample k of prompt b; L = P + max_new_tokens):
    tokens      [R, L] int32  the LEFT-padded prompt as given, then everything appended in order, pad_id after
    policy_mask [R, L] int32  1 exactly on the tokens the policy sampled (not the prompt, tool output or padding)
    logprobs    [R, L] f32    behaviour logprob of each sampled token under softmax(logits / T) (T = 1 when greedy),
                              before top-k / top-p, as generate's; 0 elsewhere
    turns       [R]    int32  tool calls made (tool_fn calls that returned a list)
    lengths     [R]    int32  tokens appended after the prompt (sampled and tool), <= max_new_tokens
Tool output counts against the row's budget of max_new_tokens and is truncated there; a row whose budget is spent
by tool output ends (its tail is the tool's). A call-end token sampled with no turns left is an ordinary token.

How it runs (accelerator-friendly: fixed shapes, no per-token host round trip). Decoding is a jitted
`lax.while_loop` segment that runs until a row pauses at a call end, every row is done, or the cache's write slot
reaches its end. The cache has C = P + N slots plus a scratch block of W slots. Every live row's tokens sit
RIGHT-aligned, ending at a common slot `end` (one write slot for all rows, as in generate; rotary positions are
tracked per row, so slots and positions differ). At a pause the tool ids (prefixed by the pending call-end token)
are prefilled into the scratch block [C, C+W) for all pausing rows together (one chunk as wide as the longest
output rounded up to a power of two; longer than W: W-wide chunks); then one gather per cache array moves every
row's tokens back to RIGHT alignment at end* = max over live rows of their token count (<= C), the scratch block
last. So the slots in use never exceed P + N, however many pauses
there are, and each pause costs one small prefill plus one pass over the cache. The calls of one pause run
together in a thread pool (tool_fn should release the GIL while it waits, as a sandboxed subprocess does), so
rows waiting for tools hold the others up only for the longest call of the pause.

Random streams: the token at appended index t of row r is drawn with fold_in(fold_in(key, r), t), generate's
rule, so a row's samples do not depend on when the other rows paused.

Not here yet: generate's return_routes (MoE routing replay would need the routes of the tool ids' prefill too).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from models import transformer
from models.layers import cache_layout
from models.sampling import check_args, choose_tokens, prefill

SCRATCH_SLOTS = 64  # the cache's scratch block: the widest tool-output prefill (longer outputs go in several)
MIN_CHUNK = 4  # narrowest prefill width (widths are powers of two up to the scratch block)
MAX_TOOL_THREADS = 32  # tool calls of one pause run concurrently, at most this many at once


class ToolSampleOutput(NamedTuple):  # NumPy arrays (the host loop fetched them anyway)
    tokens: np.ndarray       # [R, P + N] int32
    policy_mask: np.ndarray  # [R, P + N] int32, 1 on sampled tokens
    logprobs: np.ndarray     # [R, P + N] float32, behaviour logprob on sampled tokens, 0 elsewhere
    turns: np.ndarray        # [R] int32, tool calls made
    lengths: np.ndarray      # [R] int32, tokens appended after the prompt (sampled + tool)


class _State(NamedTuple):
    cache: dict             # KV cache with C + W slots
    kv_valid: jax.Array     # [R, C + W] bool
    end: jax.Array          # () int32: every live row's cached tokens end at slot end - 1
    ctx: jax.Array          # [R] int32: tokens of the row in the cache = rotary position of the pending token
    prev: jax.Array         # [R] int32: last appended token, not yet in the cache
    n_out: jax.Array        # [R] int32: tokens appended after the prompt (the pending one included)
    done: jax.Array         # [R] bool
    pausing: jax.Array      # [R] bool: sampled a call end with turns left; waits for its tool
    turns: jax.Array        # [R] int32
    tokens: jax.Array       # [R, P + N] int32
    policy: jax.Array       # [R, P + N] int32
    logprobs: jax.Array     # [R, P + N] float32


class _Sampling(NamedTuple):  # traced sampling settings, one pytree
    row_keys: jax.Array
    temperature: jax.Array
    top_p: jax.Array
    top_k: jax.Array
    eos_ids: jax.Array
    is_call_end: jax.Array  # [vocab] bool: a table, so any set of call-end ids has one shape (no recompiles)
    max_turns: jax.Array


def _in(tok_R, ids):
    return jnp.any(tok_R[:, None] == ids[None, :], axis=-1)


def _record(s: _State, sp: _Sampling, which_R, tok_R, logp_R, *, P, N) -> _State:
    """Append sampled tokens to the rows in `which_R` (each has budget left) and update their flags."""
    rows = jnp.arange(tok_R.shape[0])
    col_R = jnp.where(which_R, P + s.n_out, s.tokens.shape[1])  # out of range -> dropped
    tokens = s.tokens.at[rows, col_R].set(tok_R, mode="drop")
    policy = s.policy.at[rows, col_R].set(1, mode="drop")
    logprobs = s.logprobs.at[rows, col_R].set(logp_R, mode="drop")
    n_out = s.n_out + which_R.astype(jnp.int32)
    ends = which_R & (_in(tok_R, sp.eos_ids) | (n_out >= N))
    calls = which_R & ~ends & sp.is_call_end[tok_R] & (s.turns < sp.max_turns)
    return s._replace(tokens=tokens, policy=policy, logprobs=logprobs, n_out=n_out, done=s.done | ends,
                      pausing=s.pausing | calls, prev=jnp.where(which_R, tok_R, s.prev))


def _choose(logits_RV, s: _State, sp: _Sampling):
    keys_R = jax.vmap(jax.random.fold_in)(sp.row_keys, s.n_out)  # generate's stream: (row, appended index)
    return choose_tokens(logits_RV, keys_R, sp.temperature, sp.top_p, sp.top_k)


@partial(jax.jit, static_argnames=("cfg", "num_samples", "max_new_tokens", "scratch", "mesh", "rules"))
def _start(params, prompts_BP, mask_BP, key, sp: _Sampling, pad_id, *, cfg, num_samples, max_new_tokens, scratch,
           mesh, rules):
    """Prefill the prompts, repeat each K times, sample every row's first token."""
    B, P = prompts_BP.shape
    K, N = num_samples, max_new_tokens
    R = B * K
    last_logits_B1V, kv_valid_BS, aux = prefill(params, prompts_BP, mask_BP, P + N + scratch, cfg=cfg,
                                                mesh=mesh, rules=rules)
    rep = lambda x: jnp.repeat(x, K, axis=0)  # noqa: E731 - row b*K + k <- prompt b
    row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(R))
    sp = sp._replace(row_keys=row_keys)
    L = P + N
    s = _State(cache=jax.tree.map(rep, aux["cache"]), kv_valid=rep(kv_valid_BS), end=jnp.int32(P),
               ctx=rep(jnp.sum(mask_BP.astype(jnp.int32), axis=1)), prev=jnp.zeros((R,), jnp.int32),
               n_out=jnp.zeros((R,), jnp.int32), done=jnp.zeros((R,), bool), pausing=jnp.zeros((R,), bool),
               turns=jnp.zeros((R,), jnp.int32),
               tokens=jnp.concatenate([rep(prompts_BP), jnp.full((R, N), pad_id, jnp.int32)], axis=1),
               policy=jnp.zeros((R, L), jnp.int32), logprobs=jnp.zeros((R, L), jnp.float32))
    tok_R, logp_R = _choose(rep(last_logits_B1V[:, 0]), s, sp)
    return _record(s, sp, jnp.ones((R,), bool), tok_R, logp_R, P=P, N=N), row_keys


@partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "mesh", "rules"), donate_argnums=(1,))
def _decode(params, s: _State, sp: _Sampling, *, cfg, max_new_tokens, mesh, rules):
    """One decode segment: one-token steps until a row pauses, every row is done, or the write slot reaches C."""
    C = s.tokens.shape[1]  # P + N: the slots before the scratch block
    N = max_new_tokens

    def cond(s):
        return ~jnp.all(s.done) & ~jnp.any(s.pausing) & (s.end < C)

    def body(s):
        live_R = ~s.done
        # Finished rows mark the slot valid too (as in generate), so no row's attention is fully masked.
        kv_valid = s.kv_valid.at[:, s.end].set(True)
        logits_R1V, aux = transformer.forward(params, s.prev[:, None], cfg, positions=s.ctx[:, None],
                                              attn_mask=live_R[:, None], cache=s.cache, cache_index=s.end,
                                              kv_valid=kv_valid, mesh=mesh, rules=rules)
        s = s._replace(cache=aux["cache"], kv_valid=kv_valid, end=s.end + 1, ctx=s.ctx + live_R.astype(jnp.int32))
        tok_R, logp_R = _choose(logits_R1V[:, 0], s, sp)
        return _record(s, sp, live_R, tok_R, logp_R, P=C - N, N=N)

    return jax.lax.while_loop(cond, body, s)


def _relayout(s: _State, lens_R) -> _State:
    """Move every live row's cached tokens (ending at slot `end`) followed by its first lens_R scratch slots (from
    slot C) to RIGHT alignment at end* = max over live rows of ctx + lens (<= C); the scratch block ends invalid.
    One gather per cache array along its slot axis; finished rows are left as they are."""
    C = s.tokens.shape[1]
    S = s.kv_valid.shape[1]
    live_R = ~s.done
    total_R = s.ctx + lens_R
    new_end = jnp.max(jnp.where(live_R, total_R, 0))
    j_S = jnp.arange(S, dtype=jnp.int32)[None, :]
    tail_start_R1 = (new_end - lens_R)[:, None]  # where the scratch tokens go
    src_RS = jnp.where(j_S >= tail_start_R1, C + j_S - tail_start_R1, j_S + s.end - tail_start_R1)
    src_RS = jnp.where(live_R[:, None], jnp.clip(src_RS, 0, S - 1), j_S)
    valid_RS = (j_S >= new_end - total_R[:, None]) & (j_S < new_end)
    kv_valid = jnp.where(live_R[:, None], valid_RS, s.kv_valid)
    keys_axis = 3 if cache_layout() == "keys_slots_last" else 2

    def move(x, axis):  # x [R, ...] with the slot axis at `axis`
        shape = [src_RS.shape[0]] + [1] * (x.ndim - 1)
        shape[axis] = S
        return jnp.take_along_axis(x, src_RS.reshape(shape), axis=axis)

    cache = {**s.cache, "k": tuple(move(k, keys_axis) for k in s.cache["k"]),
             "v": tuple(move(v, 2) for v in s.cache["v"])}
    return s._replace(cache=cache, kv_valid=kv_valid, end=new_end, ctx=jnp.where(live_R, total_R, s.ctx))


@partial(jax.jit, donate_argnums=(0,))
def _compact(s: _State):
    """Re-align the live rows when the write slot reached C (a row that finished was far ahead of the others)."""
    return _relayout(s, jnp.zeros_like(s.ctx))


@partial(jax.jit, static_argnames=("max_new_tokens",), donate_argnums=(0,))
def _put_tool_output(s: _State, tool_RN, m_R, called_R, *, max_new_tokens):
    """Write each calling row's m_R tool ids (tool_RN[r, :m_R[r]]) after its call end (policy 0, logprob 0)."""
    N = max_new_tokens
    R, L = s.tokens.shape
    j_N = jnp.arange(N, dtype=jnp.int32)[None, :]
    col_RN = jnp.where(j_N < m_R[:, None], L - N + s.n_out[:, None] + j_N, L)  # out of range -> dropped
    rows_RN = jnp.broadcast_to(jnp.arange(R)[:, None], (R, N))
    tokens = s.tokens.at[rows_RN, col_RN].set(tool_RN, mode="drop")
    n_out = s.n_out + m_R
    return s._replace(tokens=tokens, n_out=n_out, turns=s.turns + called_R.astype(jnp.int32),
                      done=s.done | (called_R & (n_out >= N)), pausing=jnp.zeros_like(s.pausing))


@partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "mesh", "rules"), donate_argnums=(1,))
def _append(params, s: _State, sp: _Sampling, chunk_RW, lens_R, sample_R, *, cfg, max_new_tokens, mesh, rules):
    """Prefill up to w <= W ids per row (chunk_RW[r, :lens_R[r]], continuing the row at rotary position ctx) into the
    scratch block, re-align the cache, and sample the next token of the rows in sample_R (their appended block
    ends in this chunk) from the logits of their last id."""
    C = s.tokens.shape[1]
    w = chunk_RW.shape[1]  # <= the scratch block's width W: the chunk fills its first w slots
    j_W = jnp.arange(s.kv_valid.shape[1] - C, dtype=jnp.int32)[None, :]
    kv_valid = s.kv_valid.at[:, C:].set(j_W < lens_R[:, None])
    _, aux = transformer.forward(params, chunk_RW, cfg, positions=s.ctx[:, None] + j_W[:, :w],
                                 attn_mask=j_W[:, :w] < lens_R[:, None],
                                 cache=s.cache, cache_index=jnp.int32(C), kv_valid=kv_valid, return_logits=False,
                                 mesh=mesh, rules=rules)
    last_R = jnp.maximum(lens_R - 1, 0)
    h_R1D = jnp.take_along_axis(aux["hidden"], last_R[:, None, None], axis=1)
    logits_R1V = transformer.logits_from_hidden(params, h_R1D, cfg, mesh=mesh, rules=rules)
    s = _relayout(s._replace(cache=aux["cache"], kv_valid=kv_valid), lens_R)
    tok_R, logp_R = _choose(logits_R1V[:, 0], s, sp)
    return _record(s, sp, sample_R & ~s.done, tok_R, logp_R, P=C - max_new_tokens, N=max_new_tokens)


def _row_ids(prompt_ids, mask_row, out_row, n_out) -> list[int]:
    return [int(t) for t in prompt_ids[mask_row]] + [int(t) for t in out_row[:n_out]]


def _check_tool_ids(ids, vocab_size, row) -> list[int] | None:
    if ids is None:
        return None
    try:
        out = [int(i) for i in ids]
    except (TypeError, ValueError) as e:
        raise ValueError(f"tool_fn must return a list of token ids or None; row {row} got {type(ids).__name__}") from e
    bad = [i for i in out if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"tool_fn returned ids outside [0, {vocab_size}) for row {row}: {bad[:5]}")
    return out


def generate_with_tools(params, cfg, prompts, key, *, tool_fn: Callable[[list[int]], Sequence[int] | None],
                        call_end_ids, max_turns: int, max_new_tokens: int, temperature=1.0, top_p=1.0, top_k=0,
                        eos_id, pad_id, prompt_mask=None, num_samples=1, mesh=None,
                        rules=None) -> ToolSampleOutput:
    """Sample num_samples continuations of each LEFT-padded prompt, pausing at tool calls (module docstring).

    prompts [B, P] int32, prompt_mask [B, P] (1 = real; None = no padding). call_end_ids: an id or a list of ids
    that end a tool call. max_turns: tool calls allowed per row (0 = none: exactly generate's samples). eos_id: an id
    or a list. tool_fn(row_ids: list[int]) -> list[int] | None, called from worker threads, one call per pausing row.
    The other arguments are generate's. Returns ToolSampleOutput (host-side arrays)."""
    prompts, prompt_mask, eos_ids = check_args(cfg, prompts, prompt_mask, num_samples, max_new_tokens, temperature,
                                               top_p, top_k, eos_id)
    if not callable(tool_fn):
        raise ValueError(f"tool_fn must be callable, got {type(tool_fn).__name__}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, (int, np.integer)) or max_turns < 0:
        raise ValueError(f"max_turns must be an int >= 0, got {max_turns!r}")
    call_ids = np.atleast_1d(np.asarray(call_end_ids, np.int64))
    if call_ids.ndim != 1 or call_ids.size < 1 or not ((call_ids >= 0) & (call_ids < cfg.vocab_size)).all():
        raise ValueError(f"call_end_ids must be one id or a non-empty list of ids in [0, {cfg.vocab_size}), "
                         f"got {call_end_ids!r}")
    N, K = int(max_new_tokens), int(num_samples)
    sp = _Sampling(row_keys=None, temperature=jnp.asarray(temperature, jnp.float32),
                   top_p=jnp.asarray(top_p, jnp.float32), top_k=jnp.asarray(top_k, jnp.int32), eos_ids=eos_ids,
                   is_call_end=jnp.zeros((cfg.vocab_size,), bool).at[jnp.asarray(call_ids)].set(True),
                   max_turns=jnp.asarray(max_turns, jnp.int32))
    static = dict(cfg=cfg, max_new_tokens=N, mesh=mesh, rules=rules)
    # The per-layer view once for the whole call (models/sampling.py says why decoding runs unrolled over it).
    params = transformer.decode_view(params, cfg)
    s, row_keys = _start(params, prompts, prompt_mask, key, sp, jnp.asarray(pad_id, jnp.int32), num_samples=K,
                         scratch=min(SCRATCH_SLOTS, N), **static)
    sp = sp._replace(row_keys=row_keys)
    prompts_np = np.repeat(np.asarray(prompts), K, axis=0)
    mask_np = np.repeat(np.asarray(prompt_mask).astype(bool), K, axis=0)
    R, L = prompts_np.shape[0], prompts_np.shape[1] + N
    W = s.kv_valid.shape[1] - L
    with ThreadPoolExecutor(max_workers=min(MAX_TOOL_THREADS, R)) as pool:
        while True:
            s = _decode(params, s, sp, **static)
            done, pausing = jax.device_get((s.done, s.pausing))
            if done.all():
                break
            if not pausing.any():  # the write slot reached the cache's end: re-align and go on
                s = _compact(s)
                continue
            rows = np.flatnonzero(pausing)
            tokens, n_out, prev = jax.device_get((s.tokens, s.n_out, s.prev))
            queries = [_row_ids(prompts_np[r], mask_np[r], tokens[r, L - N:], n_out[r]) for r in rows]
            results = [_check_tool_ids(ids, cfg.vocab_size, r)
                       for r, ids in zip(rows, pool.map(tool_fn, queries))]
            tool_RN = np.zeros((R, N), np.int32)
            m_R = np.zeros((R,), np.int32)
            called_R = np.zeros((R,), bool)
            for r, ids in zip(rows, results):
                if ids is None:
                    continue
                ids = ids[: N - n_out[r]]  # tool output counts against the row's budget
                tool_RN[r, : len(ids)] = ids
                m_R[r], called_R[r] = len(ids), True
            s = _put_tool_output(s, jnp.asarray(tool_RN), jnp.asarray(m_R), jnp.asarray(called_R), max_new_tokens=N)
            # Each calling row that has budget left feeds [call end, tool ids...] to the cache, W ids at a time.
            done = np.asarray(jax.device_get(s.done))
            blocks = {r: [int(prev[r])] + list(tool_RN[r, : m_R[r]]) for r in rows if called_R[r] and not done[r]}
            offset = 0
            while blocks and offset < max(len(b) for b in blocks.values()):
                # Chunk width: the longest remaining block up to a power of two (>= MIN_CHUNK), at most W: a few
                # compiled widths, and a pause of short outputs does not pay for a W-wide prefill of every row.
                longest = max(len(b) for b in blocks.values()) - offset
                w = min(W, max(MIN_CHUNK, 1 << (longest - 1).bit_length()))
                chunk_RW = np.zeros((R, w), np.int32)
                lens_R = np.zeros((R,), np.int32)
                sample_R = np.zeros((R,), bool)
                for r, block in blocks.items():
                    piece = block[offset: offset + w]
                    chunk_RW[r, : len(piece)] = piece
                    lens_R[r] = len(piece)
                    sample_R[r] = 0 < len(piece) and offset + w >= len(block)
                s = _append(params, s, sp, jnp.asarray(chunk_RW), jnp.asarray(lens_R), jnp.asarray(sample_R),
                            **static)
                offset += w
    tokens, policy, logprobs, turns, lengths = jax.device_get((s.tokens, s.policy, s.logprobs, s.turns, s.n_out))
    return ToolSampleOutput(tokens=tokens, policy_mask=policy, logprobs=logprobs, turns=turns, lengths=lengths)
