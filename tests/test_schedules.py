"""Schedules (rl/schedules.py) against hand-computed values."""
import numpy as np
import pytest

from rl import schedules


def test_temperature_linear_endpoints_and_middle():
    assert schedules.temperature_at(0, 11, 1.0, 0.7) == pytest.approx(1.0)
    assert schedules.temperature_at(5, 11, 1.0, 0.7) == pytest.approx(0.85)
    assert schedules.temperature_at(10, 11, 1.0, 0.7) == pytest.approx(0.7)
    assert schedules.temperature_at(50, 11, 1.0, 0.7) == pytest.approx(0.7)  # held after the end


def test_temperature_cosine_and_constant():
    assert schedules.temperature_at(5, 11, 1.0, 0.6, kind="cosine") == pytest.approx(0.8)  # cos(pi/2) = 0 -> midpoint
    assert schedules.temperature_at(0, 11, 1.0, 0.6, kind="cosine") == pytest.approx(1.0)
    assert schedules.temperature_at(7, 11, 0.9, 0.1, kind="constant") == pytest.approx(0.9)
    with pytest.raises(ValueError, match="temperature kind"):
        schedules.temperature_at(0, 2, kind="exp")


def test_lr_warmup_times_linear_decay_reaches_end_fraction_exactly():
    # 3 units of 4 steps, warmup 4, peak 1.0, end 0.1: reference written out by hand
    got, want = [], []
    step = 0
    for u in range(3):
        for j in range(4):
            p = schedules.unit_progress(u, j, 4, 3)
            got.append(schedules.lr_at(step, p, peak=1.0, warmup_steps=4, end_fraction=0.1))
            want.append(min((step + 1) / 4, 1.0) * (1 - 0.9 * (step + 1) / 12))
            step += 1
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[-1] == pytest.approx(0.1)  # the stage's last step is exactly at the end fraction


def test_unit_progress_with_ragged_units():
    """Units with different step counts (filtering) still end the stage at progress 1."""
    ps = [schedules.unit_progress(u, j, n, 3) for u, n in enumerate([2, 5, 1]) for j in range(n)]
    assert ps[1] == pytest.approx(1 / 3) and ps[6] == pytest.approx(2 / 3) and ps[-1] == pytest.approx(1.0)
    assert all(b > a for a, b in zip(ps, ps[1:]))
    with pytest.raises(ValueError):
        schedules.unit_progress(0, 0, 0, 3)


def test_lr_without_warmup_and_warmup_longer_than_the_stage():
    assert schedules.lr_at(0, 0.0, peak=2e-3) == pytest.approx(2e-3)
    # warmup_steps beyond the stage's steps is allowed: the warmup simply never completes
    assert schedules.lr_at(9, 1.0, peak=1.0, warmup_steps=150, end_fraction=0.1) == pytest.approx(10 / 150 * 0.1)
