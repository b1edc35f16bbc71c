"""Token-level losses for SFT, GRPO and PPO: policy surrogate, KL estimators, value loss, entropy.

All functions are pure and jit-compatible and work on `[batch, time]` float32 arrays with a mask
that is 1 on the tokens that count (response tokens). Per-token terms are reduced to a scalar by
`aggregate`, whose four modes cover the token-mean (DAPO), sequence-mean (original GRPO) and
constant-length-normalised (Dr. GRPO) choices. `POLICY_LOSSES` maps a config name to a policy
loss with the `policy_loss` signature, so a variant is a new entry rather than a new trainer:
"ppo" (clipped token ratio), "reinforce" (unclipped), "gspo" (clipped sequence ratio, GSPO-token form) and
"cispo" (stop-gradient importance weight, clipped from above, times the logprob). `LossConfig` (at the end) is
what the train step optimises: every loss knob a stage config exposes (`stages[i].clip_high`, ...) has its one
default, doc and range check there, and the stage configs (rl/stages/) compose it.

Alignment: `token_logprobs(logits, tokens)[:, t]` is log p(tokens[:, t] | tokens[:, :t]) computed
from `logits[:, t - 1]`; position 0 has no prediction and gets 0 (its loss mask must be 0).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from schema import Checked, boolean, choice, field, integer, num

__all__ = [
    "AGG_MODES",
    "aggregate",
    "aggregate_parts",
    "token_logprobs",
    "entropy_from_logits",
    "policy_loss",
    "reinforce_loss",
    "gspo_loss",
    "cispo_loss",
    "kl_penalty",
    "value_loss",
    "sft_loss",
    "POLICY_LOSSES",
    "get_policy_loss",
    "LossConfig",
]

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps the ratio finite for any logprob difference
K3_MAX = 10.0  # k3 grows like exp(ref - logp): its value is clamped here (the loss and the logged KL), not its gradient
CLIP = 0.2  # the default ratio clip on each side (PPO's epsilon): LossConfig's and the policy losses' default
VALUE_CLIP = 0.2  # the default value-loss clip range: LossConfig's and value_loss's default
MODES = ("sft", "grpo", "ppo", "prm")  # what the train step optimises (rl/train_step.py)
KL_KINDS = ("k1", "k2", "k3")


def aggregate(values: jax.Array, mask: jax.Array, mode: str = "token-mean", max_len: int | None = None,
              denom: jax.Array | None = None) -> jax.Array:
    """Reduce per-token `values [B, T]` to a scalar over the positions where `mask` is 1.

    * token-mean: sum over all masked tokens / number of masked tokens.
    * seq-mean-token-mean: each row's token mean, averaged over rows that have at least one token.
    * seq-mean-token-sum: each row's token sum, averaged over rows that have at least one token.
    * seq-mean-token-sum-norm: each row's token sum / `max_len` (a constant, default T), averaged
      over rows that have at least one token (Dr. GRPO). Rows with no tokens never enter a
      denominator, so padding rows added to fill a minibatch change nothing.

    Every mode is `numerator / denominator` (see `aggregate_parts`). `denom` replaces the
    denominator, e.g. by the whole batch's when the batch is split for gradient accumulation: the
    microbatch results then add up to the whole-batch value.
    """
    num, den = aggregate_parts(values, mask, mode, max_len)
    return num / jnp.maximum(den if denom is None else denom, 1.0)


def aggregate_parts(values: jax.Array, mask: jax.Array, mode: str = "token-mean", max_len: int | None = None):
    """`(numerator, denominator)` of `aggregate`; the denominator depends on the mask only."""
    v = jnp.asarray(values, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)
    if mode == "token-mean":
        return (v * m).sum(), m.sum()
    if mode not in AGG_MODES:
        raise ValueError(f"aggregation mode {mode!r} unknown; choose one of {AGG_MODES}")
    row_tokens = m.sum(axis=-1)
    row_sum = (v * m).sum(axis=-1)
    has_tokens = (row_tokens > 0).astype(jnp.float32)
    if mode == "seq-mean-token-mean":
        per_row = row_sum / jnp.maximum(row_tokens, 1.0)
    elif mode == "seq-mean-token-sum":
        per_row = row_sum
    else:
        norm = v.shape[-1] if max_len is None else max_len
        if norm <= 0:
            raise ValueError(f"max_len must be positive for seq-mean-token-sum-norm, got {norm}")
        per_row = row_sum / norm
    return (per_row * has_tokens).sum(), has_tokens.sum()


def _masked_mean(x: jax.Array, m: jax.Array) -> jax.Array:
    return (x * m).sum() / jnp.maximum(m.sum(), 1.0)


def token_logprobs(logits: jax.Array, tokens: jax.Array, temperature=1.0) -> jax.Array:
    """`[B, T]` log p(tokens[:, t] | prefix) under softmax(logits / temperature); column 0 is 0.

    `temperature` is a scalar or one value per row (`[B]`).
    """
    temp = jnp.asarray(temperature, jnp.float32)
    temp = temp[:, None, None] if temp.ndim == 1 else temp
    logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32) / temp, axis=-1)
    picked = jnp.take_along_axis(logp_all, tokens[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def entropy_from_logits(logits: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Per-position entropy `[B, T]` of softmax(logits) in float32, zeroed where `mask` is 0.

    No shift is applied: entry t is the entropy of the distribution in `logits[:, t]`.
    """
    z = logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(z, axis=-1)
    ent = -(jnp.exp(logp) * logp).sum(axis=-1)
    if mask is not None:
        ent = ent * jnp.asarray(mask, jnp.float32)
    return ent


def policy_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array,
                clip_low: float = CLIP, clip_high: float = CLIP, dual_clip: float | None = None,
                agg: str = "token-mean", max_len: int | None = None, denom: jax.Array | None = None):
    """PPO clipped surrogate with asymmetric clipping (DAPO clip-higher) and dual clip.

    ratio = exp(clamp(logp - old_logp, -20, 20)); per token
    `l = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))`, and with `dual_clip = c`
    (c > 1) tokens with A < 0 use `min(l, -A * c)`, bounding the loss when the ratio explodes.
    Returns `(loss, metrics)`; metrics are masked token means: clip_frac_low (A < 0 and ratio below
    1 - clip_low), clip_frac_high (A > 0 and ratio above 1 + clip_high), dual_clip_frac,
    approx_kl (k3 estimate of KL(old || new)), ratio_mean, and ratio_max over masked tokens.
    `denom` overrides the aggregation denominator (gradient accumulation, see `aggregate`). The arguments' ranges
    (clips >= 0, dual_clip > 1) are LossConfig's checks.
    """
    m = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    log_ratio = jnp.clip(logp.astype(jnp.float32) - old_logp.astype(jnp.float32), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = jnp.maximum(unclipped, clipped)
    dual_active = jnp.zeros_like(per_token, dtype=bool)
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_active = (adv < 0) & (per_token > bound)
        per_token = jnp.where(adv < 0, jnp.minimum(per_token, bound), per_token)
    loss = aggregate(per_token, m, agg, max_len, denom)
    real = m > 0
    metrics = {
        "clip_frac_low": _masked_mean(((adv < 0) & (ratio < 1.0 - clip_low)).astype(jnp.float32), m),
        "clip_frac_high": _masked_mean(((adv > 0) & (ratio > 1.0 + clip_high)).astype(jnp.float32), m),
        "dual_clip_frac": _masked_mean(dual_active.astype(jnp.float32), m),
        "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, m),
        "ratio_mean": _masked_mean(ratio, m),
        "ratio_max": jnp.max(jnp.where(real, ratio, -jnp.inf), initial=0.0),
    }
    return loss, metrics


def reinforce_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array,
                   clip_low: float = CLIP, clip_high: float = CLIP, dual_clip: float | None = None,
                   agg: str = "token-mean", max_len: int | None = None, denom: jax.Array | None = None):
    """Unclipped importance-weighted policy gradient `-A * ratio` (on-policy: plain REINFORCE).

    Same signature and metrics as `policy_loss` so the registry can swap them; the clip arguments
    only feed the clip-fraction metrics (the share of tokens a PPO clip would have clipped); dual_clip must
    be None (dual_clip_frac is 0: nothing is clipped).
    """
    _no_dual_clip("reinforce", dual_clip)
    m = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    log_ratio = jnp.clip(logp.astype(jnp.float32) - old_logp.astype(jnp.float32), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    loss = aggregate(-adv * ratio, m, agg, max_len, denom)
    return loss, _ratio_metrics(ratio, log_ratio, adv, m, clip_low, clip_high)


def _no_dual_clip(name: str, dual_clip) -> None:
    if dual_clip is not None:
        raise ValueError(f"dual_clip applies to the 'ppo' loss only; {name} has none (got {dual_clip})")


def _ratio_metrics(ratio, log_ratio, adv, m, clip_low, clip_high, any_sign: bool = False):
    """The metrics every policy loss reports (policy_loss's keys), for a per-token ratio. Clip fractions count
    tokens with A < 0 below / A > 0 above the band (where a PPO-style min clips), or any token with any_sign."""
    real = m > 0
    neg, pos = (True, True) if any_sign else (adv < 0, adv > 0)
    return {
        "clip_frac_low": _masked_mean((neg & (ratio < 1.0 - clip_low)).astype(jnp.float32), m),
        "clip_frac_high": _masked_mean((pos & (ratio > 1.0 + clip_high)).astype(jnp.float32), m),
        "dual_clip_frac": jnp.zeros((), jnp.float32),
        "approx_kl": _masked_mean(ratio - 1.0 - log_ratio, m),
        "ratio_mean": _masked_mean(ratio, m),
        "ratio_max": jnp.max(jnp.where(real, ratio, -jnp.inf), initial=0.0),
    }


def gspo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array,
              clip_low: float = CLIP, clip_high: float = CLIP, dual_clip: float | None = None,
              agg: str = "seq-mean-token-mean", max_len: int | None = None, denom: jax.Array | None = None):
    """GSPO (Zheng et al. 2025), GSPO-token form: a clipped sequence-level ratio.

    s_i = exp(masked mean over row i's response of (logp - old_logp)) (log clamped to +-20). Per token,
    s_it = sg(s_i) * exp(logp_t - sg(logp_t)) (value s_i, gradient s_i * grad logp_t) and
    l_it = -min(s_it * A_it, clip(s_it, 1 - clip_low, 1 + clip_high) * A_it); aggregated with `agg`. With
    agg "seq-mean-token-mean" (GSPO's; the stage config requires it) and one advantage per sequence this is
    exactly -mean_i min(s_i A_i, clip(s_i) A_i), with GSPO's gradient; per-token advantages also work. GSPO's
    clip ranges are small (the paper: 3e-4 / 4e-4). Metrics as `policy_loss`, of the sequence ratio on every
    token (dual_clip_frac 0; dual_clip must be None).
    """
    _no_dual_clip("gspo", dual_clip)
    m = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    d = (logp.astype(jnp.float32) - old_logp.astype(jnp.float32)) * m
    seq_log = jnp.clip(d.sum(-1) / jnp.maximum(m.sum(-1), 1.0), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    s_B1 = jnp.exp(seq_log)[:, None]
    lp = logp.astype(jnp.float32)
    s_tok = jax.lax.stop_gradient(s_B1) * jnp.exp(lp - jax.lax.stop_gradient(lp))
    per_token = -jnp.minimum(s_tok * adv, jnp.clip(s_tok, 1.0 - clip_low, 1.0 + clip_high) * adv)
    loss = aggregate(per_token, m, agg, max_len, denom)
    s_BT = jnp.broadcast_to(s_B1, m.shape)
    return loss, _ratio_metrics(s_BT, jnp.broadcast_to(seq_log[:, None], m.shape), adv, m, clip_low, clip_high)


def cispo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array,
               clip_low: float | None = None, clip_high: float = CLIP, dual_clip: float | None = None,
               agg: str = "token-mean", max_len: int | None = None, denom: jax.Array | None = None):
    """CISPO (MiniMax-M1, 2025): the importance weight is clipped and stop-gradiented, never the token dropped.

    Per token l_t = -sg(w_t) * A_t * logp_t with w_t = min(ratio_t, 1 + clip_high), ratio_t = exp(logp_t -
    old_logp_t) (log clamped to +-20): the paper's weight, clipped from above only (it sets eps_low large enough
    never to bind). A lower bound only when asked: clip_low = c gives w_t = clip(ratio_t, 1 - c, 1 + clip_high).
    Aggregated with `agg`: token-mean (the default) is the paper's sum over masked tokens divided by their number.
    Every token keeps a gradient -w_t * A_t * grad logp_t. Metrics as `policy_loss` (clip fractions: tokens whose
    weight was clipped below / above, whatever their advantage; clip_frac_low is 0 without a lower bound;
    dual_clip must be None).
    """
    _no_dual_clip("cispo", dual_clip)
    m = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    lp = logp.astype(jnp.float32)
    log_ratio = jnp.clip(lp - old_logp.astype(jnp.float32), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = jnp.exp(log_ratio)
    if clip_low is None:
        weight = jnp.minimum(ratio, 1.0 + clip_high)
    else:
        weight = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = aggregate(-jax.lax.stop_gradient(weight) * adv * lp, m, agg, max_len, denom)
    # no lower bound: a floor of 1 - 1 = 0, which no ratio falls below (clip_frac_low 0)
    low = 1.0 if clip_low is None else clip_low
    return loss, _ratio_metrics(ratio, log_ratio, adv, m, low, clip_high, any_sign=True)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token KL(policy || ref) estimate from sampled-token logprobs (Schulman's k1/k2/k3).

    k1 = logp - ref; k2 = (logp - ref)^2 / 2; k3 = exp(ref - logp) - (ref - logp) - 1, with the log
    ratio clamped to +-20 (exp stays finite). k3's value is clamped to [0, K3_MAX] (a rare token cannot blow up
    the loss or the logged KL) but not its gradient, 1 - exp(ref - logp): a clamp that bound zeroed the gradient of
    exactly the tokens that drifted most from the reference (the straight-through value below).
    """
    d = logp.astype(jnp.float32) - ref_logp.astype(jnp.float32)
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "k3":
        neg = jnp.clip(-d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        k3 = jnp.exp(neg) - neg - 1.0
        # value: the clamped k3 exactly (k3 - k3 is 0 for a finite k3); gradient: k3's own, unclamped.
        return jax.lax.stop_gradient(jnp.clip(k3, 0.0, K3_MAX)) + (k3 - jax.lax.stop_gradient(k3))
    raise ValueError(f"kl kind {kind!r} unknown; choose one of ('k1', 'k2', 'k3')")


def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array,
               clip: float | None = VALUE_CLIP, agg: str = "token-mean", max_len: int | None = None,
               denom: jax.Array | None = None):
    """PPO clipped value loss `0.5 * max((V - R)^2, (V_clip - R)^2)`, V_clip = V_old + clip(V - V_old, +-clip).

    `clip=None` gives the plain squared error. Returns `(loss, metrics)` with the fraction of
    tokens where the clipped branch is the larger one (`value_clip_frac`).
    """
    v = values.astype(jnp.float32)
    r = jnp.asarray(returns, jnp.float32)
    m = jnp.asarray(mask, jnp.float32)
    err = (v - r) ** 2
    if clip is None:
        per_token, clip_frac = err, jnp.zeros((), jnp.float32)
    else:
        old = jnp.asarray(old_values, jnp.float32)
        v_clip = old + jnp.clip(v - old, -clip, clip)
        err_clip = (v_clip - r) ** 2
        per_token = jnp.maximum(err, err_clip)
        clip_frac = _masked_mean((err_clip > err).astype(jnp.float32), m)
    loss = 0.5 * aggregate(per_token, m, agg, max_len, denom)
    return loss, {"value_clip_frac": clip_frac, "value_mean": _masked_mean(v, m)}


def sft_loss(logits: jax.Array, tokens: jax.Array, loss_mask: jax.Array, agg: str = "token-mean",
             max_len: int | None = None):
    """Masked next-token cross-entropy; `loss_mask[:, t]` = 1 where token t (predicted from t-1) counts.

    Returns `(loss, metrics)` with the masked token accuracy of the argmax prediction.
    """
    logp = token_logprobs(logits, tokens)
    m = jnp.asarray(loss_mask, jnp.float32)
    pred = jnp.pad(jnp.argmax(logits[:, :-1], axis=-1), ((0, 0), (1, 0)))
    acc = _masked_mean((pred == tokens).astype(jnp.float32), m)
    return aggregate(-logp, m, agg, max_len), {"token_accuracy": acc}


# Policy losses by config name; each has the `policy_loss` signature.
POLICY_LOSSES: dict[str, Callable] = {
    "ppo": policy_loss,
    "reinforce": reinforce_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
}


def get_policy_loss(name: str) -> Callable:
    """Look up a policy loss by name (ValueError lists the known names)."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"policy loss {name!r} unknown; choose one of {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


def _optional_positive_int(v) -> str | None:
    return None if v is None else integer(1, 10**9)(v)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig(Checked):
    """What the train step optimises (rl/train_step.py), checked on construction (FieldErrors names the field).

    The GRPO / PPO stage configs compose it: their flat keys (`stages[i].clip_high`, ...) are these fields, so each
    has its one default, doc and check here. `mode`, `max_len_norm` and `kl_in_loss` are not config keys: the
    stage fills them in from its kind, sampling.max_new_tokens and kl_place (rl/stages/iteration.py, loss_for).
    """

    mode: str = dataclasses.field(metadata={"doc": "what is optimised: sft | grpo | ppo | prm (set by the stage)",
                                            "check": choice(*MODES)})
    policy_loss: str = field("ppo", "policy loss (rl.losses.POLICY_LOSSES): ppo (clipped token ratio) | reinforce | "
                                    "gspo (clipped sequence ratio; needs agg seq-mean-token-mean) | cispo (clipped "
                                    "stop-gradient weight min(ratio, 1 + clip_high) x logprob)",
                             choice(*POLICY_LOSSES))
    clip_low: float = field(CLIP, "PPO ratio clip below 1 - clip_low (cispo: only with cispo_floor)", num(0.0, 0.99))
    clip_high: float = field(CLIP, "PPO ratio clip above 1 + clip_high (clip-higher: > clip_low)", num(0.0, 9.99))
    dual_clip: float = field(0.0, "dual-clip constant c > 1 for negative advantages (0 = off)", num(0.0, 100.0))
    cispo_floor: bool = field(False, "cispo: also floor the importance weight at 1 - clip_low (False = clipped from "
                                     "above only, as in MiniMax-M1)", boolean)
    agg: str = field("token-mean", "loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum | "
                                   "seq-mean-token-sum-norm (Dr. GRPO: divided by sampling.max_new_tokens)",
                     choice(*AGG_MODES))
    max_len_norm: int | None = field(None, "constant divisor of seq-mean-token-sum-norm (None = T; set by the stage "
                                           "from sampling.max_new_tokens)", _optional_positive_int)
    kl_kind: str = field("k3", "KL estimator: k1 | k2 | k3 (k1 only in the reward)", choice(*KL_KINDS))
    kl_in_loss: bool = field(True, "the KL to the reference is a loss term (False: only measured, e.g. PPO's KL in "
                                   "the reward; set by the stage from kl_place)", boolean)
    entropy_coef: float = field(0.0, "entropy bonus coefficient", num(0.0, 10.0))
    value_coef: float = field(0.5, "PPO: value loss coefficient", num(0.0, 100.0))
    value_clip: float = field(VALUE_CLIP, "PPO: value clip range (0 = off)", num(0.0, 1e6))
    routing_replay: bool = field(False, "routing replay (R3, MoE models): the train step uses the experts the sampler "
                                        "chose for every token, gate weights from the current router", boolean)

    def cross_checks(self):
        if self.dual_clip != 0 and self.dual_clip <= 1:
            yield "dual_clip", f"must be 0 (off) or > 1, got {self.dual_clip}"
        if self.policy_loss != "ppo" and self.dual_clip:
            yield "dual_clip", f"applies to policy_loss ppo only, got {self.dual_clip} with {self.policy_loss}"
        if self.policy_loss == "gspo" and self.agg != "seq-mean-token-mean":
            yield "agg", f"must be seq-mean-token-mean for policy_loss gspo (its mean over sequences), got {self.agg!r}"
        if self.cispo_floor and self.policy_loss != "cispo":
            yield "cispo_floor", f"applies to policy_loss cispo only, got {self.policy_loss!r}"
        if self.policy_loss == "cispo" and not self.cispo_floor and self.clip_low != CLIP:
            yield "clip_low", (f"has no effect with policy_loss cispo (its weight is clipped from above only), got "
                               f"{self.clip_low}; set cispo_floor=True to floor the weight at 1 - clip_low")
        if self.mode != "sft" and self.kl_in_loss and self.kl_kind == "k1":
            yield "kl_kind", ("'k1' cannot be used in the loss: the gradient of k1 = logp - ref_logp is the score "
                              "function, whose expectation is zero, so it does not pull towards the reference; use k3 "
                              "(or k2) in the loss, or k1 in the reward")

    @property
    def ratio_clip_low(self) -> float | None:
        """The policy loss's clip_low argument: None (no lower bound) for cispo without cispo_floor."""
        return None if self.policy_loss == "cispo" and not self.cispo_floor else self.clip_low
