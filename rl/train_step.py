"""The functional train step shared by SFT, GRPO and PPO, plus its configs, optimizer and helpers.

One jitted pure function `(state, batch) -> (state, metrics)` serves all three modes. It runs the
policy forward once, derives per-token logprobs and entropy from the same logits, and sums
  policy loss (or masked cross-entropy for SFT)
  + kl_coef * KL(policy || ref)          (when the batch has ref_logp and kl_in_loss)
  - entropy_coef * entropy
  + value_coef * clipped value loss      (PPO: linear value head on the final hidden state)
  + router_aux_coef * sum(load-balancing) + router_z_coef * sum(z-loss)   (MoE layers)
and reports every term separately. A batch whose loss or gradient is not finite leaves params,
optimizer state and step untouched and increments `n_skipped`. `make_train_step(...,
microbatches=n)` accumulates the gradient over n row slices in a `lax.scan` for one update (same
result, about n-fold less activation memory).

    model_cfg = ModelConfig(...)
    loss_cfg = LossConfig(mode="grpo", clip_high=0.28, kl_coef_init=0.04)
    optim_cfg = OptimConfig(learning_rate=1e-5, warmup_steps=10, total_steps=500)
    ctl = AdaptiveKL(0.04, target=0.05, horizon=10_000)          # or None for FixedKL(kl_coef_init)
    state = init_train_state(model_cfg, loss_cfg, optim_cfg, jax.random.key(0), mesh=mesh, kl_controller=ctl)
    step = make_train_step(model_cfg, loss_cfg, optim_cfg, ctl, mesh=mesh)
    logprobs = make_logprob_fn(model_cfg, mesh=mesh)               # old / ref logprobs
    for mb in minibatches(batch, token_budget=16_384):
        state, metrics = step(state, mb)                         # state is donated

Batch (dict of arrays, all rows first; rows must divide the mesh's batch axes):
  tokens [B, T] int32 prompt+response right-padded; attn_mask [B, T]; loss_mask [B, T] (1 where
  token t is a response token, predicted from t - 1); advantages [B, T] or [B] (broadcast);
  old_logp [B, T] (optional: absent means on-policy, old = stop_gradient(logp)); ref_logp [B, T]
  (optional: absent means no KL term); PPO also old_values [B, T] and returns [B, T].
Value alignment matches logprobs: values[:, t] is the head applied to hidden[:, t - 1] (the state
before token t), values[:, 0] = 0.

The KL coefficient lives in `state["kl_state"]`; with `update_kl_in_step=True` (default) the
controller is updated after every applied step from the measured `kl` metric and the number of
rows with response tokens; trainers that prefer one update per iteration pass False and call
`update_kl(state, ctl, kl, n_steps)`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from rl import losses
from rl.kl_control import FixedKL

__all__ = [
    "LossConfig",
    "OptimConfig",
    "lr_schedule",
    "make_optimizer",
    "init_train_state",
    "state_shardings",
    "make_train_step",
    "update_kl",
    "make_logprob_fn",
    "compute_logprobs",
    "minibatches",
]

MODES = ("sft", "grpo", "ppo")
KL_KINDS = ("k1", "k2", "k3")


# ------------------------------------------------------------------------------------- configs
@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    """What the train step optimises. Validated on construction (ValueError names the field)."""

    mode: str  # "sft" | "grpo" | "ppo"
    policy_loss: str = "ppo"  # name in rl.losses.POLICY_LOSSES
    clip_low: float = 0.2  # ratio lower bound 1 - clip_low
    clip_high: float = 0.2  # ratio upper bound 1 + clip_high (DAPO clip-higher: 0.28)
    dual_clip: float | None = None  # c > 1 bounds the loss of negative-advantage tokens
    agg: str = "token-mean"  # one of rl.losses.AGG_MODES
    max_len_norm: int | None = None  # constant divisor for seq-mean-token-sum-norm (None = T)
    kl_coef_init: float = 0.0  # coefficient of FixedKL when no controller is given
    kl_kind: str = "k3"  # k1 | k2 | k3 estimator of KL(policy || ref)
    kl_in_loss: bool = True  # False: KL is only measured (the trainer puts it in the rewards)
    value_coef: float = 0.5  # PPO value-loss weight
    value_clip: float | None = 0.2  # PPO value clip (None = unclipped)
    entropy_coef: float = 0.0  # entropy bonus weight (loss -= entropy_coef * entropy)
    temperature: float = 1.0  # logits / T before logprobs: match the sampler's temperature

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"LossConfig.mode must be one of {MODES}, got {self.mode!r}")
        if self.policy_loss not in losses.POLICY_LOSSES:
            raise ValueError(f"LossConfig.policy_loss must be one of {sorted(losses.POLICY_LOSSES)}, got {self.policy_loss!r}")
        for name in ("clip_low", "clip_high"):
            if not 0.0 <= getattr(self, name) < 10.0:
                raise ValueError(f"LossConfig.{name} must be in [0, 10), got {getattr(self, name)}")
        if self.clip_low >= 1.0:
            raise ValueError(f"LossConfig.clip_low must be < 1 (ratio floor 1 - clip_low > 0), got {self.clip_low}")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"LossConfig.dual_clip must be None or > 1, got {self.dual_clip}")
        if self.agg not in losses.AGG_MODES:
            raise ValueError(f"LossConfig.agg must be one of {losses.AGG_MODES}, got {self.agg!r}")
        if self.max_len_norm is not None and not self.max_len_norm > 0:
            raise ValueError(f"LossConfig.max_len_norm must be None or > 0, got {self.max_len_norm}")
        if not self.kl_coef_init >= 0:
            raise ValueError(f"LossConfig.kl_coef_init must be >= 0, got {self.kl_coef_init}")
        if self.kl_kind not in KL_KINDS:
            raise ValueError(f"LossConfig.kl_kind must be one of {KL_KINDS}, got {self.kl_kind!r}")
        if not self.value_coef >= 0:
            raise ValueError(f"LossConfig.value_coef must be >= 0, got {self.value_coef}")
        if self.value_clip is not None and not self.value_clip > 0:
            raise ValueError(f"LossConfig.value_clip must be None or > 0, got {self.value_clip}")
        if not self.entropy_coef >= 0:
            raise ValueError(f"LossConfig.entropy_coef must be >= 0, got {self.entropy_coef}")
        if not self.temperature > 0:
            raise ValueError(f"LossConfig.temperature must be > 0, got {self.temperature}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with linear warmup, linear decay to `end_lr_fraction * learning_rate`, global-norm clip."""

    learning_rate: float = 3e-4  # peak learning rate
    warmup_steps: int = 0  # linear warmup from peak / warmup_steps to peak
    total_steps: int = 1000  # the decay reaches end_lr_fraction * peak here, and stays
    end_lr_fraction: float = 0.1  # final lr as a fraction of the peak
    weight_decay: float = 0.0  # decoupled, on matrices only (ndim >= 2)
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float | None = 1.0  # global-norm clip; None disables

    def __post_init__(self):
        if not self.learning_rate > 0:
            raise ValueError(f"OptimConfig.learning_rate must be > 0, got {self.learning_rate}")
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(f"OptimConfig.warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if not (isinstance(self.total_steps, int) and self.total_steps >= 1):
            raise ValueError(f"OptimConfig.total_steps must be an int >= 1, got {self.total_steps!r}")
        if self.warmup_steps > self.total_steps:
            raise ValueError(f"OptimConfig.warmup_steps ({self.warmup_steps}) exceeds total_steps ({self.total_steps})")
        if not 0.0 <= self.end_lr_fraction <= 1.0:
            raise ValueError(f"OptimConfig.end_lr_fraction must be in [0, 1], got {self.end_lr_fraction}")
        if not self.weight_decay >= 0:
            raise ValueError(f"OptimConfig.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"OptimConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"OptimConfig.eps must be > 0, got {self.eps}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"OptimConfig.grad_clip must be None or > 0, got {self.grad_clip}")


# ------------------------------------------------------------------------------------- optimizer
def lr_schedule(cfg: OptimConfig):
    """Learning rate at optimizer update `count` (0-based), same curve as rl.schedules.lr_at.

    Warmup: peak * (count + 1) / warmup (the first update already moves the parameters); then a
    straight line from peak to end_lr_fraction * peak at total_steps, held afterwards.
    """
    peak, warm, total, end = cfg.learning_rate, cfg.warmup_steps, cfg.total_steps, cfg.end_lr_fraction

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        warm_lr = peak * (step + 1.0) / max(warm, 1)
        frac = jnp.clip((step - warm) / max(total - warm, 1), 0.0, 1.0)
        return jnp.where(step < warm, warm_lr, peak * (1.0 - (1.0 - end) * frac))

    return schedule


def _decay_mask(params):
    # Decay matrices only: norms' scales and biases are not regularised towards zero.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping then AdamW on the warmup / linear-decay schedule."""
    adamw = optax.adamw(lr_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                        weight_decay=cfg.weight_decay, mask=_decay_mask)
    if cfg.grad_clip is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)


# ------------------------------------------------------------------------------------- state
def _value_head(d_model: int) -> dict:
    # Zero init: the first value estimates are 0, so early advantages are just the returns.
    return {"w": jnp.zeros((d_model,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def _model_params(params: dict) -> dict:
    return {k: v for k, v in params.items() if k != "value_head"}


def _abstract_params(model_cfg, loss_cfg):
    from models import transformer

    abstract = jax.eval_shape(lambda k: transformer.init(model_cfg, k), jax.random.key(0))
    if loss_cfg.mode == "ppo":
        abstract = {**abstract, "value_head": jax.eval_shape(lambda: _value_head(model_cfg.d_model))}
    return abstract


def state_shardings(model_cfg, loss_cfg, optim_cfg, mesh, rules=None) -> dict:
    """NamedShardings for every leaf of the train state on `mesh`.

    Params follow models.sharding.param_shardings; the optimizer moments mirror their parameter;
    counters, KL state, RNG and the value head are replicated.
    """
    from models import sharding

    rules = sharding.DEFAULT_RULES if rules is None else rules
    rep = NamedSharding(mesh, PartitionSpec())
    p_sh = dict(sharding.param_shardings(model_cfg, mesh, rules))
    if loss_cfg.mode == "ppo":
        p_sh["value_head"] = {"w": rep, "b": rep}
    opt = make_optimizer(optim_cfg)
    opt_abstract = jax.eval_shape(opt.init, _abstract_params(model_cfg, loss_cfg))
    opt_sh = optax.tree_map_params(opt, lambda _, sh: sh, opt_abstract, p_sh,
                                   transform_non_params=lambda _: rep)
    return {"params": p_sh, "opt_state": opt_sh, "step": rep, "kl_state": {"coef": rep}, "rng": rep, "n_skipped": rep}


def init_train_state(model_cfg, loss_cfg: LossConfig, optim_cfg: OptimConfig, key, mesh=None, rules=None,
                     params=None, kl_controller=None) -> dict:
    """Fresh train state: {params, opt_state, step, kl_state, rng, n_skipped}.

    `params` (e.g. from an SFT checkpoint) are used when given, else initialised (sharded when a
    mesh is given). PPO adds params["value_head"] = {"w": [d_model], "b": []}; other modes drop it.
    """
    from models import sharding, transformer

    k_params, k_rng = jax.random.split(key)
    if params is None:
        if mesh is None:
            params = transformer.init(model_cfg, k_params)
        else:
            params = sharding.init_sharded(model_cfg, k_params, mesh, sharding.DEFAULT_RULES if rules is None else rules)
    params = dict(params)
    if loss_cfg.mode == "ppo":
        params.setdefault("value_head", _value_head(model_cfg.d_model))
    else:
        params.pop("value_head", None)
    ctl = kl_controller if kl_controller is not None else FixedKL(loss_cfg.kl_coef_init)
    opt = make_optimizer(optim_cfg)
    state = {
        "params": params,
        "opt_state": None,
        "step": jnp.zeros((), jnp.int32),
        "kl_state": ctl.init(),
        "rng": k_rng,
        "n_skipped": jnp.zeros((), jnp.int32),
    }
    if mesh is None:
        state["opt_state"] = jax.jit(opt.init)(params)
        return state
    sh = state_shardings(model_cfg, loss_cfg, optim_cfg, mesh, rules)
    state["params"] = jax.device_put(params, sh["params"])
    state["opt_state"] = jax.jit(opt.init, out_shardings=sh["opt_state"])(state["params"])
    return jax.device_put(state, sh)


def update_kl(state: dict, kl_controller, kl, n_steps) -> dict:
    """Pure: a new state whose kl_state is the controller's update from the measured `kl`."""
    return {**state, "kl_state": kl_controller.update(state["kl_state"], kl, n_steps)}


# ------------------------------------------------------------------------------------- the step
def _shifted_values(params: dict, hidden: jax.Array) -> jax.Array:
    head = params["value_head"]
    v = jnp.einsum("btd,d->bt", hidden[:, :-1].astype(jnp.float32), head["w"]) + head["b"]
    return jnp.pad(v, ((0, 0), (1, 0)))


def _router_terms(aux: dict, model_cfg) -> tuple[jax.Array, jax.Array]:
    lb = jnp.asarray(aux.get("router_aux_loss", jnp.zeros((0,))), jnp.float32)
    z = jnp.asarray(aux.get("router_z_loss", jnp.zeros((0,))), jnp.float32)
    return lb.sum(), z.sum()


# Metrics combined across microbatches by max; all others are pre-scaled so that they add up.
_MAX_METRICS = ("policy/ratio_max",)


def _make_loss_fn(model_cfg, loss_cfg: LossConfig, mesh, rules):
    """loss_fn(params, batch, kl_coef, share) -> (total, metrics).

    `share` describes the batch as a part of a larger one (gradient accumulation): `denom` is the
    whole batch's aggregation denominator, `tok_w` / `real_w` its fraction of the loss tokens /
    attended tokens. Losses use `denom`; masked-mean metrics are scaled by `tok_w` and router terms
    by `real_w`, so summing over the parts gives the whole-batch values (router load-balancing loss:
    the token-weighted mean of the parts' losses, the usual accumulation approximation).
    """
    from models import transformer

    policy_fn = losses.get_policy_loss(loss_cfg.policy_loss)
    agg, max_len = loss_cfg.agg, loss_cfg.max_len_norm
    is_ppo, is_sft = loss_cfg.mode == "ppo", loss_cfg.mode == "sft"

    def loss_fn(params, batch, kl_coef, share=None):
        denom = None if share is None else share["denom"]
        tok_w = 1.0 if share is None else share["tok_w"]
        real_w = 1.0 if share is None else share["real_w"]
        tokens = batch["tokens"].astype(jnp.int32)
        mask = batch["loss_mask"].astype(jnp.float32)
        logits, aux = transformer.forward(_model_params(params), tokens, model_cfg, attn_mask=batch["attn_mask"],
                                          return_hidden=is_ppo, mesh=mesh, rules=rules)
        temp = 1.0 if is_sft else loss_cfg.temperature
        # One log-softmax feeds both the sampled-token logprobs and the entropy.
        logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32) / temp, axis=-1)
        logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
        logp = jnp.pad(logp, ((0, 0), (1, 0)))
        ent_tok = jnp.pad(-(jnp.exp(logp_all) * logp_all).sum(-1), ((0, 0), (1, 0)))
        entropy = losses.aggregate(ent_tok, mask, agg, max_len, denom)
        metrics: dict[str, Any] = {"entropy": entropy}

        if is_sft:
            policy = losses.aggregate(-logp, mask, agg, max_len, denom)
        else:
            adv = batch["advantages"].astype(jnp.float32)
            if adv.ndim == 1:
                adv = adv[:, None]
            adv = jnp.broadcast_to(adv, mask.shape)
            old = batch["old_logp"].astype(jnp.float32) if "old_logp" in batch else jax.lax.stop_gradient(logp)
            policy, pmet = policy_fn(logp, old, adv, mask, loss_cfg.clip_low, loss_cfg.clip_high,
                                     loss_cfg.dual_clip, agg, max_len, denom)
            metrics.update({f"policy/{k}": v if f"policy/{k}" in _MAX_METRICS else v * tok_w
                            for k, v in pmet.items()})
        total = policy - loss_cfg.entropy_coef * entropy

        kl = jnp.zeros((), jnp.float32)
        if not is_sft and "ref_logp" in batch:
            kl_tok = losses.kl_penalty(logp, batch["ref_logp"], loss_cfg.kl_kind)
            kl = losses.aggregate(kl_tok, mask, agg, max_len, denom)
            if loss_cfg.kl_in_loss:
                total = total + kl_coef * kl

        vloss = jnp.zeros((), jnp.float32)
        if is_ppo:
            values = _shifted_values(params, aux["hidden"])
            vloss, vmet = losses.value_loss(values, batch["old_values"], batch["returns"], mask,
                                            loss_cfg.value_clip, agg, max_len, denom)
            total = total + loss_cfg.value_coef * vloss
            metrics.update({f"value/{k}": v * tok_w for k, v in vmet.items()})

        r_lb, r_z = (t * real_w for t in _router_terms(aux, model_cfg))
        total = total + model_cfg.router_aux_coef * r_lb + model_cfg.router_z_coef * r_z

        metrics.update({
            "loss/total": total,
            "loss/policy": policy,
            "loss/kl": kl,
            "loss/value": vloss,
            "loss/router_aux": r_lb,
            "loss/router_z": r_z,
            "kl": kl,
            "n_tokens": mask.sum(),
            "n_rows": (mask.sum(-1) > 0).sum().astype(jnp.float32),
        })
        if "expert_load" in aux:
            metrics["router/expert_load"] = aux["expert_load"] * real_w
        if "dropped_fraction" in aux:
            metrics["router/dropped_fraction"] = aux["dropped_fraction"] * real_w
        return total, metrics

    return loss_fn


def _accumulated_value_and_grad(loss_fn, params, batch, kl_coef, n_micro: int, agg: str, max_len):
    """Sum of loss and gradients over `n_micro` row-strided microbatches, equal to the whole batch's.

    Row r goes to microbatch r % n_micro, so with rows sharded in contiguous blocks over the mesh
    every microbatch still spans all batch shards. Peak activation memory drops about n_micro-fold.
    """
    rows = batch["tokens"].shape[0]
    if rows % n_micro:
        raise ValueError(f"microbatches={n_micro} must divide the batch's {rows} rows")
    mask = batch["loss_mask"].astype(jnp.float32)
    _, denom = losses.aggregate_parts(mask, mask, agg, max_len)
    n_tok = jnp.maximum(mask.sum(), 1.0)
    n_real = jnp.maximum(batch["attn_mask"].astype(jnp.float32).sum(), 1.0)
    split = jax.tree.map(lambda x: jnp.swapaxes(x.reshape(rows // n_micro, n_micro, *x.shape[1:]), 0, 1), batch)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def body(carry, mb):
        g_acc, m_acc = carry
        share = {"denom": denom, "tok_w": mb["loss_mask"].astype(jnp.float32).sum() / n_tok,
                 "real_w": mb["attn_mask"].astype(jnp.float32).sum() / n_real}
        (_, met), g = grad_fn(params, mb, kl_coef, share)
        g_acc = jax.tree.map(jnp.add, g_acc, g)
        m_acc = {k: jnp.maximum(m_acc[k], v) if k in _MAX_METRICS else m_acc[k] + v for k, v in met.items()}
        return (g_acc, m_acc), None

    first = jax.tree.map(lambda x: x[0], split)
    met_shape = jax.eval_shape(lambda: grad_fn(params, first, kl_coef, {"denom": denom, "tok_w": 1.0, "real_w": 1.0})[0][1])
    m0 = {k: jnp.full(v.shape, -jnp.inf if k in _MAX_METRICS else 0.0, v.dtype) for k, v in met_shape.items()}
    g0 = jax.tree.map(jnp.zeros_like, params)
    (grads, metrics), _ = jax.lax.scan(body, (g0, m0), split)
    return (metrics["loss/total"], metrics), grads


def _batch_sharding(mesh, rules):
    from models import sharding

    rules = sharding.DEFAULT_RULES if rules is None else rules
    # Only the leading (row) axis is sharded, so one spec fits [B], [B, T] and [B, T, ...] leaves.
    lead = sharding.batch_sharding(mesh, rules, ndim=2).spec[0]
    return NamedSharding(mesh, PartitionSpec(lead))


def make_train_step(model_cfg, loss_cfg: LossConfig, optim_cfg: OptimConfig, kl_controller=None, mesh=None,
                    rules=None, update_kl_in_step: bool = True, microbatches: int = 1):
    """The jitted `(state, batch) -> (state, metrics)`; the state argument is donated.

    With a mesh, in/out shardings are explicit: the state as in `state_shardings`, batch rows over
    the mesh's batch axes, metrics replicated. `microbatches > 1` accumulates the gradient over
    that many row-strided slices of the batch in a `lax.scan` (one optimizer update, same result
    up to float rounding and the router load-balancing term), cutting activation memory.
    """
    if not (isinstance(microbatches, int) and microbatches >= 1):
        raise ValueError(f"microbatches must be an int >= 1, got {microbatches!r}")
    ctl = kl_controller if kl_controller is not None else FixedKL(loss_cfg.kl_coef_init)
    opt = make_optimizer(optim_cfg)
    schedule = lr_schedule(optim_cfg)
    loss_fn = _make_loss_fn(model_cfg, loss_cfg, mesh, rules)
    measures_kl = loss_cfg.mode != "sft"

    def step(state, batch):
        params = state["params"]
        kl_coef = state["kl_state"]["coef"]
        if microbatches == 1:
            (total, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, kl_coef)
        else:
            (total, metrics), grads = _accumulated_value_and_grad(loss_fn, params, batch, kl_coef, microbatches,
                                                                  loss_cfg.agg, loss_cfg.max_len_norm)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(total) & jnp.isfinite(grad_norm)
        updates, new_opt = opt.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)

        def pick(new, old):
            # The whole update is selected at once: a non-finite batch leaves every leaf as it was.
            return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)

        kl_state = state["kl_state"]
        if update_kl_in_step and measures_kl and "ref_logp" in batch:
            kl_state = pick(ctl.update(kl_state, metrics["kl"], metrics["n_rows"]), kl_state)
        skipped = (~finite).astype(jnp.int32)
        new_state = {
            "params": pick(new_params, params),
            "opt_state": pick(new_opt, state["opt_state"]),
            "step": state["step"] + (1 - skipped),
            "kl_state": kl_state,
            "rng": jax.random.split(state["rng"])[0],
            "n_skipped": state["n_skipped"] + skipped,
        }
        metrics.update({"kl_coef": kl_coef, "grad_norm": grad_norm, "lr": schedule(state["step"]), "skipped": skipped,
                        "n_skipped": new_state["n_skipped"]})
        return new_state, metrics

    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    st_sh = state_shardings(model_cfg, loss_cfg, optim_cfg, mesh, rules)
    rep = NamedSharding(mesh, PartitionSpec())
    return jax.jit(step, in_shardings=(st_sh, _batch_sharding(mesh, rules)), out_shardings=(st_sh, rep),
                   donate_argnums=0)


# ------------------------------------------------------------------------------------- logprobs
def _logprobs(params, tokens, attn_mask, temperature, model_cfg, mesh, rules, with_values):
    from models import transformer

    logits, aux = transformer.forward(_model_params(params), tokens, model_cfg, attn_mask=attn_mask,
                                      return_hidden=with_values, mesh=mesh, rules=rules)
    real = attn_mask.astype(jnp.float32)
    logp = losses.token_logprobs(logits, tokens, temperature) * real
    if not with_values:
        return logp
    return logp, _shifted_values(params, aux["hidden"]) * real


def make_logprob_fn(model_cfg, mesh=None, rules=None, with_values: bool = False):
    """Jitted `fn(params, tokens, attn_mask, temperature=1.0) -> logp [B, T]` (and values [B, T] for PPO).

    logp[:, t] = log softmax(logits[:, t-1] / temperature)[tokens[:, t]], logp[:, 0] = 0, and 0 on
    padding. Use it for old-policy and reference logprobs; temperature is traced (no recompiles).
    """

    def fn(params, tokens, attn_mask, temperature=1.0):
        return _logprobs(params, tokens, attn_mask, temperature, model_cfg, mesh, rules, with_values)

    if mesh is None:
        return jax.jit(fn)
    out = _batch_sharding(mesh, rules)
    return jax.jit(fn, out_shardings=(out, out) if with_values else out)


@functools.partial(jax.jit, static_argnames=("cfg",))
def compute_logprobs(params, tokens, attn_mask, cfg, temperature=1.0):
    """Unsharded convenience form of make_logprob_fn: `[B, T]` per-token logprobs."""
    return _logprobs(params, tokens, attn_mask, temperature, cfg, None, None, False)


# ------------------------------------------------------------------------------------- minibatches
def minibatches(batch: dict, token_budget: int, pad_rows_to: int = 1) -> Iterator[dict]:
    """Split `batch` (host arrays, rows first) into consecutive row blocks of <= token_budget real tokens.

    Real tokens are counted with attn_mask. Row order is kept. A single row over the budget is a
    ValueError. `pad_rows_to > 1` appends empty rows (all masks 0, one attended pad token so the
    attention softmax stays finite) until the row count is a multiple of it, to bound recompiles
    and keep the rows divisible by the mesh's batch axes; empty rows change no loss term.
    """
    if not token_budget > 0:
        raise ValueError(f"token_budget must be > 0, got {token_budget}")
    if pad_rows_to < 1:
        raise ValueError(f"pad_rows_to must be >= 1, got {pad_rows_to}")
    host = {k: np.asarray(v) for k, v in batch.items()}
    n_rows = host["tokens"].shape[0]
    lengths = host["attn_mask"].reshape(n_rows, -1).sum(axis=1)
    if lengths.max(initial=0) > token_budget:
        raise ValueError(f"token_budget={token_budget} is smaller than the longest row ({int(lengths.max())} tokens)")
    start, used = 0, 0
    for row in range(n_rows + 1):
        if row == n_rows or used + lengths[row] > token_budget:
            if row > start:
                yield _pad_rows({k: v[start:row] for k, v in host.items()}, pad_rows_to)
            start, used = row, 0
        if row < n_rows:
            used += lengths[row]


def _pad_rows(mb: dict, multiple: int) -> dict:
    n = mb["tokens"].shape[0]
    extra = (-n) % multiple
    if extra == 0:
        return mb
    out = {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)]) for k, v in mb.items()}
    out["attn_mask"][n:, 0] = 1
    return out
