"""The tokenizer a GGUF file describes, rebuilt with the `tokenizers` library (used by HFTokenizer.from_pretrained).

A GGUF checkpoint carries no tokenizer.json: llama.cpp stores the vocabulary as metadata. This module reads it with
the `gguf` package and builds the same byte-level BPE tokenizer a tokenizer.json would hold:

    tok, info = read_gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")
    tok.encode("2+2", add_special_tokens=False).ids
    info["eos_token"], info["chat_template"], info["add_bos"]

What is read (llama.cpp's key names):
    tokenizer.ggml.model        must be "gpt2" (byte-level BPE; sentencepiece "llama" vocabularies are refused)
    tokenizer.ggml.tokens       the vocabulary, id = position; tokens spelled in GPT-2's byte alphabet
    tokenizer.ggml.merges       "left right" pairs, highest priority first
    tokenizer.ggml.token_type   3 (control) -> special added tokens, 4 (user-defined) -> plain added tokens: both are
                                matched whole in the text, never cut into pieces
    tokenizer.ggml.pre          the pre-tokenizer: how text is split before the merges apply (PRE_TOKENIZERS)
    tokenizer.ggml.{bos,eos,padding,unknown}_token_id, add_bos_token, eot_token_id
    tokenizer.chat_template     the Jinja chat template

A file this module cannot read faithfully (another tokenizer model, a pre-tokenizer not in PRE_TOKENIZERS, missing
keys) raises ValueError naming the file and the key: a tokenizer that silently splits text differently from the one
the model was trained with would corrupt every prompt.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from models import gguf_file

# Split patterns, as llama.cpp and the models' own tokenizer.json files define them.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> (split regex, digits split one by one first). "smollm": SmolLM / SmolLM2 (GPT-2 regex after
# isolating every digit); "gpt-2" / "default": the GPT-2 regex alone; Llama 3 and Qwen2 vocabularies have their own.
PRE_TOKENIZERS = {
    "default": (_GPT2, False), "gpt-2": (_GPT2, False), "smollm": (_GPT2, True),
    "llama-bpe": (_LLAMA3, False), "llama3": (_LLAMA3, False), "llama-v3": (_LLAMA3, False),
    "qwen2": (_QWEN2, False), "deepseek-r1-qwen": (_QWEN2, False),
}

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types


def _fields(path: Path) -> dict:
    """Every metadata key of the file -> its value (strings, numbers, lists), read with gguf's reader (the one
    models/gguf_file.py opens: the header's lengths checked against the file's size, parsed once until the weights
    are read)."""
    reader = gguf_file.reader(path)
    return {name: gguf_file.contents(field, path, name) for name, field in reader.fields.items()
            if name.startswith(("tokenizer.", "general.architecture"))}


def _need(meta: dict, path: Path, key: str):
    if key not in meta:
        raise ValueError(f"{path}: metadata key {key!r} is missing (needed for the tokenizer)")
    return meta[key]


def _list_of(meta: dict, path: Path, key: str, kind: type, what: str, default=None) -> list:
    """The array at `key` with every item of `kind` (ValueError naming the file and key otherwise)."""
    value = _need(meta, path, key) if default is None else meta.get(key, default)
    if not isinstance(value, list):
        raise ValueError(f"{path}: metadata key {key!r} must be an array of {what}, got {str(value)[:80]!r}")
    bad = next((v for v in value if isinstance(v, bool) or not isinstance(v, kind)), None)
    if bad is not None:
        raise ValueError(f"{path}: metadata key {key!r} must be an array of {what}, it holds {bad!r}")
    return value


def _merges(meta: dict, path: Path, vocab: dict) -> list[tuple[str, str]]:
    """tokenizer.ggml.merges as (left, right) pairs, each side and their join a token of the vocabulary (the
    tokenizers library raises a bare Exception otherwise)."""
    key = "tokenizer.ggml.merges"
    merges = [tuple(m.split(" ", 1)) for m in _list_of(meta, path, key, str, "'left right' strings")]
    for i, m in enumerate(merges):
        if len(m) != 2:
            raise ValueError(f"{path}: tokenizer.ggml.merges holds an entry that is not 'left right' (#{i}: {m[0]!r})")
        missing = next((t for t in (*m, m[0] + m[1]) if t not in vocab), None)
        if missing is not None:
            raise ValueError(f"{path}: {key} entry #{i} {' '.join(m)!r}: token {missing!r} is not in "
                             f"tokenizer.ggml.tokens")
    return merges


def pre_tokenizer(name: str, path: Path):
    """The `tokenizers` pre-tokenizer for tokenizer.ggml.pre = `name`."""
    if name not in PRE_TOKENIZERS:
        raise ValueError(f"{path}: tokenizer.ggml.pre {name!r} is not supported (known: {sorted(PRE_TOKENIZERS)})")
    regex, digits = PRE_TOKENIZERS[name]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [pre_tokenizers.Split(Regex(regex), behavior="isolated"),
              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    return pre_tokenizers.Sequence(steps)


def _token_of(meta: dict, tokens: list, key: str, path: Path) -> str | None:
    i = meta.get(f"tokenizer.ggml.{key}")
    if i is None:
        return None
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.{key} = {i!r} is not an id of the vocabulary of {len(tokens)} "
                         f"tokens")
    return tokens[i]


def read_gguf_tokenizer(path) -> tuple:
    """(tokenizers.Tokenizer, info) for the GGUF file at `path`. info: eos_token, bos_token, pad_token, unk_token
    (strings or None), add_bos (the file's tokenizer.ggml.add_bos_token), chat_template (or None), stop_tokens (EOS
    plus the end-of-turn token when the file names one)."""
    path = Path(path)
    meta = _fields(path)
    model = _need(meta, path, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model {model!r} is not supported (only 'gpt2', byte-level BPE)")
    tokens = _list_of(meta, path, "tokenizer.ggml.tokens", str, "strings")
    types = _list_of(meta, path, "tokenizer.ggml.token_type", int, "integers", default=[1] * len(tokens))
    if len(types) != len(tokens):
        raise ValueError(f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicated spelling keeps its first id, as a tokenizer.json vocabulary would
    merges = _merges(meta, path, vocab)
    tok = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")), path)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    eos = _token_of(meta, tokens, "eos_token_id", path)
    if eos is None:
        raise ValueError(f"{path}: metadata key 'tokenizer.ggml.eos_token_id' is missing (needed for the tokenizer)")
    eot = _token_of(meta, tokens, "eot_token_id", path)
    template = meta.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{path}: metadata key 'tokenizer.chat_template' must be a string, got {str(template)[:80]!r}")
    info = {"eos_token": eos, "bos_token": _token_of(meta, tokens, "bos_token_id", path),
            "pad_token": _token_of(meta, tokens, "padding_token_id", path),
            "unk_token": _token_of(meta, tokens, "unknown_token_id", path),
            "add_bos": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
            "chat_template": template,
            "stop_tokens": [eos] + ([eot] if eot is not None and eot != eos else [])}
    return tok, info
