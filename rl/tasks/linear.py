"""Linear equations in one and two unknowns, solved step by step: move terms, divide, check.

Questions are language-neutral equations with explicit `*` (`3*x+5=20`; two unknowns `2*x+3*y=12, 4*x-y=10`).
Answers: `5` (one unknown; `7/3` at level 5) and `x=3, y=2` (two unknowns).
Steps (every `=` chain in a step holds at the solution, and its purely numeric parts are true arithmetic):
    3*x+5=20          `3*x=20-5=15`   `x=15/3=5`   `3*5+5=20`
    3*x+5=x+11        `3*x-x=11-5=6`  `3-1=2, 2*x=6`   `x=6/2=3`    `3*3+5=14, 3+11=14`
    2*x+3*y=12, 4*x-y=10
                      `4*(2*x+3*y)=4*12=48, 8*x+12*y=48`   `2*(4*x-y)=2*10=20, 8*x-2*y=20`
                      `12*y+2*y=48-20=28, 12+2=14, 14*y=28`   `y=28/14=2`   `2*x=12-3*2=6`   `x=6/2=3`
                      `2*3+3*2=12, 4*3-2=10`

Sources and levels (1..5):
  linear1  1: x+b=c   2: a*x+b=c   3: a*x+b=c*x+d   4: like 3 with negative coefficients and larger numbers
           5: a*x+b=c with a non-integer (fraction) solution
  linear2  1: x+y=s, x-y=d   2..5: general a1*x+b1*y=c1, a2*x+b2*y=c2 with growing coefficients and solutions
  linear   1..3 = linear1 levels 1..3, 4 = linear2 level 1, 5 = linear2 level 3
"""
from __future__ import annotations

import random
from fractions import Fraction

from rl.tasks.base import GeneratedSource
from rl.tasks.fractions_ import frac_str


def term(coef: int, var: str, first: bool) -> str:
    """One term with its sign: `3*x`, `-x`, `+y`, `-2*y` (empty for a zero coefficient)."""
    if coef == 0:
        return ""
    body = var if abs(coef) == 1 else f"{abs(coef)}*{var}"
    if coef < 0:
        return "-" + body
    return body if first else "+" + body


def linear_expr(coefs: list[tuple[int, str]], const: int = 0) -> str:
    """`3*x-y+5` from [(3, "x"), (-1, "y")] and 5; "0" for an empty expression."""
    out = ""
    for c, v in coefs:
        out += term(c, v, first=not out)
    if const or not out:
        out += str(const) if (const < 0 or not out) else f"+{const}"
    return out


def _num(v: int) -> str:
    """A number inside an arithmetic claim: negatives parenthesised so `3*(-2)` stays unambiguous."""
    return f"({v})" if v < 0 else str(v)


def _eval_expr(coefs: list[tuple[int, str]], const: int, values: dict[str, int]) -> str:
    """The substitution text `3*5+5` of an expression at a solution."""
    out = ""
    for c, v in coefs:
        if c == 0:
            continue
        val = _num(values[v])
        piece = val if abs(c) == 1 else f"{abs(c)}*{val}"
        if c < 0:
            out += "-" + piece
        else:
            out += ("+" if out else "") + piece
    if const or not out:
        out += str(const) if (const < 0 or not out) else f"+{const}"
    return out


def _minus(a: int, b: int) -> str:
    """`a-b` written without a double sign: 20-5, 20+5 for b=-5."""
    return f"{a}-{b}" if b >= 0 else f"{a}+{-b}"


def one_unknown(a: int, b: int, c: int, d: int) -> tuple[str, str, list[str]]:
    """Solve a*x+b = c*x+d (a != c). Returns question, answer, steps."""
    lhs, rhs = linear_expr([(a, "x")], b), linear_expr([(c, "x")], d)
    question = f"{lhs}={rhs}"
    k, r = a - c, d - b  # k*x = r
    x = Fraction(r, k)
    steps = []
    if c == 0:
        if b:  # with b == 0 the question already reads a*x=r
            steps.append(f"{linear_expr([(a, 'x')])}={_minus(d, b)}={r}")
    else:
        steps.append(f"{linear_expr([(a, 'x'), (-c, 'x')])}={_minus(d, b)}={r}")
        steps.append(f"{_minus(a, c)}={k}, {linear_expr([(k, 'x')])}={r}")
    if k != 1:
        steps.append(f"x={r}/{_num(k)}={frac_str(x)}")
    if x.denominator == 1:
        xv = int(x)
        left_val, right_val = a * xv + b, c * xv + d
        check = f"{_eval_expr([(a, 'x')], b, {'x': xv})}={left_val}"
        if c != 0:
            check += f", {_eval_expr([(c, 'x')], d, {'x': xv})}={right_val}"
        steps.append(check)
    return question, frac_str(x), steps


def two_unknowns(a1: int, b1: int, a2: int, b2: int, x: int, y: int) -> tuple[str, str, list[str]]:
    """Solve a1*x+b1*y=c1, a2*x+b2*y=c2 (a unique integer solution x, y) by eliminating x."""
    c1, c2 = a1 * x + b1 * y, a2 * x + b2 * y
    e1, e2 = linear_expr([(a1, "x"), (b1, "y")]), linear_expr([(a2, "x"), (b2, "y")])
    question = f"{e1}={c1}, {e2}={c2}"
    answer = f"x={x}, y={y}"
    steps = []
    if (a1, a2) == (1, 1) and b1 == -b2:
        # x+b*y=s, x-b*y=d: add the equations.
        steps.append(f"2*x={c1}+{_num(c2)}={c1 + c2}")
        steps.append(f"x={c1 + c2}/2={x}")
        rest = c1 - x
        steps.append(f"{linear_expr([(b1, 'y')])}={_minus(c1, x)}={rest}")
        if b1 != 1:
            steps.append(f"y={rest}/{_num(b1)}={y}")
    else:
        # Multiply (1) by a2 and (2) by a1, subtract: (b1*a2 - b2*a1) y = c1*a2 - c2*a1.
        m1 = [(a1 * a2, "x"), (b1 * a2, "y")]
        m2 = [(a2 * a1, "x"), (b2 * a1, "y")]
        if a2 != 1:  # multiplying by 1 leaves the equation as it is
            steps.append(f"{_num(a2)}*({e1})={_num(a2)}*{_num(c1)}={a2 * c1}, {linear_expr(m1)}={a2 * c1}")
        if a1 != 1:
            steps.append(f"{_num(a1)}*({e2})={_num(a1)}*{_num(c2)}={a1 * c2}, {linear_expr(m2)}={a1 * c2}")
        ky, ry = b1 * a2 - b2 * a1, a2 * c1 - a1 * c2
        steps.append(f"{linear_expr([(b1 * a2, 'y'), (-b2 * a1, 'y')])}={_minus(a2 * c1, a1 * c2)}={ry}, "
                     f"{_minus(b1 * a2, b2 * a1)}={ky}, {linear_expr([(ky, 'y')])}={ry}")
        if ky != 1:
            steps.append(f"y={ry}/{_num(ky)}={y}")
        rx = c1 - b1 * y
        steps.append(f"{linear_expr([(a1, 'x')])}={c1}-{_num(b1)}*{_num(y)}={rx}")
        if a1 != 1:
            steps.append(f"x={rx}/{_num(a1)}={x}")
    values = {"x": x, "y": y}
    steps.append(f"{_eval_expr([(a1, 'x'), (b1, 'y')], 0, values)}={c1}, "
                 f"{_eval_expr([(a2, 'x'), (b2, 'y')], 0, values)}={c2}")
    return question, answer, steps


def _nonzero(rng: random.Random, lo: int, hi: int) -> int:
    v = 0
    while v == 0:
        v = rng.randint(lo, hi)
    return v


def make_linear1(rng: random.Random, difficulty: int):
    if difficulty == 1:
        x, b = rng.randint(0, 25), rng.randint(1, 25)
        return one_unknown(1, b, 0, x + b)
    if difficulty == 2:
        a, x, b = rng.randint(2, 9), rng.randint(1, 9), rng.randint(0, 20)
        return one_unknown(a, b, 0, a * x + b)
    if difficulty in (3, 4):
        lo, hi, xr = (1, 9, 9) if difficulty == 3 else (-12, 12, 15)
        while True:
            a, c = _nonzero(rng, lo, hi), _nonzero(rng, lo, hi)
            if a != c and (difficulty == 4 or a > c):
                break
        x = rng.randint(-xr if difficulty == 4 else 1, xr)
        b = rng.randint(-20, 20) if difficulty == 4 else rng.randint(0, 20)
        d = (a - c) * x + b
        return one_unknown(a, b, c, d)
    # Level 5: a fraction solution r/a with r not a multiple of a.
    a = rng.randint(2, 12)
    r = _nonzero(rng, -40, 40)
    while r % a == 0:
        r = _nonzero(rng, -40, 40)
    b = rng.randint(-20, 20)
    return one_unknown(a, b, 0, r + b)


def make_linear2(rng: random.Random, difficulty: int):
    if difficulty == 1:
        x, y = rng.randint(0, 25), rng.randint(0, 25)
        return two_unknowns(1, 1, 1, -1, x, y)
    span = {2: 3, 3: 5, 4: 9, 5: 12}[difficulty]
    xr = {2: 6, 3: 9, 4: 12, 5: 20}[difficulty]
    while True:
        a1, b1, a2, b2 = (_nonzero(rng, -span, span) for _ in range(4))
        if difficulty == 2:
            a1, b1, a2 = abs(a1), abs(b1), abs(a2)
        if a1 * b2 - a2 * b1 != 0:
            break
    lo = 0 if difficulty == 2 else -xr
    return two_unknowns(a1, b1, a2, b2, rng.randint(lo, xr), rng.randint(lo, xr))


def make_linear(rng: random.Random, difficulty: int):
    if difficulty <= 3:
        return make_linear1(rng, difficulty)
    return make_linear2(rng, 1 if difficulty == 4 else 3)


LINEAR1 = GeneratedSource("linear1", make_linear1, description="one unknown: move terms, divide, check")
LINEAR2 = GeneratedSource("linear2", make_linear2, description="two unknowns by elimination, then check")
LINEAR = GeneratedSource("linear", make_linear, description="linear1 levels 1-3, linear2 at levels 4-5")
SOURCES = (LINEAR, LINEAR1, LINEAR2)
