"""Advantage estimators: group-relative (GRPO, Dr. GRPO, RLOO), REINFORCE++, GAE, step rewards.

Every function here is pure and jit-compatible (integer arguments such as `group_size` and
`seq_len` are static Python ints). Shapes follow the repository convention:

* outcome rewards are `[n_prompts * group_size]` with each prompt's samples contiguous
  (row `b * group_size + k` is sample `k` of prompt `b`, as `models.sampling.generate` emits them);
* token-level arrays are `[batch, time]` with a mask that is 1 on response tokens.

Sequence-level advantages are broadcast onto tokens by the trainer (`adv[:, None] * loss_mask`).
`ESTIMATORS` maps a config name to an outcome-level estimator `fn(rewards, group_size) -> [N]`.

Typical use (GRPO):

    adv = advantages.grpo(rewards, group_size=8)                  # [N]

Which groups train (zero reward variance: filter_zero_variance off / drop / refill) is decided in one place, the GRPO
stage's rl.stages.grpo.grpo_token_advantages.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rewards.parse import step_spans
from rewards.steps import check_steps

__all__ = [
    "grpo",
    "rloo",
    "reinforce_pp",
    "discounted_returns",
    "gae",
    "whiten",
    "place_step_rewards",
    "process_grpo",
    "ESTIMATORS",
    "get_estimator",
    "group_runs",
    "grouped",
    "step_scores",
    "step_arrays",
]


def _grouped(rewards: jax.Array, group_size: int) -> jax.Array:
    """Reshape `[N]` rewards to `[N // group_size, group_size]` after validating the sizes."""
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2 (a baseline needs other samples), got {group_size!r}")
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [n_prompts * group_size], got shape {rewards.shape}")
    if rewards.shape[0] % group_size:
        raise ValueError(f"rewards length {rewards.shape[0]} is not a multiple of group_size={group_size}")
    return rewards.reshape(-1, group_size)


def grpo(rewards: jax.Array, group_size: int, scale_by_std: bool = True, eps: float = 1e-6) -> jax.Array:
    """Group-relative advantages `(r - mean_g) / (std_g + eps)` with the unbiased (ddof=1) group std.

    `scale_by_std=False` gives Dr. GRPO's `r - mean_g`. A group whose rewards are all equal gets
    exact zeros (the centred values could otherwise be rounding noise divided by `eps`).
    """
    r = _grouped(rewards, group_size)
    centred = r - r.mean(axis=1, keepdims=True)
    if scale_by_std:
        std = jnp.sqrt(jnp.sum(centred**2, axis=1, keepdims=True) / (group_size - 1))
        centred = centred / (std + eps)
    equal = (r.max(axis=1, keepdims=True) == r.min(axis=1, keepdims=True))
    return jnp.where(equal, 0.0, centred).reshape(-1)


def rloo(rewards: jax.Array, group_size: int) -> jax.Array:
    """REINFORCE leave-one-out: `r_i - mean_{j != i} r_j` within each group."""
    r = _grouped(rewards, group_size)
    others_mean = (r.sum(axis=1, keepdims=True) - r) / (group_size - 1)
    return (r - others_mean).reshape(-1)


def whiten(x: jax.Array, mask: jax.Array, shift_mean: bool = True, eps: float = 1e-8) -> jax.Array:
    """Masked whitening `(x - mean) / sqrt(var + eps)` over the positions where `mask` is 1.

    Mean and (population, ddof=0) variance are taken over the masked entries of the whole array;
    masked-out entries come back as 0. With `shift_mean=False` the mean is added back (scale only).
    """
    x = jnp.asarray(x, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    out = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


def _reverse_scan_masked(step, init, xs):
    """Run `step` from the last time index to the first over `[B, T]` arrays given as a tuple."""
    xs_t = tuple(jnp.swapaxes(x, 0, 1) for x in xs)  # time-major for lax.scan
    _, ys = jax.lax.scan(step, init, xs_t, reverse=True)
    return jnp.swapaxes(ys, 0, 1)


def discounted_returns(token_rewards: jax.Array, mask: jax.Array, gamma: float = 1.0) -> jax.Array:
    """`G_t = r_t + gamma * G_next` over masked positions; masked-out positions are skipped (0 out)."""
    r = jnp.asarray(token_rewards, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)

    def step(carry, x):
        r_t, m_t = x
        g = r_t + gamma * carry
        # A skipped position passes the running return through untouched.
        return jnp.where(m_t > 0, g, carry), g * m_t

    return _reverse_scan_masked(step, jnp.zeros(r.shape[0], jnp.float32), (r, m))


def reinforce_pp(token_rewards: jax.Array, mask: jax.Array, gamma: float = 1.0) -> jax.Array:
    """REINFORCE++: discounted token returns, then whitened over all masked tokens of the batch."""
    return whiten(discounted_returns(token_rewards, mask, gamma), mask)


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float, lam: float):
    """Generalised advantage estimation over `[batch, time]` token rewards.

    `delta_t = r_t + gamma * V_next - V_t`, `A_t = delta_t + gamma * lam * A_next`, where "next" is
    the next position with mask 1 (masked positions are skipped: V_next and A_next carry across
    them, and they get advantage 0). After the last real token V_next = A_next = 0.
    Returns `(advantages, returns)` with `returns = advantages + values`.
    """
    r = jnp.asarray(rewards, jnp.float32)
    v = jnp.asarray(values, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)

    def step(carry, x):
        next_v, next_a = carry
        r_t, v_t, m_t = x
        delta = r_t + gamma * next_v - v_t
        a_t = delta + gamma * lam * next_a
        real = m_t > 0
        carry = (jnp.where(real, v_t, next_v), jnp.where(real, a_t, next_a))
        return carry, a_t * m_t

    zeros = jnp.zeros(r.shape[0], jnp.float32)
    adv = _reverse_scan_masked(step, (zeros, zeros), (r, v, m))
    return adv, adv + v


def place_step_rewards(step_scores: jax.Array, step_end_positions: jax.Array, seq_len: int,
                       step_mask: jax.Array | None = None) -> jax.Array:
    """Put each step's score on that step's last token: `[B, S]` scores -> `[B, seq_len]` token rewards.

    `step_end_positions[b, s]` is the token index (in the same frame as `loss_mask`) of the last
    token of step `s`; steps with `step_mask == 0` or a position outside `[0, seq_len)` are dropped.
    Two steps ending on the same token add up.
    """
    scores = jnp.asarray(step_scores, jnp.float32)
    pos = jnp.asarray(step_end_positions, jnp.int32)
    valid = (pos >= 0) & (pos < seq_len)
    if step_mask is not None:
        valid = valid & (jnp.asarray(step_mask) > 0)
    onehot = jax.nn.one_hot(jnp.where(valid, pos, 0), seq_len, dtype=jnp.float32)  # [B, S, T]
    return jnp.einsum("bs,bst->bt", jnp.where(valid, scores, 0.0), onehot)


def process_grpo(step_scores: jax.Array, step_end_positions: jax.Array, step_mask: jax.Array,
                 group_size: int, seq_len: int, eps: float = 1e-6) -> jax.Array:
    """Process-supervised GRPO (DeepSeekMath): token advantages `[B, seq_len]` from step scores `[B, S]`.

    All valid step rewards of a group's outputs are normalised together with the group's mean and
    unbiased std (a group with fewer than two valid steps, or all-equal scores, gives zeros). A
    token's advantage is the sum of the normalised rewards of the steps ending at or after it.
    Tokens after the last step end get 0; the trainer's loss mask removes prompt tokens.
    """
    scores = jnp.asarray(step_scores, jnp.float32)
    valid = jnp.asarray(step_mask) > 0
    pos = jnp.asarray(step_end_positions, jnp.int32)
    valid = valid & (pos >= 0) & (pos < seq_len)
    if scores.ndim != 2:
        raise ValueError(f"step_scores must be [batch, n_steps], got shape {scores.shape}")
    if not isinstance(group_size, int) or group_size < 2:
        raise ValueError(f"group_size must be an int >= 2, got {group_size!r}")
    if scores.shape[0] % group_size:
        raise ValueError(f"batch {scores.shape[0]} is not a multiple of group_size={group_size}")
    n_groups, n_steps = scores.shape[0] // group_size, scores.shape[1]
    g_scores = scores.reshape(n_groups, group_size * n_steps)
    g_valid = valid.reshape(n_groups, group_size * n_steps).astype(jnp.float32)
    count = g_valid.sum(axis=1, keepdims=True)
    mean = (g_scores * g_valid).sum(axis=1, keepdims=True) / jnp.maximum(count, 1.0)
    centred = (g_scores - mean) * g_valid
    std = jnp.sqrt((centred**2).sum(axis=1, keepdims=True) / jnp.maximum(count - 1.0, 1.0))
    hi = jnp.where(g_valid > 0, g_scores, -jnp.inf).max(axis=1, keepdims=True)
    lo = jnp.where(g_valid > 0, g_scores, jnp.inf).min(axis=1, keepdims=True)
    degenerate = (count < 2) | (hi == lo)
    normed = jnp.where(degenerate, 0.0, centred / (std + eps)).reshape(scores.shape)
    token_rewards = place_step_rewards(normed, pos, seq_len, valid)
    # Sum over steps ending at or after t == reverse cumulative sum of the placed rewards.
    return jnp.flip(jnp.cumsum(jnp.flip(token_rewards, axis=1), axis=1), axis=1)


def _batch_whitened(rewards: jax.Array, group_size: int) -> jax.Array:
    """REINFORCE++ on outcome rewards with gamma=1: every token's return is the reward; whiten over the batch."""
    del group_size  # no group baseline: the batch statistics are the baseline
    r = jnp.asarray(rewards, jnp.float32)
    return whiten(r, jnp.ones_like(r))


# Outcome-level estimators by config name: fn(rewards [N], group_size) -> advantages [N].
ESTIMATORS: dict[str, Callable[[jax.Array, int], jax.Array]] = {
    "grpo": grpo,
    "dr_grpo": functools.partial(grpo, scale_by_std=False),
    "rloo": rloo,
    "reinforce_pp": _batch_whitened,
}


def get_estimator(name: str) -> Callable[[jax.Array, int], jax.Array]:
    """Look up an outcome-level advantage estimator by name (ValueError lists the known names)."""
    if name not in ESTIMATORS:
        raise ValueError(f"advantage estimator {name!r} unknown; choose one of {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]


def group_runs(group_sizes) -> list[tuple[int, int, int]]:
    """Runs of contiguous groups with the same size: [(first_row, n_rows, group_size), ...].

    A curriculum batch mixes group sizes (e.g. 8 / 16 / 32 samples per problem) with each group's
    rows contiguous; the jitted estimators take one static group size, so they are called once per run.
    """
    runs, row, i = [], 0, 0
    sizes = [int(k) for k in group_sizes]
    while i < len(sizes):
        k, j = sizes[i], i
        while j < len(sizes) and sizes[j] == k:
            j += 1
        runs.append((row, (j - i) * k, k))
        row += (j - i) * k
        i = j
    return runs


def grouped(fn: Callable, values, group_sizes, *rest) -> np.ndarray:
    """`fn(values[rows], k, *rest[rows])` over each run of equal group size k; results stacked on rows.

    `fn` is an outcome estimator (`ESTIMATORS[name]`, returning `[rows]`) or any group-wise function such
    as `process_grpo` (extra row-aligned arguments in `rest`, e.g. step positions and masks).
    """
    out = None
    for start, n, k in group_runs(group_sizes):
        sl = slice(start, start + n)
        part = np.asarray(fn(jnp.asarray(np.asarray(values)[sl]), k, *[np.asarray(r)[sl] for r in rest]))
        if out is None:
            out = np.zeros((len(values),) + part.shape[1:], np.float32)
        out[sl] = part
    return out


def step_scores(tok, texts: list[str], resp_start, lengths, final=None):
    """[N, S] exact step checks (1 right, 0 wrong; unchecked steps left out), each step's last-token position
    and a mask. With `final` ([N] scores of whole responses: the sequence reward), the answer line is appended as
    the last step with that score, at the response's last token (EOS included): process supervision then credits
    the answer, its format and penalties, not only the intermediate arithmetic."""
    rows = []
    for r, t in enumerate(texts):
        start = int(resp_start[r])
        row = [(float(c), start + len(tok.encode(t[:en], add_bos=False)) - 1)
               for (_, en), c in zip(step_spans(t), check_steps(t)) if c is not None]
        if final is not None:
            row.append((float(final[r]), start + int(lengths[r]) - 1))
        rows.append(row)
    return step_arrays(rows)


def step_arrays(rows: list[list[tuple[float, int]]]):
    """(scores, end positions, mask) [N, S] of per-response lists of (score, end position) steps."""
    S = max(1, max(len(r) for r in rows))
    sc = np.zeros((len(rows), S), np.float32)
    pos = np.zeros((len(rows), S), np.int32)
    msk = np.zeros((len(rows), S), np.int32)
    for i, row in enumerate(rows):
        for j, (c, p) in enumerate(row):
            sc[i, j], pos[i, j], msk[i, j] = c, p, 1
    return sc, pos, msk
