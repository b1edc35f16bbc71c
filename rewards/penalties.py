"""Penalties on model solutions: overlong (DAPO soft buffer), repetition, language mixing, missing reasoning.

Sign convention: every *_penalty function returns a MAGNITUDE in [0, 1] (0 = no penalty, 1 = the full penalty);
rewards.combine SUBTRACTS weight * magnitude from the total. language_consistency is a share in [0, 1] (1 = all
in the expected script); its penalty is 1 - share. has_reasoning is the switch for the "an answer needs a
reasoning process" rule: with requires_reasoning on, combine sets the outcome reward to 0 when it is False.

    overlong_penalty(length, max_len, buffer)      0 for length <= max_len - buffer, linear up to 1 at max_len,
                                                   1 beyond (DAPO's soft overlong punishment, as a magnitude:
                                                   DAPO's reward term is -overlong_penalty)
    repetition_share(text, n=4)                    share of n-grams that repeat an earlier n-gram: the one repetition
                                                   measure of the project (evaluation uses it too)
    repetition_penalty(text, n=4, threshold=0.3)   (share - threshold) / (1 - threshold), clipped to [0, 1]
    language_consistency(text, lang)               share of the expected script (Han for zh, Latin for en) among
                                                   letters of the reasoning (text before the final answer line or
                                                   <answer> tag);
                                                   LaTeX commands and single-letter words (math variables) are
                                                   ignored; 1.0 when there are no letters
    language_penalty(text, lang)                   1 - language_consistency
    has_reasoning(text, min_steps=1)               at least min_steps non-empty steps (without step markers, a
                                                   non-empty <think>...</think> block counts as one step)
    text_length(text)                              UTF-8 bytes: the token count under the byte tokenizer, used
                                                   when the caller gives no token count

Units for repetition: each Han character, each run of Latin letters / digits, and each other non-space
character is one token; repetition_share(text, n) = (N - D) / N over the N = tokens - n + 1 n-grams, D of them
distinct (0.0 when N <= 1); a text of more than MAX_REPETITION_TOKENS tokens is judged on its last ones. All
functions accept any input and never raise (non-text counts as empty).
"""
from __future__ import annotations

import math
import re

from rewards.parse import as_text, find_answer_markers, is_answer_line, parse_steps
from rewards.text import is_han

__all__ = [
    "overlong_penalty", "repetition_share", "repetition_penalty", "language_consistency", "language_penalty",
    "has_reasoning", "text_length", "reasoning_text",
]

MAX_REPETITION_TOKENS = 200_000  # longer texts are judged on their last tokens (degenerate loops sit at the end)
_TOKEN = re.compile(r"[A-Za-z0-9]+|\S")
_LATEX_CMD = re.compile(r"\\[A-Za-z]+")
_LATIN_WORD = re.compile(r"[A-Za-z\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u024F]+")  # without × ÷


def _finite(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def overlong_penalty(length, max_len, buffer) -> float:
    """Soft overlong penalty magnitude in [0, 1]; 0 when max_len is None/0 (switched off)."""
    length, max_len, buffer = _finite(length), _finite(max_len), _finite(buffer)
    if length is None or not max_len or max_len <= 0:
        return 0.0
    buffer = 0.0 if buffer is None else min(max(buffer, 0.0), max_len)
    if length >= max_len:
        return 1.0
    start = max_len - buffer
    if length <= start or buffer == 0.0:
        return 0.0
    return (length - start) / buffer


def text_length(text) -> int:
    """UTF-8 byte length (the byte tokenizer's token count, without BOS/EOS)."""
    return len(as_text(text).encode("utf-8", errors="replace"))


def _tokens(text: str) -> list[str]:
    toks = _TOKEN.findall(text)
    return toks[-MAX_REPETITION_TOKENS:]


def repetition_share(text, n: int = 4) -> float:
    """Share of the text's n-grams that already occurred earlier in it (0 = no repeats; -> 1 for a loop)."""
    try:
        n = max(1, int(n))
        toks = _tokens(as_text(text))
        total = len(toks) - n + 1
        if total <= 1:
            return 0.0
        distinct = len({tuple(toks[i:i + n]) for i in range(total)})
        return (total - distinct) / total
    except Exception:  # noqa: BLE001 - never raise on model text
        return 0.0


def repetition_penalty(text, n: int = 4, threshold: float = 0.3) -> float:
    """Magnitude in [0, 1]: the repeated share above `threshold`, rescaled so a pure loop gives ~1."""
    thr = _finite(threshold)
    thr = 0.0 if thr is None else min(max(thr, 0.0), 0.999)
    share = repetition_share(text, n)
    return min(1.0, max(0.0, (share - thr) / (1.0 - thr)))


def reasoning_text(text) -> str:
    """The reasoning part: everything before the last final-answer line or <answer> tag (the whole text when
    there is none)."""
    text = as_text(text)
    try:
        lines = [m for m in find_answer_markers(text) if is_answer_line(m) or m.kind == "tag"]
        return text[: lines[-1].start] if lines else text
    except Exception:  # noqa: BLE001
        return text


def _is_latin(c: str) -> bool:
    return c.isascii() or 0x00C0 <= ord(c) <= 0x024F  # callers only pass letters


def language_consistency(text, lang: str = "zh") -> float:
    """Share of the expected script among the letters of the reasoning, in [0, 1]."""
    try:
        body = _LATEX_CMD.sub(" ", reasoning_text(text))
        han = other = 0
        for c in body:
            if c.isalpha() and not _is_latin(c):
                if is_han(c):
                    han += 1
                else:
                    other += 1
        # A single Latin letter is a math variable (x, n), not language: only words of 2+ letters count.
        latin = sum(len(w) for w in _LATIN_WORD.findall(body) if len(w) >= 2)
        letters = han + latin + other
        if letters == 0:
            return 1.0
        expected = han if lang == "zh" else latin if lang == "en" else 0
        return expected / letters
    except Exception:  # noqa: BLE001
        return 0.0


def language_penalty(text, lang: str = "zh") -> float:
    """Magnitude in [0, 1]: the share of letters not in the expected script."""
    return 1.0 - language_consistency(text, lang)


_THINK_BLOCK = re.compile(r"(?:<think>)?(.*?)</think>", re.IGNORECASE | re.DOTALL)


def has_reasoning(text, min_steps: int = 1) -> bool:
    """Whether the solution shows a reasoning process: at least min_steps steps with content; a text without
    step markers counts a non-empty <think>...</think> block (R1 style) as one step."""
    try:
        text = as_text(text)
        steps = sum(1 for s in parse_steps(text) if s.text.strip())
        if steps == 0:
            block = _THINK_BLOCK.match(text.lstrip())
            steps = int(block is not None and bool(block.group(1).strip()))
        return steps >= max(1, int(min_steps))
    except Exception:  # noqa: BLE001
        return False
