"""Difficulty-stratified problem sampling for the RL stages.

The curriculum keeps, for every training problem, a running estimate of the current
policy's pass rate, puts problems into three buckets (easy / medium / hard) and gives each
bucket its own number of samples per problem (e.g. 8 / 16 / 32: hard problems need more
draws before one of them succeeds, which is what gives GRPO a non-zero advantage).

The state is a plain dict of NumPy arrays, so it goes into a checkpoint as is:

    state = init_state(n_problems)
    ids, ks = pick(state, cfg, n_prompts=8, seed=0, iteration=it)      # which problems, how many samples
    state = record(state, ids, n_correct, n_samples, decay=cfg.decay)  # after scoring
    if due_refresh(state, it, cfg.refresh_every): state = refresh(state, it, cfg)

Picks depend only on (state, seed, iteration), so a resumed run draws the same problems.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from schema import Check, Checked, boolean, field, integer, num

EASY, MEDIUM, HARD = 0, 1, 2
BUCKET_NAMES = ("easy", "medium", "hard")


def three_ints(lo: int = 1, hi: int = 4096) -> Check:
    def c(v):
        if (not isinstance(v, (tuple, list)) or len(v) != 3
                or any(isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi for x in v)):
            return f"must be 3 ints in [{lo}, {hi}] (easy, medium, hard), got {v!r}"
        return None

    return c


def three_weights(v) -> str | None:
    if (not isinstance(v, (tuple, list)) or len(v) != 3
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 for x in v)):
        return f"must be 3 finite non-negative numbers (easy, medium, hard), got {v!r}"
    if sum(v) <= 0:
        return f"must have a positive sum, got {v!r}"
    return None


@dataclass(frozen=True, kw_only=True)
class CurriculumConfig(Checked):
    """Bucket thresholds and per-bucket sample counts (the config's `stages[i].curriculum`)."""

    enabled: bool = field(False, "difficulty-stratified sampling (else uniform problems, `samples` each)", boolean)
    easy_above: float = field(0.7, "pass rate >= this -> easy bucket", num(0.0, 1.0))
    hard_below: float = field(0.3, "pass rate <= this -> hard bucket", num(0.0, 1.0))
    samples: tuple[int, int, int] = field((8, 16, 32), "samples per problem for easy / medium / hard", three_ints(1, 4096))
    weights: tuple[float, float, float] = field((1.0, 1.0, 1.0), "relative pick probability of a problem in each bucket",
                                                three_weights)
    refresh_every: int = field(5, "re-bucket every N iterations", integer(1, 10**6))
    decay: float = field(0.5, "EMA weight of the old pass-rate estimate", num(0.0, 0.999))

    def cross_checks(self):
        if self.hard_below > self.easy_above:
            yield "hard_below", f"({self.hard_below}) must be <= easy_above ({self.easy_above})"


def init_state(n_problems: int) -> dict[str, np.ndarray]:
    """Fresh state: nothing seen, every problem in the medium bucket."""
    return {
        "pass_rate": np.full((n_problems,), np.nan, np.float64),  # EMA of observed pass rate; nan = unseen
        "n_seen": np.zeros((n_problems,), np.int64),  # samples scored so far
        "bucket": np.full((n_problems,), MEDIUM, np.int64),
        "last_refresh": np.array(-1, np.int64),
    }


def assign_buckets(pass_rate: np.ndarray, cfg: CurriculumConfig) -> np.ndarray:
    """Bucket per problem from its pass rate; unseen problems (nan) are medium."""
    b = np.full(pass_rate.shape, MEDIUM, np.int64)
    seen = ~np.isnan(pass_rate)
    b[seen & (pass_rate >= cfg.easy_above)] = EASY
    b[seen & (pass_rate <= cfg.hard_below)] = HARD
    return b


def record(state: dict, ids, n_correct, n_samples, decay: float = 0.5) -> dict:
    """Fold new observations (per picked problem: correct count out of samples) into the estimates."""
    state = {k: np.array(v, copy=True) for k, v in state.items()}
    ids = np.asarray(ids, np.int64)
    rate = np.asarray(n_correct, np.float64) / np.maximum(np.asarray(n_samples, np.float64), 1.0)
    # One problem may appear more than once in a batch; fold sequentially so the order is fixed.
    for i, r, n in zip(ids, rate, np.asarray(n_samples, np.int64)):
        old = state["pass_rate"][i]
        state["pass_rate"][i] = r if np.isnan(old) else decay * old + (1.0 - decay) * r
        state["n_seen"][i] += n
    return state


def due_refresh(state: dict, iteration: int, refresh_every: int) -> bool:
    """True when the buckets are older than `refresh_every` iterations (or never computed)."""
    last = int(state["last_refresh"])
    return last < 0 or iteration - last >= refresh_every


def refresh(state: dict, iteration: int, cfg: CurriculumConfig) -> dict:
    """Recompute the buckets from the current estimates."""
    state = {k: np.array(v, copy=True) for k, v in state.items()}
    state["bucket"] = assign_buckets(state["pass_rate"], cfg)
    state["last_refresh"] = np.array(iteration, np.int64)
    return state


def pick(state: dict, cfg: CurriculumConfig, n_prompts: int, seed: int, iteration: int):
    """Choose `n_prompts` distinct problems and the sample count for each.

    Pick probability is proportional to the bucket weight of each problem's bucket. Returns
    (ids [n] int64 sorted by bucket then id, samples [n] int64). Deterministic in (seed, iteration).
    """
    bucket = np.asarray(state["bucket"], np.int64)
    n_total = bucket.shape[0]
    if n_prompts > n_total:
        raise ValueError(f"curriculum asked for {n_prompts} problems but only {n_total} exist")
    w = np.asarray(cfg.weights, np.float64)[bucket]
    if w.sum() <= 0:  # every populated bucket has weight 0: fall back to uniform over all problems
        w = np.ones_like(w)
    rng = np.random.default_rng([int(seed), int(iteration), 7919])
    nonzero = int((w > 0).sum())
    if nonzero < n_prompts:  # not enough positive-weight problems: top up uniformly from the rest
        w = w + (w == 0) * (w.sum() / max(nonzero, 1)) * 1e-3
    ids = rng.choice(n_total, size=n_prompts, replace=False, p=w / w.sum())
    order = np.lexsort((ids, bucket[ids]))
    ids = ids[order]
    samples = np.asarray(cfg.samples, np.int64)[bucket[ids]]
    return ids.astype(np.int64), samples


def bucket_counts(state: dict) -> dict[str, int]:
    """Number of problems in each bucket, for metrics."""
    b = np.asarray(state["bucket"])
    return {name: int((b == i).sum()) for i, name in enumerate(BUCKET_NAMES)}
