"""Checks of a Hugging Face checkpoint folder before any compute, each problem a ValueError naming the file.

    hf_json = read_config(path)                    # config.json: readable, a JSON object
    problems = check_gguf(path, cfg)               # a GGUF file: tensor shapes against its metadata, weights finite
    problems = check_folder(path, cfg, model_type) # safetensors files (complete, sane headers, offsets inside the
                                                   # file, every shard of the index present), tensor shapes against
                                                   # config.json, every weight finite
    check_tokenizer_files(path)                    # tokenizer.json / tokenizer_config.json / generation_config.json
    check_template(tok, where)                     # the chat template renders a probe conversation, bounded
    text = bounded(lambda: ...)                    # any callable under the step / time limit (every chat template
                                                   # render is bounded already: models/chat_template.py)
    (models.hf.require_finite is the matching hook models.hf.load calls on every tensor)

What each check costs: the headers are read (a few KiB per file); the finiteness scan reads every weight once,
memory-mapped, in chunks (measured with the file in the page cache on the loaded 2-core machine: 2.3 GB/s float32,
0.45 GB/s bfloat16, whose bit test is slower), so the dry run of a real checkpoint takes that long. Nothing here
builds the model. A GGUF file gets the same shape and finiteness checks (check_gguf: its metadata is checked as
models/gguf_file.py reads it; every tensor is dequantized once, ~0.8 s for SmolLM2-135M's Q4_1 file).

A chat template is a program: every render goes through models/chat_template.py's bounded renderer (steps, time,
operator and output-size limits), so a template that loops or builds a huge value is an error in the dry run, not
a hung launcher; check_template renders a probe conversation.
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from models import gguf_file, hf
from models.chat_template import MAX_SECONDS, MAX_STEPS, TemplateLimit, bounded  # noqa: F401 - re-exported

_SINGLE_FILE, _INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
_HEADER_LIMIT = 100 * 1024 * 1024  # safetensors' own bound on the JSON header
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
                "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
# float dtype -> (unsigned view, exponent mask): all exponent bits set = inf or nan
_EXPONENT = {"F64": (np.uint64, 0x7FF0000000000000), "F32": (np.uint32, 0x7F800000), "F16": (np.uint16, 0x7C00),
             "BF16": (np.uint16, 0x7F80)}
_FLOATS = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2")}
_CHUNK_BYTES = 64 << 20
# The chat template's bounds live with its one renderer (models/chat_template.py); these names stay for callers.
MAX_TEMPLATE_STEPS, MAX_TEMPLATE_SECONDS = MAX_STEPS, MAX_SECONDS


# ---- config.json ------------------------------------------------------------------------------------------------------
def read_json_object(path: Path, what: str = "") -> dict:
    """A JSON file that must hold an object; ValueError naming the file otherwise."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object{what}, got a {type(data).__name__}")
    return data


def read_config(path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: not a folder (expected a Hugging Face checkpoint folder)")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path}: no config.json (expected a Hugging Face checkpoint folder)")
    return read_json_object(path / "config.json", " (the model's configuration)")


# ---- safetensors ------------------------------------------------------------------------------------------------------
def _header(file: Path) -> tuple[dict, int]:
    """(tensor entries, byte offset of the data) of one safetensors file, every offset checked against its size."""
    size = file.stat().st_size
    if size < 8:
        raise ValueError(f"{file}: {size} bytes, too short for a safetensors file (truncated or empty)")
    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > _HEADER_LIMIT or 8 + n > size:
            raise ValueError(f"{file}: header length {n} does not fit the file's {size} bytes (truncated, or not a "
                             "safetensors file)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{file}: the header is not JSON (not a safetensors file, or a damaged one)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: the header must be a JSON object, got a {type(header).__name__}")
    data_bytes = size - 8 - n
    entries = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(e, dict) and e.get("dtype") in _DTYPE_BYTES and isinstance(e.get("shape"), list)
              and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in e["shape"])
              and isinstance(e.get("data_offsets"), list) and len(e["data_offsets"]) == 2
              and all(isinstance(o, int) and not isinstance(o, bool) for o in e["data_offsets"]))
        if not ok:
            raise ValueError(f"{file}: tensor {name!r} has a malformed header entry {str(e)[:120]}")
        begin, end = e["data_offsets"]
        want = math.prod(e["shape"]) * _DTYPE_BYTES[e["dtype"]]
        if not 0 <= begin <= end or end - begin != want:
            raise ValueError(f"{file}: tensor {name!r} ({e['dtype']} {e['shape']}) has data offsets {begin}..{end}, "
                             f"its shape needs {want} bytes")
        if end > data_bytes:
            raise ValueError(f"{file}: tensor {name!r} ends at byte {end} of the data, the file holds {data_bytes} "
                             "(truncated)")
        entries[name] = e
    return entries, 8 + n


def tensor_headers(path) -> dict[str, tuple[Path, dict, int]]:
    """{tensor name: (file, header entry, data offset)} over the folder's weights (one file or an index and its
    shards); ValueError naming the file for a missing shard, a damaged header, a tensor outside its file."""
    path = Path(path)
    if (path / _INDEX_FILE).exists():
        index = read_json_object(path / _INDEX_FILE)
        wmap = index.get("weight_map")
        if not isinstance(wmap, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
            raise ValueError(f"{path / _INDEX_FILE}: weight_map must map tensor names to file names")
        files = sorted(set(wmap.values()))
        bad = [f for f in files if os.sep in f or f.startswith(".") or not f.endswith(".safetensors")]
        if bad:
            raise ValueError(f"{path / _INDEX_FILE}: weight_map names {bad[0]!r}, not a .safetensors file of the folder")
        missing = [f for f in files if not (path / f).is_file()]
        if missing:
            raise ValueError(f"{path / _INDEX_FILE}: shard(s) {missing} are missing from {path}")
    elif (path / _SINGLE_FILE).exists():
        wmap, files = None, [_SINGLE_FILE]
    else:
        raise ValueError(f"{path}: no {_SINGLE_FILE} or {_INDEX_FILE}")
    out = {}
    for f in files:
        entries, offset = _header(path / f)
        out.update((name, (path / f, e, offset)) for name, e in entries.items())
    if wmap is not None:
        absent = [n for n, f in wmap.items() if n not in out or out[n][0].name != f]
        if absent:
            raise ValueError(f"{path / _INDEX_FILE}: tensor {absent[0]!r} is not in {wmap[absent[0]]} "
                             f"({len(absent)} such)")
    return out


class _HeaderHandle:
    """What models.hf._check_tensors reads from a safe_open handle (get_slice(name).get_shape()), from headers."""

    def __init__(self, headers):
        self._headers = headers

    def get_slice(self, name):
        shape = self._headers[name][1]["shape"]
        return type("_Slice", (), {"get_shape": lambda self: list(shape)})()


def check_shapes(path, headers, cfg, model_type: str) -> None:
    """Every tensor config.json implies is present with its shape, and none is left over (models.hf's own rule)."""
    handle = _HeaderHandle(headers)
    weight_map = {name: "all" for name in headers}
    try:
        hf._check_tensors(hf._tensor_specs(cfg, model_type), weight_map, {"all": handle}, cfg, model_type)
    except ValueError as e:
        raise ValueError(f"{Path(path) / 'config.json'} and the weights disagree: {e}") from None


def _nonfinite(file: Path, e: dict, offset: int) -> int:
    """How many inf / nan values a float tensor holds (0 for other dtypes), read memory-mapped in chunks."""
    if e["dtype"] not in _EXPONENT:
        return 0
    view, mask = _EXPONENT[e["dtype"]]
    begin, end = e["data_offsets"]
    if end == begin:
        return 0
    native = _FLOATS.get(e["dtype"])  # numpy's own isfinite where numpy has the type (faster than the bit test)
    dtype = native or view
    data = np.memmap(file, dtype=dtype, mode="r", offset=offset + begin, shape=((end - begin) // view().itemsize,))
    step = max(1, _CHUNK_BYTES // view().itemsize)
    bad = 0
    for i in range(0, data.size, step):
        chunk = data[i:i + step]
        bad += int(chunk.size - np.count_nonzero(np.isfinite(chunk)) if native
                   else np.count_nonzero((chunk & view(mask)) == view(mask)))
    return bad


def check_finite(headers) -> None:
    bad = [(name, n) for name, (f, e, off) in sorted(headers.items()) if (n := _nonfinite(f, e, off))]
    if bad:
        name, n = bad[0]
        raise ValueError(f"{headers[name][0]}: tensor {name!r} holds {n} inf/nan value(s)"
                         + (f" ({len(bad)} tensors do)" if len(bad) > 1 else ""))


# ---- tokenizer files --------------------------------------------------------------------------------------------------
def _token_ok(v) -> bool:
    return v is None or isinstance(v, str) or (isinstance(v, dict) and isinstance(v.get("content"), str))


def check_tokenizer_files(path) -> None:
    """tokenizer.json, tokenizer_config.json and generation_config.json hold what models.tokenizer reads."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"{path}: no tokenizer.json (a fast-tokenizer folder is required)")
    tj = read_json_object(path / "tokenizer.json")
    if not isinstance(tj.get("model"), dict):
        raise ValueError(f"{path / 'tokenizer.json'}: no 'model' object (not a tokenizers file)")
    try:
        Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as e:  # the Rust loader raises a plain Exception for a schema it cannot read
        raise ValueError(f"{path / 'tokenizer.json'}: the tokenizers library cannot read it ({str(e)[:200]})") from None
    if (path / "tokenizer_config.json").exists():
        tc = read_json_object(path / "tokenizer_config.json")
        for key in ("eos_token", "pad_token", "bos_token", "unk_token"):
            if not _token_ok(tc.get(key)):
                raise ValueError(f"{path / 'tokenizer_config.json'}: {key} must be a string or "
                                 f"{{\"content\": ...}}, got {str(tc.get(key))[:80]}")
        ct = tc.get("chat_template")
        if not (ct is None or isinstance(ct, str) or (isinstance(ct, list) and all(
                isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
                for t in ct))):
            raise ValueError(f"{path / 'tokenizer_config.json'}: chat_template must be a string or a list of "
                             "{\"name\", \"template\"} objects")
    if (path / "generation_config.json").exists():
        gc = read_json_object(path / "generation_config.json")
        eos = gc.get("eos_token_id")
        ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else None if eos is None else [None]
        if ids is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ValueError(f"{path / 'generation_config.json'}: eos_token_id must be an id or a list of ids, "
                             f"got {str(eos)[:80]}")
    if (path / "chat_template.jinja").exists():
        try:
            (path / "chat_template.jinja").read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{path / 'chat_template.jinja'}: cannot be read ({e})") from None


# ---- the chat template ------------------------------------------------------------------------------------------------
PROBE = [{"role": "user", "content": "Question: 12 + 30 = ?"}]


def check_template(tok, where: str) -> None:
    """The folder's chat template compiles and renders a one-turn conversation within the bounds."""
    try:
        text = bounded(lambda: tok.render_chat_template(PROBE))
    except TemplateLimit as e:
        raise ValueError(f"{where}: {e}") from None
    except Exception as e:  # a template is the folder's program: any failure is its own
        raise ValueError(f"{where}: the chat template fails on a one-turn conversation "
                         f"({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(text, str) or PROBE[0]["content"] not in text:
        raise ValueError(f"{where}: the chat template's output does not contain the user's message")


# ---- a GGUF file ------------------------------------------------------------------------------------------------------
def check_gguf(path, cfg) -> list[str]:
    """Every problem of a GGUF file's weights, one message each (empty: all sound): the tensors its metadata implies,
    with their shapes (models.hf's own rule; attention.head_count_kv that disagrees with attn_k is caught here, not
    after compiling), and every tensor finite after dequantization. `cfg`: the dense ModelConfig the file holds."""
    path = Path(path)
    try:
        hf_cfg, handle = gguf_file.open_checkpoint(path)
    except (OSError, ValueError) as e:
        return [str(e)]
    problems = []
    weight_map = {name: "all" for name in handle.keys()}
    for check in (lambda: hf._check_tensors(hf._tensor_specs(cfg, hf_cfg["model_type"]), weight_map, {"all": handle},
                                            cfg, hf_cfg["model_type"], where=f"{path} (its metadata)"),
                  handle.check_finite):
        try:
            check()
        except (OSError, ValueError) as e:
            problems.append(str(e))
    return problems


# ---- everything -------------------------------------------------------------------------------------------------------
def check_folder(path, cfg, model_type: str) -> list[str]:
    """Every problem of the folder's weights, one message each (empty: all sound); the tokenizer files are
    check_tokenizer_files' (rl.setup.build_tokenizer runs it)."""
    problems = []
    try:
        headers = tensor_headers(path)
    except (OSError, ValueError) as e:
        problems.append(str(e))
    else:
        for check in (lambda: check_shapes(path, headers, cfg, model_type), lambda: check_finite(headers)):
            try:
                check()
            except (OSError, ValueError) as e:
                problems.append(str(e))
    return problems
