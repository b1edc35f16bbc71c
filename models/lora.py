"""LoRA adapters on the policy's projections (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

`ModelConfig.lora = LoraConfig(rank=r, alpha=a, targets=(...))` (or a dict: `model.lora = dict(rank=8, alpha=16)`)
adds to every targeted weight W a low-rank update: W' = W + (alpha / r) * A @ B, with A [in, r] and B [r, out].
Only A and B are trained; W stays frozen.

    adapters = lora.init(base, cfg, key)             # {"stack_0": {"attn": {"wq": {"a", "b"}, ...}}, ...}; B = 0
    merged = lora.merge(base, adapters, cfg)         # plain params, same tree/shapes/dtypes as base
    logits, aux = transformer.forward(merged, tokens, cfg)            # the trainer's and the sampler's forward
    trainable, frozen = lora.split({**base, "lora": adapters}, cfg)   # optimizer over trainable only
    loss, grads = lora.value_and_grad(loss_fn, trainable, frozen, cfg, batch)   # grads: the trainable tree only
    hf.save(folder, cfg, base, lora=adapters)        # a Hugging Face folder of the merged weights
    adapters = jax.device_put(adapters, lora.shardings(adapters, transformer.param_axes(cfg), cfg, mesh, rules))

Targets are block-relative paths of the params tree (models/transformer.py): "attn/wq", "attn/wk", "attn/wv",
"attn/wo", the dense SwiGLU "mlp/w_gate", "mlp/w_up", "mlp/w_down", the routed experts "moe/w_gate", "moe/w_up",
"moe/w_down" (one adapter per expert: A [E, D, r], B [E, r, F]) and the shared experts "moe/shared/w_gate" etc.
A target applies in every block that has that array; one that matches no array of the model is an error. The
blocks' weights are stacked (models/layer_stack.py), and so are the adapters: one adapter per target and stack, with
the stack's leading layer axis first (A [L, D, r], B [L, r, N, H] for the wq of an L-layer stack).

Shapes: a weight is [*lead, *in, *out] (lead = the stack's layer axis, then the expert axis of routed experts; in = the
contracted dims, e.g.
(N, H) for wo; out = the rest, e.g. (N, H) for wq); its adapter is a [*lead, *in, r], b [*lead, r, *out].
Initialisation (the paper's): A ~ normal(0, 1 / fan_in) (the same fan-in scale as the base weights'
models/transformer.py init), B = 0, so the merged weights, and hence the logits, equal the base's bit for bit at
init. Adapters are stored in float32 whatever the base's dtype (they are small, and a bf16 adapter loses updates);
the merge adds the update in float32 and casts the sum to the base weight's dtype.

Why merge, rather than an unmerged forward x W + s (x A) B: the forward, sampler and reference programs stay the
exact same functions of plain params (no LoRA branch in models/layers.py or the MoE kernels), so the sampler
(which runs merged weights) and the trainer cannot disagree because of LoRA, and the reference policy is the same
forward applied to the base params (one copy of the weights, one compiled program). The merge costs
prod(in) * r * prod(out) multiply-adds per targeted weight and step, nothing next to the tokens' matmuls. The price:
the backward pass forms the gradient of each merged weight (tokens x in x out, as full fine-tuning does) before
reducing it to A and B, where an unmerged forward would skip it; the embeddings, norms and untargeted weights get
no gradient at all (they are constants of the differentiated function). Persistent memory is what LoRA promises:
the optimizer holds only the adapters (experiments/bench/lora_memory.py measures both).
"""

from __future__ import annotations

import math
import re
from functools import partial
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from models import layer_stack, sharding
from models.layers import LowRank
from models.adaptation import DEFAULT_TARGETS, TARGETS, LoraConfig  # noqa: F401 (DEFAULT_TARGETS re-exported)
from schema import section_value

ADAPTER_KEY = "lora"  # the adapters' key in a combined tree {**base, "lora": adapters}
_STACK = layer_stack.STACK_KEY


def _config(cfg) -> LoraConfig:
    if getattr(cfg, "lora", None) is None:
        raise ValueError("model.lora is not set: LoRA adapters need ModelConfig.lora = dict(rank=..., alpha=...)")
    return cfg.lora


def _targeted(base, lcfg: LoraConfig):
    """[(stack key, target path, weight)] for every array of base that a target names, in a fixed order."""
    found, used = [], set()
    for block in sorted((k for k in base if _STACK.fullmatch(k)), key=lambda k: int(k.split("_")[1])):
        for target in lcfg.targets:
            node = _get(base, block, target)
            if node is not None:
                found.append((block, target, node))
                used.add(target)
    unused = [t for t in lcfg.targets if t not in used]
    if unused:
        raise ValueError(f"lora.targets {unused} match no parameter of this model (e.g. an MoE target on a dense "
                         f"model, or mlp/* where every block is MoE)")
    return found


def targeted_weights(base, cfg) -> list[tuple[str, str, object]]:
    """[(stack key, target path, leaf)] of every weight of base that cfg.lora adapts, in init's order. base may
    hold arrays, shapes (jax.eval_shape) or logical axis names (transformer.param_axes): e.g. what the merge copies,
    for rl/memory_plan.py."""
    return _targeted(base, _config(cfg))


def _split_dims(shape, target: str, stacked: bool = True):
    """(lead, in, out) dims of a weight's shape (or axes): with stacked, the stack's layer axis, then TARGETS' own
    lead dims."""
    n_lead, n_in = TARGETS[target]
    n_lead += int(stacked)
    return shape[:n_lead], shape[n_lead:n_lead + n_in], shape[n_lead + n_in:]


def _set(tree: dict, block: str, target: str, value) -> None:
    node = tree.setdefault(block, {})
    *parents, leaf = target.split("/")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def _get(tree, block: str, target: str):
    node = tree.get(block)
    for part in target.split("/"):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _adapter_shapes(w_shape, target: str, rank: int) -> tuple[tuple, tuple]:
    """(A's shape, B's shape) of the adapter of a weight of shape w_shape."""
    lead, ins, outs = _split_dims(tuple(w_shape), target)
    return (*lead, *ins, rank), (*lead, rank, *outs)


def init(base, cfg, key) -> dict:
    """Fresh adapters for the targeted weights of base: A ~ normal(0, 1/fan_in), B = 0 (float32). Each layer's A
    draws from its own key, layer by layer, so the values do not depend on how the layers are stacked."""
    lcfg = _config(cfg)
    spec = tuple((block, target, tuple(w.shape)) for block, target, w in _targeted(base, lcfg))
    layers = tuple((name, lay) for name, lay, _ in layer_stack.stacks(layer_stack.layer_groups(cfg)))
    return _init_arrays(spec, layers, lcfg.targets, lcfg.rank, key)


@partial(jax.jit, static_argnums=(0, 1, 2, 3))  # one compiled program, not one per adapter shape
def _init_arrays(spec, layers, targets, rank: int, key) -> dict:
    layers = dict(layers)  # stack key -> the model layers on its leading axis
    # One key per (layer, target) in the order layer by layer, then targets; each stack's A drawn in one vmapped call.
    draws = sorted((layers[block][r], targets.index(target)) for block, target, w_shape in spec
                   for r in range(w_shape[0]))
    index = {d: i for i, d in enumerate(draws)}
    keys = jax.random.split(key, len(draws))
    adapters = {}
    for block, target, w_shape in spec:
        a_shape, b_shape = _adapter_shapes(w_shape, target, rank)
        fan_in = math.prod(_split_dims(w_shape, target)[1])
        mine = keys[jnp.asarray([index[(layer, targets.index(target))] for layer in layers[block]])]
        a = jax.vmap(lambda k, s=a_shape[1:]: jax.random.normal(k, s, jnp.float32))(mine) * fan_in ** -0.5
        _set(adapters, block, target, {"a": a, "b": jnp.zeros(b_shape, jnp.float32)})
    return adapters


def is_identity(adapters) -> bool:
    """True when merging `adapters` changes no weight: every B is zero, as init makes them (a stage that starts
    from fresh adapters computes the base itself)."""
    leaves = jax.tree_util.tree_flatten_with_path(adapters)[0]
    return not any(bool(jnp.any(x != 0)) for path, x in leaves if getattr(path[-1], "key", None) == "b")


def _delta(w_shape, ad: dict, target: str, scale: float, stacked: bool = True):
    """The float32 update (alpha / r) * A @ B of one weight, in the weight's shape (stacked: with the stack's layer
    axis first; False for one layer's block)."""
    lead, ins, outs = _split_dims(tuple(w_shape), target, stacked)
    r = ad["a"].shape[-1]
    a = ad["a"].astype(jnp.float32).reshape(*lead, math.prod(ins), r)
    b = ad["b"].astype(jnp.float32).reshape(*lead, r, math.prod(outs))
    # HIGHEST: on accelerators a float32 matmul may otherwise run in bf16 passes; this product is tiny.
    return (scale * jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)).reshape(w_shape)


def _checked_pairs(base, adapters, lcfg: LoraConfig) -> list:
    """[((stack key, target, weight), adapter)] of every targeted weight, each adapter's shapes checked."""
    targeted, pairs = _targeted(base, lcfg), []
    for block, target, w in targeted:
        ad = _get(adapters, block, target)
        if ad is None:
            raise ValueError(f"adapters have no entry {block}/{target} (made for another lora.targets?)")
        want = _adapter_shapes(w.shape, target, lcfg.rank)
        if (tuple(ad["a"].shape), tuple(ad["b"].shape)) != want:
            raise ValueError(f"adapter {block}/{target} has shapes {tuple(ad['a'].shape)} / {tuple(ad['b'].shape)}, "
                             f"the model and lora.rank imply {want[0]} / {want[1]}")
        pairs.append(((block, target, w), ad))
    n_adapters = len(jax.tree.leaves(adapters)) // 2
    if n_adapters != len(targeted):
        raise ValueError(f"adapters hold {n_adapters} weights, lora.targets name {len(targeted)} in this model")
    return pairs


def merge(base, adapters, cfg) -> dict:
    """base with every adapted weight replaced by W + (alpha / r) A @ B (sum in float32, cast to W's dtype).

    Untargeted arrays are passed through (not copied). The result is plain params: transformer.forward,
    sampling.generate and hf.save take it as they take base. (The train step and the logprob passes take
    attach(base, adapters) instead, which merges one layer at a time inside the forward.)"""
    lcfg = _config(cfg)
    merged = {k: v for k, v in base.items() if k != ADAPTER_KEY}
    pairs = _checked_pairs(base, adapters, lcfg)
    # Only the new weights go through the jitted sum: the untargeted arrays are passed through, not copied.
    news = _merged_weights([w for (_, _, w), _ in pairs], [ad for _, ad in pairs],
                           tuple(t for (_, t, _), _ in pairs), lcfg.scale)
    for ((block, target, _), _), new in zip(pairs, news):
        merged[block] = _replaced(merged[block], target.split("/"), new)
    return merged


@partial(jax.jit, static_argnames=("targets", "scale"))  # one program for every weight (eager: one per shape)
def _merged_weights(ws, ads, targets, scale):
    return [(w.astype(jnp.float32) + _delta(w.shape, ad, t, scale)).astype(w.dtype)
            for w, ad, t in zip(ws, ads, targets)]


def attach(base, adapters, cfg) -> dict:
    """base with each stack's adapters beside its weights ({"stack_k": {..., "lora": adapters of stack_k}}): the
    params the train step and the logprob passes run, unmerged. transformer.forward merges each layer's adapters
    into its weights as it reaches that layer (merge_block), so no merged copy of the stacked weights exists, and the
    backward forms one layer's merged-weight gradient at a time. The shapes are checked as merge checks them."""
    _checked_pairs(base, adapters, _config(cfg))
    out = {k: v for k, v in base.items() if k != ADAPTER_KEY}
    for block in adapters:
        out[block] = {**out[block], ADAPTER_KEY: adapters[block]}
    return out


def merge_block(p: dict, cfg, low_rank: bool = False) -> dict:
    """One layer's block params with its attached adapters (p["lora"], a slice of attach's) merged into its weights:
    W + (alpha / r) A @ B in float32, cast to W's dtype. low_rank=True (the forward of the train step and the
    logprob passes) keeps the attention and dense-MLP targets apart as models.layers.LowRank(W, A, B, alpha / r),
    which layers.project multiplies by as x W + s (x A) B: the backward forms no gradient of W's size (a third of
    those projections' training FLOPs). Routed-expert targets (moe/*) are merged either way (the expert kernels take
    plain weights). A merged weight is float32 when W is narrower (a bfloat16 base): W + dW rounded back to bfloat16
    lost most small updates (an update under half W's last place vanished), so the sampler's view and the experts
    multiply by the unrounded sum (transformer.decode_params then casts it to cfg.dtype, as every weight)."""
    lcfg = _config(cfg)
    ads = p[ADAPTER_KEY]
    out = {k: v for k, v in p.items() if k != ADAPTER_KEY}
    for target in lcfg.targets:
        ad = _get({"b": ads}, "b", target)
        if ad is None:
            continue
        w = _get({"b": out}, "b", target)
        if low_rank and not target.startswith("moe/"):
            new = LowRank(w, ad["a"], ad["b"], lcfg.scale)
        else:
            wide = jnp.promote_types(w.dtype, jnp.float32)  # float32 for a bfloat16 base, W's dtype if wider
            new = (w.astype(jnp.float32) + _delta(w.shape, ad, target, lcfg.scale, stacked=False)).astype(wide)
        out = _replaced(out, target.split("/"), new)
    return out


def merge_blocks(params: dict, cfg) -> dict:
    """params (stacked, per-layer or attached) with every block's attached adapters merged (per layer view: the
    sampler's, merged once per call)."""
    return {k: merge_block(v, cfg) if isinstance(v, dict) and ADAPTER_KEY in v else v for k, v in params.items()}


def _replaced(node: dict, path: list[str], value) -> dict:
    """A copy of the dicts along path with the leaf replaced (the input tree is not modified)."""
    out = dict(node)
    out[path[0]] = value if len(path) == 1 else _replaced(node[path[0]], path[1:], value)
    return out


# ---- trainable / frozen ----------------------------------------------------------------------------------------------
def _is_model_key(key: str) -> bool:
    return key in ("embed", "final_norm", "unembed") or bool(_STACK.fullmatch(key))


def split(params, cfg) -> tuple[dict, dict]:
    """(trainable, frozen) of a combined tree {**base, "lora": adapters[, "value_head": ...]}: frozen = the base
    model's arrays, trainable = everything else (the adapters and, for PPO / PRM, the value head). The optimizer
    is built over trainable only."""
    _config(cfg)
    if ADAPTER_KEY not in params:
        raise ValueError(f"params have no {ADAPTER_KEY!r} entry (lora.init's adapters)")
    frozen = {k: v for k, v in params.items() if _is_model_key(k)}
    trainable = {k: v for k, v in params.items() if not _is_model_key(k)}
    return trainable, frozen


def combine(trainable, frozen) -> dict:
    """The inverse of split: {**frozen, **trainable}."""
    return {**frozen, **trainable}


def model_params(trainable, frozen, cfg) -> dict:
    """The params the forward takes: attach(frozen, trainable["lora"]) (merged layer by layer inside the forward)
    plus trainable's other entries (value head)."""
    rest = {k: v for k, v in trainable.items() if k != ADAPTER_KEY}
    return {**attach(frozen, trainable[ADAPTER_KEY], cfg), **rest}


def value_and_grad(loss_fn: Callable, trainable, frozen, cfg, *args, has_aux: bool = False):
    """jax.value_and_grad of loss_fn(model_params, *args) with respect to trainable only: the frozen base is a
    constant of the differentiated function, so no gradient of it is formed and grads has trainable's tree."""
    return jax.value_and_grad(lambda t: loss_fn(model_params(t, frozen, cfg), *args), has_aux=has_aux)(trainable)


# ---- sharding and checkpoints ----------------------------------------------------------------------------------------
def param_axes(base_axes, cfg) -> dict:
    """Logical axis names of the adapter tree, from models.transformer.param_axes(cfg): A keeps the weight's lead
    and in axes, B its lead and out axes; the rank axis is replicated."""
    lcfg, axes = _config(cfg), {}
    for block, target, w_axes in _targeted(base_axes, lcfg):
        lead, ins, outs = _split_dims(tuple(w_axes), target)
        _set(axes, block, target, {"a": (*lead, *ins, None), "b": (*lead, None, *outs)})
    return axes


def shardings(adapters, base_axes, cfg, mesh, rules=sharding.DEFAULT_RULES) -> dict:
    """NamedSharding tree of the adapters on mesh: param_axes through the rules table (models/sharding.py; a
    dimension the mesh axes do not divide stays replicated), e.g. jax.device_put(adapters, shardings(...))."""
    return jax.tree.map(lambda ax, a: NamedSharding(mesh, sharding.logical_to_spec(ax, rules, shape=a.shape,
                                                                                    mesh=mesh)),
                        param_axes(base_axes, cfg), adapters, is_leaf=lambda x: isinstance(x, tuple))


def checkpoint_item(trainable, cfg) -> tuple[dict, dict]:
    """(tree, meta) to checkpoint for a LoRA run: the trainable tree (adapters [+ value head], never the base) and
    the lora section that made it, {"lora": {"rank", "alpha", "targets"}}, for restore_item to check."""
    lcfg = _config(cfg)
    return trainable, {"lora": {"rank": lcfg.rank, "alpha": lcfg.alpha, "targets": list(lcfg.targets)}}


def restore_item(tree, meta: Mapping, base, cfg) -> dict:
    """The trainable tree of a checkpoint written by checkpoint_item, checked against this run's lora section and
    base model (ValueError naming the difference); the run then uses it with the base it loaded itself."""
    lcfg = _config(cfg)
    saved = section_value(LoraConfig, meta.get("lora") or {})
    if saved != lcfg:
        raise ValueError(f"checkpoint adapters were made with lora={saved}, this run has lora={lcfg}")
    # Every adapter's shape against the base: merge's checks run while tracing, so nothing is computed.
    jax.eval_shape(lambda b, a: merge(b, a, cfg), base, tree[ADAPTER_KEY])
    return tree
