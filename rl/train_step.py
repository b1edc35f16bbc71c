"""The functional train step shared by every objective: state, shardings, accumulation, the non-finite skip.

One jitted pure function `(state, batch, hparams) -> (state, metrics)` serves every LossConfig.mode. It runs the
policy forward once and hands it to the mode's objective (rl/objectives.py: sft, grpo, ppo; the PRM wing registers
"prm" from prm/objective.py), which reads per-token logprobs and entropy from the same logits (rl/logprobs.py:
divided by each row's sampling temperature; with ModelConfig.logits_chunk > 0 from the hidden states that many
positions at a time, models/vocab.py, never holding [B, T, vocab] logits). The step adds what every objective
shares and reports every term separately:
  objective's total   (sft: masked cross-entropy; grpo: policy loss + kl_coef * KL(policy || ref) - entropy_coef *
                       entropy; ppo: + value_coef * clipped value loss; see rl/objectives.py)
  + router_aux_coef * sum(load-balancing) + router_z_coef * sum(z-loss)   (MoE layers)
`hparams = {"lr": scalar, "kl_coef": scalar}` comes from the host each step: the learning-rate schedule
(rl.schedules.lr_at) and the KL controller (rl.kl_control) each have one owner outside the step, and a traced scalar
never recompiles. An optional `hparams["loss_denom"]` replaces the batch's own aggregation denominator (its
loss-token count for token-mean): length-bucketed SFT passes the epoch's denominator over its step count, so each
step weighs by its share of the epoch's loss tokens (rl.train_loop.train_on).

A step whose loss, gradient or parameter update is not finite, or whose batch holds a non-finite
value at a position that counts (masks 1), leaves params, optimizer state and step untouched and
increments `n_skipped`; values at masked positions (prompt, padding) are ignored, never multiplied
in. `make_train_step(..., microbatches=n)` accumulates the gradient over n row slices in a
`lax.scan` for one update (same result, about n-fold less activation memory).

    model_cfg = ModelConfig(...)
    loss_cfg = LossConfig(mode="grpo", clip_high=0.28)
    optim_cfg = OptimConfig(weight_decay=0.0, grad_clip=1.0)
    state = init_train_state(model_cfg, loss_cfg, optim_cfg, jax.random.key(0), mesh=mesh)
    step = make_train_step(model_cfg, loss_cfg, optim_cfg, mesh=mesh)
    state, metrics = step(state, batch, {"lr": 1e-5, "kl_coef": 0.04})   # state is donated

Batch (dict of arrays, all rows first; rows must divide the mesh's batch axes):
  tokens [B, T] int32 prompt+response right-padded; attn_mask [B, T]; loss_mask [B, T] (1 where
  token t is a response token, predicted from t - 1); temperature [B] (optional, default 1: the
  temperature the row was sampled at; logprobs are taken under softmax(logits / T), the sampler's
  distribution); advantages [B, T] or [B] (broadcast); old_logp [B, T] (optional: the behaviour
  policy's logprobs, i.e. the sampler's; absent means on-policy, old = stop_gradient(logp));
  ref_logp [B, T] (optional: absent means no KL term); PPO also old_values [B, T] and returns [B, T];
  routes [B, T, n_moe_layers, k] int32 (optional: the sampler's experts per token, -1 = none; replayed when
  LossConfig.routing_replay, else only compared with the trainer's own: router/replay_disagreement); an
  objective's own inputs (Objective.inputs: the PRM's step_labels, prm/objective.py).
Grouped layout (GRPO's K answers per prompt; models/shared_prompt.py): prompt_tokens / prompt_mask [G, P], the
prompts LEFT-padded and each computed once, with every per-row key above for the R = G*K answers [R, C] (row r
answers prompt r // K: the sampler's output as is, tokens = generate's tokens, old_logp its logprobs), column t
being answer token t; same loss and gradients as the flat layout, ~29% fewer token-passes at W1's shapes.
Microbatches then take whole prompts (G must divide by their number); not for an objective without
Objective.grouped ("prm") or for routing replay.
Value alignment matches logprobs: values[:, t] is the head applied to hidden[:, t - 1] (the state
before token t), values[:, 0] = 0.

Metrics: `kl` is the mean over sequences of each sequence's masked token-mean KL (the quantity an
adaptive controller reads, whatever the loss aggregation); `loss/kl` is the KL term as aggregated
in the loss.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from models import lora, shared_prompt, sharding, transformer
from rl import losses, objectives
from rl.logprobs import batch_sharding, is_grouped, model_params
from rl.losses import LossConfig
from schema import Checked, field, num, optional

__all__ = [
    "LossConfig",
    "OptimConfig",
    "make_optimizer",
    "init_train_state",
    "state_shardings",
    "make_loss_fn",
    "make_train_step",
    "denom_share",
]


# ------------------------------------------------------------------------------------- configs
@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig(Checked):
    """AdamW (decoupled weight decay on matrices) after an optional global-norm clip; each field carries its default,
    doc and range check (schema/: a bad value raises FieldErrors naming the field).

    The learning rate is not part of it: the step takes it from the host each call
    (rl.schedules.lr_at), so a stage's schedule can follow the optimizer steps it really takes.
    """

    weight_decay: float = field(0.0, "decoupled weight decay, on matrices only (ndim >= 2), scaled by the learning "
                                     "rate", num(0.0))
    b1: float = field(0.9, "Adam's first-moment decay", num(0.0, 1.0, hi_open=True))
    b2: float = field(0.999, "Adam's second-moment decay", num(0.0, 1.0, hi_open=True))
    eps: float = field(1e-8, "Adam's denominator epsilon", num(0.0, lo_open=True))
    grad_clip: float | None = field(1.0, "global-norm gradient clip; None disables", optional(num(0.0, lo_open=True),
                                                                                              "off"))


# ------------------------------------------------------------------------------------- optimizer
def _decay_mask(params):
    # Decay matrices only: norms' scales and biases are not regularised towards zero.
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, Adam scaling and decoupled weight decay: the AdamW direction at lr 1.

    The step multiplies the result by -lr (optax.adamw(lr) is exactly this chain followed by
    scale_by_learning_rate(lr)).
    """
    parts = [] if cfg.grad_clip is None else [optax.clip_by_global_norm(cfg.grad_clip)]
    parts += [optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)]
    if cfg.weight_decay:
        parts += [optax.add_decayed_weights(cfg.weight_decay, mask=_decay_mask)]
    return optax.chain(*parts)


# ------------------------------------------------------------------------------------- state
def _value_head(d_model: int) -> dict:
    # Zero init: the first value estimates are 0, so early advantages are just the returns.
    return {"w": jnp.zeros((d_model,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def _has_head(loss_cfg) -> bool:
    """Whether the mode's objective trains a value head (params["value_head"]): ppo, the PRM's prm."""
    return objectives.get(loss_cfg.mode).value_head


def _abstract_params(model_cfg, loss_cfg):
    """The train state's params as shapes: the model's, or with model_cfg.lora the adapters {"lora": ...} only
    (+ the value head)."""
    abstract = jax.eval_shape(lambda k: transformer.init(model_cfg, k), jax.random.key(0))
    if model_cfg.lora is not None:
        abstract = {lora.ADAPTER_KEY: jax.eval_shape(lambda k: lora.init(abstract, model_cfg, k), jax.random.key(0))}
    if _has_head(loss_cfg):
        abstract = {**abstract, "value_head": jax.eval_shape(lambda: _value_head(model_cfg.d_model))}
    return abstract


def state_shardings(model_cfg, loss_cfg, optim_cfg, mesh, rules=None) -> dict:
    """NamedShardings for every leaf of the train state on `mesh`.

    Params follow models.transformer.param_shardings (LoRA: the adapters follow their weights, lora.shardings);
    the optimizer moments mirror their parameter; counters, RNG and the value head are replicated.
    """
    rules = sharding.DEFAULT_RULES if rules is None else rules
    rep = NamedSharding(mesh, PartitionSpec())
    if model_cfg.lora is not None:
        adapters = _abstract_params(model_cfg, loss_cfg)[lora.ADAPTER_KEY]
        p_sh = {lora.ADAPTER_KEY: lora.shardings(adapters, transformer.param_axes(model_cfg), model_cfg, mesh, rules)}
    else:
        p_sh = dict(transformer.param_shardings(model_cfg, mesh, rules))
    if _has_head(loss_cfg):
        p_sh["value_head"] = {"w": rep, "b": rep}
    opt = make_optimizer(optim_cfg)
    opt_abstract = jax.eval_shape(opt.init, _abstract_params(model_cfg, loss_cfg))
    opt_sh = optax.tree_map_params(opt, lambda _, sh: sh, opt_abstract, p_sh,
                                   transform_non_params=lambda _: rep)
    return {"params": p_sh, "opt_state": opt_sh, "step": rep, "rng": rep, "n_skipped": rep}


def init_train_state(model_cfg, loss_cfg: LossConfig, optim_cfg: OptimConfig, key, mesh=None, rules=None,
                     params=None) -> dict:
    """Fresh train state: {params, opt_state, step, rng, n_skipped}.

    `params` (e.g. from an SFT checkpoint) are used when given, else initialised (sharded when a
    mesh is given). A mode whose objective has a value head (ppo, the PRM's prm: Objective.value_head) adds
    params["value_head"] = {"w": [d_model], "b": []}; other modes drop it.
    With model_cfg.lora, params are the trainable tree {"lora": adapters} (required): the optimizer holds only them.
    """
    k_params, k_rng = jax.random.split(key)
    if model_cfg.lora is not None and (params is None or lora.ADAPTER_KEY not in params):
        raise ValueError("model.lora: the train state's params must be {'lora': adapters} (lora.init on the base)")
    if params is None:
        if mesh is None:
            params = transformer.init(model_cfg, k_params)
        else:
            params = transformer.init_sharded(model_cfg, k_params, mesh,
                                              sharding.DEFAULT_RULES if rules is None else rules)
    params = dict(params)
    if _has_head(loss_cfg):
        params.setdefault("value_head", _value_head(model_cfg.d_model))
    else:
        params.pop("value_head", None)
    opt = make_optimizer(optim_cfg)
    state = {
        "params": params,
        "opt_state": None,
        "step": jnp.zeros((), jnp.int32),
        "rng": k_rng,
        "n_skipped": jnp.zeros((), jnp.int32),
    }
    if mesh is None:
        state["opt_state"] = jax.jit(opt.init)(params)
        return state
    sh = state_shardings(model_cfg, loss_cfg, optim_cfg, mesh, rules)
    state["params"] = jax.device_put(params, sh["params"])
    state["opt_state"] = jax.jit(opt.init, out_shardings=sh["opt_state"])(state["params"])
    # A PRNG key array cannot be device_put onto a mesh spanning several processes; its raw uint32 data can.
    state["rng"] = jax.random.wrap_key_data(jax.device_put(jax.random.key_data(state["rng"]), sh["rng"]))
    return jax.device_put(state, sh)


# ------------------------------------------------------------------------------------- the step
def _real_tokens(batch: dict) -> jax.Array:
    """Tokens the model attends to, as the flat layout counts them (grouped: each prompt once per answer)."""
    n = batch["attn_mask"].astype(jnp.float32).sum()
    if is_grouped(batch):
        k = batch["tokens"].shape[0] // batch["prompt_tokens"].shape[0]
        n = n + k * batch["prompt_mask"].astype(jnp.float32).sum()
    return n


def _split_microbatches(batch: dict, n_micro: int) -> dict:
    """Leaves [rows, ...] -> [n_micro, rows / n_micro, ...]: row r to microbatch r % n_micro (flat layout); grouped
    layout: prompt g and its K answer rows to microbatch g % n_micro."""
    if not is_grouped(batch):
        rows = batch["tokens"].shape[0]
        if rows % n_micro:
            raise ValueError(f"microbatches={n_micro} must divide the batch's {rows} rows")
        return jax.tree.map(lambda x: jnp.swapaxes(x.reshape(rows // n_micro, n_micro, *x.shape[1:]), 0, 1), batch)
    G = batch["prompt_tokens"].shape[0]
    if G % n_micro:
        raise ValueError(f"microbatches={n_micro} must divide the batch's {G} prompts (grouped layout)")
    K = batch["tokens"].shape[0] // G

    def split(name, x):
        if name.startswith("prompt_"):  # [G, ...]
            return jnp.swapaxes(x.reshape(G // n_micro, n_micro, *x.shape[1:]), 0, 1)
        y = jnp.swapaxes(x.reshape(G // n_micro, n_micro, K, *x.shape[1:]), 0, 1)  # [n, G / n, K, ...]
        return y.reshape(n_micro, (G // n_micro) * K, *x.shape[1:])

    return {name: split(name, jnp.asarray(x)) for name, x in batch.items()}


def _router_terms(aux: dict, model_cfg) -> tuple[jax.Array, jax.Array]:
    lb = jnp.asarray(aux.get("router_aux_loss", jnp.zeros((0,))), jnp.float32)
    z = jnp.asarray(aux.get("router_z_loss", jnp.zeros((0,))), jnp.float32)
    return lb.sum(), z.sum()


# The float inputs of the policy objectives; an objective adds its own (Objective.inputs: the PRM's step_labels).
_INPUTS = ("old_logp", "ref_logp", "advantages", "old_values", "returns")


def _masked_inputs(batch: dict, mask: jax.Array, keys) -> tuple[dict, jax.Array]:
    """Float inputs with masked positions zeroed by selection (a NaN there never spreads), and the number of
    non-finite values at positions that count."""
    out, bad = {}, jnp.zeros((), jnp.float32)
    for k in keys:
        if k not in batch:
            continue
        x = jnp.asarray(batch[k], jnp.float32)
        m = mask if x.ndim == 2 else (mask.sum(-1) > 0).astype(jnp.float32)
        counts = m > 0
        bad = bad + jnp.sum(counts & ~jnp.isfinite(x))
        out[k] = jnp.where(counts, x, 0.0)
    return out, bad


def make_loss_fn(model_cfg, loss_cfg: LossConfig, mesh, rules):
    """loss_fn(params, batch, kl_coef, share) -> (total, metrics): the forward, the mode's objective
    (rl/objectives.py) and what every objective shares (router losses, counts, the non-finite input count).

    `share` describes the batch as a part of a larger one (gradient accumulation): `denom` is the
    whole batch's aggregation denominator, `tok_w` / `real_w` / `row_w` its fraction of the loss
    tokens / attended tokens / rows with loss tokens. Losses use `denom`; masked-mean metrics are
    scaled by `tok_w`, sequence means by `row_w` and router terms by `real_w`, so summing over the
    parts gives the whole-batch values (router load-balancing loss: the token-weighted mean of the
    parts' losses, the usual accumulation approximation).
    """
    objective = objectives.get(loss_cfg.mode)
    keys = _INPUTS + tuple(k for k in objective.inputs if k not in _INPUTS)
    chunked = model_cfg.logits_chunk > 0

    def loss_fn(params, batch, kl_coef, share=None):
        denom = None if share is None else share["denom"]
        tok_w = 1.0 if share is None else share["tok_w"]
        real_w = 1.0 if share is None else share["real_w"]
        row_w = 1.0 if share is None else share["row_w"]
        tokens = batch["tokens"].astype(jnp.int32)
        mask = batch["loss_mask"].astype(jnp.float32)
        inputs, n_bad = _masked_inputs(batch, mask, keys)
        if loss_cfg.routing_replay and "routes" not in batch:
            raise ValueError("LossConfig.routing_replay needs batch['routes'] (the sampler's experts, "
                             "models.sampling.generate(..., return_routes=True))")
        grouped = is_grouped(batch)
        if grouped and (not objective.grouped or loss_cfg.routing_replay):
            raise ValueError("the grouped batch layout (prompt_tokens / prompt_mask) supports the policy losses "
                             f"without routing replay; use the flat layout for mode={loss_cfg.mode!r} or "
                             "routing_replay")
        if grouped:
            logits, aux = shared_prompt.forward(model_params(params), batch["prompt_tokens"], batch["prompt_mask"],
                                                tokens, batch["attn_mask"], model_cfg, return_logits=not chunked,
                                                mesh=mesh, rules=rules)
        else:
            logits, aux = transformer.forward(model_params(params), tokens, model_cfg, attn_mask=batch["attn_mask"],
                                              return_hidden=objective.value_head, return_logits=not chunked,
                                              mesh=mesh, rules=rules, routes=batch.get("routes"),
                                              replay_routes=loss_cfg.routing_replay)
        total, metrics = objective.loss(objectives.Forward(
            params=params, batch=batch, inputs=inputs, tokens=tokens, mask=mask, logits=logits, aux=aux,
            grouped=grouped, kl_coef=kl_coef, denom=denom, tok_w=tok_w, row_w=row_w, model_cfg=model_cfg,
            loss_cfg=loss_cfg, mesh=mesh, rules=rules))

        r_lb, r_z = (t * real_w for t in _router_terms(aux, model_cfg))
        total = total + model_cfg.router_aux_coef * r_lb + model_cfg.router_z_coef * r_z
        metrics = {**metrics, "nonfinite_inputs": n_bad, "loss/total": total, "loss/router_aux": r_lb,
                   "loss/router_z": r_z, "n_tokens": mask.sum(),
                   "n_rows": (mask.sum(-1) > 0).sum().astype(jnp.float32)}
        if "expert_load" in aux:
            metrics["router/expert_load"] = aux["expert_load"] * real_w
        if "dropped_fraction" in aux:
            metrics["router/dropped_fraction"] = aux["dropped_fraction"] * real_w
        if "replay_differ" in aux:  # share of token-layer routes the trainer's router would choose differently
            metrics["router/replay_disagreement"] = (
                jnp.sum(aux["replay_differ"]) / jnp.maximum(jnp.sum(aux["replay_compared"]), 1.0) * real_w)
        return total, metrics

    return loss_fn


def denom_share(denom) -> dict:
    """The `share` of loss_fn that only replaces the aggregation denominator by `denom` (metrics unscaled)."""
    return {"denom": jnp.asarray(denom, jnp.float32), "tok_w": 1.0, "real_w": 1.0, "row_w": 1.0}


def _accumulated_value_and_grad(loss_fn, params, batch, kl_coef, n_micro: int, agg: str, max_len, denom=None):
    """Sum of loss and gradients over `n_micro` row-strided microbatches, equal to the whole batch's (with `denom`
    given: the whole batch's numerators over `denom`).

    Row r goes to microbatch r % n_micro (grouped layout: prompt g and its answers go to g % n_micro; see
    _split_microbatches), so with rows sharded in contiguous blocks over the mesh every microbatch still spans
    all batch shards. Peak activation memory drops about n_micro-fold.
    """
    mask = batch["loss_mask"].astype(jnp.float32)
    if denom is None:
        _, denom = losses.aggregate_parts(mask, mask, agg, max_len)
    n_tok = jnp.maximum(mask.sum(), 1.0)
    n_real = jnp.maximum(_real_tokens(batch), 1.0)
    n_seq = jnp.maximum((mask.sum(-1) > 0).sum().astype(jnp.float32), 1.0)
    split = _split_microbatches(batch, n_micro)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def share_of(mb):
        m = mb["loss_mask"].astype(jnp.float32)
        return {"denom": denom, "tok_w": m.sum() / n_tok, "real_w": _real_tokens(mb) / n_real,
                "row_w": (m.sum(-1) > 0).sum().astype(jnp.float32) / n_seq}

    def body(carry, mb):
        g_acc, m_acc = carry
        (_, met), g = grad_fn(params, mb, kl_coef, share_of(mb))
        g_acc = jax.tree.map(jnp.add, g_acc, g)
        m_acc = {k: jnp.maximum(m_acc[k], v) if k in objectives.MAX_METRICS else m_acc[k] + v for k, v in met.items()}
        return (g_acc, m_acc), None

    first = jax.tree.map(lambda x: x[0], split)
    met_shape = jax.eval_shape(lambda: grad_fn(params, first, kl_coef, share_of(first))[0][1])
    m0 = {k: jnp.full(v.shape, -jnp.inf if k in objectives.MAX_METRICS else 0.0, v.dtype) for k, v in met_shape.items()}
    g0 = jax.tree.map(jnp.zeros_like, params)
    (grads, metrics), _ = jax.lax.scan(body, (g0, m0), split)
    return (metrics["loss/total"], metrics), grads


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def make_train_step(model_cfg, loss_cfg: LossConfig, optim_cfg: OptimConfig, mesh=None, rules=None,
                    microbatches: int = 1):
    """The jitted `(state, batch, hparams) -> (state, metrics)`; the state argument is donated.

    hparams = {"lr": scalar, "kl_coef": scalar} and optionally "loss_denom" (the aggregation denominator
    replacing the batch's own; see the module doc) (traced: a new value never recompiles). With a
    mesh, in/out shardings are explicit: the state as in `state_shardings`, batch rows over the
    mesh's batch axes, hparams and metrics replicated. `microbatches > 1` accumulates the gradient
    over that many row-strided slices of the batch in a `lax.scan` (one optimizer update, same
    result up to float rounding and the router load-balancing term), cutting activation memory.

    With model_cfg.lora the step is `(state, batch, hparams, frozen)`: state["params"] is the trainable tree
    {"lora": adapters[, "value_head"]}, `frozen` the base weights (not donated, never changed); the loss runs on
    lora.model_params(trainable, frozen) (adapters attached; each block applies them in its forward, lora.merge_block)
    and only the trainable tree is differentiated (lora.value_and_grad's rule, in the microbatch scan too).
    """
    if not (isinstance(microbatches, int) and microbatches >= 1):
        raise ValueError(f"microbatches must be an int >= 1, got {microbatches!r}")
    opt = make_optimizer(optim_cfg)
    loss_fn = make_loss_fn(model_cfg, loss_cfg, mesh, rules)

    def step(state, batch, hparams, frozen=None):
        params = state["params"]
        # LoRA: the loss of the trainable tree, the frozen base a constant of the differentiated function
        fn = loss_fn if frozen is None else (lambda t, *a: loss_fn(lora.model_params(t, frozen, model_cfg), *a))
        lr = jnp.asarray(hparams["lr"], jnp.float32)
        kl_coef = jnp.asarray(hparams.get("kl_coef", 0.0), jnp.float32)
        denom = hparams.get("loss_denom")  # None: the batch's own denominator
        if microbatches == 1:
            share = None if denom is None else denom_share(denom)
            (total, metrics), grads = jax.value_and_grad(fn, has_aux=True)(params, batch, kl_coef, share)
        else:
            (total, metrics), grads = _accumulated_value_and_grad(fn, params, batch, kl_coef, microbatches,
                                                                  loss_cfg.agg, loss_cfg.max_len_norm, denom)
        # float32 like every other metric, also for bf16 gradients (the cast fuses into the reduction)
        grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))
        direction, new_opt = opt.update(grads, state["opt_state"], params)
        new_params = jax.tree.map(lambda p, d: (p - lr * d).astype(p.dtype), params, direction)
        # The update itself is checked too: a finite gradient with an absurd learning rate must not reach the weights.
        finite = (jnp.isfinite(total) & jnp.isfinite(grad_norm) & (metrics["nonfinite_inputs"] == 0)
                  & _all_finite(new_params) & _all_finite(new_opt))

        def pick(new, old):
            # The whole update is selected at once: a non-finite step leaves every leaf as it was. One lax.cond, not
            # a select per leaf: XLA fused the all-leaves AND of `finite` into every leaf's select, code growing as
            # leaves^2 (experiments/bench/compile_cache_repro.py); the compiled temporaries are the same either way.
            return jax.lax.cond(finite, lambda: new, lambda: old)

        skipped = (~finite).astype(jnp.int32)
        new_state = {
            "params": pick(new_params, params),
            "opt_state": pick(new_opt, state["opt_state"]),
            "step": state["step"] + (1 - skipped),
            "rng": jax.random.split(state["rng"])[0],
            "n_skipped": state["n_skipped"] + skipped,
        }
        metrics.update({"kl_coef": kl_coef, "grad_norm": grad_norm, "lr": lr, "skipped": skipped,
                        "n_skipped": new_state["n_skipped"]})
        return new_state, metrics

    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    st_sh = state_shardings(model_cfg, loss_cfg, optim_cfg, mesh, rules)
    rep = NamedSharding(mesh, PartitionSpec())
    in_sh = (st_sh, batch_sharding(mesh, rules), rep)
    if model_cfg.lora is not None:  # the frozen base, sharded as the model's params
        in_sh += (transformer.param_shardings(model_cfg, mesh, rules),)
    return jax.jit(step, in_shardings=in_sh, out_shardings=(st_sh, rep), donate_argnums=0)
