"""Integer arithmetic generators with worked column solutions: addition, subtraction, multiplication.

Questions and steps are language-neutral ASCII math (`347+485`, step `4+8+1=13`), so the same problem renders
in Chinese or English; the markers come from rl/tasks/render.py. Every step is one or more plain arithmetic
claims `a op b = c` with operators + - * and =, so `rewards.steps.check_steps` (and sympy) can check them.

Steps written:
  addition        one column per step from the units up, the carry as an extra `+1` (`4+8+1=13`),
                  then the whole sum (`347+485=832`); single-digit sums are the one step `3+4=7`.
  subtraction     one column per step; a borrow shows as `1d` on top and `-1` in the next column
                  (`12-7=5`, `3-1-1=1`); a negative result is computed as `-(b-a)` first.
  multiplication  one partial product per non-zero digit of the second factor, shifted by its place
                  (`47*6=282`, `47*3=141, 141*10=1410`), their running sum (`282+1410=1692`), then the whole
                  product (`47*36=1692`); a multi-digit by one-digit product shows its digit-by-digit
                  carries (`7*6=42`, `4*6+4=28`).

Difficulty levels (1..5):
  add / sub   operands with `difficulty` digits (sub: from level 4 the result may be negative;
              add level 5 adds three 3-digit numbers).
  mul         1x1, 2x1, 2x2, 3x2, 3x3 digits.
  arith       the quickstart-friendly mix: level 1 is ONLY single-digit a+b (prompt `3+4`, one step
              `3+4=7`: short enough for a byte-level model trained for minutes on a CPU); level 2 two-digit
              add/sub or 1x1 mul; level 3 three-digit add/sub or 2x1 mul; level 4 four-digit add/sub or 2x2
              mul; level 5 five-digit add/sub or 3x2 mul.
"""
from __future__ import annotations

import random

from rl.tasks.base import GeneratedSource


def _rand_digits(rng: random.Random, n_digits: int) -> int:
    """A uniformly random integer with exactly n_digits digits (0..9 for one digit)."""
    if n_digits == 1:
        return rng.randint(0, 9)
    return rng.randint(10 ** (n_digits - 1), 10**n_digits - 1)


def addition_steps(a: int, b: int) -> list[str]:
    """Column addition of two non-negative integers, carries included."""
    if a < 10 and b < 10:
        return [f"{a}+{b}={a + b}"]
    steps, carry, da, db = [], 0, str(a)[::-1], str(b)[::-1]
    for i in range(max(len(da), len(db))):
        terms = [int(s[i]) for s in (da, db) if i < len(s)]
        if carry:
            terms.append(carry)
        total = sum(terms)
        if len(terms) > 1:  # a lone digit with no carry has nothing to compute
            steps.append("+".join(map(str, terms)) + f"={total}")
        carry = total // 10
    steps.append(f"{a}+{b}={a + b}")
    return steps


def subtraction_steps(a: int, b: int) -> list[str]:
    """Column subtraction with borrows; a negative result goes through -(b-a)."""
    if a < b:
        return [f"{a}-{b}=-({b}-{a})"] + subtraction_steps(b, a)[:-1] + [f"{a}-{b}={a - b}"]
    if a < 10:
        return [f"{a}-{b}={a - b}"]
    steps, borrow, da, db = [], 0, str(a)[::-1], str(b)[::-1]
    for i in range(len(da)):
        top, bot = int(da[i]), int(db[i]) if i < len(db) else 0
        if i >= len(db) and not borrow:
            continue  # digit copied down unchanged
        value = top - borrow - bot
        lhs_top = top
        new_borrow = 0
        if value < 0:
            lhs_top, value, new_borrow = top + 10, value + 10, 1
        parts = [str(lhs_top)] + (["1"] if borrow else []) + ([str(bot)] if i < len(db) else [])
        steps.append("-".join(parts) + f"={value}")
        borrow = new_borrow
    steps.append(f"{a}-{b}={a - b}")
    return steps


def _mul_by_digit_steps(a: int, d: int) -> list[str]:
    """a (multi-digit) times a single digit d, one step per digit of a with its carry."""
    steps, carry = [], 0
    for ch in str(a)[::-1]:
        prod = int(ch) * d + carry
        steps.append(f"{ch}*{d}" + (f"+{carry}" if carry else "") + f"={prod}")
        carry = prod // 10
    return steps


def multiplication_steps(a: int, b: int) -> list[str]:
    """Partial products by the digits of b, then their running sum."""
    if a < 10 and b < 10:
        return [f"{a}*{b}={a * b}"]
    if b < 10:
        return _mul_by_digit_steps(a, b) + [f"{a}*{b}={a * b}"]
    steps, partials = [], []
    for k, ch in enumerate(str(b)[::-1]):
        if ch == "0":
            continue
        d = int(ch)
        # The tens (hundreds) digit's partial product: a*d, then shifted: `47*3=141, 141*10=1410`.
        steps.append(f"{a}*{d}={a * d}" + (f", {a * d}*{10**k}={a * d * 10**k}" if k else ""))
        partials.append(a * d * 10**k)
    running = partials[0]
    for p in partials[1:]:
        steps.append(f"{running}+{p}={running + p}")
        running += p
    steps.append(f"{a}*{b}={a * b}")
    return steps


def make_add(rng: random.Random, difficulty: int):
    if difficulty == 5:
        terms = [_rand_digits(rng, 3) for _ in range(3)]
        steps, running = [], terms[0]
        for t in terms[1:]:
            steps.append(f"{running}+{t}={running + t}")
            running += t
        return "+".join(map(str, terms)), str(running), steps
    a, b = _rand_digits(rng, difficulty), _rand_digits(rng, difficulty)
    return f"{a}+{b}", str(a + b), addition_steps(a, b)


def make_sub(rng: random.Random, difficulty: int):
    n = max(1, difficulty)
    a, b = _rand_digits(rng, n), _rand_digits(rng, n)
    if difficulty < 4 and a < b:
        a, b = b, a
    return f"{a}-{b}", str(a - b), subtraction_steps(a, b)


_MUL_DIGITS = {1: (1, 1), 2: (2, 1), 3: (2, 2), 4: (3, 2), 5: (3, 3)}


def make_mul(rng: random.Random, difficulty: int):
    da, db = _MUL_DIGITS[difficulty]
    a = _rand_digits(rng, da) if da > 1 else rng.randint(2, 9)
    b = _rand_digits(rng, db) if db > 1 else rng.randint(2, 9)
    return f"{a}*{b}", str(a * b), multiplication_steps(a, b)


def make_arith(rng: random.Random, difficulty: int):
    """The quickstart mix; level 1 is single-digit addition only."""
    if difficulty == 1:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"{a}+{b}", str(a + b), [f"{a}+{b}={a + b}"]
    kind = rng.choice(("add", "sub", "mul"))
    if kind == "add":
        a, b = _rand_digits(rng, difficulty), _rand_digits(rng, difficulty)
        return f"{a}+{b}", str(a + b), addition_steps(a, b)
    if kind == "sub":
        return make_sub(rng, difficulty)
    return make_mul(rng, difficulty - 1)


ADD = GeneratedSource("add", make_add, description="column addition; difficulty = digits (5: three 3-digit terms)")
SUB = GeneratedSource("sub", make_sub, description="column subtraction with borrows; difficulty = digits")
MUL = GeneratedSource("mul", make_mul, description="multiplication by partial products; 1x1 .. 3x3 digits")
ARITH = GeneratedSource("arith", make_arith,
                        description="mix of add/sub/mul; level 1 = single-digit a+b (quickstart)")
SOURCES = (ARITH, ADD, SUB, MUL)
