"""Schedules over training: sampling temperature and learning rate.

Pure Python functions evaluated on the host: the temperature once per RL iteration, the learning
rate once per optimizer step (passed to the jitted train step as a traced scalar). The KL
coefficient's ramp lives with its controller (rl.kl_control).

    temp = temperature_at(it, iterations, start=1.0, end=0.7)            # linear anneal
    p = unit_progress(unit, j, steps_in_unit, n_units)                    # stage progress after step j
    lr = lr_at(step, p, peak=1e-3, warmup_steps=10, end_fraction=0.1)     # warmup x linear decay
"""
from __future__ import annotations

import math


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
        return float(end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * p)))
    raise ValueError(f"temperature kind must be linear|cosine|constant, got {kind!r}")


def unit_progress(unit: int, step_in_unit: int, steps_in_unit: int, n_units: int) -> float:
    """Fraction of a stage done after optimizer step `step_in_unit` (0-based) of unit `unit`.

    A unit (SFT epoch, rejection round, RL iteration) may take a different number of optimizer
    steps each time (filtering decides how many rows are trained); measuring progress by units
    keeps the schedule exact anyway: the last step of the last unit is at progress 1.0.
    """
    if steps_in_unit < 1 or n_units < 1:
        raise ValueError(f"unit_progress needs steps_in_unit >= 1 and n_units >= 1, got {steps_in_unit}, {n_units}")
    return float(min((unit + (step_in_unit + 1) / steps_in_unit) / n_units, 1.0))


def lr_at(step: int, progress: float, *, peak: float, warmup_steps: int = 0, end_fraction: float = 0.1) -> float:
    """Learning rate of optimizer step `step` (0-based, counted over the stage) at stage `progress` in [0, 1].

    peak * warmup(step) * decay(progress): linear warmup over the first `warmup_steps` updates (the first
    update already uses peak / warmup_steps, never 0) times a linear decay from peak at progress 0 to
    `end_fraction * peak` at progress 1, so the last step of a stage runs at exactly end_fraction * peak.
    """
    warm = min((step + 1) / warmup_steps, 1.0) if warmup_steps > 0 else 1.0
    p = min(max(float(progress), 0.0), 1.0)
    return float(peak * warm * (1.0 - (1.0 - end_fraction) * p))
