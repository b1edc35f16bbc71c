"""Tokenizers with one small shared interface: ByteTokenizer (from-scratch models) and HFTokenizer (checkpoints).

ByteTokenizer is byte-level UTF-8: every UTF-8 byte is one token, so Chinese and English (and anything else)
round-trip losslessly and there is no vocabulary file to ship. Ids:

    PAD = 0, BOS = 1, EOS = 2, byte b -> b + 3  (ids 3..258), vocab_size = 259.

HFTokenizer wraps a Hugging Face folder's tokenizer.json (the `tokenizers` library), or the tokenizer a GGUF file's
metadata describes (models/tokenizer_gguf.py), and renders its chat template (chat_template.jinja,
tokenizer_config.json or the GGUF's tokenizer.chat_template) with Jinja2 in a sandbox, the way transformers does, through
the one bounded renderer (models/chat_template.py: steps, time, operator and output-size limits):

    tok = HFTokenizer.from_pretrained("ckpt/Qwen3-1.7B")        # or "SmolLM2-135M-Instruct.Q4_1.gguf"
    ids = tok.apply_chat_template([{"role": "user", "content": "问题：1+1=?"}])   # add_generation_prompt=True
    ids = tok.encode("Question: 2+2?")                                           # no special tokens added

What the trainer, the sampler's callers and the demo use, on both:

    PAD, EOS, BOS (BOS may be None)      pad_id, eos_id        vocab_size
    stop_ids                             the ids that end a generation: EOS, plus for a checkpoint folder the
                                         eos_token_id(s) of its generation_config.json (chat models end a turn
                                         with <|im_end|> whatever tokenizer_config.json calls EOS)
    encode(text, add_bos=..., add_eos=...) -> list[int]        decode(ids, skip_special=True) -> str (stops at EOS)
    encode_batch(texts, max_len=None, pad_left=False, add_bos=..., add_eos=False) -> (ids [B, L], mask [B, L])
    decode_batch(ids, lengths=None, skip_special=True) -> list[str]

The defaults differ where the formats do: ByteTokenizer.encode adds BOS unless told not to (its models are trained
that way); HFTokenizer.encode adds nothing unless asked, and add_bos=True adds BOS only where the tokenizer itself
would (tokenizer.json's post-processor, a GGUF's add_bos_token): chat templates place their own special tokens, Qwen
tokenizers have no BOS at all and SmolLM2's BOS is <|im_start|>, so add_bos=True is a no-op there.

    tok = ByteTokenizer()
    ids, mask = tok.encode_batch(["问题：1+1=?", "Question: 2+2?"], pad_left=True)
    text = tok.decode(ids[0])
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from models import chat_template
from models.tokenizer_gguf import read_gguf_tokenizer


class _Batching:
    """encode_batch / decode_batch on top of a tokenizer's encode, decode and PAD."""

    PAD: int

    def encode_batch(
        self,
        texts: Sequence[str],
        max_len: int | None = None,
        pad_left: bool = False,
        add_bos: bool = True,
        add_eos: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encode and pad to a rectangle.

        Returns (ids [B, L] int32, mask [B, L] int32 with 1 on real tokens). L is the longest
        sequence, or `max_len` when given; longer sequences are truncated, keeping the END of
        the text when pad_left (prompts: the question's tail must survive next to the
        generation) and the START otherwise. pad_left=True is the sampler's layout.
        """
        if max_len is not None and max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        seqs = [self.encode(t, add_bos=add_bos, add_eos=add_eos) for t in texts]
        length = max((len(s) for s in seqs), default=0) if max_len is None else max_len
        ids = np.full((len(seqs), length), self.PAD, dtype=np.int32)
        mask = np.zeros((len(seqs), length), dtype=np.int32)
        for row, seq in enumerate(seqs):
            seq = seq[-length:] if pad_left else seq[:length]
            if length == 0 or not seq:
                continue
            n = len(seq)
            if pad_left:
                ids[row, length - n:] = seq
                mask[row, length - n:] = 1
            else:
                ids[row, :n] = seq
                mask[row, :n] = 1
        return ids, mask

    def decode_batch(self, ids, lengths=None, skip_special: bool = True) -> list[str]:
        """Decode each row of `ids` [B, L]; `lengths` [B] (optional) keeps only each row's first n tokens."""
        arr = np.asarray(ids)
        if arr.ndim != 2:
            raise ValueError(f"ids must be 2-D [batch, length], got shape {arr.shape}")
        if lengths is not None:
            lengths = np.asarray(lengths)
            if lengths.shape != (arr.shape[0],):
                raise ValueError(f"lengths must have shape ({arr.shape[0]},), got {lengths.shape}")
        texts = []
        for row in range(arr.shape[0]):
            seq = arr[row] if lengths is None else arr[row, : int(lengths[row])]
            texts.append(self.decode(seq.tolist(), skip_special=skip_special))
        return texts


class ByteTokenizer(_Batching):
    """Maps text <-> token ids, one token per UTF-8 byte plus three special ids."""

    PAD = 0
    BOS = 1
    EOS = 2
    OFFSET = 3  # id of byte 0x00
    vocab_size = 256 + OFFSET
    pad_id, eos_id, bos_id = PAD, EOS, BOS
    stop_ids = (EOS,)

    # -- single sequences -------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = True, add_eos: bool = False) -> list[int]:
        """Token ids of `text` (UTF-8 bytes shifted by OFFSET), optionally framed by BOS/EOS."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = [b + self.OFFSET for b in text.encode("utf-8")]
        if add_bos:
            ids.insert(0, self.BOS)
        if add_eos:
            ids.append(self.EOS)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids`, stopping at the first EOS.

        PAD and BOS are dropped. Byte sequences that are not valid UTF-8 (a model can emit
        anything) become U+FFFD instead of raising. With skip_special=False the specials are
        kept as the markers <pad>/<bos>/<eos> (the EOS marker ends the text).
        """
        out: list[str] = []
        buf = bytearray()

        def flush() -> None:
            if buf:
                out.append(buf.decode("utf-8", errors="replace"))
                buf.clear()

        for raw in ids:
            i = int(raw)
            if i == self.EOS:
                if not skip_special:
                    flush()
                    out.append("<eos>")
                break
            if i in (self.PAD, self.BOS):
                if not skip_special:
                    flush()
                    out.append("<pad>" if i == self.PAD else "<bos>")
                continue
            if not self.OFFSET <= i < self.vocab_size:
                raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
            buf.append(i - self.OFFSET)
        flush()
        return "".join(out)


# ---- Hugging Face tokenizers --------------------------------------------------------------------------------------
def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or {"content": ...} (older files)."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value


def _plain(value):
    """Messages as plain JSON data (dicts, lists, str, numbers), so the template sees no caller objects."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    raise TypeError(f"chat messages must hold JSON-like data, got {type(value).__name__}")


class HFTokenizer(_Batching):
    """A Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json [+ chat_template.jinja])."""

    def __init__(self, tokenizer, *, eos_token: str, pad_token: str | None = None, bos_token: str | None = None,
                 unk_token: str | None = None, chat_template: str | None = None, extra_stop_ids=(),
                 add_bos: bool | None = None):
        self._tok = tokenizer
        self.special_tokens = {name: tok for name, tok in (("eos_token", eos_token), ("pad_token", pad_token),
                                                           ("bos_token", bos_token), ("unk_token", unk_token))
                               if tok is not None}
        self.eos_id = self._id_of("eos_token", eos_token)
        self.pad_id = self.eos_id if pad_token is None else self._id_of("pad_token", pad_token)
        self.bos_id = None if bos_token is None else self._id_of("bos_token", bos_token)
        if add_bos is None:  # a folder: BOS is added when its tokenizer.json's post-processor adds it
            add_bos = self.bos_id is not None and tokenizer.encode("a", add_special_tokens=True).ids[:1] == [self.bos_id]
        self.add_bos = bool(add_bos) and self.bos_id is not None
        self.chat_template = chat_template
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.stop_ids = tuple(dict.fromkeys([self.eos_id, *(int(i) for i in extra_stop_ids)]))

    # the ByteTokenizer spelling of the special ids, used by the trainer and the sampler's callers
    PAD = property(lambda self: self.pad_id)
    EOS = property(lambda self: self.eos_id)
    BOS = property(lambda self: self.bos_id)

    def _id_of(self, field: str, token: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"{field} {token!r} is not in the tokenizer's vocabulary")
        return i

    @classmethod
    def from_pretrained(cls, path) -> "HFTokenizer":
        """The tokenizer of a Hugging Face folder, or of a GGUF file (models.tokenizer_gguf)."""
        path = Path(path)
        if path.suffix == ".gguf" and path.is_file():
            tok, info = read_gguf_tokenizer(path)
            stops = [tok.token_to_id(t) for t in info["stop_tokens"]]
            return cls(tok, eos_token=info["eos_token"], pad_token=info["pad_token"], bos_token=info["bos_token"],
                       unk_token=info["unk_token"], chat_template=info["chat_template"], extra_stop_ids=stops,
                       add_bos=info["add_bos"])
        if not (path / "tokenizer.json").exists():
            raise ValueError(f"{path}: no tokenizer.json (a fast-tokenizer folder is required)")
        config_path = path / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        eos = _token_text(config.get("eos_token"))
        if eos is None:
            raise ValueError(f"{config_path}: eos_token is missing")
        template = None
        if (path / "chat_template.jinja").exists():  # transformers >= 4.43 writes the template to its own file
            template = (path / "chat_template.jinja").read_text()
        elif isinstance(config.get("chat_template"), str):
            template = config["chat_template"]
        elif isinstance(config.get("chat_template"), list):  # named templates: [{"name": ..., "template": ...}]
            named = {t["name"]: t["template"] for t in config["chat_template"]}
            template = named.get("default")
        stops = []
        if (path / "generation_config.json").exists():  # e.g. Qwen: [<|im_end|>, <|endoftext|>]
            gen = json.loads((path / "generation_config.json").read_text()).get("eos_token_id")
            stops = [] if gen is None else [gen] if isinstance(gen, int) else list(gen)
        return cls(Tokenizer.from_file(str(path / "tokenizer.json")), eos_token=eos,
                   pad_token=_token_text(config.get("pad_token")), bos_token=_token_text(config.get("bos_token")),
                   unk_token=_token_text(config.get("unk_token")), chat_template=template, extra_stop_ids=stops)

    # -- text <-> ids -------------------------------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids of `text` with no special tokens added (special-token strings inside the text still map to
        their ids); add_bos prepends BOS when the tokenizer itself adds one (self.add_bos: a folder whose
        tokenizer.json prepends it, a GGUF file with tokenizer.ggml.add_bos_token; chat models like Qwen and SmolLM2
        add none, their template writes the turn markers), add_eos appends EOS."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        ids = list(self._tok.encode(text, add_special_tokens=False).ids)
        if add_bos and self.add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids` up to the first EOS (kept as text when skip_special=False, then the text ends).

        Special tokens are dropped when skip_special; ids outside the vocabulary (a model's padded embedding rows)
        are skipped and incomplete UTF-8 becomes U+FFFD, so any model output decodes without raising."""
        kept = []
        for raw in ids:
            i = int(raw)
            if i == self.eos_id:
                if not skip_special:
                    kept.append(i)
                break
            kept.append(i)
        return self._tok.decode(kept, skip_special_tokens=skip_special)

    # -- chat ---------------------------------------------------------------------------------------------------------
    @cached_property
    def _template(self):
        if self.chat_template is None:
            raise ValueError("this tokenizer folder has no chat template (chat_template.jinja or "
                             "tokenizer_config.json's chat_template)")
        return chat_template.compile_template(self.chat_template)

    def render_chat_template(self, messages, add_generation_prompt: bool = True, **kwargs) -> str:
        """The chat template's text for `messages` ([{"role": ..., "content": ...}, ...]); extra keywords (tools,
        enable_thinking, ...) go to the template, as do the special-token strings (eos_token, pad_token, ...)."""
        variables = {**self.special_tokens, "tools": None, "documents": None, **_plain(kwargs)}
        # Every render is bounded (chat_template.TemplateLimit past a bound): the template is the checkpoint's code.
        return chat_template.render(self._template, messages=_plain(list(messages)),
                                    add_generation_prompt=add_generation_prompt, **variables)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, **kwargs) -> list[int]:
        """Ids of the rendered chat (encoded without adding special tokens: the template writes its own)."""
        return self.encode(self.render_chat_template(messages, add_generation_prompt, **kwargs))
