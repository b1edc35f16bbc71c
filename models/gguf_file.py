"""GGUF files (llama.cpp's single-file checkpoints) read as a Hugging Face checkpoint, for models/hf.py.

    hf_cfg, handle = open_checkpoint("SmolLM2-135M-Instruct.Q4_1.gguf")
    hf_cfg["model_type"], hf_cfg["num_hidden_layers"]                      # a config.json-like dict: 'llama', 30
    handle.get_slice("model.layers.0.self_attn.q_proj.weight")[:, :8]      # float32, torch layout [out, in]

`models.hf.load(path)` is the entry point (it maps these Hugging Face names onto the params pytree exactly as for a
safetensors folder); this module only translates the file:

- metadata -> config.json: `general.architecture` and its `{arch}.block_count`, `.embedding_length`,
  `.feed_forward_length`, `.attention.head_count(_kv)`, `.attention.key_length` (head dim), `.rope.freq_base`,
  `.attention.layer_norm_rms_epsilon`, `.context_length`; the vocabulary is the embedding's row count; no
  `output.weight` tensor = tied embeddings. Architectures: llama (with `.expert_count` > 0: Mixtral, model_type
  mixtral), qwen2, qwen3 and qwen3moe (`.expert_count`, `.expert_used_count`, `.expert_feed_forward_length`,
  `.expert_weights_norm`, default true as llama.cpp runs it; blocks without a router are dense).
- tensors: GGUF names (`blk.{i}.attn_q.weight`, ...) -> Hugging Face names; every tensor is dequantized to float32
  on first read (`gguf.quants.dequantize`; types in DEQUANTIZED) and checked finite. GGUF dims are listed fastest
  first, so a tensor's numpy shape is already torch's [out, in]; the experts of a block are one [E, out, in] tensor
  (`ffn_gate_exps`, ...), served as one Hugging Face tensor per expert.
- llama (and so Mixtral): llama.cpp's converter reorders the rows of each head of the Q and K projections so that
  the two halves of each rotary pair sit next to each other (interleaved rotary, rows 2i and 2i + 1); our attention
  rotates dims i and i + head_dim/2 (Hugging Face's half split), so those rows are put back
  (`unpermute_rotary_rows`). Qwen files are converted without the reordering (llama.cpp runs them half-split).

Anything this loader cannot represent (another architecture, rope scaling, per-layer head counts, an unsupported
tensor type, a missing metadata key, a truncated file, NaN weights, an unknown tensor) is a ValueError naming the
file and the key or tensor. Before gguf's reader sees a file, check_layout walks its header and holds every count
and length (tensors, metadata keys, strings, arrays, tensor dims) against the bytes left in the file: gguf's reader
trusts them, and one array length of 2^40 in a 113 KB file made it allocate without bound.
"""

from __future__ import annotations

import functools
import mmap
import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe")  # general.architecture values read
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
_EXPERT_NAMES = {"ffn_gate_exps.weight": ("gate_proj", "w1"), "ffn_up_exps.weight": ("up_proj", "w3"),
                 "ffn_down_exps.weight": ("down_proj", "w2")}  # Hugging Face names: (qwen3_moe, mixtral)


DEQUANTIZED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")  # tensor types read


# ---- the file ------------------------------------------------------------------------------------------------------
class LayoutError(ValueError):
    """A count or length in a GGUF header that the file's size cannot hold (check_layout); names the file."""


# GGUF metadata value types: fixed sizes of the scalars (GGUFValueType: uint8 .. float64, bool), string, array.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NESTING = 4  # arrays of arrays (no real file nests them; the walk recurses once per level)


def check_layout(path: Path) -> None:
    """LayoutError unless every count and length in the header of the GGUF file at `path` fits the bytes left after
    it: the tensor and metadata counts, each key and string length, each array's length (times its item size), each
    tensor's dims and element count (no tensor type stores under one bit per element). Files that are not GGUF (no
    magic) are left to gguf's reader to refuse."""
    size = path.stat().st_size
    if size < 24:
        raise _layout_error(path, size, "the header alone takes 24")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            return
        _walk_header(data, size, path)


def _layout_error(path: Path, size: int, detail: str) -> LayoutError:
    return LayoutError(f"{path}: not a readable GGUF file, truncated or corrupt ({size} bytes): {detail}")


def _walk_header(data, size: int, path: Path) -> None:
    """check_layout's walk: a cursor over the header, each read checked against the bytes left before it is made."""
    # gguf's reader takes a version whose low 16 bits are 0 as a file of the other byte order; so does this walk.
    order = "<" if struct.unpack_from("<I", data, 4)[0] & 0xFFFF else ">"
    if struct.unpack_from(order + "I", data, 4)[0] not in (2, 3):
        return  # a version gguf's reader refuses itself (version 1 had 32-bit counts)
    pos = 8

    def take(n: int, what: str) -> int:
        nonlocal pos
        if n > size - pos:
            raise _layout_error(path, size, f"{what} needs {n} bytes at offset {pos}, the file has {size - pos} left")
        pos += n
        return pos - n

    def number(fmt: str, what: str) -> int:
        return struct.unpack_from(order + fmt, data, take(struct.calcsize(fmt), what))[0]

    def string(what: str) -> str:
        n = number("Q", f"the length of {what}")
        start = take(n, what)
        return bytes(data[start: start + min(n, 100)]).decode("utf-8", "replace")  # a name, as errors show it

    def value(kind: int, key: str, depth: int = 0) -> None:
        if kind in _SCALAR_BYTES:
            take(_SCALAR_BYTES[kind], f"metadata key {key!r}")
        elif kind == _STRING:
            string(f"metadata key {key!r}'s string")
        elif kind == _ARRAY and depth < _MAX_NESTING:
            item = number("I", f"metadata key {key!r}'s item type")
            count = number("Q", f"metadata key {key!r}'s length")
            # The least an item takes (a string: its 8-byte length; an array: type + length), checked at once.
            least = _SCALAR_BYTES.get(item, 8 if item == _STRING else 12)
            if count * least > size - pos:
                raise _layout_error(path, size, f"metadata key {key!r} claims {count} array items of at least "
                                                f"{least} bytes, the file has {size - pos} bytes left")
            if item in _SCALAR_BYTES:
                take(count * least, f"metadata key {key!r}'s items")
            else:
                for _ in range(count):
                    value(item, key, depth + 1)
        else:
            raise _layout_error(path, size, f"metadata key {key!r} has value type {kind} (or arrays nested over "
                                            f"{_MAX_NESTING} deep), which this reader does not take")

    n_tensors = number("Q", "the tensor count")
    n_keys = number("Q", "the metadata key count")
    for count, least, what in ((n_keys, 8 + 4 + 1, "metadata keys"), (n_tensors, 8 + 4 + 4 + 8, "tensors")):
        if count * least > size - pos:
            raise _layout_error(path, size, f"the header claims {count} {what}, more than the file can hold")
    for i in range(n_keys):
        key = string(f"metadata key #{i}'s name")
        value(number("I", f"metadata key {key!r}'s type"), key)
    for i in range(n_tensors):
        name = string(f"tensor #{i}'s name")
        n_dims = number("I", f"tensor {name!r}'s dimension count")
        if n_dims > _MAX_DIMS:
            raise _layout_error(path, size, f"tensor {name!r} has {n_dims} dimensions (GGUF allows {_MAX_DIMS})")
        dims = struct.unpack_from(f"{order}{n_dims}Q", data, take(8 * n_dims, f"tensor {name!r}'s dims"))
        elements = 1
        for d in dims:
            elements *= d  # Python ints: no overflow
        if elements > 8 * size:
            raise _layout_error(path, size, f"tensor {name!r} has dims {list(dims)} ({elements} elements), more than "
                                            f"the file can hold")
        take(4 + 8, f"tensor {name!r}'s type and offset")


@functools.lru_cache(maxsize=2)
def _parsed(path: str, mtime_ns: int, size: int):
    """GGUFReader of an unchanged file, parsed once until the weights are read (GGUFHandle.release clears this): a
    run reads the tokenizer and the config, then the weights, of the same file, and parsing a real file's metadata
    (its vocabulary and merges) takes seconds. The reader only maps the file; the tensors are read on demand. The
    header's counts and lengths are checked first (check_layout)."""
    check_layout(Path(path))
    return GGUFReader(path)


def reader(path) -> GGUFReader:
    """gguf's reader of the file at `path`, its header checked (check_layout) and parsed once per process;
    ValueError naming the file when it is not a readable GGUF file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such GGUF file")
    stat = path.stat()
    try:
        return _parsed(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    except LayoutError:
        raise
    except (ValueError, IndexError, KeyError, OverflowError, TypeError) as e:
        # GGUFReader maps the file and slices each tensor out of it: a file cut short fails to reshape its last
        # tensors (or its header), a corrupt one in the header.
        raise ValueError(f"{path}: not a readable GGUF file, truncated or corrupt ({path.stat().st_size} bytes): "
                         f"{type(e).__name__}: {e}") from None


def contents(field, path: Path, key: str):
    """A metadata field's value (str, number, or list); ValueError naming the file and key for text that is not
    UTF-8 (gguf decodes strings strictly)."""
    try:
        return field.contents()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: metadata key {key!r} holds text that is not UTF-8 ({e.reason})") from None


def _field(reader, path: Path, key: str, default=_REQUIRED):
    field = reader.get_field(key)
    if field is None:
        if default is _REQUIRED:
            raise ValueError(f"{path}: metadata key {key!r} is missing")
        return default
    value = contents(field, path, key)
    if isinstance(value, list):
        raise ValueError(f"{path}: metadata key {key!r} is a per-layer list {value[:4]}...; only one value for "
                         f"every layer is supported")
    return value


def whole_number(value, path: Path, key: str, least: int = 1) -> int:
    """value as an int >= least (a count, size or id: GGUF stores them as integers; an integral float is taken);
    ValueError naming the file and key for inf, nan, a fraction, text, a bool or a smaller number."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{path}: metadata key {key!r} must be an integer >= {least}, got {value!r}")
    return value


def _positive(value, path: Path, key: str) -> float:
    """value as a finite float > 0 (an epsilon, a rotary base); ValueError naming the file and key otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{path}: metadata key {key!r} must be a finite number > 0, got {value!r}")
    return float(value)


# ---- metadata -> config.json ---------------------------------------------------------------------------------------
def hf_config(reader, path: Path) -> dict:
    """The config.json dict (for models.hf.config_from_hf) of an opened GGUF file."""
    arch = _field(reader, path, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} (general.architecture) is not supported; supported: "
                         f"{list(ARCHITECTURES)}")
    get = lambda key, default=_REQUIRED: _field(reader, path, f"{arch}.{key}", default)  # noqa: E731

    def count(key, default=_REQUIRED, least=1) -> int:  # an integer value, checked (inf, 0 heads: named errors)
        return whole_number(get(key, default), path, f"{arch}.{key}", least)

    scaling = get("rope.scaling.type", "none")
    if scaling not in ("none", ""):
        raise ValueError(f"{path}: {arch}.rope.scaling.type {scaling!r} is not supported (only the default rotary "
                         f"embedding is implemented)")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path}: tensor 'token_embd.weight' is missing")
    d_model, heads = count("embedding_length"), count("attention.head_count")
    vocab = int(embed.shape[-1])  # GGUF dims fastest first: [d_model, vocab]
    if count("vocab_size", vocab) != vocab:
        raise ValueError(f"{path}: {arch}.vocab_size = {get('vocab_size')} but token_embd.weight has {vocab} rows")
    head_dim = count("attention.key_length", max(1, d_model // heads))
    for key in ("attention.value_length", "rope.dimension_count"):
        if count(key, head_dim) != head_dim:
            raise ValueError(f"{path}: {arch}.{key} = {get(key)} differs from the head dim {head_dim} (only full "
                             f"rotary on equal key / value heads is implemented)")
    n_layers, n_experts = count("block_count"), count("expert_count", 0, least=0)
    if arch == "qwen3moe" and not n_experts:
        raise ValueError(f"{path}: metadata key 'qwen3moe.expert_count' is missing")
    hf = {
        "model_type": arch, "vocab_size": vocab, "hidden_size": d_model, "num_hidden_layers": n_layers,
        "intermediate_size": count("feed_forward_length", 0, least=0) if n_experts else count("feed_forward_length"),
        "num_attention_heads": heads, "num_key_value_heads": count("attention.head_count_kv", heads),
        "head_dim": head_dim, "max_position_embeddings": count("context_length"),
        "rms_norm_eps": _positive(get("attention.layer_norm_rms_epsilon"), path,
                                  f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": _positive(get("rope.freq_base", 10_000.0), path, f"{arch}.rope.freq_base"), "hidden_act": "silu",
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
    }
    if not n_experts:
        return hf
    routed = {int(t.name.split(".")[1]) for t in reader.tensors if t.name.endswith(".ffn_gate_inp.weight")}
    dense = sorted(set(range(n_layers)) - routed)
    norm = bool(get("expert_weights_norm", True))
    used = count("expert_used_count")
    if arch == "llama":  # Mixtral: every block routed, top-k renormalised
        if dense or not norm:
            raise ValueError(f"{path}: a llama file with experts is read as Mixtral, which routes every block and "
                             f"renormalises the top-k weights (blocks without a router: {dense})")
        # GGUF dims fastest first: an experts tensor is [d_model, expert width, experts]
        widths = [int(t.shape[1]) for t in reader.tensors if t.name.endswith("ffn_gate_exps.weight")]
        hf.update(model_type="mixtral", num_local_experts=n_experts, num_experts_per_tok=used,
                  intermediate_size=count("expert_feed_forward_length", widths[0] if widths else _REQUIRED))
    else:
        hf.update(model_type="qwen3_moe", num_experts=n_experts, num_experts_per_tok=used, decoder_sparse_step=1,
                  moe_intermediate_size=count("expert_feed_forward_length"), mlp_only_layers=dense,
                  norm_topk_prob=norm)
        if dense and not hf["intermediate_size"]:
            raise ValueError(f"{path}: metadata key 'qwen3moe.feed_forward_length' is missing (blocks {dense} are "
                             f"dense)")
        hf["intermediate_size"] = hf["intermediate_size"] or hf["moe_intermediate_size"]
    return hf


# ---- tensors -------------------------------------------------------------------------------------------------------
def hf_names(gguf_name: str, model_type: str, n_experts: int = 0) -> list[str] | None:
    """The Hugging Face name(s) of a GGUF tensor (one per expert for an experts tensor); None if unknown."""
    if gguf_name in _TOP_NAMES:
        return [_TOP_NAMES[gguf_name]]
    parts = gguf_name.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    pre, rest = f"model.layers.{parts[1]}.", parts[2]
    moe = pre + ("block_sparse_moe." if model_type == "mixtral" else "mlp.")
    if rest in _BLOCK_NAMES:
        return [pre + _BLOCK_NAMES[rest]]
    if n_experts and rest == "ffn_gate_inp.weight":
        return [moe + "gate.weight"]
    if n_experts and rest in _EXPERT_NAMES:
        name = _EXPERT_NAMES[rest][model_type == "mixtral"]
        return [f"{moe}experts.{e}.{name}.weight" for e in range(n_experts)]
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
        model_type = hf_cfg["model_type"]
        n_experts = hf_cfg.get("num_experts", hf_cfg.get("num_local_experts", 0))
        names = {t.name: hf_names(t.name, model_type, n_experts) for t in reader.tensors}
        unknown = [name for name, hf in names.items() if hf is None]
        if unknown:
            raise ValueError(f"{path}: tensor(s) {unknown[:5]} are not part of a {model_type} model this loader "
                             f"maps (rope frequency factors, per-expert tensors of old files, ...)")
        supported = {GGMLQuantizationType[n] for n in DEQUANTIZED}
        for t in reader.tensors:
            if t.tensor_type not in supported:
                raise ValueError(f"{path}: tensor {t.name} has type {t.tensor_type.name}, which is not dequantized "
                                 f"here (supported: {', '.join(DEQUANTIZED)})")
        # Hugging Face name -> (GGUF tensor, expert index or None), and its shape in the Hugging Face layout.
        self._entries, self.shapes = {}, {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            experts = len(names[t.name]) > 1 or t.name.endswith("_exps.weight")
            if experts and (len(shape) != 3 or shape[0] != n_experts):
                raise ValueError(f"{path}: tensor {t.name} has shape {shape}, expected [{n_experts}, out, in]")
            for e, name in enumerate(names[t.name]):
                self._entries[name] = (t, e if experts else None)
                self.shapes[name] = shape[1:] if experts else shape
        # Heads whose Q / K rows llama.cpp reordered (llama and Mixtral; see the module docstring).
        self._permuted = {}
        if model_type in ("llama", "mixtral"):
            for name in self._entries:
                if name.endswith("self_attn.q_proj.weight"):
                    self._permuted[name] = hf_cfg["num_attention_heads"]
                elif name.endswith("self_attn.k_proj.weight"):
                    self._permuted[name] = hf_cfg["num_key_value_heads"]
        self._cached: tuple[str, np.ndarray] | None = None

    def keys(self):
        return list(self._entries)

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self, name)

    def _whole(self, t) -> np.ndarray:
        """A GGUF tensor dequantized to float32 (kept until another one is read: experts come one after another)."""
        if self._cached is not None and self._cached[0] == t.name:
            return self._cached[1]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = np.asarray(dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32).reshape(shape)
        if not np.isfinite(w).all():
            bad = int(np.size(w) - np.isfinite(w).sum())
            raise ValueError(f"{self.path}: tensor {t.name} ({t.tensor_type.name}) has {bad} non-finite values "
                             f"(NaN or inf) after dequantization")
        self._cached = (t.name, w)
        return w

    def release(self) -> None:
        """Drop what reading held (models.hf.load calls it when the weights are in place): the dequantized tensor,
        the file's pages reading touched and the parsed readers' cache (a later read parses the file again, ~3 s
        for SmolLM2's). Held otherwise for the whole run: 94 MiB of SmolLM2's mapped Q4_1 file and ~150 MiB of
        its parsed metadata (gguf's reader keeps each of the 49,152 tokens and merges as numpy arrays)."""
        self._cached = None
        drop_pages(self._reader)
        _parsed.cache_clear()

    def check_finite(self) -> None:
        """Every tensor dequantized once (one held at a time) and checked finite: ValueError naming the file and the
        first tensor that is not (the dry run's scan, models/hf_checks.check_gguf)."""
        for t in {t.name: t for t, _ in self._entries.values()}.values():
            self._whole(t)
        self._cached = None

    def dequantized(self, name: str) -> np.ndarray:
        """The whole tensor `name`, float32, in the Hugging Face layout."""
        t, expert = self._entries[name]
        w = self._whole(t)
        w = w if expert is None else w[expert]
        return unpermute_rotary_rows(w, self._permuted[name]) if name in self._permuted else w


def drop_pages(opened: GGUFReader) -> None:
    """madvise(MADV_DONTNEED) over the reader's read-only map of its file: the kernel drops the pages from this
    process (they stay in the page cache; the next read maps them again, unchanged). Where numpy's map or the call
    is missing (not Linux), nothing happens."""
    mapped = getattr(getattr(opened, "data", None), "_mmap", None)  # np.memmap keeps its mmap.mmap there
    if mapped is not None and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)


def open_checkpoint(path) -> tuple[dict, GGUFHandle]:
    """(config.json dict, tensors under Hugging Face names) of a GGUF file; ValueError naming the file and problem."""
    path = Path(path)
    opened = reader(path)
    hf_cfg = hf_config(opened, path)
    return hf_cfg, GGUFHandle(path, opened, hf_cfg)
