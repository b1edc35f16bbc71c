"""GGUF files (llama.cpp's single-file checkpoints) read as a Hugging Face checkpoint, for models/hf.py.

    hf_cfg, handle = open_checkpoint("SmolLM2-135M-Instruct.Q4_1.gguf")
    hf_cfg["model_type"], hf_cfg["num_hidden_layers"]                      # a config.json-like dict: 'llama', 30
    handle.get_slice("model.layers.0.self_attn.q_proj.weight")[:, :8]      # float32, torch layout [out, in]

`models.hf.load(path)` is the entry point (it maps these Hugging Face names onto the params pytree exactly as for a
safetensors folder); this module only translates the file:

- metadata -> config.json: `general.architecture` (llama, qwen2, qwen3) and its `{arch}.block_count`,
  `.embedding_length`, `.feed_forward_length`, `.attention.head_count(_kv)`, `.attention.key_length` (head dim),
  `.rope.freq_base`, `.attention.layer_norm_rms_epsilon`, `.context_length`; the vocabulary is the embedding's row
  count; no `output.weight` tensor = tied embeddings.
- tensors: GGUF names (`blk.{i}.attn_q.weight`, ...) -> Hugging Face names; every tensor is dequantized to float32
  on first read (`gguf.quants.dequantize`; types in DEQUANTIZED) and checked finite. GGUF dims are listed fastest
  first, so a tensor's numpy shape is already torch's [out, in].
- llama only: llama.cpp's converter reorders the rows of each head of the Q and K projections so that the two
  halves of each rotary pair sit next to each other (interleaved rotary, rows 2i and 2i + 1); our attention rotates
  dims i and i + head_dim/2 (Hugging Face's half split), so those rows are put back (`unpermute_rotary_rows`). Qwen
  files are converted without the reordering (llama.cpp runs them with the half-split rotary).

Anything this loader cannot represent (another architecture, mixture-of-experts files, rope scaling, per-layer head
counts, an unsupported tensor type, a missing metadata key, a truncated file, NaN weights, an unknown tensor) is a
ValueError naming the file and the key or tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

ARCHITECTURES = ("llama", "qwen2", "qwen3")  # general.architecture values, each the Hugging Face model_type too
_REQUIRED = object()

_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


DEQUANTIZED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")  # tensor types read


# ---- the file ------------------------------------------------------------------------------------------------------
def _reader(path: Path):
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, KeyError, OverflowError, TypeError) as e:
        # GGUFReader maps the file and slices each tensor out of it: a file cut short fails to reshape its last
        # tensors (or its header), a corrupt one in the header.
        raise ValueError(f"{path}: not a readable GGUF file, truncated or corrupt ({path.stat().st_size} bytes): "
                         f"{type(e).__name__}: {e}") from None


def _field(reader, path: Path, key: str, default=_REQUIRED):
    field = reader.get_field(key)
    if field is None:
        if default is _REQUIRED:
            raise ValueError(f"{path}: metadata key {key!r} is missing")
        return default
    value = field.contents()
    if isinstance(value, list):
        raise ValueError(f"{path}: metadata key {key!r} is a per-layer list {value[:4]}...; only one value for "
                         f"every layer is supported")
    return value


# ---- metadata -> config.json ---------------------------------------------------------------------------------------
def hf_config(reader, path: Path) -> dict:
    """The config.json dict (for models.hf.config_from_hf) of an opened GGUF file."""
    arch = _field(reader, path, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} (general.architecture) is not supported; supported: "
                         f"{list(ARCHITECTURES)}")
    get = lambda key, default=_REQUIRED: _field(reader, path, f"{arch}.{key}", default)  # noqa: E731
    if get("expert_count", 0):
        raise ValueError(f"{path}: {arch}.expert_count = {get('expert_count')}: mixture-of-experts GGUF files are "
                         f"not supported (dense {list(ARCHITECTURES)} only)")
    scaling = get("rope.scaling.type", "none")
    if scaling not in ("none", ""):
        raise ValueError(f"{path}: {arch}.rope.scaling.type {scaling!r} is not supported (only the default rotary "
                         f"embedding is implemented)")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path}: tensor 'token_embd.weight' is missing")
    d_model, heads = int(get("embedding_length")), int(get("attention.head_count"))
    vocab = int(embed.shape[-1])  # GGUF dims fastest first: [d_model, vocab]
    if int(get("vocab_size", vocab)) != vocab:
        raise ValueError(f"{path}: {arch}.vocab_size = {get('vocab_size')} but token_embd.weight has {vocab} rows")
    head_dim = int(get("attention.key_length", d_model // heads))
    for key in ("attention.value_length", "rope.dimension_count"):
        if int(get(key, head_dim)) != head_dim:
            raise ValueError(f"{path}: {arch}.{key} = {get(key)} differs from the head dim {head_dim} (only full "
                             f"rotary on equal key / value heads is implemented)")
    return {
        "model_type": arch, "vocab_size": vocab, "hidden_size": d_model,
        "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim, "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10_000.0)), "hidden_act": "silu",
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
    }


# ---- tensors -------------------------------------------------------------------------------------------------------
def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name (None if this loader does not know it)."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}"
    return None


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order: within each head, rows (2i, 2i + 1) go back to (i, i + head_dim / 2)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Slice:
    """safetensors' get_slice stand-in: the shape, and the dequantized tensor cut by an index."""

    def __init__(self, handle: "GGUFHandle", name: str):
        self._handle, self._name = handle, name

    def get_shape(self) -> list[int]:
        return list(self._handle.shapes[self._name])

    def __getitem__(self, index):
        return self._handle.dequantized(self._name)[index]


class GGUFHandle:
    """The tensors of a GGUF file under Hugging Face names, read like a safetensors file (keys, get_slice).

    A tensor is dequantized when first read and kept until another one is read: models.hf.load reads one parameter
    at a time (every device's slice of it), so one float32 copy of one tensor is held at a time."""

    def __init__(self, path: Path, reader, hf_cfg: dict):
        self.path, self._reader = path, reader
        unknown = [t.name for t in reader.tensors if hf_name(t.name) is None]
        if unknown:
            raise ValueError(f"{path}: tensor(s) {unknown[:5]} are not part of a dense {hf_cfg['model_type']} model "
                             f"this loader maps (rope frequency factors, experts, ...)")
        supported = {GGMLQuantizationType[n] for n in DEQUANTIZED}
        for t in reader.tensors:
            if t.tensor_type not in supported:
                raise ValueError(f"{path}: tensor {t.name} has type {t.tensor_type.name}, which is not dequantized "
                                 f"here (supported: {', '.join(DEQUANTIZED)})")
        self._tensors = {hf_name(t.name): t for t in reader.tensors}
        self.shapes = {name: tuple(int(d) for d in reversed(t.shape.tolist())) for name, t in self._tensors.items()}
        # Heads whose Q / K rows llama.cpp reordered (llama only; see the module docstring).
        self._permuted = {}
        if hf_cfg["model_type"] == "llama":
            for name in self._tensors:
                if name.endswith("self_attn.q_proj.weight"):
                    self._permuted[name] = hf_cfg["num_attention_heads"]
                elif name.endswith("self_attn.k_proj.weight"):
                    self._permuted[name] = hf_cfg["num_key_value_heads"]
        self._cached: tuple[str, np.ndarray] | None = None

    def keys(self):
        return list(self._tensors)

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self, name)

    def dequantized(self, name: str) -> np.ndarray:
        """The whole tensor `name`, float32, in the Hugging Face layout."""
        if self._cached is not None and self._cached[0] == name:
            return self._cached[1]
        t = self._tensors[name]
        w = np.asarray(dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32).reshape(self.shapes[name])
        if not np.isfinite(w).all():
            bad = int(np.size(w) - np.isfinite(w).sum())
            raise ValueError(f"{self.path}: tensor {t.name} ({t.tensor_type.name}) has {bad} non-finite values "
                             f"(NaN or inf) after dequantization")
        if name in self._permuted:
            w = unpermute_rotary_rows(w, self._permuted[name])
        self._cached = (name, w)
        return w


def open_checkpoint(path) -> tuple[dict, GGUFHandle]:
    """(config.json dict, tensors under Hugging Face names) of a GGUF file; ValueError naming the file and problem."""
    path = Path(path)
    reader = _reader(path)
    hf_cfg = hf_config(reader, path)
    return hf_cfg, GGUFHandle(path, reader, hf_cfg)
