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


def test_lr_warmup_then_linear_decay_to_ten_percent():
    # warmup 4 over peak 1.0: 0.25, 0.5, 0.75, 1.0 ; then decay over total - warmup = 10 steps to 0.1
    got = [schedules.lr_at(s, 1.0, 4, 14) for s in range(16)]
    want = [0.25, 0.5, 0.75, 1.0] + [1.0 - 0.9 * (s - 4) / 10 for s in range(4, 14)] + [0.1, 0.1]
    want[4] = 1.0
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_lr_fn_matches_host_curve():
    fn = schedules.make_lr_fn(3e-3, 5, 40, 0.1)
    for s in range(0, 45, 3):
        assert float(fn(s)) == pytest.approx(schedules.lr_at(s, 3e-3, 5, 40, 0.1), rel=1e-5)
    fn0 = schedules.make_lr_fn(1e-3, 0, 10)
    assert float(fn0(0)) == pytest.approx(1e-3)


def test_kl_ramp():
    assert schedules.kl_coef_at(0, 0.04, 0) == pytest.approx(0.04)
    assert schedules.kl_coef_at(0, 0.04, 4) == pytest.approx(0.01)
    assert schedules.kl_coef_at(3, 0.04, 4) == pytest.approx(0.04)
    assert schedules.kl_coef_at(9, 0.04, 4) == pytest.approx(0.04)
