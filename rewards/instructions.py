"""Checkers for verifiable instructions (IFEval-style constraints) and the instruction reward.

    from rewards.instructions import instruction_score, constraint_results
    check = {"constraints": [{"type": "language", "lang": "en"}, {"type": "num_steps", "n": 2},
                             {"type": "answer_line", "lang": "en"}, {"type": "max_chars", "k": 80}]}
    instruction_score("Step 1: 3+4=7\\nStep 2: 7*2=14\\nAnswer: 14", check)   # 1.0
    constraint_results("Step 1: 3+4=7\\nAnswer: 7", check)                     # [True, False, True, True]

The reward is the share of constraints met, in [0, 1]. `check` is an instruction problem's payload
(`Problem.check` of the `instructions` sources in rl/tasks/instructions.py, a dict or its JSON text) or a
plain list of constraints. Each constraint is a dict with a "type" and its parameters:

    language     {"lang": "zh"|"en"}   at least LANGUAGE_MIN_SHARE of the letters of the WHOLE response are in
                                       the expected script (Han for zh; Latin words of 2+ letters for en, so
                                       math variables such as x do not count), and there is at least one letter
    num_steps    {"n": N}              exactly N steps (rewards.parse.split_steps), none of them empty
    answer_line  {"lang": "zh"|"en"}   the last non-empty line is a final-answer line with a value:
                                       答案：x / 最终答案：x (zh), Answer: x / Final Answer: x (en); markdown
                                       emphasis around the marker is fine (**Answer:** x)
    max_chars    {"k": K}              at most K characters (code points) once surrounding whitespace is stripped
    include_word {"word": w}           w occurs: as a whole word, case-insensitively, when w is Latin letters;
                                       as a substring otherwise (Chinese has no spaces between words)
    avoid_word   {"word": w}           w does not occur (same matching as include_word)
    list_items   {"n": N}              exactly N list-item lines: "- x", "* x", "• x", "1. x", "1) x", "1、x"

Rules that hold for every constraint: an empty (or whitespace-only) response meets none, so an empty answer
scores 0 rather than collecting avoid_word / max_chars for free; a response longer than MAX_TEXT_CHARS meets
none (degenerate output; it also bounds the cost of every scan). Text is any input: bytes are decoded as UTF-8
with replacement, other non-str input is empty. Nothing here raises on model text; a malformed check payload
scores 0.0 (`parse_constraints` is the validating entry point for trusted payloads and raises ValueError).
"""
from __future__ import annotations

import json
import re

from rewards.parse import as_text, split_steps

__all__ = [
    "CONSTRAINT_TYPES", "LANGUAGE_MIN_SHARE", "MAX_TEXT_CHARS", "parse_constraints", "check_constraint",
    "constraint_results", "instruction_score", "script_share", "word_occurs",
]

LANGUAGE_MIN_SHARE = 0.9  # share of letters in the expected script for the language constraint
MAX_TEXT_CHARS = 20_000  # longer responses meet no constraint
MAX_WORD_CHARS = 40  # include/avoid words in a payload are short
MAX_COUNT = 1_000  # largest N / K a payload may ask for (K: characters, so allow more)
MAX_K = 100_000
LANGS = ("zh", "en")

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
_LATIN_WORD = re.compile(r"[A-Za-z]{2,}")
_LATIN_ONLY = re.compile(r"[A-Za-z][A-Za-z' -]*\Z")
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*•][ \t]+|[0-9]{1,3}(?:[.)][ \t]+|、[ \t]*))\S", re.MULTILINE)
_ANSWER_LINE = {
    "zh": re.compile(r"[ \t*#>]*(?:最终)?答案[ \t]*[：:][ \t*]*[^\s*]"),
    "en": re.compile(r"[ \t*#>]*(?:final[ \t]+)?answer[ \t]*[:：][ \t*]*[^\s*]", re.IGNORECASE),
}


def _int_param(c: dict, name: str, hi: int) -> int:
    v = c.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi:
        raise ValueError(f"constraint {c.get('type')!r}: {name!r} must be an int in [1, {hi}], got {v!r}")
    return v


def _lang_param(c: dict) -> str:
    if c.get("lang") not in LANGS:
        raise ValueError(f"constraint {c.get('type')!r}: 'lang' must be one of {LANGS}, got {c.get('lang')!r}")
    return c["lang"]


def _word_param(c: dict) -> str:
    w = c.get("word")
    if not isinstance(w, str) or not w.strip() or w != w.strip() or len(w) > MAX_WORD_CHARS or "\n" in w:
        raise ValueError(f"constraint {c.get('type')!r}: 'word' must be a non-empty single-line string of at most "
                         f"{MAX_WORD_CHARS} characters without surrounding spaces, got {w!r}")
    return w


# ------------------------------------------------------------------------------------------ checkers


def script_share(text, lang: str) -> float:
    """Share of the response's letters in `lang`'s script (see the module docstring); 0.0 with no letters."""
    text = as_text(text)
    han = len(_HAN.findall(text))
    latin = sum(len(w) for w in _LATIN_WORD.findall(text))
    # Letters of other scripts (kana, Cyrillic, accented Latin, ...) count against both languages.
    other = sum(1 for c in text if not c.isascii() and c.isalpha()) - han
    letters = han + latin + max(other, 0)
    if letters == 0:
        return 0.0
    return (han if lang == "zh" else latin if lang == "en" else 0) / letters


def word_occurs(text: str, word: str) -> bool:
    """Whole-word, case-insensitive match for Latin words; substring match otherwise."""
    if _LATIN_ONLY.match(word):
        return re.search(rf"(?<![A-Za-z]){re.escape(word)}(?![A-Za-z])", text, re.IGNORECASE) is not None
    return word in text


def _language(text: str, c: dict) -> bool:
    return script_share(text, c["lang"]) >= LANGUAGE_MIN_SHARE


def _num_steps(text: str, c: dict) -> bool:
    steps = split_steps(text)
    return len(steps) == c["n"] and all(s.strip() for s in steps)


def _answer_line(text: str, c: dict) -> bool:
    last = text.rstrip().rsplit("\n", 1)[-1]
    return _ANSWER_LINE[c["lang"]].match(last) is not None


def _max_chars(text: str, c: dict) -> bool:
    return len(text.strip()) <= c["k"]


def _include_word(text: str, c: dict) -> bool:
    return word_occurs(text, c["word"])


def _avoid_word(text: str, c: dict) -> bool:
    return not word_occurs(text, c["word"])


def _list_items(text: str, c: dict) -> bool:
    return len(_LIST_ITEM.findall(text)) == c["n"]


# type -> (parameter validator returning the canonical params, checker on stripped-non-empty capped text)
CONSTRAINT_TYPES = {
    "language": (lambda c: {"lang": _lang_param(c)}, _language),
    "num_steps": (lambda c: {"n": _int_param(c, "n", MAX_COUNT)}, _num_steps),
    "answer_line": (lambda c: {"lang": _lang_param(c)}, _answer_line),
    "max_chars": (lambda c: {"k": _int_param(c, "k", MAX_K)}, _max_chars),
    "include_word": (lambda c: {"word": _word_param(c)}, _include_word),
    "avoid_word": (lambda c: {"word": _word_param(c)}, _avoid_word),
    "list_items": (lambda c: {"n": _int_param(c, "n", MAX_COUNT)}, _list_items),
}


def _validate_one(c) -> dict:
    if not isinstance(c, dict):
        raise ValueError(f"a constraint must be a dict with a 'type', got {c!r}")
    kind = c.get("type")
    if kind not in CONSTRAINT_TYPES:
        raise ValueError(f"unknown constraint type {kind!r}; known: {sorted(CONSTRAINT_TYPES)}")
    params = CONSTRAINT_TYPES[kind][0](c)
    extra = set(c) - set(params) - {"type"}
    if extra:
        raise ValueError(f"constraint {kind!r} has unknown parameter(s) {sorted(extra)}")
    return {"type": kind, **params}


def parse_constraints(check) -> tuple[dict, ...]:
    """The validated constraints of a payload: a dict with "constraints", its JSON text, or a list of
    constraints. Raises ValueError naming what is wrong (used when a problem is built, on trusted data)."""
    if isinstance(check, str):
        try:
            check = json.loads(check)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"instruction check is not valid JSON: {e}") from None
    if isinstance(check, dict):
        check = check.get("constraints")
    if not isinstance(check, (list, tuple)) or not check:
        raise ValueError(f"instruction check needs a non-empty list of constraints, got {check!r}"[:300])
    return tuple(_validate_one(c) for c in check)


def check_constraint(text, constraint) -> bool:
    """Whether the response meets one constraint; False for a malformed constraint. Never raises."""
    try:
        c = _validate_one(constraint)
        text = as_text(text)
        if len(text) > MAX_TEXT_CHARS or not text.strip():
            return False
        return bool(CONSTRAINT_TYPES[c["type"]][1](text, c))
    except Exception:  # noqa: BLE001 - never raise on model text or a hostile payload
        return False


def constraint_results(text, check) -> list[bool]:
    """One bool per constraint of `check`, in order ([] when the payload is malformed). Never raises."""
    try:
        constraints = parse_constraints(check)
    except Exception:  # noqa: BLE001
        return []
    return [check_constraint(text, c) for c in constraints]


def instruction_score(text, check) -> float:
    """Share of the constraints the response meets, in [0, 1]; 0.0 for a malformed payload. Never raises."""
    results = constraint_results(text, check)
    return sum(results) / len(results) if results else 0.0
