"""Off-policy correction between the behaviour policy (the sampler's logprobs) and the policy at the start of an update.

The sampler and the trainer disagree for two reasons: numerics (bf16 sampling against float32 training, other
kernels, MoE routes that flip) and staleness (a batch sampled k updates ago, rl/stages/iteration.py). With
prox_t the trainer's logprob of token t at the start of the update (the denominator of the PPO ratio) and behav_t
the sampler's, the per-token ratio is rho_t = exp(prox_t - behav_t). Three corrections, each optional:

  TIS     w_t = min(rho_t, C): truncated importance sampling; the weight of each token's policy-loss term.
  MIS     a sequence is masked (weight 0) when its ratio leaves [lo, hi]; the sequence ratio is prod_t rho_t
          ("product", the true sequence importance ratio) or its geometric mean ("geometric", length-free).
  IcePop  w_t = rho_t * 1[lo <= rho_t <= hi] (Ring-1T): the importance ratio inside the band, 0 outside it (tokens
          whose two policies disagree too much carry no gradient). The 0/1 band alone is `in_band`. IcePop already
          weights by rho_t, so it is not combined with TIS (a ValueError; the stage config refuses it too).

    w, metrics = correction(prox, behav, mask, tis_cap=2.0, mis_low=0.5, mis_high=2.0)
    w, metrics = correction(prox, behav, mask, icepop_low=0.5, icepop_high=5.0)
    batch, metrics = corrected_batch(batch, prox, OffPolicyConfig(tis_cap=2.0))   # what an RL stage does with it

`w` [B, T] is the product of the active corrections (1 where none applies, 0 off the mask); the stage multiplies
each token's advantage by it, which scales each token's policy-loss term by w for every loss in
rl.losses.POLICY_LOSSES (all are positively homogeneous in the advantage), while the loss denominators stay the
response-token counts. A bound of 0 means "no bound on that side". All functions are pure and jit-compatible,
float32 in and out; log ratios are clamped to +-20 like rl.losses. `OffPolicyConfig` holds the stage fields
(`stages[i].tis_cap`, ...), each with its one default, doc and check; the GRPO / PPO stage configs compose it.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from rl.losses import LOG_RATIO_CLAMP
from schema import Checked, choice, field, num

MIS_KINDS = ("product", "geometric")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OffPolicyConfig(Checked):
    """Which corrections an RL stage applies (all off by default; a bound of 0 = no bound on that side)."""

    tis_cap: float = field(0.0, "truncated importance sampling: each token's policy loss weighted by min(rho, cap), "
                                "rho = trainer / sampler probability at the start of the update (0 = off, else >= 1)",
                           num(0.0, 1e6))
    mis_low: float = field(0.0, "MIS: mask sequences whose ratio is below this (0 = no lower bound)", num(0.0, 1e6))
    mis_high: float = field(0.0, "MIS: mask sequences whose ratio is above this (0 = no upper bound)", num(0.0, 1e6))
    mis_kind: str = field("product", "MIS sequence ratio: product of the token ratios | geometric (their geometric "
                                     "mean)", choice(*MIS_KINDS))
    icepop_low: float = field(0.0, "IcePop: each token weighted by its ratio rho, and by 0 when rho is below this "
                                    "(0 = no lower bound; not with tis_cap)", num(0.0, 1e6))
    icepop_high: float = field(0.0, "IcePop: each token weighted by its ratio rho, and by 0 when rho is above this "
                                     "(0 = no upper bound; not with tis_cap)", num(0.0, 1e6))

    def cross_checks(self):
        if 0 < self.tis_cap < 1:
            yield "tis_cap", f"must be 0 (off) or >= 1, got {self.tis_cap}"
        for name in ("mis", "icepop"):
            lo, hi = getattr(self, f"{name}_low"), getattr(self, f"{name}_high")
            if lo >= 1:
                yield f"{name}_low", f"must be < 1 (0 = no lower bound), got {lo}"
            if 0 < hi <= 1:
                yield f"{name}_high", f"must be > 1 (0 = no upper bound), got {hi}"
        if self.tis_cap and (self.icepop_low or self.icepop_high):
            yield "icepop_high" if self.icepop_high else "icepop_low", \
                "IcePop weights each token by its ratio rho already; set it or tis_cap, not both"

    @property
    def enabled(self) -> bool:
        """Any correction on: the update recomputes the trainer's logprobs at its start."""
        return self.tis_cap > 0 or self.mis_low > 0 or self.mis_high > 0 or self.icepop_low > 0 or self.icepop_high > 0


def _mean(x, m):
    return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1.0)


def token_log_ratio(prox_logp, behav_logp, mask):
    """log rho_t = prox_t - behav_t, clamped to +-20, 0 off the mask."""
    m = jnp.asarray(mask, jnp.float32)
    d = jnp.asarray(prox_logp, jnp.float32) - jnp.asarray(behav_logp, jnp.float32)
    return jnp.clip(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * m


def in_band(log_ratio, low: float, high: float):
    """rho = exp(log_ratio) inside [low, high]; a bound of 0 is absent."""
    ok = jnp.ones(jnp.shape(log_ratio), bool)
    if low > 0:
        ok = ok & (log_ratio >= jnp.log(jnp.float32(low)))
    if high > 0:
        ok = ok & (log_ratio <= jnp.log(jnp.float32(high)))
    return ok


def tis_weights(log_ratio, mask, cap: float):
    """Truncated importance weights min(rho_t, cap) [B, T] (0 off the mask) and the share of tokens truncated."""
    m = jnp.asarray(mask, jnp.float32)
    rho = jnp.exp(log_ratio)
    return jnp.minimum(rho, cap) * m, _mean((rho > cap).astype(jnp.float32), m)


def sequence_log_ratio(log_ratio, mask, kind: str = "product"):
    """[B] log of the sequence ratio: sum_t log rho_t ("product") or its mean over the response ("geometric")."""
    if kind not in MIS_KINDS:
        raise ValueError(f"mis kind must be one of {MIS_KINDS}, got {kind!r}")
    m = jnp.asarray(mask, jnp.float32)
    total = jnp.sum(log_ratio * m, axis=-1)
    if kind == "product":
        return jnp.clip(total, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return total / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def correction(prox_logp, behav_logp, mask, *, tis_cap: float = 0.0, mis_low: float = 0.0, mis_high: float = 0.0,
               mis_kind: str = "product", icepop_low: float = 0.0, icepop_high: float = 0.0):
    """Token weights [B, T] of the active corrections (tis_cap 0 = no TIS; MIS / IcePop off when both of their
    bounds are 0) and metrics: offpolicy/log_ratio_abs_mean and _max, kl (k3 estimate of KL(behaviour || prox) per
    token), weight_mean (the final weight's token mean), and per correction tis_truncated_frac / tis_weight_mean,
    mis_masked_frac (share of sequences), icepop_masked_frac (share of tokens) / icepop_weight_mean."""
    icepop = icepop_low > 0 or icepop_high > 0
    if tis_cap > 0 and icepop:
        raise ValueError("tis_cap and icepop_low / icepop_high both weight each token by its ratio rho; use one")
    m = jnp.asarray(mask, jnp.float32)
    lr = token_log_ratio(prox_logp, behav_logp, m)
    real = m > 0
    w = m
    met = {"offpolicy/log_ratio_abs_mean": _mean(jnp.abs(lr), m),
           "offpolicy/log_ratio_abs_max": jnp.max(jnp.where(real, jnp.abs(lr), 0.0), initial=0.0),
           "offpolicy/kl": _mean(jnp.exp(lr) - 1.0 - lr, m)}
    if tis_cap > 0:
        tis, truncated = tis_weights(lr, m, tis_cap)
        w = w * tis
        met.update({"offpolicy/tis_truncated_frac": truncated, "offpolicy/tis_weight_mean": _mean(tis, m)})
    if mis_low > 0 or mis_high > 0:
        has_B = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
        keep_B = in_band(sequence_log_ratio(lr, m, mis_kind), mis_low, mis_high).astype(jnp.float32)
        w = w * keep_B[:, None]
        met["offpolicy/mis_masked_frac"] = _mean(1.0 - keep_B, has_B)
    if icepop:
        keep = in_band(lr, icepop_low, icepop_high).astype(jnp.float32)
        ice = jnp.exp(lr) * keep * m  # Ring-1T's weight: rho inside the band, 0 outside
        w = w * ice
        met["offpolicy/icepop_masked_frac"] = _mean(1.0 - keep, m)
        met["offpolicy/icepop_weight_mean"] = _mean(ice, m)
    met["offpolicy/weight_mean"] = _mean(w, m)
    return w, met


def corrected_batch(batch: dict, prox_logp, cfg: OffPolicyConfig) -> tuple[dict, dict]:
    """A train batch corrected as `cfg` asks: prox_logp
    (the trainer's logprobs at the start of the update) becomes the ratio's old policy, the behaviour logprobs
    batch["old_logp"] (the sampler's) give the weights, and each token's advantage is multiplied by its weight.
    Host NumPy in and out; the metrics as floats."""
    mask = np.asarray(batch["loss_mask"], np.float32)
    prox = np.asarray(prox_logp, np.float32) * mask
    w, met = correction(prox, batch["old_logp"], mask, tis_cap=cfg.tis_cap, mis_low=cfg.mis_low,
                        mis_high=cfg.mis_high, mis_kind=cfg.mis_kind, icepop_low=cfg.icepop_low,
                        icepop_high=cfg.icepop_high)
    adv = np.asarray(batch["advantages"], np.float32)
    adv = adv[:, None] if adv.ndim == 1 else adv
    return {**batch, "old_logp": prox, "advantages": adv * np.asarray(w)}, {k: float(v) for k, v in met.items()}
