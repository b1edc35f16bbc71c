"""Advantage estimators vs float64 NumPy references written here, plus hand-checked cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl import advantages as A


# ---------------------------------------------------------------- float64 references (loops, obvious)
def ref_grpo(r, g, scale=True, eps=1e-6):
    r = np.asarray(r, np.float64)
    out = np.zeros_like(r)
    for s in range(0, len(r), g):
        grp = r[s:s + g]
        if grp.max() == grp.min():
            continue
        c = grp - grp.mean()
        out[s:s + g] = c / (np.std(grp, ddof=1) + eps) if scale else c
    return out


def ref_rloo(r, g):
    r = np.asarray(r, np.float64)
    out = np.zeros_like(r)
    for i in range(len(r)):
        s = (i // g) * g
        others = [r[j] for j in range(s, s + g) if j != i]
        out[i] = r[i] - np.mean(others)
    return out


def ref_returns(r, m, gamma):
    out = np.zeros_like(r, dtype=np.float64)
    for b in range(r.shape[0]):
        g = 0.0
        for t in reversed(range(r.shape[1])):
            if m[b, t]:
                g = r[b, t] + gamma * g
                out[b, t] = g
    return out


def ref_whiten(x, m, eps=1e-8):
    vals = x[m > 0].astype(np.float64)
    return np.where(m > 0, (x - vals.mean()) / np.sqrt(vals.var() + eps), 0.0)


def ref_gae(r, v, m, gamma, lam):
    adv = np.zeros_like(r, dtype=np.float64)
    for b in range(r.shape[0]):
        idx = [t for t in range(r.shape[1]) if m[b, t]]
        nxt_v, nxt_a = 0.0, 0.0
        for t in reversed(idx):
            delta = r[b, t] + gamma * nxt_v - v[b, t]
            nxt_a = delta + gamma * lam * nxt_a
            nxt_v = v[b, t]
            adv[b, t] = nxt_a
    return adv, adv + v


# ---------------------------------------------------------------- grpo / rloo
def test_grpo_hand_checked_group():
    # [1, 0, 0, 0]: mean 0.25, ddof=1 std = sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
    adv = np.asarray(A.grpo(jnp.array([1.0, 0, 0, 0]), 4))
    np.testing.assert_allclose(adv, [1.5, -0.5, -0.5, -0.5], rtol=1e-5)
    adv_dr = np.asarray(A.grpo(jnp.array([1.0, 0, 0, 0]), 4, scale_by_std=False))
    np.testing.assert_allclose(adv_dr, [0.75, -0.25, -0.25, -0.25], rtol=1e-6)


def test_grpo_equal_group_is_zero_and_matches_reference():
    rng = np.random.default_rng(0)
    r = rng.normal(size=24).astype(np.float32)
    r[8:16] = 0.37  # one group of equal rewards
    for scale in (True, False):
        got = np.asarray(jax.jit(A.grpo, static_argnums=(1, 2))(r, 8, scale))
        np.testing.assert_allclose(got, ref_grpo(r, 8, scale), rtol=1e-5, atol=1e-6)
        assert np.all(got[8:16] == 0.0)


def test_grpo_rejects_bad_group_size():
    with pytest.raises(ValueError, match="group_size"):
        A.grpo(jnp.ones(4), 1)
    with pytest.raises(ValueError, match="group_size"):
        A.grpo(jnp.ones(5), 2)


def test_rloo_matches_reference():
    r = np.random.default_rng(1).normal(size=12)
    np.testing.assert_allclose(np.asarray(A.rloo(r, 4)), ref_rloo(r, 4), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(A.rloo(jnp.array([1.0, 0, 0, 0]), 4)), [1, -1 / 3, -1 / 3, -1 / 3], rtol=1e-6)


def test_registry():
    assert set(A.ESTIMATORS) >= {"grpo", "dr_grpo", "rloo"}
    r = jnp.array([1.0, 0, 0, 0])
    np.testing.assert_allclose(np.asarray(A.get_estimator("dr_grpo")(r, 4)), [0.75, -0.25, -0.25, -0.25], rtol=1e-6)
    with pytest.raises(ValueError, match="unknown"):
        A.get_estimator("nope")


# ---------------------------------------------------------------- token-level estimators
def _padded_batch(seed=2):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(3, 7))
    v = rng.normal(size=(3, 7))
    m = np.ones((3, 7), np.float64)
    m[0, 5:] = 0  # right padding
    m[1, :2] = 0  # prompt tokens
    m[2, 3] = 0  # a hole in the middle: skipped, values carry across
    return r, v, m


def test_whiten_matches_reference():
    r, _, m = _padded_batch()
    np.testing.assert_allclose(np.asarray(A.whiten(r, m)), ref_whiten(r, m), rtol=1e-5, atol=1e-5)


def test_reinforce_pp_matches_reference():
    r, _, m = _padded_batch()
    for gamma in (1.0, 0.9):
        want = ref_whiten(ref_returns(r, m, gamma), m)
        got = np.asarray(jax.jit(A.reinforce_pp, static_argnums=2)(r, m, gamma))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gae_matches_reference_with_padding_and_holes():
    r, v, m = _padded_batch()
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.9, 0.0)):
        adv, ret = jax.jit(A.gae, static_argnums=(3, 4))(r, v, m, gamma, lam)
        want_adv, want_ret = ref_gae(r, v, m, gamma, lam)
        np.testing.assert_allclose(np.asarray(adv), want_adv, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(ret), want_ret, rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(adv)[m == 0] == 0)


def test_gae_hand_checked_terminal_reward():
    # One sequence, reward 1 at the end, zero values, gamma=lam=1: every advantage is 1.
    adv, ret = A.gae(jnp.array([[0.0, 0, 1, 0]]), jnp.zeros((1, 4)), jnp.array([[1, 1, 1, 0]]), 1.0, 1.0)
    np.testing.assert_allclose(np.asarray(adv), [[1, 1, 1, 0]])
    np.testing.assert_allclose(np.asarray(ret), [[1, 1, 1, 0]])


# ---------------------------------------------------------------- step rewards
def test_place_step_rewards():
    scores = jnp.array([[1.0, 0.5, 2.0], [0.3, 0.0, 0.0]])
    pos = jnp.array([[2, 5, 5], [1, -1, 9]])
    smask = jnp.array([[1, 1, 0], [1, 0, 1]])  # step (1, 2) is out of range -> dropped
    got = np.asarray(A.place_step_rewards(scores, pos, 6, smask))
    want = np.zeros((2, 6))
    want[0, 2], want[0, 5], want[1, 1] = 1.0, 0.5, 0.3
    np.testing.assert_allclose(got, want)


def ref_process_grpo(scores, pos, smask, g, T, eps=1e-6):
    out = np.zeros((scores.shape[0], T))
    for s in range(0, scores.shape[0], g):
        vals = [scores[b, j] for b in range(s, s + g) for j in range(scores.shape[1]) if smask[b, j]]
        if len(vals) < 2 or max(vals) == min(vals):
            continue
        mu, sd = np.mean(vals), np.std(vals, ddof=1)
        for b in range(s, s + g):
            for t in range(T):
                out[b, t] = sum((scores[b, j] - mu) / (sd + eps)
                                for j in range(scores.shape[1]) if smask[b, j] and pos[b, j] >= t)
    return out


def test_process_grpo_matches_reference():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 2, size=(6, 3)).astype(np.float64)
    pos = np.sort(rng.integers(1, 10, size=(6, 3)), axis=1)
    smask = (rng.random((6, 3)) > 0.2).astype(np.int32)
    scores[3:] = 1.0  # second group: all steps equal -> zeros
    got = np.asarray(jax.jit(A.process_grpo, static_argnums=(3, 4))(scores, pos, smask, 3, 10))
    np.testing.assert_allclose(got, ref_process_grpo(scores, pos, smask, 3, 10), rtol=1e-4, atol=1e-5)
    assert np.all(got[3:] == 0)


def test_process_grpo_hand_checked():
    # Group of 2 outputs, each with 2 steps. Step rewards [1, 0] and [0, 0]: mean 0.25, std 0.5.
    scores = jnp.array([[1.0, 0.0], [0.0, 0.0]])
    pos = jnp.array([[1, 3], [2, 3]])
    got = np.asarray(A.process_grpo(scores, pos, jnp.ones((2, 2)), 2, 5))
    n1, n0 = 0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)
    np.testing.assert_allclose(got[0], [n1 + n0, n1 + n0, n0, n0, 0], rtol=1e-5)
    np.testing.assert_allclose(got[1], [2 * n0, 2 * n0, 2 * n0, n0, 0], rtol=1e-5)
