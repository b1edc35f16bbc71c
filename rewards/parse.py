"""Parsing of model solutions: step markers, step spans and the final answer (the one extractor of rewards/).

Used by the format reward, the step checker, answer verification (rewards.verify reads its candidates from
answer_candidates), the combined reward, evaluation, and the trainer (which maps each step's character span to
its last token to place process rewards).

Accepted step markers (anywhere in the text; English ones must not follow a letter):
    步骤一：  步骤1：  步骤 12:  第一步：  第3步:        Chinese numerals (零〇一二两三…十百千) or digits 0-9 / ０-９,
    Step 1:   Step 1.   **Step 2:**                  full-width or ASCII colon (English also accepts a period).
A step ends at the next step marker, at a final-answer line (below), at <answer> or </think>.

Final-answer occurrences (find_answer_markers; the one that starts last and has a value wins):
    line   答案：x  最终答案：x  答：x (not inside 解答：)  答案是x / 答案为x        (zh, zh_is)
           Answer: x  Final Answer: x  (the) (final) answer is x                 (en, en_is)
           #### x at the start of a line, x a number (GSM8K; "#### Step 1" and "#### 1. Setup" are headings)
    tag    <answer>x</answer> (R1 style; an unclosed tag has no value)
    boxed  \\boxed{x} (nested braces, \\{ \\} literal)  \\boxed x  \\fbox{x}
A line's value runs to the end of its line (or the next non-empty line when the marker ends its line), never past
the next marker or a closing </answer> / </think>; an answer line inside a box's braces is part of the box.
extract_answer(text) reads the winner (within the last ANSWER_WINDOW characters):
  * a box is joined with the boxes just before it when only connectors separate them ("\\boxed{2} and
    \\boxed{3}" gives "2, 3"; "first \\boxed{3}, then corrected: \\boxed{4}" gives "4");
  * a line or tag value is cut at its first sentence end (". ", "。", a newline, "I hope", "<|"), then taken
    after its last "is" ("Final Answer: The largest $n$ is 34" gives "34"), then math regions in it win
    ("so the answer is $y = 5$" gives "y = 5"), Latin prose gives its number ("12 apples" gives "12") and a
    formula is read whole;
  * one value (issue 52): a reading never picks one value out of several. A sentence that names two or more
    values (_values: numbers and math regions with a digit, each distinct value once, not counting step markers
    nor the working before an "=") is prose with no reading ("it is either 71 or 72", "not 71 but 72"), or a
    formula read whole with no number fallback ("71 or 72" is a list; "71或72", which the parser refuses, matches
    nothing);
  * a text with no answer occurrence at all answers with its final sentence when that names exactly one value
    ("...So, Mia has 15 marbles." gives "15");
  * values lose surrounding whitespace, trailing . and 。, and $...$, $$...$$, \\(...\\), \\[...\\] delimiters.
answer_candidates(text) gives verification the same readings in order, plus fallbacks for a bare answer: a
multiple-choice letter at the start, the last math regions when they are all the text names, else the text.

Every public function accepts anything (str, bytes, None, other objects) and never raises; bytes are decoded
as UTF-8 with replacement, other non-str input counts as empty text. All scans are linear in the text length.
"""
from __future__ import annotations

import bisect
import re
from fractions import Fraction
from typing import NamedTuple

from rewards.mathparse import FUNCS, GREEK
from rewards.text import MATH_CHARS, as_text, brace_pairs

__all__ = [
    "Step", "AnswerMarker", "ANSWER_WINDOW", "as_text", "cn_to_int", "parse_steps", "split_steps", "step_spans",
    "find_answer_markers", "answer_value", "is_answer_line", "final_answer_marker", "extract_answer", "clean_answer",
    "answer_candidates",
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

# Answer-line markers, each with its lang. "The answer is" / "答案是" only end a step when they start a line
# (mid-sentence they are prose, though extract_answer still reads them).
_LINE_MARKERS = (  # (pattern, lang, a substring every match contains: patterns whose key is absent are skipped)
    (re.compile(r"(?:最终)?答案\s*[：:]|(?<![\u3400-\u9fff])答\s*[：:]"), "zh", "答"),
    (re.compile(r"(?:最终)?答案\s*(?:是|为)\s*[：:]?"), "zh_is", "答"),
    # GSM8K: "#### 72" at a line start; not a markdown heading such as "#### Step 1" or "#### 1. Setup"
    (re.compile(r"^[ \t>]*####[ \t]*(?=[-+]?\$?[ \t]*[0-9０-９.])(?![ \t]*[0-9]+\.?[ \t]+[^\s0-9])", re.MULTILINE),
     "gsm8k", "####"),
)
_ANY_MARKER = re.compile(r"答|answer|####|\\(?:boxed|fbox)", re.IGNORECASE)  # every marker contains one of these
# English markers "(final) answer:" (en) and "(the) (final) answer is" (en_is), not after an ASCII letter. They
# are found from each literal "answer" (a scan for a literal is fast, a pattern with optional words in front is
# not): the part after it decides the kind, the leftmost valid prefix before it the start, so the matches are
# those of a left-to-right scan with the two patterns.
_ANSWER_WORD = re.compile(r"answer", re.IGNORECASE)
_EN_AFTER = re.compile(r"answer(?:\s*[:：]|(\s+is(?![A-Za-z])\s*[:：]?))", re.IGNORECASE)
_EN_BEFORE = {"en": re.compile(r"(?<![A-Za-z])(?:final\s+)?\Z", re.IGNORECASE),
              "en_is": re.compile(r"(?<![A-Za-z])(?:the\s+)?(?:final\s+)?\Z", re.IGNORECASE)}


def _english_markers(text: str) -> list[tuple[int, int, str]]:
    """(start, end, lang) of the English answer markers, in order."""
    out = []
    for word in _ANSWER_WORD.finditer(text):
        i = word.start()
        after = _EN_AFTER.match(text, i)
        if after is None:
            continue
        lang = "en_is" if after.group(1) else "en"
        before = _EN_BEFORE[lang].search(text, max(0, i - 32), i)
        if before is not None and (not out or before.start() >= out[-1][1]):  # a scan resumes after a match
            out.append((before.start(), after.end(), lang))
    return out


_TAG_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_TAG_CLOSE = re.compile(r"</answer>|</think>", re.IGNORECASE)  # a line value never runs past these
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
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
    """One final-answer occurrence: kind ("line" for 答案：/Answer:/The answer is/####, "tag" for <answer>,
    "boxed" for \\boxed/\\fbox), the marker start, and the raw value span [vstart, vend) (vstart == -1 for an
    unterminated \\boxed{ or <answer>).
    Values are cut lazily with answer_value(), so hostile texts with many markers stay linear in memory."""

    kind: str
    start: int
    vstart: int
    vend: int
    lang: str = ""  # zh (答案：), zh_is (答案是), en (Answer:), en_is (The answer is), gsm8k (####), tag, "" for boxed
    at_line_start: bool = False


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
    """Start positions of answer lines and tags (see is_answer_line) and of </think>: they terminate a step."""
    starts = [m.start for m in find_answer_markers(text) if is_answer_line(m) or m.kind == "tag"]
    return sorted(starts + [m.start() for m in _THINK_CLOSE.finditer(text)])


def is_answer_line(marker) -> bool:
    """Whether an answer occurrence is a final-answer line: 答案：/最终答案：/答：/Answer:/#### anywhere, or
    "The answer is" / "答案是" at the start of a line (mid-sentence they are prose, though extract_answer
    still reads them)."""
    return marker.kind == "line" and (marker.lang not in ("en_is", "zh_is") or marker.at_line_start)


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


# ---------------------------------------------------------------------------------------------------------------
# Final answers: the one extractor (format checks, verification, the combined reward and evaluation use it)

ANSWER_WINDOW = 20_000  # the final answer is searched for in the last characters of a text only
MAX_SENTENCE_CHARS = 1_000  # a longer sentence states no single value (no number is picked out of it)
_CHOICE = re.compile(r"^\s*\(?([A-E])\)?\s*[.:)]\s+\S")
_SENTENCE_END = re.compile(r"\n|\.\s|。|I hope|<\|")
_IS = re.compile(r"\bis\b")
# $$..$$, \[..\], \(..\), $..$; each alternative stops at the next opener of its kind, so scanning stays linear
_REGIONS = re.compile(r"(?<!\\)\$\$((?:(?!\$\$).)+?)\$\$|\\\[((?:(?!\\\[).)+?)\\\]"
                      r"|\\\(((?:(?!\\\()[^\n])+?)\\\)|(?<!\\)\$((?:[^$\n\\]|\\.)+?)\$", re.DOTALL)
_LAST_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])(?:-?\d+\s*/\s*\d+(?!\d|[.,]\d)|-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:[.,]\d+)?"
                          r"|-?\.\d+)(?:\s*%)?")
_CODE_LIKE = re.compile(r"__|\b(?:lambda|import|eval|exec|os|sys|open|system)\b|[\"`]"
                        r"|\\(?:input|include|write|immediate|openout|read)\b")
_GAP_WORDS = re.compile(r"\\text\s*\{([^{}]*)\}|\\[a-zA-Z]+|[$,;.:()\[\]\\]")
_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z0-9])[a-zA-Z]*[a-z][a-zA-Z]*(?![a-zA-Z0-9])")
_LATEX_CMD_ARG = re.compile(r"\\[a-zA-Z]+\s*(?:\{[^{}]*\})?")
_MATH_WORDS = {"sqrt", "frac", "dfrac", "tfrac", "cdot", "times", "infty", "infinity", "percent",
               "percentage", "text", "left", "right", "boxed", "sin", "cos", "tan", "log", "ceil",
               "floor", "units", "pmatrix", "bmatrix", "matrix", "begin", "end", "mathrm"}


def _line_value_span(text: str, pos: int, limit: int) -> tuple[int, int]:
    """Value span of an answer line: skip whitespace (so "Answer:\n42" works), then up to the end of that
    line, never past `limit` (the next answer marker or closing tag)."""
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
    """Every final-answer occurrence (answer lines, #### lines, <answer> tags and boxed values), by start.
    An answer line inside a box's braces is part of the box, not a marker of its own."""
    try:
        text = as_text(text)
        if _ANY_MARKER.search(text) is None:
            return []  # the common case for a bare answer: one cheap scan
        keys = {"答": "答" in text, "####": "####" in text}
        # "Final Answer:" / "最终答案：" are matched once each (regex alternation), so there are no duplicates.
        lines = [(m.start(), m.end(), lang) for rx, lang, key in _LINE_MARKERS if keys[key] for m in rx.finditer(text)]
        lines = sorted(lines + _english_markers(text))
        has_tags = "<" in text
        tags = [(m.start(), m.end()) for m in _TAG_OPEN.finditer(text)] if has_tags else []
        closers = [m.start() for m in _TAG_CLOSE.finditer(text)] if has_tags else []
        boxes = [(m.start(), m.end()) for m in _BOXED.finditer(text)]
        braces = brace_pairs(text) if boxes else {}
        out = []
        for start, mend in boxes:
            vs, ve = _boxed_span(text, mend, braces)
            out.append(AnswerMarker("boxed", start, vs, ve))
        lines = _outside_boxes(lines, [(b.vstart, b.vend) for b in out if b.vstart >= 0])
        limits = sorted([m[0] for m in lines] + [s for s, _ in tags] + [s for s, _ in boxes] + closers) + [len(text)]
        for start, mend, lang in lines:
            vs, ve = _line_value_span(text, mend, limits[bisect.bisect_right(limits, start)])
            out.append(AnswerMarker("line", start, vs, ve, lang, lang == "gsm8k" or _at_line_start(text, start)))
        for start, mend in tags:
            k = bisect.bisect_left(closers, mend)
            vs, ve = (mend, closers[k]) if k < len(closers) else (-1, -1)  # an unclosed tag has no value
            out.append(AnswerMarker("tag", start, vs, ve, "tag", _at_line_start(text, start)))
        out.sort(key=lambda a: a.start)
        return out
    except Exception:  # noqa: BLE001
        return []


def _outside_boxes(lines: list[tuple], spans: list[tuple[int, int]]) -> list[tuple]:
    """The line markers (sorted by start) that do not start inside a box value span (sorted by start), in one
    sweep: "\boxed{\text{answer: 5}}" is one boxed answer."""
    out, j, covered_to = [], 0, -1
    for line in lines:
        while j < len(spans) and spans[j][0] <= line[0]:
            covered_to = max(covered_to, spans[j][1])
            j += 1
        if line[0] >= covered_to:
            out.append(line)
    return out


def answer_value(text, marker: AnswerMarker) -> str | None:
    """The cleaned raw value of one answer occurrence (None when empty or unterminated)."""
    text = as_text(text)
    if marker.vstart < 0:
        return None
    return clean_answer(text[marker.vstart:marker.vend])


def final_answer_marker(text) -> AnswerMarker | None:
    """The answer occurrence that starts last. A boxed value inside an answer line ("Answer: \\boxed{5}")
    starts later, so it wins and gives the clean value."""
    markers = find_answer_markers(text)
    return markers[-1] if markers else None


def _short_gap(gap: str) -> bool:
    """Text between two answers that only connects them (",", "and", "for part (a) and"), as
    opposed to a correction ("first 3, then corrected: 4", where the last answer wins)."""
    words = _GAP_WORDS.sub(lambda m: " " + (m.group(1) or "") + " ", gap).split()
    if not any(ch.isalnum() for w in words for ch in w):
        return True
    return len(words) <= 4 and any(w.lower() in ("and", "or", "&", "和", "或") for w in words)


def _trailing_run(spans: list[tuple[int, int, str]], text: str) -> list[tuple[int, int, str]]:
    """The last answer span and the ones just before it that only short connectors separate from it."""
    run = [spans[-1]]
    for prev in reversed(spans[:-1]):
        if prev[1] <= run[0][0] and _short_gap(text[prev[1]:run[0][0]]):
            run.insert(0, prev)
        else:
            break
    return run


def _join_trailing(spans: list[tuple[int, int, str]], text: str) -> str:
    """The last answer, joined with the answers before it when only short connectors separate them."""
    return ", ".join(s[2] for s in _trailing_run(spans, text))


def _regions(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), next(g for g in m.groups() if g is not None)) for m in _REGIONS.finditer(text)]


def _is_prose(text: str) -> bool:
    """Latin prose ("The largest n is 34") as opposed to a formula ("2abc", "x = 3")."""
    text = _LATEX_CMD_ARG.sub(" ", text)
    words = [w for w in _PROSE_WORD.findall(text)
             if len(w) >= 3 and w.lower() not in _MATH_WORDS and w not in FUNCS and w not in GREEK]
    # one long word ("Soucis: 2,74") or two short ones ("not it's not 10"); "2abc" is algebra
    return any(len(w) >= 4 for w in words) or len(words) >= 2


# ---------------------------------------------------------------------------------------------------------------
# One value per answer: the values a sentence names (docs/rewards.md, "An answer names one value")

_WORKING_CHARS = frozenset("0123456789+-*/^()% \t")  # what the arithmetic before an "=" is made of (after MATH_CHARS)
_STEP_WORDS = (_ZH_STEP, _EN_STEP)


class _Value(NamedTuple):
    key: object  # the number's exact value (Fraction, percent flag), or a math region's text without spaces
    text: str    # as written: "1,000", "3/4", "\\frac{1}{2}"


def _number_key(s: str):
    """(exact value, percent) of a number as _LAST_NUMBER finds it ("1,000", "2,5", "3 / 4", "28%"); the text itself
    when it does not convert."""
    t = "".join(s.split())
    pct = t.endswith("%")
    t = t.rstrip("%")
    try:
        if "/" in t:
            n, d = t.split("/")
            return Fraction(int(n), int(d)), pct
        if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", t):
            t = t.replace(",", "")
        return Fraction(t.replace(",", ".")), pct
    except (ValueError, ZeroDivisionError, OverflowError):
        return t


def _drop_working(seg: str) -> str:
    """`seg` with the working of its equations blanked: the arithmetic (digits, + - * / ^ ( ) %, spaces, and "," or
    "." between digits) right before each "=", when it holds a digit, and the "=" itself: "is 9 + 5 = 14" keeps
    "is" and "14"; "x = 3 and y = 2" loses only its "="s (a name is not arithmetic). Linear: a backward scan stops
    at the previous "="."""
    folded = seg.translate(MATH_CHARS)
    out, kept, floor = [], 0, 0
    for eq in (i for i, ch in enumerate(folded) if ch == "="):
        j = eq
        while j > floor and (folded[j - 1] in _WORKING_CHARS
                             or (folded[j - 1] in ",." and j < eq and folded[j].isdigit())):
            j -= 1
        cut = j if any(ch.isdigit() for ch in folded[j:eq]) else eq
        out.append(seg[kept:cut])
        out.append(" " * (eq + 1 - cut))
        kept = floor = eq + 1
    out.append(seg[kept:])
    return "".join(out)


def _values(sentence: str) -> list[_Value]:
    """The distinct values a sentence names, in order of last mention: each math region holding a digit ($71$,
    $\\frac{1}{2}$, $9 + 6 = 15$: one value each) and each number outside them, not counting step markers
    ("Step 2:") nor the working before an "=" ("9 + 5 = 14" names 14). Equal numbers are one value (15 and 15.0)."""
    found: dict = {}
    pos = 0
    for start, end, content in _regions(sentence) + [(len(sentence), len(sentence), "")]:
        outside = _drop_working(sentence[pos:start])
        for rx in _STEP_WORDS:
            outside = rx.sub(" ", outside)
        for num in _LAST_NUMBER.findall(outside):
            num = num.strip()
            found.pop(key := _number_key(num), None)
            found[key] = num
        if any(ch.isdigit() for ch in content):
            c = content.strip()
            key = _number_key(c) if _LAST_NUMBER.fullmatch(c) else "".join(c.split())
            found.pop(key, None)
            found[key] = c
        pos = end
    return [_Value(k, t) for k, t in found.items()]


def _one_value(sentence: str, values: list[_Value]) -> str | None:
    """The value a sentence states when it names exactly one (as written), else None; a sentence over
    MAX_SENTENCE_CHARS states none (a runaway line, or hostile text the parser refuses, such as 5,000 "-"s)."""
    return values[0].text if len(values) == 1 and len(sentence) <= MAX_SENTENCE_CHARS else None


def _final_sentence(text: str) -> str:
    """The last sentence of a text (pieces split as answer values are cut: ". ", "。", a newline, "I hope", "<|"),
    without its closing "." or "。"."""
    for piece in reversed(_SENTENCE_END.split(text)):
        piece = piece.strip().rstrip(" .。")
        if piece:
            return piece
    return ""


def _region_reading(regions: list[tuple[int, int, str]], text: str, keys: set) -> str | None:
    """The last math region of `text` joined with those just before it (_join_trailing), when they name every
    value in `keys` (the text's _values); None when the text names a value outside them ("it could be $71$, but I
    think it's $72$")."""
    run = _trailing_run(regions, text)
    covered = {v.key for start, end, _ in run for v in _values(text[start:end])}
    return ", ".join(c for _, _, c in run) if keys <= covered else None


def _readings(raw: str) -> list[str]:
    """Readings of an answer line's value, best first: the sentence it starts, after its last "is" ("the largest n
    is 34"), math regions in it ($y = 5$), for prose its number, and for a formula the parser reads it whole (with
    its one number as a fallback). A reading never picks one value out of several: a sentence that names two or
    more values (_values) has none unless it is one formula or one run of joined regions ("71 or 72" is the list
    71, 72; "it is either 71 or 72", "not 71 but 72", "71或72" give [])."""
    sentence = _SENTENCE_END.split(raw.strip(), maxsplit=1)[0].strip().rstrip(". ")
    tail = _IS.split(sentence)[-1].strip() if _IS.search(sentence) else sentence
    values = _values(tail)
    keys = {v.key for v in values}
    if any(v.key not in keys for v in _values(sentence)):
        return []  # "not 71, it is 72": the words before "is" name another value
    regions = _regions(tail)
    if regions:
        joined = _region_reading(regions, tail, keys)
        return [] if joined is None else [joined]
    one = _one_value(tail, values)
    if _is_prose(tail):
        if not values:
            return [tail]  # a text answer: "no real solutions"
        return [] if one is None else [one]
    return [tail] + ([one] if one is not None and one != tail else [])


def _unmarked_readings(text: str) -> list[str] | None:
    """Readings of a text with no answer occurrence: its final sentence, when that names exactly one value and
    looks like no code ("So, Mia has 15 marbles." gives 15; "Ben has 9 + 5 = 14." gives 14; "They have 71 or 72."
    and "...so Mia has" give None). A formula or Chinese sentence reads whole first ("5万元", "x = 3"), prose by
    its value."""
    sentence = _final_sentence(text)
    value = _one_value(sentence, _values(sentence))
    if value is None or _CODE_LIKE.search(sentence):
        return None
    return [value] if _is_prose(sentence) or value == sentence else [sentence, value]


def _marker_readings(text: str, markers: list[AnswerMarker]) -> list[str] | None:
    """Readings of the winning answer occurrence: the last one with a value. A box is joined with the boxes
    just before it when only connectors separate them ("\\boxed{2} and \\boxed{3}" is "2, 3"). None when
    there is no answer occurrence with a value."""
    for i in range(len(markers) - 1, -1, -1):
        m = markers[i]
        if m.vstart < 0 or clean_answer(text[m.vstart:m.vend]) is None:
            continue
        if m.kind == "boxed":
            boxes = [(b.start, b.vend + text.startswith("}", b.vend), text[b.vstart:b.vend]) for b in markers[:i + 1]
                     if b.kind == "boxed" and b.vstart >= 0]
            return [_join_trailing(boxes, text)]
        raw = text[m.vstart:m.vend]
        return _readings(" ".join(raw.split()) if m.kind == "tag" else raw)
    return None


def _answer_readings(text: str, markers: list[AnswerMarker]) -> list[str] | None:
    """The readings of the text's answer: its winning answer occurrence's, or, when it has no answer occurrence
    at all, its final sentence's (_unmarked_readings). None when it has neither; [] when its answer names no
    single value."""
    readings = _marker_readings(text, markers)
    return _unmarked_readings(text) if readings is None and not markers else readings


def extract_answer(text) -> str | None:
    """The final answer string: the value of the last answer occurrence that has one (an empty "Answer:" or
    an unterminated "\\boxed{" at the very end does not erase an earlier answer), or without any occurrence the
    one value of the final sentence, read as the module docstring says; None when there is none (or when the
    answer names more than one value)."""
    try:
        text = as_text(text)[-ANSWER_WINDOW:]
        readings = _answer_readings(text, find_answer_markers(text))
        for r in readings or ():
            value = clean_answer(r)
            if value is not None:
                return value
        return None
    except Exception:  # noqa: BLE001
        return None


def answer_candidates(text) -> list[str]:
    """Answer strings to try for verification, best first: the readings of extract_answer's answer (its occurrence,
    or the final sentence's one value); without one, the content so far of a cut-off last \\boxed{, a
    multiple-choice letter at the start ("(B) ..."), the last math regions when they name every value of the text,
    else the text itself (a formula or text answer the parser reads whole; never one number picked out of
    several)."""
    try:
        text = as_text(text)[-ANSWER_WINDOW:]
        markers = find_answer_markers(text)
        readings = _marker_readings(text, markers)
        if readings is not None:
            return readings
        if markers and markers[-1].kind == "boxed" and markers[-1].vstart < 0:
            rest = text[markers[-1].start:].split("{", 1)[-1].strip()
            if rest:
                return [rest]  # a cut-off "\\boxed{..." with no other answer: what it holds so far
        choice = _CHOICE.match(text)
        if choice:
            return [choice.group(1), text]
        unmarked = None if markers else _unmarked_readings(text)
        if unmarked:
            return unmarked
        regions = _regions(text)
        joined = _region_reading(regions, text, {v.key for v in _values(text)}) if regions else None
        return [text] if joined is None else [joined]
    except Exception:  # noqa: BLE001
        return []
