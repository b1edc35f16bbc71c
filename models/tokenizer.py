"""Byte-level UTF-8 tokenizer with pad/bos/eos specials.

Every UTF-8 byte is one token, so Chinese and English (and anything else) round-trip
losslessly and there is no vocabulary file to ship. Ids:

    PAD = 0, BOS = 1, EOS = 2, byte b -> b + 3  (ids 3..258), vocab_size = 259.

Used by the sampler's callers (rollout, demo) to turn prompts into left-padded id batches
and generated ids back into text:

    tok = ByteTokenizer()
    ids, mask = tok.encode_batch(["问题：1+1=?", "Question: 2+2?"], pad_left=True)
    text = tok.decode(ids[0])
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class ByteTokenizer:
    """Maps text <-> token ids, one token per UTF-8 byte plus three special ids."""

    PAD = 0
    BOS = 1
    EOS = 2
    OFFSET = 3  # id of byte 0x00
    vocab_size = 256 + OFFSET

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

    # -- batches ----------------------------------------------------------------------------
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
