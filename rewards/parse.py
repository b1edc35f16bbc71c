"""Parsing of model solutions: step markers, step spans and the final answer.

Used by the format reward, the step checker, the combined reward and the trainer (which maps each step's
character span to its last token to place process rewards).

Accepted step markers (anywhere in the text; English ones must not follow a letter):
    步骤一：  步骤1：  步骤 12:  第一步：  第3步:        Chinese numerals (零〇一二两三…十百千) or digits 0-9 / ０-９,
    Step 1:   Step 1.   **Step 2:**                  full-width or ASCII colon (English also accepts a period).
Accepted final-answer forms (the one that starts last wins):
    答案：x   最终答案：x   Answer: x   Final Answer: x   The answer is x   \\boxed{x} (nested braces)
    \\boxed x   \\fbox{x}
An answer line's value runs to the end of its line (or the next non-empty line when the marker ends its line).
Values are cleaned: surrounding whitespace, trailing periods (. 。), and $...$, \\(...\\), \\[...\\] delimiters go.

Every public function accepts anything (str, bytes, None, other objects) and never raises; bytes are decoded
as UTF-8 with replacement, other non-str input counts as empty text. All scans are linear in the text length.
"""
from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "Step", "AnswerMarker", "as_text", "cn_to_int", "parse_steps", "split_steps", "step_spans",
    "find_answer_markers", "answer_value", "is_answer_line", "final_answer_marker", "extract_answer", "clean_answer",
]

_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9}
_CN_UNITS = {"十": 10, "百": 100, "千": 1000}
_CN_CHARS = "零〇一二两三四五六七八九十百千"
_DIGITS = "0-9０-９"

# Step markers. Group "n" holds the number text.
_ZH_STEP = re.compile(
    rf"步骤\s*(?P<n>[{_CN_CHARS}]{{1,8}}|[{_DIGITS}]{{1,6}})\s*[：:]"
    rf"|第\s*(?P<n2>[{_CN_CHARS}]{{1,8}}|[{_DIGITS}]{{1,6}})\s*步\s*[：:]"
)
# "Step 1." must not be the start of a decimal such as "Step 1.5".
_EN_STEP = re.compile(rf"(?<![A-Za-z])step\s*(?P<n>[{_DIGITS}]{{1,6}})\s*(?:[:：]|\.(?![0-9]))", re.IGNORECASE)

# Answer-line markers. "The answer is" only ends a step when it starts a line (it often appears mid-sentence).
_ZH_ANSWER = re.compile(r"(?:最终)?答案\s*[：:]")
_EN_ANSWER = re.compile(r"(?<![A-Za-z])(?:final\s+)?answer\s*[:：]", re.IGNORECASE)
_EN_ANSWER_IS = re.compile(r"(?<![A-Za-z])the\s+(?:final\s+)?answer\s+is\b\s*[:：]?", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_LINE_START_PREFIX = re.compile(r"[ \t*#>\-]*\Z")  # whitespace / markdown decoration allowed before a line-start marker
_DECORATION = re.compile(r"[*#>\-][ \t*#>\-]*\Z")  # markdown decoration (not plain indentation) before a marker


class Step(NamedTuple):
    """One step: its number, the span of the whole step (marker included, trailing whitespace excluded),
    where the content (after the marker) starts, the content, and the marker style."""

    number: int | None
    start: int
    content_start: int
    end: int
    text: str
    style: str = "zh"  # "zh" for 步骤一：/第一步：, "en" for Step 1:


class AnswerMarker(NamedTuple):
    """One final-answer occurrence: kind ("line" for 答案：/Answer:/The answer is, "boxed" for \\boxed/\\fbox),
    the marker start, and the raw value span [vstart, vend) (vstart == -1 for an unterminated \\boxed{).
    Values are cut lazily with answer_value(), so hostile texts with many markers stay linear in memory."""

    kind: str
    start: int
    vstart: int
    vend: int
    lang: str = ""  # "zh" (答案：), "en" (Answer:), "en_is" (The answer is), "" for boxed
    at_line_start: bool = False


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


def cn_to_int(s: str) -> int | None:
    """Value of a Chinese numeral (一, 十二, 二十, 九十九, 一百零一, 两千三百) or of a digit string; None if malformed."""
    if not isinstance(s, str) or not s or len(s) > 12:
        return None
    if all(c in "0123456789０１２３４５６７８９" for c in s):
        return int(s)  # int() accepts full-width digits
    total, digit, last_unit = 0, None, 10_000
    for c in s:
        if c in _CN_DIGITS:
            if digit is not None and _CN_DIGITS[c] != 0 and digit != 0:
                return None  # two digits in a row, e.g. 一二
            digit = _CN_DIGITS[c]
        elif c in _CN_UNITS:
            unit = _CN_UNITS[c]
            if unit >= last_unit:
                return None  # units must decrease: 十百 is malformed
            total += (1 if digit is None else digit) * unit  # 十 alone means 10
            digit, last_unit = None, unit
        else:
            return None
    if digit is not None:
        total += digit
    return total


def _near_line_start(text: str, pos: int, window: int) -> int | None:
    """Start of pos's line when it is at most `window` characters back, else None (bounded scan: linear
    overall even for huge single-line texts)."""
    lo = max(0, pos - window)
    nl = text.rfind("\n", lo, pos)
    if nl >= 0:
        return nl + 1
    return 0 if lo == 0 else None


def _at_line_start(text: str, pos: int) -> bool:
    line_start = _near_line_start(text, pos, 64)
    return line_start is not None and _LINE_START_PREFIX.match(text, line_start, pos) is not None


def _step_markers(text: str) -> list[tuple[int, int, int | None, str]]:
    """(marker start, marker end, number, style) of every step marker, in text order."""
    found = []
    for m in _ZH_STEP.finditer(text):
        found.append((m.start(), m.end(), cn_to_int(m.group("n") or m.group("n2")), "zh"))
    for m in _EN_STEP.finditer(text):
        found.append((m.start(), m.end(), cn_to_int(m.group("n")), "en"))
    out = []
    for start, end, number, style in sorted(found):
        # Markdown decoration around the marker ("**Step 1:**", "### 步骤一：") belongs to the marker.
        line_start = _near_line_start(text, start, 16)
        if line_start is not None and _DECORATION.match(text, line_start, start):
            start = line_start
        if text.startswith("**", end):
            end += 2
        out.append((start, end, number, style))
    return out


def _answer_line_starts(text: str) -> list[int]:
    """Start positions of answer-line markers that terminate a step (see is_answer_line)."""
    return sorted(m.start for m in find_answer_markers(text) if is_answer_line(m))


def is_answer_line(marker) -> bool:
    """Whether an answer occurrence is a final-answer line: 答案：/最终答案：/Answer: anywhere, or
    "The answer is" at the start of a line (mid-sentence it is prose, though extract_answer still reads it)."""
    return marker.kind == "line" and (marker.lang != "en_is" or marker.at_line_start)


def parse_steps(text) -> list[Step]:
    """All steps in order. Text before the first marker (a preamble) is not a step; a step ends at the next
    step marker or answer line (答案：/Answer:/a line starting with "The answer is"), whichever comes first."""
    try:
        text = as_text(text)
        markers = _step_markers(text)
        if not markers:
            return []
        boundaries = sorted({m[0] for m in markers} | set(_answer_line_starts(text)) | {len(text)})
        steps, bi = [], 0
        for start, mend, number, style in markers:
            while boundaries[bi] <= start:
                bi += 1
            end = boundaries[bi]
            # Trailing whitespace does not belong to the step: its last character is then a real token.
            while end > mend and text[end - 1].isspace():
                end -= 1
            cstart = mend
            while cstart < end and text[cstart].isspace():
                cstart += 1
            steps.append(Step(number, start, cstart, end, text[cstart:end], style))
        return steps
    except Exception:  # noqa: BLE001 - never raise on model text
        return []


def split_steps(text) -> list[str]:
    """Content of each step (marker removed, whitespace stripped), in order; [] when there are no markers."""
    return [s.text for s in parse_steps(text)]


def step_spans(text) -> list[tuple[int, int]]:
    """Character span (start, end) of each step in `text`: start at the step marker, end just after the step's
    last non-space character, so text[end - 1] is the step's last character (the trainer maps it to a token).

    For bytes input the spans index the decoded string, not the bytes."""
    return [(s.start, s.end) for s in parse_steps(text)]


_BRACE_TOKEN = re.compile(r"\\[{}]|[{}]")


def _brace_matches(text: str) -> dict[int, int]:
    """Map each "{" to its matching "}" in one linear pass (unescaped braces; \\{ and \\} are literal)."""
    stack, match = [], {}
    for m in _BRACE_TOKEN.finditer(text):
        tok = m.group()
        if tok == "{":
            stack.append(m.start())
        elif tok == "}" and stack:
            match[stack.pop()] = m.start()
    return match


def _line_value_span(text: str, pos: int, limit: int) -> tuple[int, int]:
    """Value span of an answer line: skip whitespace (so "Answer:\n42" works), then up to the end of that
    line, never past `limit` (the next answer marker)."""
    i = pos
    while i < limit and text[i].isspace():
        i += 1
    end = text.find("\n", i, limit)
    return i, (limit if end < 0 else end)


_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def clean_answer(value) -> str | None:
    """Strip whitespace, trailing periods and math delimiters; None when nothing is left."""
    if not isinstance(value, str):
        return None
    v = value.strip()
    for _ in range(4):  # a few rounds: "$42$." -> "$42$" -> "42"
        before = v
        v = v.rstrip(" \t\r\n.。")
        for left, right in _DELIMS:
            if len(v) >= len(left) + len(right) and v.startswith(left) and v.endswith(right):
                v = v[len(left):len(v) - len(right)].strip()
        if v.startswith("$") and v.count("$") == 1:
            v = v[1:].strip()  # an unclosed leading "$"
        if v.endswith("$") and v.count("$") == 1:
            v = v[:-1].strip()
        if v == before:
            break
    return v or None


def _boxed_span(text: str, end_of_cmd: int, braces: dict[int, int]) -> tuple[int, int]:
    """Value span after \\boxed / \\fbox: a braced group (nested braces allowed) or, for "\\boxed x", one token.
    (-1, -1) when there is none (unterminated brace, nothing after the command)."""
    i, n = end_of_cmd, len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i < n and text[i] == "{":
        close = braces.get(i)
        return (-1, -1) if close is None else (i + 1, close)
    if i == end_of_cmd:
        return -1, -1  # "\\boxedx" is not a boxed value
    j = i
    while j < n and not text[j].isspace() and text[j] not in "${}":
        j += 1
    return (i, j) if j > i else (-1, -1)


def find_answer_markers(text) -> list[AnswerMarker]:
    """Every final-answer occurrence (answer lines and boxed values), ordered by start position."""
    try:
        text = as_text(text)
        # "Final Answer:" / "最终答案：" are matched once each (regex alternation), so there are no duplicates.
        lines = sorted((m.start(), m.end(), lang) for rx, lang in ((_ZH_ANSWER, "zh"), (_EN_ANSWER, "en"), (_EN_ANSWER_IS, "en_is"))
                       for m in rx.finditer(text))
        boxes = [(m.start(), m.end()) for m in _BOXED.finditer(text)]
        braces = _brace_matches(text) if boxes else {}
        starts = sorted([m[0] for m in lines] + [s for s, _ in boxes]) + [len(text)]
        out, k = [], 0
        for start, mend, lang in lines:
            while starts[k] <= start:
                k += 1
            vs, ve = _line_value_span(text, mend, starts[k])
            out.append(AnswerMarker("line", start, vs, ve, lang, _at_line_start(text, start)))
        for start, mend in boxes:
            vs, ve = _boxed_span(text, mend, braces)
            out.append(AnswerMarker("boxed", start, vs, ve))
        out.sort(key=lambda a: a.start)
        return out
    except Exception:  # noqa: BLE001
        return []


def answer_value(text, marker: AnswerMarker) -> str | None:
    """The cleaned value of one answer occurrence (None when empty or unterminated)."""
    text = as_text(text)
    if marker.vstart < 0:
        return None
    return clean_answer(text[marker.vstart:marker.vend])


def final_answer_marker(text) -> AnswerMarker | None:
    """The answer occurrence that wins: the one starting last. A boxed value inside an answer line
    ("Answer: \\boxed{5}") starts later, so it wins and gives the clean value."""
    markers = find_answer_markers(text)
    return markers[-1] if markers else None


def extract_answer(text) -> str | None:
    """The final answer string: the value of the last occurrence that has one (an empty "Answer:" or an
    unterminated "\\boxed{" at the very end does not erase an earlier answer); None when there is none."""
    try:
        text = as_text(text)
        for m in reversed(find_answer_markers(text)):
            value = answer_value(text, m)
            if value is not None:
                return value
        return None
    except Exception:  # noqa: BLE001
        return None
