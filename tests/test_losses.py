"""Losses vs float64 NumPy references written here, hand-checked clip cases, and an analytic gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl import losses as L
from rl.sft import build_sft_batch_from_ids


# ---------------------------------------------------------------- references
def ref_aggregate(v, m, mode, max_len=None):
    v, m = np.asarray(v, np.float64), np.asarray(m, np.float64)
    if mode == "token-mean":
        return (v * m).sum() / max(m.sum(), 1)
    rows = []
    for b in range(v.shape[0]):
        n = m[b].sum()
        if n == 0:
            continue
        s = (v[b] * m[b]).sum()
        rows.append({"seq-mean-token-mean": s / n, "seq-mean-token-sum": s,
                     "seq-mean-token-sum-norm": s / (max_len or v.shape[1])}[mode])
    return np.mean(rows) if rows else 0.0


def ref_policy_token(lp, old, a, cl, ch, dual):
    ratio = np.exp(np.clip(lp - old, -20, 20))
    out = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - cl, 1 + ch))
    if dual is not None:
        out = np.where(a < 0, np.minimum(out, -a * dual), out)
    return out


def _batch(seed=0, b=4, t=6):
    rng = np.random.default_rng(seed)
    lp = rng.normal(-2, 1, size=(b, t))
    old = lp + rng.normal(0, 0.5, size=(b, t))
    adv = rng.normal(size=(b, t))
    m = (rng.random((b, t)) > 0.3).astype(np.float64)
    m[1] = 0  # a row with no tokens
    return lp, old, adv, m


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_aggregate_matches_reference(mode):
    v, _, _, m = _batch(1)
    np.testing.assert_allclose(float(L.aggregate(v, m, mode)), ref_aggregate(v, m, mode), rtol=1e-5)
    if mode == "seq-mean-token-sum-norm":
        np.testing.assert_allclose(float(L.aggregate(v, m, mode, max_len=32)), ref_aggregate(v, m, mode, 32), rtol=1e-5)


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_aggregate_with_global_denominator_adds_up_over_row_splits(mode):
    v, _, _, m = _batch(3, b=6)
    _, den = L.aggregate_parts(v, m, mode)
    parts = [float(L.aggregate(v[rows], m[rows], mode, denom=den)) for rows in (slice(0, 2), slice(2, 6))]
    np.testing.assert_allclose(sum(parts), ref_aggregate(v, m, mode), rtol=1e-5)


def test_aggregate_hand_checked_and_errors():
    v = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    m = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert float(L.aggregate(v, m, "token-mean")) == pytest.approx(10 / 4)
    assert float(L.aggregate(v, m, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)  # empty row excluded
    assert float(L.aggregate(v, m, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    assert float(L.aggregate(v, m, "seq-mean-token-sum-norm", max_len=10)) == pytest.approx((0.6 + 0.4) / 2)
    with pytest.raises(ValueError, match="aggregation mode"):
        L.aggregate(v, m, "mean")


@pytest.mark.parametrize("cl,ch,dual", [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 3.0)])
def test_policy_loss_matches_reference(cl, ch, dual):
    lp, old, adv, m = _batch(2)
    for mode in L.AGG_MODES:
        loss, met = L.policy_loss(lp, old, adv, m, cl, ch, dual, mode)
        want = ref_aggregate(ref_policy_token(lp, old, adv, cl, ch, dual), m, mode)
        np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)
    ratio = np.exp(lp - old)
    sel = m > 0
    np.testing.assert_allclose(float(met["ratio_mean"]), ratio[sel].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(met["ratio_max"]), ratio[sel].max(), rtol=1e-5)
    np.testing.assert_allclose(float(met["clip_frac_high"]), ((adv > 0) & (ratio > 1 + ch))[sel].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(met["clip_frac_low"]), ((adv < 0) & (ratio < 1 - cl))[sel].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(met["approx_kl"]), (ratio - 1 - np.log(ratio))[sel].mean(), rtol=1e-4)


def test_clip_higher_hand_checked():
    # A > 0, ratio 1.25: symmetric clip 0.2 caps at 1.2; clip-higher 0.28 lets 1.25 through.
    lp, old, adv, m = jnp.log(jnp.array([[1.25]])), jnp.zeros((1, 1)), jnp.ones((1, 1)), jnp.ones((1, 1))
    assert float(L.policy_loss(lp, old, adv, m, 0.2, 0.2)[0]) == pytest.approx(-1.2, rel=1e-6)
    loss, met = L.policy_loss(lp, old, adv, m, 0.2, 0.28)
    assert float(loss) == pytest.approx(-1.25, rel=1e-6)
    assert float(met["clip_frac_high"]) == 0.0
    # A < 0, ratio 0.7: the lower clip (1 - 0.2) binds: loss = max(0.7, 0.8) = 0.8.
    loss, met = L.policy_loss(jnp.log(jnp.array([[0.7]])), old, -adv, m, 0.2, 0.28)
    assert float(loss) == pytest.approx(0.8, rel=1e-6)
    assert float(met["clip_frac_low"]) == 1.0


def test_dual_clip_hand_checked():
    # A = -1, ratio 5: PPO gives max(5, 1.2) = 5; dual clip c=3 bounds it at 3.
    lp, old, adv, m = jnp.log(jnp.array([[5.0]])), jnp.zeros((1, 1)), -jnp.ones((1, 1)), jnp.ones((1, 1))
    assert float(L.policy_loss(lp, old, adv, m)[0]) == pytest.approx(5.0, rel=1e-6)
    loss, met = L.policy_loss(lp, old, adv, m, dual_clip=3.0)
    assert float(loss) == pytest.approx(3.0, rel=1e-6)
    assert float(met["dual_clip_frac"]) == 1.0
    # A positive advantage is untouched by dual clip.
    assert float(L.policy_loss(lp, old, -adv, m, dual_clip=3.0)[0]) == pytest.approx(-1.2, rel=1e-6)
    with pytest.raises(ValueError, match="dual_clip"):  # the range is LossConfig's one check
        L.LossConfig(mode="grpo", dual_clip=0.5)


def test_policy_loss_extreme_logprobs_stay_finite():
    lp = jnp.array([[0.0, -1e4]])
    old = jnp.array([[-1e4, 0.0]])
    loss, met = L.policy_loss(lp, old, jnp.array([[1.0, -1.0]]), jnp.ones((1, 2)))
    assert np.isfinite(float(loss)) and np.isfinite(float(met["ratio_max"]))


def test_policy_loss_gradient_matches_analytic():
    # d/d logp of token-mean PPO loss: -A * ratio / n where the unclipped branch is active, else 0.
    lp, old, adv, m = _batch(4)
    cl, ch = 0.2, 0.28
    grad = np.asarray(jax.grad(lambda x: L.policy_loss(x, old, adv, m, cl, ch)[0])(jnp.asarray(lp, jnp.float32)))
    ratio = np.exp(lp - old)
    clipped = ((adv > 0) & (ratio > 1 + ch)) | ((adv < 0) & (ratio < 1 - cl))
    want = np.where(clipped, 0.0, -adv * ratio) * m / m.sum()
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)


def test_kl_penalty_matches_reference():
    lp, ref, _, _ = _batch(5)
    d = lp - ref
    np.testing.assert_allclose(np.asarray(L.kl_penalty(lp, ref, "k1")), d, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(L.kl_penalty(lp, ref, "k2")), 0.5 * d**2, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(L.kl_penalty(lp, ref, "k3")), np.exp(-d) + d - 1, rtol=1e-4, atol=1e-6)
    big = L.kl_penalty(jnp.array([0.0, 0.0]), jnp.array([50.0, -50.0]), "k3")
    assert np.all(np.isfinite(np.asarray(big))) and float(big.max()) <= L.K3_MAX
    with pytest.raises(ValueError, match="kl kind"):
        L.kl_penalty(lp, ref, "k4")


def test_k3_value_is_clamped_but_its_gradient_is_the_unclamped_estimators():
    """Clamping k3 at K3_MAX zeroed the gradient of exactly the tokens that drifted most (here the four with
    ref - logp >= 3): the value stays clamped (loss, logged KL), the gradient is d k3 / d logp = 1 - exp(ref - logp)
    of the unclamped estimator (float64 NumPy), wherever the log ratio is inside its +-20 clamp."""
    rng = np.random.default_rng(0)
    ref = rng.normal(-2.0, 1.0, 12)
    drift = np.array([-0.5, -0.1, 0.0, 0.2, 1.0, 4.0, 11.0, -2.0, -3.0, -4.5, -8.0, -12.0])  # logp - ref
    logp, m = ref + drift, (np.arange(12) % 5 != 4).astype(np.float64)  # two masked-out positions
    k3 = np.exp(-drift) + drift - 1.0
    assert (k3 > L.K3_MAX).sum() == 5 and m[k3 > L.K3_MAX].sum() == 4  # the clamp binds on these
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    value = np.asarray(L.kl_penalty(f32(logp), f32(ref), "k3"), np.float64)
    np.testing.assert_allclose(value, np.minimum(k3, L.K3_MAX), rtol=1e-5, atol=1e-6)
    assert value.max() == L.K3_MAX  # exactly the bound, not k3 + (bound - k3) rounded
    grad = np.asarray(jax.grad(lambda x: L.aggregate(L.kl_penalty(x, f32(ref), "k3"), f32(m)))(f32(logp)), np.float64)
    want = (1.0 - np.exp(ref - logp)) * m / m.sum()
    np.testing.assert_allclose(grad, want, rtol=2e-5, atol=1e-7)
    bound = (k3 > L.K3_MAX) & (m > 0)  # descent moves each drifted token's logp back toward the reference's
    assert np.all(np.sign(grad[bound]) == np.sign(drift[bound])) and np.abs(grad[bound]).min() > 0

def test_entropy_from_logits_matches_reference():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(2, 3, 7)) * 3
    m = np.array([[1, 1, 0], [0, 1, 1]])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = -(p * np.log(p)).sum(-1) * m
    np.testing.assert_allclose(np.asarray(L.entropy_from_logits(logits, m)), want, rtol=1e-5, atol=1e-6)
    # Uniform distribution: entropy log(V).
    assert float(L.entropy_from_logits(jnp.zeros((1, 1, 7)))[0, 0]) == pytest.approx(np.log(7), rel=1e-6)


def test_value_loss_matches_reference():
    v, old, ret, m = _batch(7)
    got, met = L.value_loss(v, old, ret, m, clip=0.2)
    vc = old + np.clip(v - old, -0.2, 0.2)
    want = 0.5 * ref_aggregate(np.maximum((v - ret) ** 2, (vc - ret) ** 2), m, "token-mean")
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    got_plain, _ = L.value_loss(v, old, ret, m, clip=None)
    np.testing.assert_allclose(float(got_plain), 0.5 * ref_aggregate((v - ret) ** 2, m, "token-mean"), rtol=1e-5)


def test_token_logprobs_and_sft_loss_match_reference():
    rng = np.random.default_rng(8)
    logits = rng.normal(size=(2, 5, 6))
    tokens = rng.integers(0, 6, size=(2, 5))
    m = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    lsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = np.zeros((2, 5))
    for b in range(2):
        for t in range(1, 5):
            want[b, t] = lsm[b, t - 1, tokens[b, t]]
    np.testing.assert_allclose(np.asarray(L.token_logprobs(logits, tokens)), want, rtol=1e-5, atol=1e-6)
    loss, _ = L.sft_loss(logits, tokens, m)
    np.testing.assert_allclose(float(loss), -(want * m).sum() / m.sum(), rtol=1e-5)


def test_sft_batch_masks_answer_tokens_only():
    batch = build_sft_batch_from_ids([[1, 5, 6], [1, 7]], [[8, 9, 2], [10, 11, 12, 13, 2]], max_len=6)
    np.testing.assert_array_equal(batch["tokens"], [[1, 5, 6, 8, 9, 2], [1, 7, 10, 11, 12, 13]])
    np.testing.assert_array_equal(batch["loss_mask"], [[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    np.testing.assert_array_equal(batch["attn_mask"], np.ones((2, 6)))


def test_policy_loss_registry():
    assert L.get_policy_loss("ppo") is L.policy_loss
    lp, old, adv, m = _batch(9)
    loss, _ = L.get_policy_loss("reinforce")(lp, old, adv, m)
    np.testing.assert_allclose(float(loss), ref_aggregate(-adv * np.exp(lp - old), m, "token-mean"), rtol=1e-5)
    with pytest.raises(ValueError, match="unknown"):
        L.get_policy_loss("nope")


# ---------------------------------------------------------------- GSPO and CISPO (issue 14)
def ref_gspo_seq_objective(lp, old, a_seq, m, cl, ch):
    """GSPO as the paper writes it: -mean over sequences of min(s_i A_i, clip(s_i) A_i), s_i = exp(mean log ratio)."""
    out = []
    for b in range(lp.shape[0]):
        n = m[b].sum()
        if n == 0:
            continue
        s = np.exp(((lp[b] - old[b]) * m[b]).sum() / n)
        out.append(-min(s * a_seq[b], np.clip(s, 1 - cl, 1 + ch) * a_seq[b]))
    return np.mean(out)


def ref_gspo_token(lp, old, a, m, cl, ch):
    """Per-token GSPO-token values and their analytic d/d logp (float64): value -min(s A, clip(s) A) with the row's
    sequence ratio s; gradient -A s where the unclipped branch is the smaller loss, else 0."""
    n = np.maximum(m.sum(-1, keepdims=True), 1)
    s = np.exp(((lp - old) * m).sum(-1, keepdims=True) / n) * np.ones_like(lp)
    val = -np.minimum(s * a, np.clip(s, 1 - cl, 1 + ch) * a)
    clipped = ((a > 0) & (s > 1 + ch)) | ((a < 0) & (s < 1 - cl))
    return val, np.where(clipped, 0.0, -a * s)


def _seq_batch(seed, b=5, t=7, spread=0.3):
    lp, _, _, m = _batch(seed, b, t)
    rng = np.random.default_rng(seed + 100)
    old = lp + rng.normal(0, spread, size=lp.shape)
    a_seq = rng.normal(size=(b,))
    return lp, old, a_seq, m


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_value_and_gradient_match_the_sequence_objective(seed):
    """One advantage per sequence: the GSPO-token loss equals GSPO's sequence objective, and so does its gradient
    (float64 central differences of the NumPy objective)."""
    lp, old, a_seq, m = _seq_batch(seed)
    cl, ch = 0.1, 0.15  # wide enough that some rows clip and some do not at this spread
    adv = np.broadcast_to(a_seq[:, None], lp.shape)
    f = lambda x: L.gspo_loss(x, old, adv, m, cl, ch, None, "seq-mean-token-mean")[0]
    want = ref_gspo_seq_objective(lp, old, a_seq, m, cl, ch)
    np.testing.assert_allclose(float(f(jnp.asarray(lp, jnp.float32))), want, rtol=1e-5, atol=1e-6)
    grad = np.asarray(jax.grad(f)(jnp.asarray(lp, jnp.float32)))
    h, fd = 1e-6, np.zeros_like(lp)
    for idx in np.ndindex(lp.shape):
        up, dn = lp.copy(), lp.copy()
        up[idx] += h
        dn[idx] -= h
        fd[idx] = (ref_gspo_seq_objective(up, old, a_seq, m, cl, ch) - ref_gspo_seq_objective(dn, old, a_seq, m, cl, ch)) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo_token_form_with_per_token_advantages(mode):
    lp, old, _, m = _seq_batch(3)
    adv = np.random.default_rng(4).normal(size=lp.shape)
    cl, ch = 0.1, 0.15
    val, dval = ref_gspo_token(lp, old, adv, m, cl, ch)
    loss, met = L.gspo_loss(lp, old, adv, m, cl, ch, None, mode)
    np.testing.assert_allclose(float(loss), ref_aggregate(val, m, mode), rtol=1e-5, atol=1e-6)
    grad = np.asarray(jax.grad(lambda x: L.gspo_loss(x, old, adv, m, cl, ch, None, mode)[0])(jnp.asarray(lp, jnp.float32)))
    # d aggregate / d value_t: 1 / (rows with tokens * row tokens) for the sequence mean, 1 / tokens for token-mean
    n_row = m.sum(-1, keepdims=True)
    scale = (1.0 / ((n_row > 0).sum() * np.maximum(n_row, 1))) if mode == "seq-mean-token-mean" else 1.0 / m.sum()
    np.testing.assert_allclose(grad, dval * m * scale, rtol=1e-4, atol=1e-7)
    s = np.exp(((lp - old) * m).sum(-1) / np.maximum(n_row[:, 0], 1))
    np.testing.assert_allclose(float(met["ratio_max"]), s[n_row[:, 0] > 0].max(), rtol=1e-5)


def test_cispo_value_and_gradient_match_reference():
    """MiniMax-M1's CISPO: -sum_t sg(min(ratio_t, 1 + eps_high)) A_t logp_t / n over masked tokens, the weight
    clipped from above only when no lower bound is given (a token with ratio 0.3 keeps weight 0.3); the gradient
    keeps every token: -w A / n. A lower bound only when asked (clip_low = c: clip(ratio, 1 - c, 1 + eps_high))."""
    lp, old, adv, m = _batch(11)
    ch = 0.28
    r = np.exp(lp - old)
    w = np.minimum(r, 1 + ch)
    loss, met = L.POLICY_LOSSES["cispo"](lp, old, adv, m, clip_high=ch)
    np.testing.assert_allclose(float(loss), -(w * adv * lp * m).sum() / m.sum(), rtol=1e-5)
    grad = np.asarray(jax.grad(lambda x: L.cispo_loss(x, old, adv, m, clip_high=ch)[0])(jnp.asarray(lp, jnp.float32)))
    np.testing.assert_allclose(grad, -w * adv * m / m.sum(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(float(met["clip_frac_high"]), ((r > 1 + ch) * m).sum() / m.sum(), rtol=1e-6)
    assert float(met["clip_frac_low"]) == 0
    assert ((r < 0.8) * m).sum() > 0 and 0 < float(met["clip_frac_high"])  # the batch has tokens a floor would move
    cl = 0.2  # asked for: the floor 1 - clip_low
    w = np.clip(r, 1 - cl, 1 + ch)
    loss, met = L.cispo_loss(lp, old, adv, m, cl, ch)
    np.testing.assert_allclose(float(loss), -(w * adv * lp * m).sum() / m.sum(), rtol=1e-5)
    grad = np.asarray(jax.grad(lambda x: L.cispo_loss(x, old, adv, m, cl, ch)[0])(jnp.asarray(lp, jnp.float32)))
    np.testing.assert_allclose(grad, -w * adv * m / m.sum(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(float(met["clip_frac_low"]), ((r < 1 - cl) * m).sum() / m.sum(), rtol=1e-6)


def test_cispo_stage_has_no_floor_unless_asked():
    from rl import stages
    from schema import FieldErrors

    def cfg(**kw):
        return stages.parse_stage({**stages.defaults("grpo"), **kw})

    assert stages.components(cfg(policy_loss="cispo"), 32)[0].ratio_clip_low is None
    assert stages.components(cfg(policy_loss="cispo", cispo_floor=True, clip_low=0.5), 32)[0].ratio_clip_low == 0.5
    assert stages.components(cfg(), 32)[0].ratio_clip_low == 0.2
    with pytest.raises(FieldErrors, match="clip_low has no effect with policy_loss cispo"):
        cfg(policy_loss="cispo", clip_low=0.5)
    with pytest.raises(FieldErrors, match="cispo_floor applies to policy_loss cispo only"):
        cfg(cispo_floor=True)
    from rl.train_step import LossConfig

    with pytest.raises(ValueError, match="clip_low must be a number"):  # no lower bound is cispo_floor=False's
        LossConfig(mode="grpo", clip_low=None)


def test_sequence_and_cispo_losses_share_the_registry_signature():
    import inspect

    want = list(inspect.signature(L.policy_loss).parameters)
    for name in ("reinforce", "gspo", "cispo"):  # dual_clip is PPO's; the others refuse it (no silent 0.5 fraction)
        fn = L.get_policy_loss(name)
        assert list(inspect.signature(fn).parameters) == want
        with pytest.raises(ValueError, match="dual_clip"):
            fn(*_batch(0)[:4], 0.2, 0.2, 2.0)


def test_policy_loss_is_selected_from_the_stage_config():
    from rl import stages
    from schema import FieldErrors

    def cfg(**kw):
        return stages.parse_stage({**stages.defaults("grpo"), **kw})

    assert stages.components(cfg(policy_loss="cispo"), 32)[0].policy_loss == "cispo"
    assert stages.components(cfg(policy_loss="gspo", agg="seq-mean-token-mean"), 32)[0].policy_loss == "gspo"
    with pytest.raises(FieldErrors, match="agg must be seq-mean-token-mean"):
        cfg(policy_loss="gspo")
    for loss in ("cispo", "reinforce", "gspo"):
        with pytest.raises(FieldErrors, match="dual_clip applies to policy_loss ppo only"):
            cfg(policy_loss=loss, dual_clip=3.0, agg="seq-mean-token-mean")
