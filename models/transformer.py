"""The policy: a decoder-only (MoE) transformer as pure functions over a plain dict of arrays.

    params = init(cfg, key)                        # {"embed", "stack_0", ..., "final_norm"[, "unembed"]}
    params = init_sharded(cfg, key, mesh, rules)   # the same, created in its sharded layout (param_shardings)
    logits_BTV, aux = forward(params, tokens_BT, cfg)
    cache = init_cache(cfg, batch, max_len)        # {"k", "v": one array per layer (see init_cache)}; then
                                                   # forward(..., cache=cache, cache_index=i, kv_valid=...)

Parameters of the blocks are stored stacked (models/layer_stack.py): params["stack_k"] holds the weights of one run
of identical blocks with a leading layer axis (SmolLM2: one stack of 30), and forward runs each group of stacks as one
lax.scan, so XLA compiles one block per group whatever the depth. `layer_stack.per_layer(params, cfg)` is the
per-layer view ("block_i" keys) that checkpoint files use.

Block i: x += attention(rms_norm(x)); x += ffn(rms_norm(x)), where ffn is a MoE layer iff cfg.is_moe_layer(i)
(n_experts > 0, moe_every > 0, (i + 1) % moe_every == 0 and i not in cfg.dense_layers), else a dense SwiGLU.
Attention optionally has q/k/v biases (cfg.attn_bias) and per-head q/k RMSNorm (cfg.qk_norm). A final RMSNorm
precedes the (tied or untied) unembedding; logits are float32 (`return_logits=False` skips them, see forward). `param_axes(cfg)` mirrors the params tree with logical axis names
that models/sharding.py maps onto a device mesh; given mesh and rules, forward also pins the residual stream's layout.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from models import layer_stack, lora, sharding
from models.config import ModelConfig
from models.layers import attention, cache_layout, causal_mask, rms_norm, rope_tables, swiglu
from models.moe import moe_layer


# ---- parameters ------------------------------------------------------------------------------------------------------
def _swiglu_shapes(d_model: int, d_ff: int, lead=()):
    return {"w_gate": (*lead, d_model, d_ff), "w_up": (*lead, d_model, d_ff), "w_down": (*lead, d_ff, d_model)}


def _block_shapes(cfg: ModelConfig, i: int):
    D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    block = {"attn_norm": (D,), "mlp_norm": (D,),
             "attn": {"wq": (D, N, H), "wk": (D, K, H), "wv": (D, K, H), "wo": (N, H, D)}}
    if cfg.attn_bias:
        block["attn"].update({"bq": (N, H), "bk": (K, H), "bv": (K, H)})
    if cfg.qk_norm:
        block["attn"].update({"q_norm": (H,), "k_norm": (H,)})
    if cfg.is_moe_layer(i):
        block["moe"] = {"router": (D, cfg.n_experts), **_swiglu_shapes(D, cfg.expert_ff, (cfg.n_experts,))}
        if cfg.n_shared_experts:
            block["moe"]["shared"] = _swiglu_shapes(D, cfg.n_shared_experts * cfg.expert_ff)
    else:
        block["mlp"] = _swiglu_shapes(D, cfg.d_ff)
    return block


def _block_axes(cfg: ModelConfig, i: int):
    mlp = {"w_gate": ("embed", "mlp"), "w_up": ("embed", "mlp"), "w_down": ("mlp", "embed")}
    block = {"attn_norm": (None,), "mlp_norm": (None,),
             "attn": {"wq": ("embed", "heads", "head_dim"), "wk": ("embed", "kv_heads", "head_dim"),
                      "wv": ("embed", "kv_heads", "head_dim"), "wo": ("heads", "head_dim", "embed")}}
    if cfg.attn_bias:
        block["attn"].update({"bq": ("heads", "head_dim"), "bk": ("kv_heads", "head_dim"),
                              "bv": ("kv_heads", "head_dim")})
    if cfg.qk_norm:
        block["attn"].update({"q_norm": (None,), "k_norm": (None,)})
    if cfg.is_moe_layer(i):
        block["moe"] = {"router": ("embed", None), **{n: ("expert", *a) for n, a in mlp.items()}}
        if cfg.n_shared_experts:
            block["moe"]["shared"] = dict(mlp)
    else:
        block["mlp"] = dict(mlp)
    return block


def param_axes(cfg: ModelConfig):
    """Same tree as init(cfg, key), with a tuple of logical axis names (or None) per array dimension; a stack's
    leading layer axis is None (replicated)."""
    axes = {"embed": ("vocab", "embed"), "final_norm": (None,)}
    for name, layers, _ in layer_stack.stacks(layer_stack.layer_groups(cfg)):
        axes[name] = jax.tree.map(lambda a: (None, *a), _block_axes(cfg, layers[0]), is_leaf=_is_axes)
    if not cfg.tie_embeddings:
        axes["unembed"] = ("embed", "vocab")
    return axes


def _init_scale(name: str, shape) -> float | None:
    """Standard deviation of a parameter's normal init; None for RMSNorm scales (initialised to one), 0 for the
    attention biases (initialised to zero)."""
    if name.endswith("norm"):
        return None
    if name in ("bq", "bk", "bv"):
        return 0.0
    if name == "embed":
        return 1.0  # unit scale; the first RMSNorm sees O(1) inputs
    if name in ("wq", "wk", "wv"):
        fan_in = shape[0]  # [D, heads, head_dim]
    elif name == "wo":
        fan_in = shape[0] * shape[1]  # contracts over (heads, head_dim)
    else:
        fan_in = shape[-2]  # [(E,) in, out]
    return fan_in ** -0.5


def _init_group(key, shapes, dtype):
    """Initialises one group (a block, or the embeddings) from a single normal draw sliced into its arrays:
    one RNG kernel per group instead of one per array keeps compilation of init fast."""
    paths_and_shapes, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))
    scales = [_init_scale(str(path[-1].key), shape) for path, shape in paths_and_shapes]
    total = sum(math.prod(shape) for (_, shape), scale in zip(paths_and_shapes, scales) if scale)
    noise = jax.random.normal(key, (total,), jnp.float32)
    leaves, offset = [], 0
    for (_, shape), scale in zip(paths_and_shapes, scales):
        if not scale:  # constant init; draws no noise, so the other arrays' values do not depend on these
            leaves.append(jnp.ones(shape, dtype) if scale is None else jnp.zeros(shape, dtype))
            continue
        size = math.prod(shape)
        leaves.append((noise[offset:offset + size].reshape(shape) * scale).astype(dtype))
        offset += size
    return jax.tree_util.tree_unflatten(treedef, leaves)


@partial(jax.jit, static_argnums=0)  # one compiled program instead of one dispatch per parameter
def init(cfg: ModelConfig, key):
    """Random parameters: normal(0, 1/fan_in) weights, unit embeddings, unit norm scales; each block draws from its
    own key (the values do not depend on how the blocks are stacked)."""
    top = {"embed": (cfg.vocab_size, cfg.d_model), "final_norm": (cfg.d_model,)}
    if not cfg.tie_embeddings:
        top["unembed"] = (cfg.d_model, cfg.vocab_size)
    keys = jax.random.split(key, cfg.n_layers + 1)
    dtype = jnp.dtype(cfg.param_dtype)
    params = _init_group(keys[0], top, dtype)
    blocks = [_init_group(keys[i + 1], _block_shapes(cfg, i), dtype) for i in range(cfg.n_layers)]
    params.update(layer_stack.stack_blocks(blocks, layer_stack.layer_groups(cfg)))
    return params


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def param_shardings(cfg: ModelConfig, mesh, rules=sharding.DEFAULT_RULES):
    """Tree of NamedSharding matching init(cfg, key) (models/sharding.py maps param_axes onto the mesh)."""
    shapes = jax.eval_shape(partial(init, cfg), jax.random.key(0))
    return jax.tree.map(
        lambda axes, s: NamedSharding(mesh, sharding.logical_to_spec(axes, rules, shape=s.shape, mesh=mesh)),
        param_axes(cfg), shapes, is_leaf=_is_axes)


def init_sharded(cfg: ModelConfig, key, mesh, rules=sharding.DEFAULT_RULES):
    """init(cfg, key) with every parameter created directly in its sharded layout (no host holds the whole model)."""
    return jax.jit(partial(init, cfg), out_shardings=param_shardings(cfg, mesh, rules))(key)


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int, dtype=None):
    """Zeroed KV cache: {"k": one keys array per layer, "v": one [batch, n_kv_heads, max_len, head_dim] array per
    layer} (tuples; dtype defaults to cfg.dtype). The keys' layout is the backend's (layers.cache_layout(), see
    layers.CACHE_LAYOUTS): [batch, n_kv_heads, head_dim, max_len] for "keys_slots_last" (the CPU's), the values'
    layout for "keys_like_values". One buffer per layer, so a decode step reads its layer's keys where they are (a
    slice of a stacked [n_layers, ...] buffer is copied every step)."""
    dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
    v_shape = (batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
    k_shape = (batch_size, cfg.n_kv_heads, cfg.head_dim, max_len) if cache_layout() == "keys_slots_last" else v_shape
    return {"k": tuple(jnp.zeros(k_shape, dtype) for _ in range(cfg.n_layers)),
            "v": tuple(jnp.zeros(v_shape, dtype) for _ in range(cfg.n_layers))}


def cache_slots(cache) -> int:
    """Number of slots (max_len) of a KV cache from init_cache."""
    return cache["v"][0].shape[2]


# ---- forward ---------------------------------------------------------------------------------------------------------
def _block(p, x_BTD, positions_BT, rope, mask_BTS, token_mask_BT, cache, cache_index, routes_BTK=None, *,
           cfg: ModelConfig, layer: int, constrain, mesh=None, rules=None, replay: bool = True, moe_impl="auto"):
    h_BTD = rms_norm(x_BTD, p["attn_norm"], cfg.norm_eps)
    a_BTD, cache = attention(p["attn"], h_BTD, positions_BT, mask_BTS, rope_theta=cfg.rope_theta, cache=cache,
                             layer=layer, cache_index=cache_index, rope=rope, norm_eps=cfg.norm_eps,
                             use_kernel=mesh is None)
    x_BTD = constrain(x_BTD + a_BTD)
    h_BTD = rms_norm(x_BTD, p["mlp_norm"], cfg.norm_eps)
    if "moe" in p:
        y_BTD, stats = moe_layer(p["moe"], h_BTD, cfg, token_mask_BT=token_mask_BT, mesh=mesh, rules=rules,
                                 routes_BTK=routes_BTK, replay=replay, impl=moe_impl)
    else:
        y_BTD, stats = swiglu(p["mlp"], h_BTD), None
    return constrain(x_BTD + y_BTD), cache, stats


def _run_blocks(params, x_BTD, args, cache, cache_index, routes, cfg: ModelConfig, block, scan: bool):
    """Every block, group by group (models/layer_stack.py): a group of several repeats runs as one lax.scan over its
    stacks' leading axis when `scan`, else unrolled over slices of the stacked weights; params in the per-layer view
    (layer_stack.per_layer: the sampler's, sliced once per generate call) always run unrolled. Each block sees a one-layer
    cache; a scanned group's per-layer KV buffers are stacked for the scan and split again after it (a copy per call:
    the sampler's decode steps run unrolled instead). Returns (x, cache (per-layer tuples), router statistics stacked
    in cfg.moe_layers order, experts used [n_moe_layers, B, T, k] or None)."""
    B, T = x_BTD.shape[:2]
    new_k = None if cache is None else list(cache["k"])
    new_v = None if cache is None else list(cache["v"])
    moe_index = {layer: j for j, layer in enumerate(cfg.moe_layers)}
    stats, used = {}, {}  # layer -> its router statistics / experts [B, T, k]
    # Also with a cache: the grouped layout's answers run against the prompts' KV cache in the train step (a forward
    # that is not differentiated, the sampler's, runs a checkpointed block as it is).
    remat = cfg.remat
    per_layer_view = "block_0" in params  # layer_stack.per_layer's view: unrolled over its per-layer blocks

    def run_block(p, x, one_cache, routes_BTK):
        if lora.ADAPTER_KEY in p:  # attached LoRA adapters (lora.attach): x W + s (x A) B in this layer's matmuls
            p = lora.merge_block(p, cfg, low_rank=True)
        return block(p, x, *args, one_cache, cache_index, routes_BTK, layer=0)

    stacks = [params[name] for name in params if layer_stack.STACK_KEY.fullmatch(name)]
    if remat:
        run_block = jax.checkpoint(run_block)
    elif any(lora.ADAPTER_KEY in st for st in stacks):
        # Attached adapters: the backward recomputes each layer's merged weights from W, A and B instead of keeping
        # a copy of every layer's (a scan would stack them as residuals); activations are saved as usual.
        weight_shapes = {tuple(w.shape[1:]) for st in stacks for w in jax.tree.leaves(st) if w.ndim >= 3}
        run_block = jax.checkpoint(run_block, policy=_saves_no_value_shaped_like(weight_shapes))

    def layer_fn(p, x, one_cache, routes_BTK):
        return run_block(p, x, one_cache, routes_BTK)

    def moe_routes(layers):
        if routes is None or layers[0] not in moe_index:
            return None
        return jnp.moveaxis(routes[:, :, jnp.asarray([moe_index[i] for i in layers])], 2, 0)  # [R, B, T, k]

    def keep(layer, layer_stats):
        if layer_stats is not None:
            used[layer] = layer_stats.pop("experts").reshape(B, T, cfg.experts_per_token)
            stats[layer] = layer_stats

    for g in layer_stack.layer_groups(cfg):
        if scan and g.repeats > 1 and not per_layer_view:
            xs = {"p": tuple(params[name] for name in g.names),
                  "routes": tuple(moe_routes(g.layers(j)) for j in range(g.period))}
            if cache is not None:
                xs["k"] = tuple(jnp.stack([new_k[i] for i in g.layers(j)]) for j in range(g.period))
                xs["v"] = tuple(jnp.stack([new_v[i] for i in g.layers(j)]) for j in range(g.period))

            def step(x, xs_i):
                ys = {"k": [], "v": [], "stats": [], "experts": []}
                for j in range(len(xs_i["p"])):
                    one = None if cache is None else {"k": (xs_i["k"][j],), "v": (xs_i["v"][j],)}
                    x, one, layer_stats = layer_fn(xs_i["p"][j], x, one, xs_i["routes"][j])
                    ys["k"].append(None if one is None else one["k"][0])
                    ys["v"].append(None if one is None else one["v"][0])
                    ys["experts"].append(None if layer_stats is None else layer_stats.pop("experts"))
                    ys["stats"].append(layer_stats)
                return x, ys

            x_BTD, ys = jax.lax.scan(step, x_BTD, xs)
            for j in range(g.period):
                for r, layer in enumerate(g.layers(j)):
                    if cache is not None:
                        new_k[layer], new_v[layer] = ys["k"][j][r], ys["v"][j][r]
                    if ys["stats"][j] is not None:
                        keep(layer, {**{n: a[r] for n, a in ys["stats"][j].items()}, "experts": ys["experts"][j][r]})
            continue
        for r in range(g.repeats):
            for j, name in enumerate(g.names):
                layer = g.start + r * g.period + j
                p = params[f"block_{layer}"] if per_layer_view else jax.tree.map(lambda w, r=r: w[r], params[name])
                one = None if cache is None else {"k": (new_k[layer],), "v": (new_v[layer],)}
                routes_BTK = routes[:, :, moe_index[layer]] if routes is not None and layer in moe_index else None
                x_BTD, one, layer_stats = layer_fn(p, x_BTD, one, routes_BTK)
                if one is not None:
                    new_k[layer], new_v[layer] = one["k"][0], one["v"][0]
                keep(layer, layer_stats)
    cache = None if cache is None else {"k": tuple(new_k), "v": tuple(new_v)}
    order = [i for i in cfg.moe_layers if i in stats]
    aux = _stack_stats([stats[i] for i in order], cfg.n_experts)
    used_LBTK = jnp.stack([used[i] for i in order]) if order else None
    return x_BTD, cache, aux, used_LBTK


def _saves_no_value_shaped_like(shapes: set):
    """A jax.checkpoint policy: save every intermediate except those whose shape is one of `shapes` (a block's
    weight shapes: the merged LoRA weights and their float32 intermediates, recomputed in the backward pass)."""
    def policy(prim, *avals, **params):
        try:
            out = prim.abstract_eval(*avals, **params)
        except Exception:  # noqa: BLE001 - a primitive without a plain abstract rule: save as usual
            return True
        out = out[0] if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], (set, frozenset)) else out
        outs = out if isinstance(out, (list, tuple)) else [out]
        return not any(tuple(getattr(o, "shape", ())) in shapes for o in outs)
    return policy


def _stack_stats(stats, n_experts: int):
    if not stats:
        return {"router_aux_loss": jnp.zeros((0,), jnp.float32), "router_z_loss": jnp.zeros((0,), jnp.float32),
                "expert_load": jnp.zeros((0, n_experts), jnp.float32),
                "router_prob": jnp.zeros((0, n_experts), jnp.float32),
                "dropped_fraction": jnp.zeros((0,), jnp.float32)}
    return {name: jnp.stack([s[name] for s in stats]) for name in stats[0]}


def forward(params, tokens, cfg: ModelConfig, *, positions=None, attn_mask=None, cache=None, cache_index=None,
            kv_valid=None, return_hidden=False, return_logits=True, mesh=None, rules=None, routes=None,
            replay_routes=True, return_routes=False, moe_impl="auto", scan_layers=None, causal=True):
    """Logits [B, T, vocab] (float32) and aux (router statistics per MoE layer, "hidden", "cache", "routes").

    return_hidden: aux["hidden"] = the final-normed hidden states [B, T, d_model] (compute dtype).
    return_logits=False: no unembedding at all; returns (None, aux) with aux["hidden"], for callers that take
    logprobs chunk by chunk from the hidden states (models/vocab.py) instead of materialising [B, T, vocab].

    Without cache: causal self-attention over `tokens`; attn_mask [B, T] (1 = real) masks padded keys and keeps
    padding out of the experts and router statistics; positions default to arange(T).
    With cache: the tokens fill slots cache_index .. cache_index + T - 1 (cache_index may be traced); the query in slot
    s sees slot j iff j <= s and kv_valid[b, j] (default: all slots valid); positions default to the slot numbers;
    attn_mask, if given, only marks which new tokens are real for the router statistics.

    Routes (MoE): return_routes=True adds aux["routes"] [B, T, n_moe_layers, k] int32, the experts each token used in
    each MoE block (in the order of cfg.moe_layers; dense blocks have no entry). routes (same layout, -1 = no record)
    are recorded experts, e.g. the sampler's: with replay_routes (routing replay, R3) the MoE blocks use them, gate
    weights recomputed from the current router (models/moe.py); either way aux gains "replay_differ" and
    "replay_compared" per MoE layer, the token routes the router's own top-k would choose differently / compared.
    moe_impl: the MoE layers' expert kernel (models/moe.py moe_layer's impl; "auto" for forward passes and gradients).
    scan_layers: run each group of stacked blocks as one lax.scan (None = cfg.scan_layers); params in the per-layer
    view (layer_stack.per_layer, as the sampler passes them) always run unrolled.
    causal=False (with a cache and kv_valid): the queries see exactly the kv_valid slots, whatever their order (a
    ring-buffer cache whose write slot wraps around: models/slot_sampling.py).
    """
    B, T = tokens.shape
    dtype = jnp.dtype(cfg.dtype)
    if mesh is not None:
        rules = sharding.DEFAULT_RULES if rules is None else rules
        constrain = partial(sharding.constrain, axes=("batch", "length", None), mesh=mesh, rules=rules)
    else:
        constrain = lambda x: x
    if cache is None:
        slots_T = jnp.arange(T, dtype=jnp.int32)
        mask_BTS = causal_mask(slots_T, slots_T)[None]
        if attn_mask is not None:
            mask_BTS = mask_BTS & attn_mask.astype(bool)[:, None, :]
        cache_index = None
    else:
        cache_index = jnp.asarray(0 if cache_index is None else cache_index, jnp.int32)
        slots_T = cache_index + jnp.arange(T, dtype=jnp.int32)
        if causal:
            mask_BTS = causal_mask(slots_T, jnp.arange(cache_slots(cache), dtype=jnp.int32))[None]
            if kv_valid is not None:
                mask_BTS = mask_BTS & kv_valid.astype(bool)[:, None, :]
        elif kv_valid is None:
            raise ValueError("forward(causal=False) needs kv_valid: the slots each query may see")
        else:
            mask_BTS = jnp.broadcast_to(kv_valid.astype(bool)[:, None, :], (B, T, kv_valid.shape[1]))
    if positions is None:
        positions = jnp.broadcast_to(slots_T, (B, T))
    token_mask_BT = None if attn_mask is None else attn_mask.astype(bool)
    rope = rope_tables(positions, cfg.head_dim, cfg.rope_theta)  # shared by every layer

    n_moe = len(cfg.moe_layers)
    if routes is not None and tuple(routes.shape) != (B, T, n_moe, cfg.experts_per_token):
        raise ValueError(f"routes must be [batch, time, n_moe_layers, experts_per_token] = "
                         f"{(B, T, n_moe, cfg.experts_per_token)}, got {tuple(routes.shape)}")

    x_BTD = constrain(jnp.take(params["embed"], tokens, axis=0).astype(dtype))
    block = partial(_block, cfg=cfg, constrain=constrain, mesh=mesh, rules=rules, replay=replay_routes,
                    moe_impl=moe_impl)
    args = (positions, rope, mask_BTS, token_mask_BT)
    scan = cfg.scan_layers if scan_layers is None else scan_layers
    x_BTD, cache, aux, used_LBTK = _run_blocks(params, x_BTD, args, cache, cache_index, routes, cfg, block, scan)
    h_BTD = rms_norm(x_BTD, params["final_norm"], cfg.norm_eps)
    if return_routes:
        aux["routes"] = (jnp.moveaxis(used_LBTK, 0, 2) if used_LBTK is not None
                         else jnp.zeros((B, T, 0, cfg.experts_per_token), jnp.int32))
    if return_hidden or not return_logits:
        aux["hidden"] = h_BTD
    if cache is not None:
        aux["cache"] = cache
    if not return_logits:
        return None, aux
    return logits_from_hidden(params, h_BTD, cfg, mesh=mesh, rules=rules), aux


def decode_params(params, cfg: ModelConfig) -> dict:
    """The per-layer view the sampler decodes with (layer_stack.per_layer: "block_i" slices, taken once per call
    rather than in every decode step), with attached LoRA adapters merged into each layer's weights and the weight
    matrices in the compute dtype cfg.dtype (bfloat16 sampling of float32 weights reads half the bytes per token;
    norm scales and biases keep their dtype, as the forward casts them)."""
    view = layer_stack.per_layer(params, cfg)
    if cfg.lora is not None:
        view = lora.merge_blocks(view, cfg)
    dtype = jnp.dtype(cfg.dtype)
    return jax.tree.map(lambda w: w.astype(dtype) if _cast_for_decoding(w, dtype) else w, view)


def _cast_for_decoding(w, dtype) -> bool:
    """Whether decode_params casts this array: a floating matrix (norm scales and biases keep their dtype)."""
    return w.ndim >= 2 and jnp.issubdtype(w.dtype, jnp.floating) and w.dtype != dtype


@partial(jax.jit, static_argnums=1)
def _decode_params_program(params, cfg: ModelConfig) -> dict:
    return decode_params(params, cfg)


def decode_view(params, cfg: ModelConfig) -> dict:
    """decode_params as one jitted program over only what it changes (the stacked blocks, and arrays it casts);
    the entries it would return unchanged (the embedding table in the compute dtype, the final norm) are the
    caller's own arrays. A jit returns even an unchanged input as a new buffer: SmolLM2's 108 MiB table was copied
    on every sampler call. The sampler's entry point when the view is built outside its decode program."""
    dtype = jnp.dtype(cfg.dtype)
    kept = {k: v for k, v in params.items() if not layer_stack.STACK_KEY.fullmatch(k)
            and not any(_cast_for_decoding(w, dtype) for w in jax.tree.leaves(v))}
    return {**kept, **_decode_params_program({k: v for k, v in params.items() if k not in kept}, cfg)}


def logits_from_hidden(params, h_BTD, cfg: ModelConfig, *, mesh=None, rules=None):
    """float32 logits [B, T, vocab] of final-normed hidden states (forward's last step; the sampler applies it to
    the last prompt position only, so a prefill never holds [B, P, vocab] logits)."""
    dtype = jnp.dtype(cfg.dtype)
    h_BTD = h_BTD.astype(dtype)
    w, layout, scale = unembedding(params, cfg)
    if layout == "VD":
        # The scale is folded into the (smaller than activations at training shapes) weight, in the compute dtype.
        w_VD = w.astype(dtype) if scale == 1.0 else w.astype(dtype) * jnp.asarray(scale, dtype)
        logits_BTV = jnp.einsum("BTD,VD->BTV", h_BTD, w_VD, preferred_element_type=jnp.float32)
    else:
        logits_BTV = jnp.einsum("BTD,DV->BTV", h_BTD, w.astype(dtype), preferred_element_type=jnp.float32)
    if mesh is not None:
        rules = sharding.DEFAULT_RULES if rules is None else rules
        logits_BTV = sharding.constrain(logits_BTV, ("batch", "length", "vocab"), mesh, rules)
    return logits_BTV.astype(jnp.float32)


def unembedding(params, cfg: ModelConfig):
    """The output projection as (w, layout, scale): logits = scale * h @ w for layout "DV" (an untied [D, V]
    "unembed"), scale * h @ w.T for "VD" (the tied [V, D] embedding table). scale is d_model**-0.5 for a tied table
    when cfg.scale_tied_unembed (unit-scale embeddings of the from-scratch model), else 1."""
    if cfg.tie_embeddings:
        return params["embed"], "VD", (cfg.d_model ** -0.5 if cfg.scale_tied_unembed else 1.0)
    return params["unembed"], "DV", 1.0
