"""Fraction generators with worked solutions: adding / subtracting fractions and simplifying.

Questions are language-neutral (`1/4+1/6`, `12/18`); answers are in lowest terms (`5/12`, `-1/6`, `2`).
Each step holds true equalities between plain fractions so sympy (or `rewards.steps.check_steps`) can check it:
    1/4+1/6   ->  `1/4=3/12, 1/6=2/12`   `3/12+2/12=5/12`
    12/18     ->  `12=6*2, 18=6*3`       `12/18=2/3`
A sum that is not in lowest terms gets a final simplification step (`10/12=5/6`).

Difficulty levels (1..5):
  1  a/n + b/n with the same denominator n <= 12
  2  simplify (a*g)/(b*g) with b, g <= 9, or a/b + c/d with coprime denominators (2..7)
  3  a/b + c/d with denominators sharing a factor (4/6, 6/9, ...), result possibly reducible
  4  a/b - c/d with denominators up to 12 (the result may be negative)
  5  three fractions a/b + c/d - e/f with denominators up to 12
"""
from __future__ import annotations

import math
import random
from fractions import Fraction

from rl.tasks.base import GeneratedSource


def frac_str(f: Fraction) -> str:
    """`3/4`, `-1/6`, or an integer `2` when the denominator is 1."""
    return str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def simplify_steps(num: int, den: int) -> list[str]:
    """Steps that reduce num/den (den > 0) by their gcd; empty when already in lowest terms."""
    g = math.gcd(num, den)
    if g == 1:
        return []
    value = Fraction(num, den)
    if num % den == 0:  # a whole number: 8/4=2
        return [f"{num}/{den}={num // den}"]
    if abs(num) == g:  # the numerator is the gcd itself: 6/18=1/3
        return [f"{den}={g}*{den // g}", f"{num}/{den}={frac_str(value)}"]
    return [f"{abs(num)}={g}*{abs(num) // g}, {den}={g}*{den // g}", f"{num}/{den}={frac_str(value)}"]


def combine_steps(terms: list[tuple[int, int]], signs: list[str]) -> tuple[list[str], Fraction]:
    """Bring fractions (num, den) to the least common denominator and add / subtract them left to right.

    `signs[i]` is the operator before term i+1 ("+" or "-"). Returns the steps and the exact value."""
    lcd = 1
    for _, d in terms:
        lcd = _lcm(lcd, d)
    steps = []
    rewritten = [(n * (lcd // d), lcd) for n, d in terms]
    conversions = [f"{n}/{d}={rn}/{lcd}" for (n, d), (rn, _) in zip(terms, rewritten) if d != lcd]
    if conversions:
        steps.append(", ".join(conversions))
    numerators = [rn for rn, _ in rewritten]
    expr = f"{numerators[0]}/{lcd}" + "".join(f"{s}{n}/{lcd}" for s, n in zip(signs, numerators[1:]))
    total_num = numerators[0]
    for s, n in zip(signs, numerators[1:]):
        total_num = total_num + n if s == "+" else total_num - n
    steps.append(f"{expr}={total_num}/{lcd}")
    steps += simplify_steps(total_num, lcd)
    return steps, Fraction(total_num, lcd)


def _proper(rng: random.Random, den: int) -> tuple[int, int]:
    return rng.randint(1, den - 1), den


def make_fractions(rng: random.Random, difficulty: int):
    if difficulty == 1:
        n = rng.randint(3, 12)
        a, b = rng.randint(1, n - 1), rng.randint(1, n - 1)
        terms, signs = [(a, n), (b, n)], ["+"]
    elif difficulty == 2:
        if rng.random() < 0.5:  # simplify a*g / b*g
            g, b = rng.randint(2, 9), rng.randint(2, 9)
            a = rng.choice([k for k in range(1, b) if math.gcd(k, b) == 1])
            p, q = a * g, b * g
            return f"{p}/{q}", frac_str(Fraction(p, q)), simplify_steps(p, q)
        d1, d2 = rng.choice([(2, 3), (2, 5), (2, 7), (3, 4), (3, 5), (3, 7), (4, 5), (4, 7), (5, 6), (5, 7), (6, 7)])
        if rng.random() < 0.5:
            d1, d2 = d2, d1
        terms, signs = [_proper(rng, d1), _proper(rng, d2)], ["+"]
    elif difficulty == 3:
        d1, d2 = rng.choice([(4, 6), (6, 9), (4, 10), (6, 8), (8, 12), (6, 10), (9, 12), (10, 15)])
        if rng.random() < 0.5:
            d1, d2 = d2, d1
        terms, signs = [_proper(rng, d1), _proper(rng, d2)], ["+"]
    elif difficulty == 4:
        d1, d2 = rng.randint(2, 12), rng.randint(2, 12)
        terms, signs = [_proper(rng, d1), _proper(rng, d2)], ["-"]
    else:
        dens = [rng.randint(2, 12) for _ in range(3)]
        terms, signs = [_proper(rng, d) for d in dens], ["+", "-"]
    question = f"{terms[0][0]}/{terms[0][1]}" + "".join(f"{s}{n}/{d}" for s, (n, d) in zip(signs, terms[1:]))
    steps, value = combine_steps(terms, signs)
    return question, frac_str(value), steps


FRACTIONS = GeneratedSource("fractions", make_fractions, description="add/subtract/simplify fractions")
SOURCES = (FRACTIONS,)
