"""KL controllers: the Ziegler update against a float64 reference, purity, jit, validation."""

import jax
import numpy as np
import pytest

from rl.kl_control import AdaptiveKL, FixedKL, KLConfig, controller


def ref_adaptive(coef, kl, target, horizon, n_steps):
    err = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + err * n_steps / horizon)


def test_adaptive_matches_reference_sequence():
    ctl = AdaptiveKL(init_coef=0.1, target=6.0, horizon=10_000)
    state = ctl.init()
    coef = 0.1
    for kl in [0.0, 3.0, 6.0, 6.6, 9.0, 100.0]:
        state = ctl.update(state, kl, 256)
        coef = ref_adaptive(coef, kl, 6.0, 10_000, 256)
        np.testing.assert_allclose(float(state["coef"]), coef, rtol=1e-6)


def test_adaptive_hand_checked_and_jittable():
    ctl = AdaptiveKL(init_coef=1.0, target=1.0, horizon=10.0)
    up = jax.jit(ctl.update)
    # kl 2x target -> err clipped to 0.2 -> coef * (1 + 0.2 * 5 / 10) = 1.1
    assert float(up(ctl.init(), 2.0, 5)["coef"]) == pytest.approx(1.1, rel=1e-6)
    # kl 0.5x target -> err -0.5 clipped to -0.2 -> 0.9
    assert float(up(ctl.init(), 0.5, 5)["coef"]) == pytest.approx(0.9, rel=1e-6)
    # on target -> unchanged
    assert float(up(ctl.init(), 1.0, 5)["coef"]) == pytest.approx(1.0, rel=1e-6)


def test_update_is_pure():
    ctl = AdaptiveKL(init_coef=0.5, target=1.0, horizon=10.0)
    s0 = ctl.init()
    s1 = ctl.update(s0, 3.0, 1)
    assert float(s0["coef"]) == 0.5 and float(s1["coef"]) != 0.5


def test_fixed_never_changes():
    ctl = FixedKL(0.04)
    s = ctl.update(ctl.init(), 123.0, 1000)
    assert float(s["coef"]) == pytest.approx(0.04)


def test_validation_and_factory():
    with pytest.raises(ValueError, match="target"):
        AdaptiveKL(init_coef=0.1, target=0.0, horizon=1.0)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKL(init_coef=0.1, target=1.0, horizon=-1.0)
    with pytest.raises(ValueError, match="coef"):
        FixedKL(-1.0)
    assert isinstance(controller(KLConfig(kl_coef=0.1)), FixedKL)  # the stage's KL fields pick the controller
    ada = controller(KLConfig(kl_coef=0.1, kl_adaptive=True, kl_target=1.0, kl_horizon=100))
    assert isinstance(ada, AdaptiveKL) and (ada.init_coef, ada.target, ada.horizon) == (0.1, 1.0, 100.0)
    assert controller(KLConfig(kl_coef=0.0)) is None  # no KL term, no reference policy
    with pytest.raises(ValueError, match="kl_adaptive"):
        KLConfig(kl_adaptive="pid")


def test_adaptive_started_at_zero_can_grow():
    """A multiplicative update of 0 stays 0 forever; the floor lets the controller act."""
    ctl = AdaptiveKL(init_coef=0.0, target=0.01, horizon=100.0, min_coef=1e-3)
    s = ctl.init()
    assert float(s["coef"]) == 0.0
    for _ in range(3):
        s = ctl.update(s, 1.0, 50)  # KL far above target
    coef = 1e-3
    for _ in range(3):
        coef = max(coef, 1e-3) * (1 + 0.2 * 50 / 100.0)
    np.testing.assert_allclose(float(s["coef"]), coef, rtol=1e-6)


def test_min_coef_zero_is_the_papers_controller_and_the_default_floors():
    """Ziegler et al.'s update has no floor: with min_coef=0 a small coefficient follows it exactly (float64
    reference) and 0 stays 0; the default floor 1e-4 lifts a coefficient below it before the update."""
    ctl = AdaptiveKL(init_coef=2e-5, target=0.01, horizon=100.0, min_coef=0.0)
    s, coef = ctl.init(), 2e-5
    for kl in (0.02, 0.005, 0.03):
        s = ctl.update(s, kl, 50)
        coef = ref_adaptive(coef, kl, 0.01, 100.0, 50)
        np.testing.assert_allclose(float(s["coef"]), coef, rtol=1e-6)
    zero = AdaptiveKL(init_coef=0.0, target=0.01, horizon=100.0, min_coef=0.0)
    assert float(zero.update(zero.init(), 1.0, 50)["coef"]) == 0.0
    floored = AdaptiveKL(init_coef=2e-5, target=0.01, horizon=100.0)
    np.testing.assert_allclose(float(floored.update(floored.init(), 0.02, 50)["coef"]), 1e-4 * 1.1, rtol=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_kl_leaves_the_coefficient(bad):
    ctl = AdaptiveKL(init_coef=0.05, target=0.01, horizon=100.0)
    s = ctl.update(ctl.init(), bad, 10)
    assert float(s["coef"]) == pytest.approx(0.05)
    s = ctl.update(s, 0.02, 10)  # the next finite KL updates normally
    assert float(s["coef"]) == pytest.approx(0.05 * (1 + 0.2 * 10 / 100.0), rel=1e-6)


def test_ramp_applies_to_both_kinds():
    for ctl in (FixedKL(0.04, ramp_steps=4), AdaptiveKL(init_coef=0.04, target=1.0, horizon=10.0, ramp_steps=4)):
        st = ctl.init()
        assert [round(ctl.coef_at(st, u), 6) for u in range(6)] == [0.01, 0.02, 0.03, 0.04, 0.04, 0.04]
    assert FixedKL(0.04).coef_at(FixedKL(0.04).init(), 0) == pytest.approx(0.04)
