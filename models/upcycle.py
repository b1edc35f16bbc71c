"""Sparse upcycling: a dense pretrained checkpoint's params turned into the project's MoE params.

Komatsuzaki et al. 2022, "Sparse Upcycling: Training Mixture-of-Experts from Dense Checkpoints" (ICLR 2023): an
MoE model starts from a dense one by replacing some of its MLP blocks with MoE blocks whose experts are all copies
of that block's MLP, next to a freshly initialised router; every other weight is carried over as is.

    moe_cfg = upcycle.moe_config(dense_cfg)                      # dense_cfg.upcycle = UpcycleConfig(...) (or a dict)
    moe_params = upcycle.upcycle_params(dense_params, dense_cfg, key)
    logits, aux = transformer.forward(moe_params, tokens, moe_cfg)   # == the dense model's logits at init
    upcycle.expert_spread(trained_params, moe_cfg)   # {"block_i/w_up": ...}: how far training moved the copies apart

The choices taken (UpcycleConfig fields):
* n_experts experts per MoE block, each an exact copy of the dense block's SwiGLU (w_gate, w_up, w_down stacked on
  the expert axis, models/moe.py's layout); no noise is added, so the upcycled model computes the dense function.
* moe_every: which blocks become MoE, in ModelConfig's convention (block i iff (i + 1) % moe_every == 0). The paper
  upcycles every other MLP layer; default 2 does the same (1 = every block).
* top-k routing (top_k, the paper's decoder choice is k = 2) with the top-k gate weights renormalised to sum to one
  (ModelConfig.norm_topk_prob = True): with identical experts, sum_k g_k f(x) = f(x), so the upcycled model's output
  equals the dense model's whatever the router says. That is the property the tests check.
* router: a fresh [d_model, n_experts] matrix, zero-mean normal with std router_init_std (default 0.02, the
  initializer range of Llama / Mixtral configs): a small random router starts near-uniform and its logits break
  the tie between the identical experts; its scale does not change the output at init (see the previous point).
* capacity_factor: None (the default) is the project's dropless dispatch, so no token is ever dropped. A capacity
  factor must be at least n_experts / top_k: then each expert's capacity ceil(cf * tokens * k / E) >= tokens, so no
  token is dropped at init whatever the routing (dropping one would break the equality above).
The rest of the dense config is kept (router loss weights at ModelConfig's, unless the run sets them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models import layer_stack
from models.adaptation import UpcycleConfig  # noqa: F401 (re-exported)


def _upcycle_config(cfg) -> UpcycleConfig:
    if getattr(cfg, "upcycle", None) is None:
        raise ValueError("model.upcycle is not set: sparse upcycling needs ModelConfig.upcycle = dict(n_experts=...)")
    return cfg.upcycle  # ModelConfig's validation has checked that the model is dense


def moe_config(dense_cfg):
    """The MoE ModelConfig of the upcycled model: dense_cfg with dense_cfg.upcycle's experts (each of width d_ff,
    no shared experts, renormalised top-k gates) and upcycle = None (the result is a plain MoE config)."""
    up = _upcycle_config(dense_cfg)
    moe_cfg = dense_cfg.replace(n_experts=up.n_experts, experts_per_token=up.top_k, moe_every=up.moe_every,
                                expert_d_ff=dense_cfg.d_ff, n_shared_experts=0, norm_topk_prob=True,
                                capacity_factor=up.capacity_factor, upcycle=None)
    if not moe_cfg.moe_layers:
        raise ValueError(f"upcycle.moe_every={up.moe_every} makes no block of this {dense_cfg.n_layers}-block model "
                         f"an MoE block (dense_layers={dense_cfg.dense_layers})")
    return moe_cfg


def upcycle_params(dense_params, dense_cfg, key) -> dict:
    """The upcycled params (models.transformer.init(moe_config(dense_cfg))'s tree): in each MoE block the dense
    "mlp" becomes "moe" = {router: normal(0, router_init_std) [D, E], w_gate/w_up [E, D, F], w_down [E, F, D]},
    every expert a copy of the dense MLP; every other weight is the dense one. The blocks are restacked for the MoE
    model's layer plan (models/layer_stack.py: a dense stack and an MoE stack for moe_every=2)."""
    up, moe_cfg = _upcycle_config(dense_cfg), moe_config(dense_cfg)
    params = layer_stack.per_layer(dense_params, dense_cfg)
    keys = jax.random.split(key, len(moe_cfg.moe_layers))
    for k, i in zip(keys, moe_cfg.moe_layers):
        block = dict(params[f"block_{i}"])
        if "mlp" not in block:
            raise ValueError(f"block_{i} has no dense 'mlp' to upcycle (params of another architecture?)")
        mlp = block.pop("mlp")
        d_model = mlp["w_gate"].shape[0]
        dtype = mlp["w_gate"].dtype
        router = (jax.random.normal(k, (d_model, up.n_experts), jnp.float32) * up.router_init_std).astype(dtype)
        experts = {name: jnp.broadcast_to(w[None], (up.n_experts, *w.shape)) for name, w in mlp.items()}
        block["moe"] = {"router": router, **{name: jnp.array(w) for name, w in experts.items()}}
        params[f"block_{i}"] = block
    return layer_stack.stacked(params, moe_cfg)


def expert_spread(params, cfg) -> dict[str, float]:
    """How far apart the experts of each MoE block are: ||W - mean_e W|| / ||mean_e W repeated E times|| of every
    routed expert weight W (w_gate, w_up, w_down, E experts stacked on axis 0), keyed "block_i/name". 0 at upcycling
    (exact copies); routing replay can only matter once this is not small, since a flipped route then picks another
    function. cfg: the MoE model's config (which layer each stacked block is)."""
    out = {}
    params = layer_stack.per_layer(params, cfg)
    for name_b in sorted((k for k in params if k.startswith("block_")), key=lambda k: int(k.split("_")[1])):
        moe_p = params[name_b].get("moe")
        if moe_p is None:
            continue
        for name in ("w_gate", "w_up", "w_down"):
            w = jnp.asarray(moe_p[name], jnp.float32)
            mean = jnp.mean(w, axis=0, keepdims=True)
            out[f"{name_b}/{name}"] = float(jnp.linalg.norm(w - mean) / (jnp.linalg.norm(mean) * w.shape[0] ** 0.5))
    return out
