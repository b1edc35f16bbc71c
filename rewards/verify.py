"""Answer verification: is_equiv(pred, gold, timeout=1.0) -> bool, safe on hostile model text.

    from rewards.verify import is_equiv
    is_equiv("7,425,000", "7425000")                          # True
    is_equiv(r"\\boxed{\\dfrac{1}{2}}", "0.5")                   # True
    is_equiv("5*o**2 - 1475*o + 16980", "5*(o - 283)*(o - 12)") # True (symbolic)
    is_equiv(r"x \\in [-2, 7]", r"-2 \\le x \\le 7")              # True
    is_equiv("最终答案：６个", "6"), is_equiv("#### 72", "72")     # True, True

How a pair is decided (cheapest first):
1. Both sides plain numbers (separators, decimals, a/b, percent): the shared equality rule
   (rewards._verify_eval.exact_equal) on exact Fractions, in-process, no parser and no sympy.
2. Otherwise each side is reduced to its final answer by the one extractor,
   rewards.parse.answer_candidates (the readings of extract_answer's occurrence: last \\boxed{},
   answer line, #### line or <answer> tag; else the final sentence's one value, the last $...$
   regions when they are all the text names, or the text), parsed by rewards.mathparse (own tokenizer and Pratt parser: model text is never
   passed to eval/exec/sympify/parse_expr/parse_latex; Chinese units, qualifiers and full-width
   forms are read there) and compared structurally: sets and lists without order, tuples and
   intervals with order and brackets, matrices element-wise, equations and inequalities up to a
   constant factor, "x = 3" against "3", text answers by normalised words.
3. Scalars: the shared equality rule when both are exact rationals (the same rule the step
   checker rewards.steps uses, so the two agree); then complex-float evaluation at deterministic
   random points, three positive reals and two complex values with positive real part (a
   mismatch is final; agreement at >= 4 points settles an analytic identity).  Where that
   argument is weak (floor/ceiling/factorial, too few points in the domain) sympy is asked for a
   proof in a killable worker process (rewards._verify_worker) within the remaining time; if
   sympy cannot decide in time, the numeric agreement stands.
Decimal answers are accepted when they are the other side rounded to their own number of
decimals (at least 2; rewards._verify_eval states the rule).  Anything that overflows a float
(9^{9^{9^9}}, 10**10**10, factorial(10**9)) or exceeds the size limits is rejected: it returns
False, never raises.
"""
from __future__ import annotations

import math
import re
import time
from fractions import Fraction

from rewards import _verify_eval as ev
from rewards._verify_worker import get_worker
from rewards.mathparse import ParseError, parse_answer
from rewards.parse import ANSWER_WINDOW, answer_candidates
from rewards.text import deeper_than

MAX_INPUT_CHARS = 200_000   # longer inputs are rejected outright
MAX_ANSWER_CHARS = 2_000    # an extracted answer longer than this is rejected
MAX_TAIL_CHARS = ANSWER_WINDOW  # only the end of a long solution is searched for its answer (rewards.parse)
MAX_ITEMS = 64              # elements of a set / list / tuple / matrix
REL_TOL = 1e-9              # numeric agreement between two floats
MAX_PM = 4                  # +- signs expanded into 2**MAX_PM values at most
MAX_MATRIX_TERMS = 6        # explicit matrices in one sum or product
_COLLECTIONS = ("list", "set")


class _Deadline(Exception):
    """The time budget of this call ran out."""


# ---------------------------------------------------------------------------------------------
# 1. plain numbers, in-process

# Matched against the stripped string, and linear: each optional `\s*` is glued to the symbol that must follow it
# (after `$` a digit, possibly signed or after a point: the lookahead), so when a match fails the engine gives a
# whitespace run back one character at a time at O(1) per step, never re-splitting it between two quantifiers (the
# old `^\s*\$?\s*...\s*(\\?%)?\s*\$?\s*$` took minutes on 250 leading newlines).
_PLAIN = re.compile(r"(?:\$\s*)?([-+]?)(?=\.?\d)(\d{1,3}(?:,\d{3})+|\d+)?(\.\d+)?(?:\s*(\\?%))?(?:\s*\$)?")
_PLAIN_FRAC = re.compile(r"([-+]?)(\d+)\s*/\s*(\d+)")


def _plain_number(s: str):
    """(value, ndec, is_percent) for a bare number string, else None."""
    s = s.strip()
    m = _PLAIN.fullmatch(s)
    if m and m.group(2) and m.group(2).startswith("0,"):
        return None  # "0,111" is a decimal comma, left to the parser
    if m and (m.group(2) or m.group(3)):
        whole = (m.group(2) or "0").replace(",", "")
        frac = (m.group(3) or ".")[1:]
        value = Fraction(int(whole + frac), 10 ** len(frac))
        return (-value if m.group(1) == "-" else value), (len(frac) or None), bool(m.group(4))
    m = _PLAIN_FRAC.fullmatch(s)
    if m and int(m.group(3)) != 0:
        value = Fraction(int(m.group(2)), int(m.group(3)))
        return (-value if m.group(1) == "-" else value), None, False
    return None


def _plain_node(plain) -> tuple:
    """The parser tree of a plain number, so the fast path applies the same equality rule as the parser."""
    value, ndec, is_percent = plain
    node = ("num", value, ndec)
    return ("pct", node) if is_percent else node


# ---------------------------------------------------------------------------------------------
# 2. the answer to compare: rewards.parse.answer_candidates (the one extractor), parsed

def _parse_first(cands: list[str], deadline: float):
    for c in cands:
        _check_deadline(deadline)
        if len(c) > MAX_ANSWER_CHARS:
            continue
        try:
            return parse_answer(c), c
        except (ParseError, RecursionError, ValueError):
            continue
    return None, (cands[0] if cands else "")


_CANON_DROP = re.compile(r"\\text\s*\{|\\mathrm\s*\{|\\textbf\s*\{|\\mbox\s*\{|[{}$\s]|\\[,;!]|\\left|\\right")


_JUNK = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffd]")


def _same_text(a: str, b: str) -> bool:
    """Last resort for answers the parser does not read: identical after light normalisation."""
    if len(a) > MAX_ANSWER_CHARS or len(b) > MAX_ANSWER_CHARS or _JUNK.search(a) or _JUNK.search(b):
        return False
    return any(ch.isalnum() for ch in a) and _canon(a) == _canon(b)


def _canon(s: str) -> str:
    s = _CANON_DROP.sub("", s).rstrip(".")
    return s.strip("()") if len(s) <= 5 else s


# ---------------------------------------------------------------------------------------------
# 3. structural comparison

def _name_like(node) -> bool:
    kind = node[0]
    if kind in ("sym", "call", "text"):
        return True
    if kind in ("*", "/", "ratio"):
        return _name_like(node[1]) and _name_like(node[2])
    if kind == "fn" and node[1] == "abs":
        return _name_like(node[2][0])
    if kind == "seq":
        return all(_name_like(x) for x in node[3])
    return False


def _expand_pm(node) -> list:
    """All sign choices of +- (at most MAX_PM of them) as separate trees."""
    kind = node[0]
    if kind == "pm":
        rights = _expand_pm(node[2])
        if node[1] is None:
            return [r for v in rights for r in (v, ("neg", v))]
        lefts = _expand_pm(node[1])
        return [(op, a, b) for a in lefts for b in rights for op in ("+", "-")]
    if kind in ("+", "-", "*", "/", "^", "ratio"):
        return [(kind, a, b) for a in _expand_pm(node[1]) for b in _expand_pm(node[2])]
    if kind in ("neg", "fact", "pct"):
        return [(kind, a) for a in _expand_pm(node[1])]
    if kind == "fn" and len(node[2]) == 1:
        return [("fn", node[1], (a,)) for a in _expand_pm(node[2][0])]
    return [node]


def _has_pm(node) -> bool:
    return any(nd[0] == "pm" for nd in ev.walk(node))


def _matrix_arith(node):
    """Sums, differences and products of explicit matrices, as element-wise trees."""
    kind = node[0]
    if kind == "neg":
        a = _matrix_arith(node[1])
        if a[0] == "matrix":
            return ("matrix", tuple(tuple(("neg", x) for x in row) for row in a[1]))
        return node
    if kind not in ("+", "-", "*"):
        return node
    a, b = _matrix_arith(node[1]), _matrix_arith(node[2])
    if a[0] == "matrix" and b[0] == "matrix":
        ra, rb = a[1], b[1]
        if kind in ("+", "-"):
            if len(ra) != len(rb) or len(ra[0]) != len(rb[0]):
                raise ev.EvalError("matrix shapes differ")
            return ("matrix", tuple(tuple((kind, x, y) for x, y in zip(r1, r2)) for r1, r2 in zip(ra, rb)))
        if len(ra[0]) != len(rb) or len(ra) * len(rb[0]) * len(rb) > 4096:
            raise ev.EvalError("matrix shapes do not chain")
        rows = []
        for i in range(len(ra)):
            row = []
            for j in range(len(rb[0])):
                total = ("*", ra[i][0], rb[0][j])
                for k in range(1, len(rb)):
                    total = ("+", total, ("*", ra[i][k], rb[k][j]))
                row.append(total)
            rows.append(tuple(row))
        return ("matrix", tuple(rows))
    if kind == "*" and (a[0] == "matrix") != (b[0] == "matrix"):
        mat, scalar = (a, b) if a[0] == "matrix" else (b, a)
        if scalar[0] in ("list", "set", "seq", "rel", "text"):
            return node
        return ("matrix", tuple(tuple(("*", scalar, x) for x in row) for row in mat[1]))
    return node


def _reduce(node):
    """Rewrites an answer to the value it states (x = 3 -> 3, x in S -> S, a<x<b -> interval)."""
    kind = node[0]
    if kind == "rel":
        parts, ops = node[1], node[2]
        if ops == ("in",) or (len(ops) >= 1 and ops[-1] == "in"):
            return _reduce(parts[-1])
        if "~" in ops and len(parts) > 1:
            k = ops.index("~")
            left = parts[:k + 1]
            if len(left) == 1 and _name_like(left[0]):
                return _reduce(parts[k + 1]) if len(parts) == k + 2 else _reduce(
                    ("rel", parts[k + 1:], ops[k + 1:]))
            return _reduce(left[0] if len(left) == 1 else ("rel", left, ops[:k]))
        if all(op == "=" for op in ops):
            if (_name_like(parts[0]) or (len(parts) > 2 and _name_like(parts[-2]))
                    or not any(ev.symbols(p) for p in parts)):
                return _reduce(parts[-1])
            if len(parts) > 2:
                return ("rel", parts[-2:], ops[-1:])
            return node
        if len(parts) == 3 and _name_like(parts[1]):
            if ops[0] in ("<", "<=") and ops[1] in ("<", "<="):
                lo, hi = parts[0], parts[2]
                return ("seq", "(" if ops[0] == "<" else "[", ")" if ops[1] == "<" else "]", (lo, hi))
            if ops[0] in (">", ">=") and ops[1] in (">", ">="):
                return ("seq", "(" if ops[1] == ">" else "[", ")" if ops[0] == ">" else "]",
                        (parts[2], parts[0]))
        return node
    if kind in ("+", "-", "*", "neg"):
        n_matrices = sum(nd[0] == "matrix" for nd in ev.walk(node))
        if n_matrices > MAX_MATRIX_TERMS:  # products of products grow exponentially
            raise ev.Bomb("too many matrices")
        if n_matrices:
            return _matrix_arith(node)
    if kind == "seq":
        return ("seq", node[1], node[2], tuple(_reduce(x) if x[0] == "rel" else x for x in node[3]))
    if kind in ("list", "set"):
        items = []
        for x in node[1]:
            y = _reduce(x)
            # "1 +- sqrt(5), -2" lists three values
            items.extend(y[1] if y[0] == "set" and x[0] != "set" else (y,))
        if kind == "list" and len(items) == 1:
            return items[0]
        return (kind, tuple(items))
    if kind == "*":
        if node[2][0] == "text" and node[1][0] != "text":
            return _reduce(node[1])
        if node[1][0] == "text" and node[2][0] != "text":
            return _reduce(node[2])
    if kind == "^" and node[1][0] == "text":
        return node[1]
    if kind == "text":
        return ("text", node[1].strip().strip("()").strip())
    if kind != "set" and _has_pm(node):
        if sum(nd[0] == "pm" for nd in ev.walk(node)) > MAX_PM:
            raise ev.Bomb("too many +- signs")
        variants = _expand_pm(node)
        if len(variants) > 1:
            return ("set", tuple(variants))
    return node


def _word(node) -> str | None:
    """The letters of a text node or of a product of one-letter symbols (odd == o*d*d)."""
    if node[0] == "text":
        return node[1].replace(" ", "")
    if node[0] == "sym":
        return node[1]
    if node[0] == "*":
        a, b = _word(node[1]), _word(node[2])
        return a + b if a is not None and b is not None else None
    return None


def _check_deadline(deadline: float) -> None:
    if time.monotonic() > deadline:
        raise _Deadline


class _Comparer:
    def __init__(self, deadline: float):
        self.deadline = deadline

    def check_time(self) -> None:
        _check_deadline(self.deadline)

    # -- dispatch
    def equiv(self, a, b) -> bool:
        self.check_time()
        if a[0] == "rel" and b[0] == "rel" and self.relations(a, b):
            return True
        a, b = _reduce(a), _reduce(b)
        ka, kb = a[0], b[0]
        if ka in _COLLECTIONS or kb in _COLLECTIONS:
            return self.collections(a, b)
        if ka == "union" or kb == "union":
            pa, pb = self.union_parts(a), self.union_parts(b)
            return len(pa) == len(pb) and self.unordered(pa, pb)
        if ka == "seq" or kb == "seq":
            return ka == kb and a[1] == b[1] and a[2] == b[2] and self.ordered(a[3], b[3])
        if ka == "matrix" or kb == "matrix":
            return (ka == kb and len(a[1]) == len(b[1]) and len(a[1][0]) == len(b[1][0])
                    and all(self.ordered(ra, rb) for ra, rb in zip(a[1], b[1])))
        if ka == "rel" or kb == "rel":
            return ka == kb and self.relations(a, b)
        if ka == "text" or kb == "text":
            wa, wb = _word(a), _word(b)
            return wa is not None and wa == wb
        if ka == "ratio" or kb == "ratio":
            return ka == kb and self.equiv(a[1], b[1]) and self.equiv(a[2], b[2])
        return self.scalars(a, b)

    def union_parts(self, node) -> list:
        if node[0] == "union":
            return self.union_parts(node[1]) + self.union_parts(node[2])
        return [node]

    def ordered(self, xs, ys) -> bool:
        if len(xs) != len(ys) or len(xs) > MAX_ITEMS:
            return False
        return all(self.equiv(x, y) for x, y in zip(xs, ys))

    def unordered(self, xs, ys) -> bool:
        """Set equality: every x matches some y and every y matches some x."""
        if len(xs) > MAX_ITEMS or len(ys) > MAX_ITEMS:
            return False
        matched_y = set()
        for x in xs:
            hit = False
            for j, y in enumerate(ys):
                if self.equiv(x, y):
                    matched_y.add(j)
                    hit = True
                    break
            if not hit:
                return False
        for j, y in enumerate(ys):
            if j not in matched_y and not any(self.equiv(x, y) for x in xs):
                return False
        return True

    def collections(self, a, b) -> bool:
        xs = a[1] if a[0] in _COLLECTIONS else (a,)
        ys = b[1] if b[0] in _COLLECTIONS else (b,)
        # a bare list against a bracketed tuple is read in order: "1, 3" vs "(1, 3)"
        if a[0] == "list" and b[0] == "seq":
            return b[1] == "(" and self.ordered(xs, b[3])
        if b[0] == "list" and a[0] == "seq":
            return a[1] == "(" and self.ordered(a[3], ys)
        return self.unordered(xs, ys)

    # -- relations
    @staticmethod
    def _orient(node):
        parts, ops = list(node[1]), list(node[2])
        if ops and all(op in (">", ">=") for op in ops):
            parts.reverse()
            ops = ["<" if op == ">" else "<=" for op in reversed(ops)]
        return parts, ops

    def relations(self, a, b) -> bool:
        pa, oa = self._orient(a)
        pb, ob = self._orient(b)
        if oa != ob or len(pa) != len(pb):
            return False
        if len(pa) == 2 and oa[0] in ("=", "!=", "<", "<="):
            da, db = ("-", pa[1], pa[0]), ("-", pb[1], pb[0])
            if self.proportional(da, db, positive=oa[0] in ("<", "<=")):
                return True
        return self.ordered(pa, pb)

    def proportional(self, a, b, positive: bool) -> bool:
        """a == c * b for a constant c != 0 (c > 0 when positive), checked at random points."""
        names = ev.symbols(a) | ev.symbols(b)
        if not names:
            return False
        ratios = []
        for env in ev.sample_points(names):
            try:
                va, vb = ev.numeric(a, env), ev.numeric(b, env)
            except (ev.EvalError, ev.Bomb):
                continue
            if abs(va) < 1e-12 and abs(vb) < 1e-12:
                continue
            if abs(vb) < 1e-12 or abs(va) < 1e-12:
                return False
            ratios.append(va / vb)
        if len(ratios) < 2:
            return False
        r0 = ratios[0]
        if any(abs(r - r0) > 1e-8 * max(1.0, abs(r0)) for r in ratios):
            return False
        if positive and not (abs(r0.imag) < 1e-9 and r0.real > 0):
            return False
        if len(ratios) >= _STRONG_POINTS and not _needs_proof(a, b):
            return True
        result = get_worker().confirm("ratio", a, b, self.deadline - time.monotonic())
        return result is not False

    # -- scalars
    def scalars(self, a, b) -> bool:
        """Numbers by the shared equality rule (rewards._verify_eval: exact rationals, rounding, percent);
        otherwise complex floats, at random points when there are symbols."""
        same = ev.exact_equal(a, b)
        if same is not None:
            return same
        return any(self.inexact(x, y) for x, y in ev.percent_readings(a, b))

    def inexact(self, a, b) -> bool:
        inf_a, inf_b = _infinity_sign(a), _infinity_sign(b)
        if inf_a or inf_b:
            return inf_a == inf_b
        names = ev.symbols(a) | ev.symbols(b)
        if not names:
            try:
                va, vb = ev.numeric(a, {}), ev.numeric(b, {})
            except ev.EvalError:  # a constant outside its domain (1/0, log 0) states nothing
                return False
            if abs(va - vb) <= REL_TOL * max(1.0, abs(va), abs(vb)):
                return True
            return ev.numbers_equal(va, ev.decimal_places(a), vb, ev.decimal_places(b))
        agree = 0
        bombs = 0
        points = ev.sample_points(names)
        for env in points:
            try:
                va, vb = _value_at(a, env), _value_at(b, env)
            except ev.Bomb:
                bombs += 1
                continue
            if va is None and vb is None:
                continue
            if va is None or vb is None:
                return False
            if abs(va - vb) > REL_TOL * max(1.0, abs(va), abs(vb)):
                return False
            agree += 1
        if bombs == len(points):
            raise ev.Bomb("overflow at every point")
        if agree >= _STRONG_POINTS and not _needs_proof(a, b):
            # analytic expressions equal at independent random real and complex points are
            # identical; sympy is only asked when that argument does not hold
            return True
        result = get_worker().confirm("expr", a, b, self.deadline - time.monotonic())
        if result is not None:
            return result
        return agree >= 2


def _value_at(node, env) -> complex | None:
    """The node's value at a point, None outside its domain (Bomb propagates)."""
    try:
        return ev.numeric(node, env)
    except ev.Bomb:
        raise
    except ev.EvalError:
        return None


_STRONG_POINTS = 4          # agreeing random points that settle an analytic identity
_PIECEWISE = {"floor", "ceiling"}


def _needs_proof(a, b) -> bool:
    """Piecewise-constant functions can agree at a few points by chance: ask sympy."""
    for node in (a, b):
        for nd in ev.walk(node):
            if (nd[0] == "fn" and nd[1] in _PIECEWISE) or nd[0] == "fact":
                return True
    return False


MAX_EXPONENT = 10_000        # |constant exponent| above this makes the answer a bomb


def _check_exponents(node) -> None:
    """Raises Bomb for a power whose constant exponent is absurd (x^{10^{10}}), even when some
    sample points would not overflow."""
    for nd in ev.walk(node):
        if nd[0] == "^" and not ev.symbols(nd[2]):
            try:
                value = ev.numeric(nd[2], {})
            except ev.EvalError:
                continue
            if abs(value) > MAX_EXPONENT:
                raise ev.Bomb("exponent too large")


def _infinity_sign(node) -> int:
    if node == ("const", "oo"):
        return 1
    if node[0] == "neg" and node[1] == ("const", "oo"):
        return -1
    return 0


# ---------------------------------------------------------------------------------------------
# public API

def _as_text(value) -> str | None:
    """Strings pass; plain numbers (int, float, Fraction) are written out; anything else is None."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, Fraction):
        return f"{value.numerator}/{value.denominator}"
    return None


MAX_NESTING = 100            # brackets nested deeper than this reject the input


def _literal_answer(node) -> bool:
    """Whether an answer states number literals (rewards._verify_eval.literal): the value it states (_reduce:
    "x = 82" and "34 + 48 = 82" state 82) is a literal, or a collection of them ("x=7, y=-2", "(1, 2)")."""
    node = _reduce(node)
    if node[0] in _COLLECTIONS:
        return bool(node[1]) and all(_literal_answer(x) for x in node[1])
    if node[0] == "seq":
        return bool(node[3]) and all(_literal_answer(x) for x in node[3])
    return ev.literal(node)


def _plain_literal(s: str) -> bool:
    """A plain number string (_plain_number) that is a literal: not a fraction out of lowest terms ("12/18")."""
    m = _PLAIN_FRAC.fullmatch(s.strip())
    return m is None or (int(m.group(3)) > 1 and math.gcd(int(m.group(2)), int(m.group(3))) == 1)


def _is_equiv(pred, gold, timeout: float, literal: bool = False) -> bool:
    pred, gold = _as_text(pred), _as_text(gold)
    if pred is None or gold is None:
        return False
    if len(pred) > MAX_INPUT_CHARS or len(gold) > MAX_INPUT_CHARS or "\x00" in pred:
        return False
    # Every step below is linear (or size-capped) in its input, and the deadline is checked between the steps and
    # between the candidates, so the timeout bounds parsing as well as comparing (also with reward_workers=0,
    # where nothing can kill a stuck call).
    deadline = time.monotonic() + timeout
    if deeper_than(pred, MAX_NESTING) or deeper_than(gold, MAX_NESTING):
        return False
    pa, pb = _plain_number(pred), _plain_number(gold)
    if pa is not None and pb is not None:
        if literal and _plain_literal(gold) and not _plain_literal(pred):
            return False
        return ev.exact_equal(_plain_node(pa), _plain_node(pb)) is True
    _check_deadline(deadline)
    cands_p = answer_candidates(pred)
    _check_deadline(deadline)
    cands_g = answer_candidates(gold)
    node_p, text_p = _parse_first(cands_p, deadline)
    node_g, text_g = _parse_first(cands_g, deadline)
    _check_deadline(deadline)
    if node_p is None or node_g is None:
        return _same_text(text_p, text_g)
    try:
        _check_exponents(node_p)
        _check_exponents(node_g)
        if literal and _literal_answer(node_g) and not _literal_answer(node_p):
            return False  # a gold written as number literals asks for a result, not an expression of it
        if _Comparer(deadline).equiv(node_p, node_g):
            return True
    except ev.Bomb:
        return False
    return _same_text(text_p, text_g)


def is_equiv(pred, gold, timeout: float = 1.0, *, literal: bool = False) -> bool:
    """True when the predicted answer (or text ending in one) states the gold answer.

    With literal=True (the graders' rule, rewards.combine.score): when the gold is written as number literals
    (an integer, a decimal, a fraction in lowest terms, a percentage, a d x 10^k, or a collection of them, after
    "x =": rewards._verify_eval.literal) the answer must state literals too, so "34+48", "8*9" and "12/18" do not
    state 82, 72 and 2/3, while "82", "x = 82", "34 + 48 = 82" and "0.67" (rounded) do; a gold expression keeps
    symbolic equivalence. The default (False) is plain value equivalence, which the step checker agrees with.

    Never raises; returns False for non-strings, oversized or malformed input, and when the
    time budget (seconds) runs out before equivalence is shown."""
    try:
        return _is_equiv(pred, gold, 1.0 if timeout is None else float(timeout), bool(literal)) is True
    except (_Deadline, Exception):  # noqa: BLE001 - a reward must never crash the loop
        return False


def warmup() -> None:
    """Starts this process's sympy worker now, so the first symbolic comparison is not slowed
    down by its start-up (about half a second)."""
    get_worker().start()


__all__ = ["is_equiv", "warmup"]
