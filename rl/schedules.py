"""Schedules over training steps: sampling temperature, learning rate, KL coefficient.

Pure Python functions of an integer step, so the trainer can evaluate them on the host
each iteration (temperature, KL ramp) and the optimizer can use the same learning-rate
curve (`lr_schedule` returns plain floats; `make_lr_fn` wraps it for optax).

    temp = temperature_at(step, total, start=1.0, end=0.7)       # linear anneal
    lr = lr_at(step, peak=1e-3, warmup=10, total=100)             # warmup, then decay to 10%
    coef = kl_coef_at(step, target_coef=0.04, ramp_steps=20)      # 0 -> target over 20 steps
"""
from __future__ import annotations


def _frac(step: int, total: int) -> float:
    """Progress in [0, 1] of `step` over `total` steps (1.0 when total <= 1)."""
    if total <= 1:
        return 1.0
    return min(max(step / (total - 1), 0.0), 1.0)


def temperature_at(step: int, total: int, start: float = 1.0, end: float = 0.7, kind: str = "linear") -> float:
    """Sampling temperature at `step` of `total`: `start` at step 0, `end` at the last step.

    kind: "linear" (straight line), "cosine" (half-cosine), or "constant" (always `start`).
    """
    if kind == "constant":
        return float(start)
    p = _frac(step, total)
    if kind == "linear":
        return float(start + (end - start) * p)
    if kind == "cosine":
        import math

        return float(end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * p)))
    raise ValueError(f"temperature kind must be linear|cosine|constant, got {kind!r}")


def lr_at(step: int, peak: float, warmup: int, total: int, end_fraction: float = 0.1) -> float:
    """Learning rate: linear warmup from 0 to `peak` over `warmup` steps, then linear decay
    to `end_fraction * peak` at step `total` (held there afterwards).

    Step indices count optimizer updates from 0; the first update uses peak/warmup (never 0,
    so the first step always moves the parameters).
    """
    if warmup > 0 and step < warmup:
        return float(peak * (step + 1) / warmup)
    decay_steps = max(total - warmup, 1)
    p = min(max((step - warmup) / decay_steps, 0.0), 1.0)
    return float(peak * (1.0 - (1.0 - end_fraction) * p))


def make_lr_fn(peak: float, warmup: int, total: int, end_fraction: float = 0.1):
    """An optax-compatible schedule (count -> lr) with the same curve as `lr_at`, traceable in jit."""
    import jax.numpy as jnp

    def fn(count):
        count = jnp.asarray(count, jnp.float32)
        warm = peak * (count + 1.0) / max(warmup, 1)
        decay_steps = max(total - warmup, 1)
        p = jnp.clip((count - warmup) / decay_steps, 0.0, 1.0)
        dec = peak * (1.0 - (1.0 - end_fraction) * p)
        return jnp.where(count < warmup, warm, dec) if warmup > 0 else dec

    return fn


def kl_coef_at(step: int, target_coef: float, ramp_steps: int = 0) -> float:
    """KL coefficient ramp: linear from 0 to `target_coef` over `ramp_steps` (constant if 0)."""
    if ramp_steps <= 0:
        return float(target_coef)
    return float(target_coef * min((step + 1) / ramp_steps, 1.0))
