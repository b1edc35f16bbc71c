"""Hugging Face checkpoint folders (config.json + *.safetensors) <-> ModelConfig and the params pytree; GGUF files in.

    cfg, params = hf.load("ckpt/Qwen3-1.7B", dtype="bfloat16")               # on one host
    cfg, params = hf.load("SmolLM2-135M-Instruct.Q4_1.gguf")                 # a GGUF file, dequantized to float32
    cfg, params = hf.load(path, dtype="bfloat16", mesh=mesh, rules=rules)     # sharded: each device reads its slices
    cfg, params = hf.load(path, dtype="bfloat16", param_dtype="float32")     # float32 master weights, bf16 compute
    hf.save("out/folder", cfg, params)                                        # transformers' from_pretrained reads it
    hf.save("out/folder", cfg, base, lora=adapters)                           # LoRA adapters merged in (models/lora.py)

Supported `model_type`s: qwen2 (q/k/v bias), qwen3 (per-head q/k RMSNorm, explicit head_dim, tied embeddings in the
small models), qwen3_moe (q/k norm, routed experts every `decoder_sparse_step` blocks except `mlp_only_layers`,
`norm_topk_prob`), mixtral (every block MoE, softmax over the top-k router logits) and llama (no biases, default rotary
embedding). Weights are the Hub layout: one file `model.safetensors`, or several with `model.safetensors.index.json`,
one tensor per expert (`...experts.{e}.gate_proj.weight`, Mixtral's `w1/w3/w2`).

The name mapping (`_tensor_specs`) says, for every array of the pytree (a path flattened with flax.traverse_util),
which checkpoint tensor(s) it comes from: `ours = hf.reshape(split).transpose(perm)` (a torch Linear weight is
[out, in], ours [in..., out...]), and experts stacked on a leading axis, one tensor each. Loading reads every tensor
through `safe_open(...).get_slice`: without a mesh the whole tensor, with a mesh only the rows/experts of each
device's shard (jax.make_array_from_callback asks for the slices the addressable devices hold), so no host ever holds
a full copy of a model larger than its memory. An unsupported model_type or option, a missing tensor, an unused one, or
a shape that disagrees with config.json fails with a ValueError that names it.

A `.gguf` file goes through the same mapping: models/gguf_file.py turns its metadata into a config.json dict and serves
its tensors, dequantized and under Hugging Face names, through the same get_slice interface.

`save` writes the Hub layout back (sharded when `max_shard_bytes` is given), choosing the model_type from the config
(MoE: qwen3_moe with q/k norm, else mixtral; dense: qwen2 with attention bias, qwen3 with q/k norm, else llama). A
from-scratch model whose tied unembedding is scaled by d_model**-0.5 is written with an explicit (scaled) lm_head and
tie_word_embeddings false, which computes the same function.
"""

from __future__ import annotations

import json
import math
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16", so safetensors' numpy reader handles BF16 tensors)
import numpy as np
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from models import gguf_file, layer_stack, sharding
from models import lora as lora_adapters
from models.config import ModelConfig
from models.transformer import init, param_shardings

ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "mixtral": "MixtralForCausalLM", "llama": "LlamaForCausalLM"}
_SINGLE_FILE, _INDEX_FILE = "model.safetensors", "model.safetensors.index.json"


# ---- config.json <-> ModelConfig -------------------------------------------------------------------------------------

def require_finite(array: np.ndarray, names, path) -> None:
    """models.hf.load's hook: a tensor with inf / nan values is an error naming it (NaN weights never load)."""
    a = np.asarray(array)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        if not np.isfinite(a.astype(np.float32) if a.dtype.name == "bfloat16" else a).all():
            raise ValueError(f"{path}: tensor {', '.join(names)[:200]} holds inf/nan values")

def _rope_theta(hf: dict, model_type: str) -> float:
    """The rotary base; only the default (unscaled) rotary embedding is implemented."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for where, table in (("rope_parameters", params), ("rope_scaling", scaling)):
        kind = table.get("rope_type", table.get("type", "default"))
        if kind != "default":
            raise ValueError(f"config.json: {where} type {kind!r} is not supported for {model_type} "
                             f"(only the default rotary embedding is implemented)")
    theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
    return float(theta)


def _reject(hf: dict, key: str, allowed, model_type: str, what: str) -> None:
    value = hf.get(key, allowed)
    if value != allowed and not (allowed is None and value in (None, False)):
        raise ValueError(f"config.json: {key}={value!r} is not supported for {model_type} ({what})")


def config_from_hf(hf: dict, *, dtype: str = "float32", param_dtype: str | None = None) -> ModelConfig:
    """ModelConfig equal to a Hugging Face config.json dict (compute dtype `dtype`, storage `param_dtype`)."""
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"config.json: model_type {model_type!r} is not supported; supported: {sorted(ARCHITECTURES)}")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if key not in hf:
            raise ValueError(f"config.json: {key} is missing (model_type {model_type})")
    act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
    if act != "silu":
        raise ValueError(f"config.json: hidden_act {act!r} is not supported (SwiGLU with silu only)")
    if model_type in ("qwen2", "qwen3", "qwen3_moe"):
        _reject(hf, "use_sliding_window", False, model_type, "sliding-window attention is not implemented")
        kinds = set(hf.get("layer_types") or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ValueError(f"config.json: layer_types {sorted(kinds)} are not supported (full attention only)")
    if model_type == "mixtral":
        _reject(hf, "sliding_window", None, model_type, "sliding-window attention is not implemented")
    if model_type != "qwen2":  # qwen2's q/k/v biases are built in; elsewhere attention_bias also biases o_proj
        _reject(hf, "attention_bias", False, model_type, "a bias on the output projection is not implemented")
    if model_type == "llama":
        _reject(hf, "mlp_bias", False, model_type, "biases in the MLP are not implemented")

    heads, d_model = hf["num_attention_heads"], hf["hidden_size"]
    fields = dict(
        vocab_size=hf["vocab_size"], d_model=d_model, n_layers=hf["num_hidden_layers"], n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hf.get("head_dim") or d_model // heads,
        d_ff=hf["intermediate_size"], max_seq_len=hf.get("max_position_embeddings", 4096),
        rope_theta=_rope_theta(hf, model_type), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)), scale_tied_unembed=False,
        attn_bias=model_type == "qwen2", qk_norm=model_type in ("qwen3", "qwen3_moe"),
        n_experts=0, moe_every=0, capacity_factor=None, dtype=dtype, param_dtype=param_dtype or dtype)
    if "router_aux_loss_coef" in hf:
        fields["router_aux_coef"] = float(hf["router_aux_loss_coef"])
    if model_type == "qwen3_moe":
        n_experts = hf.get("num_experts", hf.get("num_local_experts", 0)) or 0
        if n_experts and hf.get("decoder_sparse_step", 1) > 0:
            fields.update(n_experts=n_experts, experts_per_token=hf["num_experts_per_tok"],
                          moe_every=hf.get("decoder_sparse_step", 1), expert_d_ff=hf["moe_intermediate_size"],
                          dense_layers=tuple(hf.get("mlp_only_layers") or ()),
                          norm_topk_prob=bool(hf.get("norm_topk_prob", False)))
    elif model_type == "mixtral":
        fields.update(n_experts=hf["num_local_experts"], experts_per_token=hf["num_experts_per_tok"], moe_every=1,
                      expert_d_ff=hf["intermediate_size"], norm_topk_prob=True)
    return ModelConfig(**fields)


def infer_model_type(cfg: ModelConfig) -> str:
    """The Hugging Face model_type that computes the same function as cfg (see the module docstring)."""
    if cfg.is_moe_model and cfg.moe_layers:
        return "qwen3_moe" if cfg.qk_norm else "mixtral"
    return "qwen2" if cfg.attn_bias else "qwen3" if cfg.qk_norm else "llama"


def _check_saveable(cfg: ModelConfig, model_type: str) -> None:
    if model_type not in ARCHITECTURES:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {sorted(ARCHITECTURES)}")
    moe = bool(cfg.is_moe_model and cfg.moe_layers)
    need = {"qwen2": (False, True, False), "qwen3": (False, False, True), "qwen3_moe": (True, False, True),
            "mixtral": (True, False, False), "llama": (False, False, False)}[model_type]
    for name, want, have in zip(("n_experts/moe_every (MoE blocks)", "attn_bias", "qk_norm"), need,
                                (moe, cfg.attn_bias, cfg.qk_norm)):
        if want != have:
            raise ValueError(f"cannot save as {model_type}: it needs {name} = {want}, the config has {have}")
    if cfg.n_shared_experts:
        raise ValueError(f"n_shared_experts={cfg.n_shared_experts}: no supported model_type has shared experts")
    if model_type == "mixtral" and (cfg.moe_layers != tuple(range(cfg.n_layers)) or not cfg.norm_topk_prob):
        raise ValueError("cannot save as mixtral: every block must be MoE (moe_every=1, dense_layers=()) with "
                         "norm_topk_prob=True")


def config_to_hf(cfg: ModelConfig, model_type: str | None = None) -> dict:
    """config.json dict for cfg (model_type inferred when None)."""
    model_type = model_type or infer_model_type(cfg)
    _check_saveable(cfg, model_type)
    untie = cfg.tie_embeddings and cfg.scale_tied_unembed  # written as an explicit, scaled lm_head
    hf = {"architectures": [ARCHITECTURES[model_type]], "model_type": model_type, "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layers,
          "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
          "hidden_act": "silu", "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.norm_eps,
          "rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
          "tie_word_embeddings": cfg.tie_embeddings and not untie, "attention_dropout": 0.0, "use_cache": True,
          "dtype": cfg.param_dtype}
    if model_type in ("qwen2", "qwen3", "qwen3_moe"):
        hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=cfg.n_layers)
    if model_type != "qwen2":
        hf["attention_bias"] = False
    if model_type == "llama":
        hf["mlp_bias"] = False
    if model_type == "qwen3_moe":
        hf.update(num_experts=cfg.n_experts, num_experts_per_tok=cfg.experts_per_token,
                  moe_intermediate_size=cfg.expert_ff, decoder_sparse_step=cfg.moe_every,
                  mlp_only_layers=list(cfg.dense_layers), norm_topk_prob=cfg.norm_topk_prob,
                  router_aux_loss_coef=cfg.router_aux_coef, output_router_logits=False)
    if model_type == "mixtral":
        hf.update(num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.experts_per_token,
                  intermediate_size=cfg.expert_ff, sliding_window=None, router_aux_loss_coef=cfg.router_aux_coef,
                  output_router_logits=False)
    return hf


# ---- the name mapping ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    """How one pytree array is made from checkpoint tensors: ours = hf.reshape(split).transpose(perm).

    groups[i] = how many consecutive `split` dims make up dimension i of the checkpoint tensor. Several names = one
    tensor per expert, stacked on our leading axis (split/perm then describe a single expert)."""
    names: tuple[str, ...]
    split: tuple[int, ...]
    groups: tuple[int, ...]
    perm: tuple[int, ...]

    @property
    def hf_shape(self) -> tuple[int, ...]:
        out, k = [], 0
        for g in self.groups:
            out.append(math.prod(self.split[k:k + g]))
            k += g
        return tuple(out)


def _plain(name, shape, groups=None):
    return _Spec((name,), tuple(shape), tuple(groups or (1,) * len(shape)), tuple(range(len(shape))))


def _linear(name, in_dims, out_dims):
    """torch Linear weight [prod(out), prod(in)] -> ours [*in, *out]."""
    n_out, n_in = len(out_dims), len(in_dims)
    perm = tuple(range(n_out, n_out + n_in)) + tuple(range(n_out))
    names = (name,) if isinstance(name, str) else tuple(name)
    return _Spec(names, (*out_dims, *in_dims), (n_out, n_in), perm)


def _tensor_specs(cfg: ModelConfig, model_type: str) -> dict[tuple, _Spec]:
    D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    specs = {("embed",): _plain("model.embed_tokens.weight", (cfg.vocab_size, D)),
             ("final_norm",): _plain("model.norm.weight", (D,))}
    if not cfg.tie_embeddings:
        specs[("unembed",)] = _linear("lm_head.weight", (D,), (cfg.vocab_size,))
    for i in range(cfg.n_layers):
        pre, blk = f"model.layers.{i}.", f"block_{i}"
        att = pre + "self_attn."
        specs[(blk, "attn_norm")] = _plain(pre + "input_layernorm.weight", (D,))
        specs[(blk, "mlp_norm")] = _plain(pre + "post_attention_layernorm.weight", (D,))
        specs[(blk, "attn", "wq")] = _linear(att + "q_proj.weight", (D,), (N, H))
        specs[(blk, "attn", "wk")] = _linear(att + "k_proj.weight", (D,), (K, H))
        specs[(blk, "attn", "wv")] = _linear(att + "v_proj.weight", (D,), (K, H))
        specs[(blk, "attn", "wo")] = _linear(att + "o_proj.weight", (N, H), (D,))
        if cfg.attn_bias:
            for ours, theirs, heads in (("bq", "q_proj", N), ("bk", "k_proj", K), ("bv", "v_proj", K)):
                specs[(blk, "attn", ours)] = _plain(f"{att}{theirs}.bias", (heads, H), (2,))
        if cfg.qk_norm:
            specs[(blk, "attn", "q_norm")] = _plain(att + "q_norm.weight", (H,))
            specs[(blk, "attn", "k_norm")] = _plain(att + "k_norm.weight", (H,))
        if not cfg.is_moe_layer(i):
            F = cfg.d_ff
            specs[(blk, "mlp", "w_gate")] = _linear(pre + "mlp.gate_proj.weight", (D,), (F,))
            specs[(blk, "mlp", "w_up")] = _linear(pre + "mlp.up_proj.weight", (D,), (F,))
            specs[(blk, "mlp", "w_down")] = _linear(pre + "mlp.down_proj.weight", (F,), (D,))
            continue
        F, E = cfg.expert_ff, cfg.n_experts
        if model_type == "mixtral":
            moe, names = pre + "block_sparse_moe.", {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}
        else:
            moe, names = pre + "mlp.", {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}
        specs[(blk, "moe", "router")] = _linear(moe + "gate.weight", (D,), (E,))
        for ours, theirs in names.items():
            per_expert = [f"{moe}experts.{e}.{theirs}.weight" for e in range(E)]
            dims = ((F,), (D,)) if ours == "w_down" else ((D,), (F,))
            specs[(blk, "moe", ours)] = _linear(per_expert, *dims)
    return specs


# ---- reading ---------------------------------------------------------------------------------------------------------
def _weight_map(path: Path) -> dict[str, str]:
    """Checkpoint tensor name -> file name within the folder."""
    if (path / _INDEX_FILE).exists():
        return dict(json.loads((path / _INDEX_FILE).read_text())["weight_map"])
    if (path / _SINGLE_FILE).exists():
        with safe_open(path / _SINGLE_FILE, framework="numpy") as f:
            return {name: _SINGLE_FILE for name in f.keys()}
    raise ValueError(f"{path}: no {_SINGLE_FILE} or {_INDEX_FILE}")


def _read_slice(handle, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """One safetensors read: only these rows/columns of the tensor leave the file."""
    return handle.get_slice(name)[index]


def _bounds(s: slice, size: int) -> tuple[int, int]:
    start, stop, step = s.indices(size)
    if step != 1:
        raise ValueError(f"strided shard index {s} is not supported")
    return start, stop


def _read_one(handle, name: str, spec: _Spec, index: tuple[slice, ...]) -> np.ndarray:
    """The part index (in our layout) of one checkpoint tensor, in our layout."""
    split_idx = [None] * len(spec.split)
    for ours_dim, split_dim in enumerate(spec.perm):
        split_idx[split_dim] = _bounds(index[ours_dim], spec.split[split_dim])
    hf_index, block_shape, rest, k = [], [], [], 0
    for g in spec.groups:
        # Along a checkpoint dim made of split dims (a, b, ...), rows a0..a1 of the first are one contiguous range;
        # the inner dims are read whole for those rows and cut after the reshape.
        inner = math.prod(spec.split[k + 1:k + g])
        a0, a1 = split_idx[k]
        hf_index.append(slice(a0 * inner, a1 * inner))
        block_shape += [a1 - a0, *spec.split[k + 1:k + g]]
        rest += [slice(None)] + [slice(*split_idx[j]) for j in range(k + 1, k + g)]
        k += g
    block = np.asarray(_read_slice(handle, name, tuple(hf_index))).reshape(block_shape)
    return block[tuple(rest)].transpose(spec.perm)


def _read(handles, weight_map, spec: _Spec, index: tuple[slice, ...]) -> np.ndarray:
    if len(spec.names) == 1:
        return _read_one(handles[weight_map[spec.names[0]]], spec.names[0], spec, index)
    e0, e1 = _bounds(index[0], len(spec.names))  # experts: our leading axis picks the tensors to open
    return np.stack([_read_one(handles[weight_map[spec.names[e]]], spec.names[e], spec, index[1:])
                     for e in range(e0, e1)])


def where_file(root: Path, weight_map: dict, spec) -> str:
    """The file a spec's first tensor is read from (for error messages)."""
    return str(root / weight_map.get(spec.names[0], "?"))


def _check_tensors(specs, weight_map, handles, cfg: ModelConfig, model_type: str, where: str = "config.json") -> None:
    used = set()
    for spec in specs.values():
        for name in spec.names:
            if name not in weight_map:
                raise ValueError(f"checkpoint tensor {name} is missing ({where} describes a {model_type} model "
                                 f"that needs it)")
            shape = tuple(handles[weight_map[name]].get_slice(name).get_shape())
            if shape != spec.hf_shape:
                raise ValueError(f"checkpoint tensor {name} has shape {shape}, {where} implies {spec.hf_shape}")
            used.add(name)
    ignorable = {"lm_head.weight"} if cfg.tie_embeddings else set()  # some tied checkpoints store the copy
    unused = sorted(n for n in set(weight_map) - used - ignorable if not n.endswith("rotary_emb.inv_freq"))
    if unused:
        raise ValueError(f"checkpoint tensor(s) {unused[:5]}{' ...' if len(unused) > 5 else ''} are not used by the "
                         f"{model_type} mapping (an option this loader does not implement?)")


def load(path, *, dtype: str = "float32", mesh=None, rules=None, param_dtype: str | None = None):
    """(ModelConfig, params) from a Hugging Face checkpoint folder or a GGUF file (`*.gguf`, models/gguf_file.py).

    dtype: compute dtype, and storage dtype of the params unless param_dtype says otherwise (e.g. dtype="bfloat16",
    param_dtype="float32" for float32 master weights). With a mesh, params are created in the layout of
    models.transformer.param_shardings(cfg, mesh, rules) and each device's slice is read from the files directly
    (a GGUF tensor is dequantized whole, once, then sliced). A tensor with inf / nan values is an error naming it.
    """
    path = Path(path)
    if is_gguf(path):
        hf_cfg, handle = gguf_file.open_checkpoint(path)
        cfg = _gguf_config(path, hf_cfg, dtype, param_dtype)
        weight_map = {name: path.name for name in handle.keys()}
        try:
            return cfg, _assemble(cfg, hf_cfg["model_type"], weight_map, {path.name: handle}, mesh, rules,
                                  where=f"{path} (its metadata)", root=path.parent)
        finally:
            handle.release()
    hf_cfg = _read_config_json(path)
    cfg = config_from_hf(hf_cfg, dtype=dtype, param_dtype=param_dtype)
    weight_map = _weight_map(path)
    with ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(path / f, framework="numpy")) for f in set(weight_map.values())}
        return cfg, _assemble(cfg, hf_cfg["model_type"], weight_map, handles, mesh, rules, where="config.json",
                              root=path)


def load_config(path, *, dtype: str = "float32", param_dtype: str | None = None) -> ModelConfig:
    """The ModelConfig of a checkpoint folder or GGUF file, without reading the weights."""
    path = Path(path)
    if is_gguf(path):
        hf_cfg, _ = gguf_file.open_checkpoint(path)
        return _gguf_config(path, hf_cfg, dtype, param_dtype)
    return config_from_hf(_read_config_json(path), dtype=dtype, param_dtype=param_dtype)


def is_gguf(path) -> bool:
    """True for a GGUF file (by its extension; a folder is a Hugging Face checkpoint)."""
    return Path(path).suffix.lower() == ".gguf"


def _read_config_json(path: Path) -> dict:
    config_path = path / "config.json"
    if not config_path.exists():
        raise ValueError(f"{path}: no config.json (expected a Hugging Face checkpoint folder or a .gguf file)")
    return json.loads(config_path.read_text())


def _gguf_config(path: Path, hf_cfg: dict, dtype: str, param_dtype: str | None) -> ModelConfig:
    try:
        return config_from_hf(hf_cfg, dtype=dtype, param_dtype=param_dtype)
    except ValueError as e:  # the dict was derived from the file's metadata: name the file
        raise ValueError(f"{path}: {str(e).replace('config.json: ', '')}") from None


def _assemble(cfg: ModelConfig, model_type: str, weight_map: dict, handles: dict, mesh, rules, *, where: str,
              root: Path):
    """The params pytree read through safetensors-like handles (get_slice(name)[index], .get_shape())."""
    specs = _tensor_specs(cfg, model_type)  # per-layer keys ("block_i", ...), one per checkpoint tensor (group)
    abstract = jax.eval_shape(partial(init, cfg), jax.random.key(0))
    per_layer = set(traverse_util.flatten_dict(layer_stack.per_layer(abstract, cfg)))
    assert per_layer == set(specs), sorted(per_layer ^ set(specs))  # the mapping covers the whole pytree
    shapes = traverse_util.flatten_dict(abstract)  # stacked keys ("stack_k", ...)
    layers_of = {name: layers for name, layers, _ in layer_stack.stacks(layer_stack.layer_groups(cfg))}
    target = np.dtype(jnp.dtype(cfg.param_dtype))
    shardings = None
    if mesh is not None:
        rules = sharding.DEFAULT_RULES if rules is None else rules
        shardings = traverse_util.flatten_dict(param_shardings(cfg, mesh, rules))
    _check_tensors(specs, weight_map, handles, cfg, model_type, where)

    def read(spec, index):
        host = _read(handles, weight_map, spec, index)
        require_finite(host, spec.names, where_file(root, weight_map, spec))  # NaN weights never load silently
        return host.astype(target)

    def read_leaf(key, index):
        """The part `index` of our array `key`: a stacked leaf reads its layers' tensors one by one."""
        if key[0] not in layers_of:
            return read(specs[key], index)
        layers = layers_of[key[0]]
        l0, l1 = _bounds(index[0], len(layers))
        return np.stack([read(specs[(f"block_{layers[r]}", *key[1:])], index[1:]) for r in range(l0, l1)])

    leaves = {}
    for key, sd in shapes.items():
        if shardings is None:
            leaves[key] = jnp.asarray(read_leaf(key, tuple(slice(None) for _ in sd.shape)))
            continue
        cache = {}  # devices holding the same slice (replicated dims) share one read

        def shard(index, key=key, shape=sd.shape, cache=cache):
            key_ = tuple(_bounds(s, n) for s, n in zip(index, shape))
            if key_ not in cache:
                cache[key_] = read_leaf(key, index)
            return cache[key_]

        leaves[key] = jax.make_array_from_callback(sd.shape, shardings[key], shard)
    return traverse_util.unflatten_dict(leaves)


# ---- writing ---------------------------------------------------------------------------------------------------------
def _host(x) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        raise ValueError("save needs every parameter addressable from this process (gather a multi-host model first)")
    return np.asarray(jax.device_get(x))


def _to_hf(x: np.ndarray, spec: _Spec) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(np.argsort(spec.perm)).reshape(spec.hf_shape))


def save(path, cfg: ModelConfig, params, *, model_type: str | None = None, max_shard_bytes: int | None = None,
         lora=None):
    """Writes config.json and the weights (Hub layout) to the folder `path`; returns the model_type written.

    max_shard_bytes: split the weights into model-0000i-of-0000n.safetensors files of at most about this size, with
    model.safetensors.index.json; None = one model.safetensors. Parameters keep their dtype.
    lora: LoRA adapters (models/lora.py, made with cfg.lora) merged into params before writing, so the folder is a
    plain checkpoint of the adapted model.
    """
    if lora is not None:
        params = lora_adapters.merge(params, lora, cfg)
    model_type = model_type or infer_model_type(cfg)
    hf_cfg = config_to_hf(cfg, model_type)
    if not layer_stack.is_per_layer(params):  # the checkpoint's tensors are per layer
        params = layer_stack.per_layer(params, cfg)
    flat = traverse_util.flatten_dict(params)
    if cfg.tie_embeddings and cfg.scale_tied_unembed:  # an explicit lm_head computes the same logits
        out_cfg = cfg.replace(tie_embeddings=False)
        embed = _host(flat[("embed",)])
        flat[("unembed",)] = (embed.astype(np.float32).T * cfg.d_model ** -0.5).astype(embed.dtype)
    else:
        out_cfg = cfg
    specs = _tensor_specs(out_cfg, model_type)
    extra = sorted("/".join(k) for k in set(flat) - set(specs))
    if extra:
        raise ValueError(f"parameter(s) {extra} have no {model_type} checkpoint equivalent")
    tensors = {}
    for key, spec in specs.items():
        if key not in flat:
            raise ValueError(f"parameter {'/'.join(key)} is missing from params")
        x = _host(flat[key])
        want = ((len(spec.names),) if len(spec.names) > 1 else ()) + tuple(spec.split[i] for i in spec.perm)
        if x.shape != want:
            raise ValueError(f"parameter {'/'.join(key)} has shape {x.shape}, the config implies {want}")
        if len(spec.names) == 1:
            tensors[spec.names[0]] = _to_hf(x, spec)
        else:
            tensors.update((name, _to_hf(x[e], spec)) for e, name in enumerate(spec.names))

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    shards, size = [[]], 0
    for name, t in tensors.items():
        if max_shard_bytes is not None and shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += t.nbytes
    meta = {"format": "pt"}  # transformers expects the torch-layout marker
    if len(shards) == 1:
        save_file({n: tensors[n] for n in shards[0]}, str(path / _SINGLE_FILE), metadata=meta)
        return model_type
    weight_map = {}
    for i, names in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(path / fname), metadata=meta)
        weight_map.update((n, fname) for n in names)
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map}
    (path / _INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return model_type
