"""Character-level helpers shared by every reward module: text coercion, width folding, Han detection, brackets.

    as_text(x)                 any input -> str (bytes decoded as UTF-8 with replacement, other objects -> "")
    s.translate(FULLWIDTH)     full-width ASCII forms (０-９ Ａ-Ｚ （ ） ， ： ＋ ＝ …), the ideographic space and the
                               Unicode operator forms × ✕ · ⋅ ∙ ∗ ÷ − to ASCII (what the answer parser folds)
    s.translate(MATH_CHARS)    only the characters of arithmetic: full-width digits, + - * / = ( ) % ^ . < >, and the
                               Unicode operator forms × ✕ · ⋅ ∙ ∗ ÷ − (what the step checker folds; CJK punctuation such
                               as ， and ： stays, because it separates claims)
    is_han(c)                  a CJK unified ideograph (basic block, extensions A and B-F, compatibility ideographs)
    brace_pairs(s)             {index of "{": index of its "}"}: the one brace matcher (\\{ \\} and \\\\ are escapes)
    deeper_than(s, limit)      whether ( [ { brackets nest deeper than limit

Used by rewards.parse (answers, steps), rewards.mathparse (the answer parser), rewards.steps and rewards.penalties.
Everything is linear in the text length and never raises on str input.
"""
from __future__ import annotations

import re

__all__ = ["as_text", "FULLWIDTH", "MATH_CHARS", "is_han", "brace_pairs", "deeper_than"]


def as_text(text) -> str:
    """Coerce any input to str: bytes are decoded as UTF-8 with replacement; other non-str input gives ""."""
    if isinstance(text, str):
        return text
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            return bytes(text).decode("utf-8", errors="replace")
        except Exception:  # noqa: BLE001 - hostile buffer objects
            return ""
    return ""


# U+FF01..U+FF5E are the full-width forms of ASCII U+0021..U+007E, in the same order.
_WIDE = {chr(0xFF01 + i): chr(0x21 + i) for i in range(0x5E)}
_OPERATORS = {"×": "*", "✕": "*", "·": "*", "⋅": "*", "∙": "*", "∗": "*", "÷": "/", "−": "-"}
FULLWIDTH = str.maketrans({**_WIDE, "\u3000": " ", **_OPERATORS})
MATH_CHARS = str.maketrans({**{w: a for w, a in _WIDE.items() if a in "0123456789+-*/=()%^.<>"}, **_OPERATORS})


def is_han(c: str) -> bool:
    """Whether the character is a Han ideograph (CJK unified ideographs and their extensions)."""
    o = ord(c)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF
            or 0x20000 <= o <= 0x2FFFF)


_BRACE_TOKEN = re.compile(r"\\[\\{}]|[{}]")  # an escape pair (\\ \{ \}) or a brace


def brace_pairs(text: str) -> dict[int, int]:
    """Map each "{" to its matching "}" in one pass. \\{ and \\} are literal braces, and \\\\{ is a row break
    followed by a real brace; unmatched braces are left out."""
    stack, pairs = [], {}
    for m in _BRACE_TOKEN.finditer(text):
        tok = m.group()
        if tok == "{":
            stack.append(m.start())
        elif tok == "}" and stack:
            pairs[stack.pop()] = m.start()
    return pairs


def deeper_than(text: str, limit: int) -> bool:
    """Whether ( [ { brackets (of any kind, counted together) nest more than `limit` deep."""
    if text.count("{") + text.count("(") + text.count("[") <= limit:
        return False
    depth = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            if depth > limit:
                return True
        elif ch in "})]":
            depth -= 1
    return False
