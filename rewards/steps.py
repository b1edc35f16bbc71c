"""Exact checker for the arithmetic in each solution step: the process labels / step scores.

    check_steps(text) -> list[float | None]     one entry per step from rewards.parse.split_steps:
        1.0  every arithmetic claim in the step is true
        0.0  at least one claim is false
        None the step has no checkable claim (or lies beyond MAX_CHECK_CHARS of steps)

A claim is an equality chain between arithmetic expressions, e.g. `3 + 4 = 7`, `12*3=36 = 6*6`,
`1/2 + 1/3 = 5/6`, `7×2＝14`, `20% × 50 = 10`, `2^{10} = 1024`, `\\frac{3}{4} = 0.75`. Numbers are digits with an
optional decimal part (full-width digits are accepted) and an optional `%`; operators are + - * / ^ ** and their
Unicode forms × ÷ · − ＋ － ＊ ／ and LaTeX \\times \\cdot \\div \\frac; parentheses (also （）) and implicit
multiplication `2(3+4)` are allowed. Every consecutive pair of parsable parts in a chain is compared, provided
the chain has at least one operation (so `x = 3` or `7 = 7` alone is no claim).

Each part is parsed by the answer verifier's parser (rewards.mathparse.parse_arithmetic: the same grammar and
trees as answers, restricted to plain arithmetic) and evaluated exactly with fractions.Fraction
(rewards._verify_eval.exact); two parts are compared by the verifier's equality rule
(rewards._verify_eval.exact_equal), so `check_step("a = b")` and `is_equiv("a", "b")` agree wherever both decide.
Model text is never passed to eval, sympy or any other general parser. That rule is exact, except that a decimal
literal with at least two decimals is taken as a rounded value (`1/3 = 0.33` holds because 1/3 rounds to 0.33;
`1/3 = 0.3` does not: one decimal is too coarse), and a bare percentage states its number or its fraction
(`50% = 0.5`). Limits keep hostile text cheap: expressions of at most 400 characters, exact results under
20,000 bits and exponents up to 10,000 (rewards._verify_eval), 64 parts per chain, 2000 evaluations and 200 claims
per step, and steps beyond the first MAX_CHECK_CHARS characters of steps are not checked.

To avoid false labels, an edge part of a chain is only used when the text around it cannot continue the
expression: `2x + 3 = 7`, `f(3) = 9`, `3:4 = 6:8`, `1,000 + 2 = 1,002`, `3² = 9` give no claim. A neighbouring Han
character, CJK punctuation, an arrow or therefore-sign (→ ⇒ ∴), `$`, line start/end, ASCII punctuation followed
by a space, or a separate word of two or more letters is a safe boundary; so is whitespace between two
expressions on one line (`3+4=7 5+6=11`) and a parenthetical remark (`2 + 3 = 5 (check)`).
"""
from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import NamedTuple

from rewards import _verify_eval as ev
from rewards.mathparse import ParseError, parse_arithmetic
from rewards.parse import as_text, split_steps
from rewards.text import MATH_CHARS, is_han

__all__ = ["Claim", "evaluate", "find_claims", "check_step", "check_steps", "step_score"]

MAX_EXPR_CHARS = 400
MAX_CLAIMS = 200
MAX_CHAIN_PARTS = 64  # parts of one `a = b = c ...` chain that are looked at
MAX_EVALUATIONS = 2000  # expression evaluations per step
MAX_STEP_CHARS = 200_000  # longer steps are checked on their first part only
MAX_CHECK_CHARS = 65_536  # steps starting beyond this many characters of step text are not checked (None)

def _frac(m: re.Match) -> str:
    """\\frac{a}{b} -> ((a)/(b)); but after a number ("2\\frac{1}{2}", "(2) \\frac{1}{2}") the answer parser reads
    a mixed number (or, after an operator, a product), so that notation is left unread and gives no claim."""
    i = m.start() - 1
    while i >= 0 and m.string[i] in " \t":
        i -= 1
    if i >= 0 and (m.string[i].isdigit() or m.string[i] in ".)"):
        return m.group(0)
    return f"(({m.group(1)})/({m.group(2)}))"


_LATEX = [
    (re.compile(r"\\[dt]?frac\s*\{([0-9+\-*/.() ]{1,60})\}\s*\{([0-9+\-*/.() ]{1,60})\}"), _frac),
    (re.compile(r"\\(?:times|cdot|ast)(?![A-Za-z])"), "*"),
    (re.compile(r"\\div(?![A-Za-z])"), "/"),
    (re.compile(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])"), ""),
    (re.compile(r"\^\s*\{([0-9+\-*/.() ]{1,20})\}"), r"^(\1)"),
    (re.compile(r"\*\*"), "^"),
]
# A run of characters that can form an arithmetic chain (no newlines: claims do not span lines).
# Maximal runs only (no required "=" inside the pattern): a pattern like `[...]*=` backtracks quadratically.
_RUN = re.compile(r"[0-9.+\-*/^()%= \t]+")
_CJK_PUNCT = set("，。：；、！？「」『』“”‘’《》…【】") | set("→⇒⟹∴∵")  # arrows and therefore-signs end a claim
_SAFE_ASCII_PUNCT = set(",;:!?.")
_OPERATIONS = ("+", "-", "*", "/", "^", "pct")


class Claim(NamedTuple):
    """One checked equality: the two sides as written (normalised) and whether they are equal."""

    lhs: str
    rhs: str
    ok: bool


def evaluate(expr: str) -> Fraction | None:
    """Exact value of an arithmetic expression in the grammar above, or None (malformed, too large, 1/0)."""
    if not isinstance(expr, str):
        return None
    node, _ = _parse(_normalise(expr))
    return None if node is None else ev.exact(node)


def _parse(expr) -> tuple[tuple | None, int]:
    """(tree, number of operations) of already normalised text when it is exact arithmetic, else (None, 0)."""
    if not isinstance(expr, str) or len(expr) > MAX_EXPR_CHARS:
        return None, 0
    try:
        node = parse_arithmetic(expr)
        ev.exact(node)
    except (ParseError, ev.NotExact, ValueError, ZeroDivisionError, OverflowError, RecursionError, MemoryError):
        return None, 0
    return node, sum(1 for nd in ev.walk(node) if nd[0] in _OPERATIONS)


def _normalise(text: str) -> str:
    text = text.translate(MATH_CHARS)
    for rx, rep in _LATEX:
        text = rx.sub(rep, text)
    return text


def _edge_is_safe(text: str, run_start: int, run_end: int, left: bool, part: str) -> bool:
    """Whether the text just outside the run cannot continue the edge part's expression."""
    stripped = part.strip()
    if left:
        pos, spaced = run_start - 1, part[:1].isspace()
        edge_op = stripped[:1] in "+-*/^%" if stripped else False
    else:
        pos, spaced = run_end, part[-1:].isspace()
        edge_op = stripped[-1:] in "+-*/^(" if stripped else False
    if pos < 0 or pos >= len(text):
        return True
    c = text[pos]
    if c in "\n\r" or is_han(c) or c in _CJK_PUNCT or c == "$":
        return True
    if c in _SAFE_ASCII_PUNCT:
        if left:
            return spaced
        nxt = text[pos + 1] if pos + 1 < len(text) else "\n"
        return nxt.isspace() or is_han(nxt) or nxt in _CJK_PUNCT or nxt == "$"
    if c.isalpha() and spaced and not edge_op:
        # A separate word: "total 3 + 4 = 7", "= 7 apples" are fine; a lone letter ("2 x 3", "= 4 y") is not.
        lo, hi = pos, pos
        while lo > 0 and text[lo - 1].isalpha():
            lo -= 1
        while hi + 1 < len(text) and text[hi + 1].isalpha():
            hi += 1
        return hi - lo + 1 >= 2
    return False


def _trim_parens(part: str, left: bool) -> str:
    """Drop unbalanced edge parentheses that belong to surrounding prose: "(see 3+4" -> "3+4", "5 (" -> "5"."""
    excess = part.count("(") - part.count(")")
    if left and excess > 0:
        body = part.lstrip()
        k = min(excess, len(body) - len(body.lstrip("(")))
        return body[k:]
    if not left and excess < 0:
        body = part.rstrip()
        k = min(-excess, len(body) - len(body.rstrip(")")))
        return body[: len(body) - k]
    if not left and excess > 0 and part.rstrip().endswith("("):
        return part.rstrip()[:-1]  # "= 5 (correct)": the "(" opens a remark
    return part


# "3+4=7 5+6=11": whitespace between an operand and a number separates two expressions. Not before "(":
# "2 (3+4)" is an implicit product.
_GAP = re.compile(r"(?<=[0-9)%])[ \t]+(?=[0-9.])")
_THOUSANDS = re.compile(r"[0-9]{3}(?![0-9.])")


def _sub_runs(run: str) -> list[tuple[int, int]]:
    """Split a run where whitespace separates two operands (two expressions side by side), except for
    space-grouped thousands ("1 000"), which are left whole (and then do not parse: no claim)."""
    cuts, spans, start = [], [], 0
    for g in _GAP.finditer(run):
        if run[g.start() - 1].isdigit() and _THOUSANDS.match(run, g.end()):
            continue
        cuts.append((g.start(), g.end()))
    for cut_start, cut_end in cuts:
        spans.append((start, cut_start))
        start = cut_end
    spans.append((start, len(run)))
    return spans


def _chain_claims(text: str, start: int, end: int, left_edge: bool, right_edge: bool, budget: list[int]) -> list[Claim]:
    """Claims of one chain text[start:end]; edges that touch surrounding prose are checked for safety."""
    chain = text[start:end]
    parts = chain.split("=", MAX_CHAIN_PARTS)
    truncated = len(parts) > MAX_CHAIN_PARTS  # the rest of a very long chain is not looked at
    parts = parts[:MAX_CHAIN_PARTS]
    values: list[tuple[tuple | None, int]] = []
    for i, part in enumerate(parts):
        budget[0] -= 1
        if len(part) > 2 * MAX_EXPR_CHARS or budget[0] < 0:
            values.append((None, 0))  # too long to be a claim, or out of budget: skip the work
            continue
        usable = True
        if i == 0 and left_edge:
            part = _trim_parens(part, left=True)
            usable = _edge_is_safe(text, start, end, True, part)
        if i == len(parts) - 1 and right_edge and not truncated:
            part = _trim_parens(part, left=False)
            usable = usable and _edge_is_safe(text, start, end, False, part)
        parts[i] = part
        values.append(_parse(part) if usable and part.strip() else (None, 0))
    if not any(v is not None and n_ops > 0 for v, n_ops in values):
        return []
    claims = []
    for i in range(len(parts) - 1):
        (a, _), (b, _) = values[i], values[i + 1]
        if a is not None and b is not None:
            claims.append(Claim(parts[i].strip(), parts[i + 1].strip(), ev.exact_equal(a, b) is True))
    return claims


def find_claims(step) -> list[Claim]:
    """All checkable equalities in one step's text."""
    try:
        text = _normalise(as_text(step)[:MAX_STEP_CHARS])
        claims: list[Claim] = []
        budget = [MAX_EVALUATIONS]
        for m in _RUN.finditer(text):
            if budget[0] <= 0 or len(claims) >= MAX_CLAIMS:
                break
            run_start, run_end = m.start(), m.end()
            run = m.group()
            if "=" not in run:
                continue
            # A trailing "." ends a sentence, not a decimal: "3 + 4 = 7." (the run regex took it).
            while run.endswith(".") or run.endswith(" ") and run.rstrip().endswith("."):
                cut = len(run) - len(run.rstrip(" ."))
                run, run_end = run[: len(run) - cut], run_end - cut
            subs = _sub_runs(run)
            for k, (s0, s1) in enumerate(subs):
                if "=" in run[s0:s1]:
                    claims += _chain_claims(text, run_start + s0, run_start + s1, k == 0, k == len(subs) - 1, budget)
        return claims[:MAX_CLAIMS]
    except Exception:  # noqa: BLE001 - never raise on model text
        return []


def check_step(step) -> float | None:
    """1.0 if every claim in the step holds, 0.0 if any fails, None without claims."""
    claims = find_claims(step)
    if not claims:
        return None
    return 1.0 if all(c.ok for c in claims) else 0.0


def check_steps(text) -> list[float | None]:
    """Score of every step of a solution (see module docstring); [] when there are no step markers. One entry
    per step of rewards.parse.step_spans(text), always: steps after the first MAX_CHECK_CHARS characters of
    step text are None (not checked), which bounds the cost of a huge text."""
    try:
        scores, seen = [], 0
        for step in split_steps(text):
            scores.append(check_step(step) if seen < MAX_CHECK_CHARS else None)
            seen += len(step)
        return scores
    except Exception:  # noqa: BLE001
        return []


def step_score(scores) -> float | None:
    """Mean of the non-None step scores, or None when no step has a claim."""
    vals = [s for s in (scores or []) if s is not None and not (isinstance(s, float) and math.isnan(s))]
    return sum(vals) / len(vals) if vals else None
