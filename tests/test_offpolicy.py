"""Off-policy corrections (rl/offpolicy.py: TIS, MIS, IcePop) against float64 NumPy references written here, and the
stage fields that switch them on."""
import numpy as np
import pytest

from rl import offpolicy as op


def _batch(seed=0, b=6, t=9, spread=0.4):
    rng = np.random.default_rng(seed)
    behav = rng.normal(-2, 1, size=(b, t))
    prox = behav + rng.normal(0, spread, size=(b, t))
    m = (rng.random((b, t)) > 0.25).astype(np.float64)
    m[2] = 0  # a row with no response tokens
    return prox, behav, m


def ref_correction(prox, behav, m, tis_cap=0.0, mis=(0.0, 0.0), mis_kind="product", icepop=(0.0, 0.0)):
    """Float64 reference: weights [B, T] and the metrics, written out token by token and row by row."""
    B, T = m.shape
    lr = np.clip(prox - behav, -20, 20) * m
    rho = np.exp(lr)
    w = m.copy()
    tok = m > 0
    met = {"offpolicy/log_ratio_abs_mean": np.abs(lr)[tok].mean(), "offpolicy/log_ratio_abs_max": np.abs(lr)[tok].max(),
           "offpolicy/kl": (rho - 1 - lr)[tok].mean()}
    if tis_cap:
        w = w * np.minimum(rho, tis_cap)
        met["offpolicy/tis_truncated_frac"] = (rho > tis_cap)[tok].mean()
        met["offpolicy/tis_weight_mean"] = np.minimum(rho, tis_cap)[tok].mean()
    if any(mis):
        masked = []
        for b in range(B):
            n = m[b].sum()
            if n == 0:
                continue
            seq = lr[b].sum() if mis_kind == "product" else lr[b].sum() / n
            ratio = np.exp(seq)
            out = (mis[0] > 0 and ratio < mis[0]) or (mis[1] > 0 and ratio > mis[1])
            masked.append(out)
            if out:
                w[b] = 0
        met["offpolicy/mis_masked_frac"] = np.mean(masked)
    if any(icepop):  # Ring-1T: the token's weight is rho itself inside [low, high], 0 outside
        out = np.zeros((B, T), bool)
        if icepop[0] > 0:
            out |= rho < icepop[0]
        if icepop[1] > 0:
            out |= rho > icepop[1]
        ice = np.where(out, 0.0, rho) * m
        w = w * ice
        met["offpolicy/icepop_masked_frac"] = out[tok].mean()
        met["offpolicy/icepop_weight_mean"] = ice[tok].mean()
    met["offpolicy/weight_mean"] = w[tok].mean()
    return w, met


CASES = [
    dict(),
    dict(tis_cap=1.2),
    dict(mis=(0.5, 2.0)),
    dict(mis=(0.0, 1.5), mis_kind="geometric"),
    dict(mis=(0.9, 0.0), mis_kind="geometric"),
    dict(icepop=(0.8, 1.25)),
    dict(icepop=(0.0, 1.3)),
    dict(tis_cap=2.0, mis=(0.2, 5.0)),
    dict(mis=(0.2, 5.0), icepop=(0.5, 1.5)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "none")
def test_correction_matches_reference(case):
    prox, behav, m = _batch(1)
    w_want, met_want = ref_correction(prox, behav, m, **case)
    kw = dict(tis_cap=case.get("tis_cap", 0.0), mis_low=case.get("mis", (0, 0))[0], mis_high=case.get("mis", (0, 0))[1],
              mis_kind=case.get("mis_kind", "product"), icepop_low=case.get("icepop", (0, 0))[0],
              icepop_high=case.get("icepop", (0, 0))[1])
    w, met = op.correction(prox, behav, m, **kw)
    np.testing.assert_allclose(np.asarray(w), w_want, rtol=1e-5, atol=1e-6)
    assert set(met) == set(met_want)
    for k, v in met_want.items():
        np.testing.assert_allclose(float(met[k]), v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_icepop_alone_weights_each_token_by_its_ratio_inside_the_band():
    """correction(..., icepop_low=a, icepop_high=b) alone is rho * 1[a <= rho <= b] token by token (Ring-1T's IcePop),
    not a 0/1 mask: in-band tokens keep their ratio. IcePop and TIS both weight by rho, so together they are refused."""
    prox, behav, m = _batch(3, spread=0.5)
    a, b = 0.7, 1.4
    w, _ = op.correction(prox, behav, m, icepop_low=a, icepop_high=b)
    rho = np.exp(prox - behav)
    for i, j in np.ndindex(m.shape):
        want = rho[i, j] if (m[i, j] and a <= rho[i, j] <= b) else 0.0
        np.testing.assert_allclose(float(w[i, j]), want, rtol=1e-5, atol=1e-7)
    inside = (m > 0) & (rho >= a) & (rho <= b)
    assert inside.any() and np.abs(rho[inside] - 1).max() > 0.1  # in-band weights differ from 1 on this batch
    assert ((m > 0) & ~inside).any()  # and some tokens fall outside the band
    with pytest.raises(ValueError, match="tis_cap"):
        op.correction(prox, behav, m, tis_cap=2.0, icepop_high=b)


def test_each_correction_really_acts_on_this_batch():
    """The reference cases are not vacuous: every correction changes some weight at the bounds used above."""
    prox, behav, m = _batch(1)
    _, met = op.correction(prox, behav, m, tis_cap=1.2, mis_low=0.5, mis_high=2.0)
    assert 0 < float(met["offpolicy/tis_truncated_frac"]) < 1
    assert 0 < float(met["offpolicy/mis_masked_frac"]) < 1
    _, met = op.correction(prox, behav, m, icepop_low=0.8, icepop_high=1.25)
    assert 0 < float(met["offpolicy/icepop_masked_frac"]) < 1


def test_on_policy_batch_is_left_alone():
    """prox == behaviour: every weight is 1 on the mask, 0 off it, nothing truncated or masked."""
    _, behav, m = _batch(2)
    for kw in (dict(tis_cap=2.0, mis_low=0.5, mis_high=2.0), dict(mis_low=0.5, mis_high=2.0, icepop_low=0.5,
                                                                     icepop_high=2.0)):
        w, met = op.correction(behav, behav, m, **kw)
        np.testing.assert_array_equal(np.asarray(w), m)
        assert float(met["offpolicy/kl"]) == 0 and float(met["offpolicy/mis_masked_frac"]) == 0


def test_extreme_log_ratios_stay_finite():
    prox = np.array([[0.0, -1e4, 0.0]])
    behav = np.array([[-1e4, 0.0, 0.0]])
    w, met = op.correction(prox, behav, np.ones((1, 3)), tis_cap=2.0, mis_high=10.0)
    assert np.all(np.isfinite(np.asarray(w))) and all(np.isfinite(float(v)) for v in met.values())
    with pytest.raises(ValueError, match="mis kind"):
        op.sequence_log_ratio(np.zeros((1, 2)), np.ones((1, 2)), "harmonic")


def test_stage_fields_switch_the_corrections_and_name_bad_bounds():
    from rl import stages
    from schema import FieldErrors

    def cfg(**kw):
        return stages.parse_stage({**stages.defaults("grpo"), **kw})

    assert not cfg().offpolicy.enabled
    assert cfg(tis_cap=2.0).offpolicy.enabled and cfg(icepop_high=5.0).offpolicy.enabled
    assert cfg(mis_low=0.5).offpolicy.enabled
    for kw, fld in ((dict(tis_cap=0.5), "tis_cap"), (dict(mis_high=0.9), "mis_high"), (dict(icepop_low=1.5), "icepop_low"),
                    (dict(mis_kind="harmonic"), "mis_kind"), (dict(tis_cap=2.0, icepop_high=5.0), "icepop_high")):
        with pytest.raises(FieldErrors, match=fld):
            cfg(**kw)
