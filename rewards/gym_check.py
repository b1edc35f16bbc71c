"""Our graders for the reasoning-gym task families (rl/tasks/gym.py): safe on hostile model text.

    from rewards.gym_check import gym_score, parse_check
    check = {"grader": "countdown", "family": "countdown", "numbers": [6, 61, 94, 4], "target": 309, "use_all": True}
    gym_score("Step 1: ...\\nAnswer: 94*4 - 61 - 6", check)       # 1.0
    gym_score("Answer: 94*4 - 61 - 6 + 0", check)                  # 0.0 (0 is not one of the numbers)

reasoning-gym ships a `score_answer` per generator; several of them run Python's eval or sympy's expression parser
on the answer text, so they are never imported or called here. The payload (`Problem.check` of a `gym@NAME` problem,
a dict or its JSON text) names one of four graders; each reads the response's final answer with the project's one
extractor (rewards.parse) and parses it with the project's safe parser (rewards.mathparse), never with eval:

    number     {"gold": "-4"} (+ "variable": "e" for equations). The answer must be a number as written: an
               integer, a decimal or a fraction in lowest terms, optionally "e = 13"; then
               rewards.verify.is_equiv against gold.
               An expression that evaluates to the gold (the question's own "5 - 3 - 6") scores 0: echoing the
               question is not solving it.
    fraction   {"gold": "138/583"} (plain n/d, or an integer): one fraction n/d (plain, $..$ or \\frac / \\dfrac) in lowest terms
               (gcd(n, d) = 1, d > 1), or an integer when the reduced denominator is 1; then is_equiv. The
               question's own unreduced fraction has the right value and scores 0.
    roots      {"gold": "-29/8, 0", "n_roots": 2}: the real roots as a comma list, in any order, each a constant
               (a decimal, a fraction, an exact form such as (61 - sqrt(13639))/102) or "x = value"; compared by
               is_equiv (sets without order; a decimal counts when it is the exact root rounded to its own
               number of decimals, at least 2). `gold` holds exact roots (rationals, or 40-digit rationals for
               irrational roots) so the model may round as it likes. With n_roots = 0 the answer must say there
               is no real root: "none", "no real solutions", "no solution", "∅", "{}", "\\emptyset".
    countdown  {"numbers": [...], "target": T, "use_all": bool}: an arithmetic expression of integer literals with
               + - * /, unary minus and parentheses only (rewards.mathparse.parse_arithmetic; no powers, % or
               decimals; the generator's own answers read "-56 - 82 + 86*(66 - 18)/6"), each literal one of the given numbers, each number used at most once (all of them when
               use_all), whose exact rational value is the target; "expr = T" is accepted. Evaluated here on
               Fractions, a literal tree walk, bounded by the number of given numbers.

Every grader returns 1.0 or 0.0 and never raises (a malformed payload scores 0.0; `parse_check` is the
validating entry point for trusted payloads, used by rl.tasks.base). is_equiv runs under VERIFY_TIMEOUT.
"""
from __future__ import annotations

import json
import re
from fractions import Fraction

from rewards._verify_eval import binary, integer_literal, reduced_fraction, symbols
from rewards.mathparse import ParseError, parse_answer, parse_arithmetic
from rewards.parse import as_text, extract_answer
from rewards.verify import is_equiv

__all__ = ["GRADERS", "MAX_ANSWER_CHARS", "VERIFY_TIMEOUT", "parse_check", "gym_score", "countdown_ok"]

GRADERS = ("number", "fraction", "roots", "countdown")
MAX_ANSWER_CHARS = 500   # a longer extracted answer scores 0 (no gym answer is that long)
MAX_NUMBERS = 64         # countdown numbers per problem (bounds the exact evaluation)
VERIFY_TIMEOUT = 1.0     # seconds per is_equiv call
_NO_ROOTS = {"none", "noroots", "norealroots", "norealroot", "nosolution", "nosolutions", "norealsolution",
             "norealsolutions", "norealvalues", "∅", "{}", "\\emptyset", "\\varnothing", "emptyset", "empty"}
_CD_OPS = ("+", "-", "*", "/")
_UNICODE_OPS = str.maketrans({"×": "*", "÷": "/", "−": "-", "·": "*"})


def parse_check(check) -> dict:
    """The payload as a dict, validated (ValueError naming the field): trusted payloads only."""
    data = json.loads(check) if isinstance(check, str) else check
    if not isinstance(data, dict):
        raise ValueError(f"gym check must be a JSON object, got {type(data).__name__}")
    grader, family = data.get("grader"), data.get("family")
    if grader not in GRADERS:
        raise ValueError(f"'grader' must be one of {GRADERS}, got {grader!r}")
    if not isinstance(family, str) or not family.strip():
        raise ValueError(f"'family' must name the reasoning-gym generator, got {family!r}")
    if grader == "countdown":
        nums, target = data.get("numbers"), data.get("target")
        if (not isinstance(nums, list) or not 1 <= len(nums) <= MAX_NUMBERS
                or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in nums)):
            raise ValueError(f"'numbers' must be a list of 1..{MAX_NUMBERS} positive ints, got {nums!r}"[:300])
        if not isinstance(target, int) or isinstance(target, bool):
            raise ValueError(f"'target' must be an int, got {target!r}")
        if not isinstance(data.get("use_all"), bool):
            raise ValueError(f"'use_all' must be true or false, got {data.get('use_all')!r}")
        return data
    gold = data.get("gold")
    if not isinstance(gold, str) or not gold.strip():
        raise ValueError(f"'gold' must be a non-empty string, got {gold!r}")
    if grader == "roots":
        n = data.get("n_roots")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"'n_roots' must be an int >= 0, got {n!r}")
    variable = data.get("variable")
    if variable is not None and not (isinstance(variable, str) and re.fullmatch(r"[A-Za-z]", variable)):
        raise ValueError(f"'variable' must be one letter or null, got {variable!r}")
    return data


def _answer(text) -> str | None:
    """The response's final answer (rewards.parse.extract_answer), None when missing or too long."""
    answer = extract_answer(as_text(text))
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer


def _stated_value(node, variable):
    """`node` without a leading "variable =": "e = 13" -> 13 (any one-letter name when variable is None)."""
    if node[0] == "rel" and node[2] == ("=",) and node[1][0][0] == "sym":
        if variable is None or node[1][0][1] == variable:
            return node[1][1]
    return node


def _number_ok(answer: str, data: dict) -> bool:
    """A number as written (rewards.verify's literal rule, the math families' own), "e = 13" for the equation's
    unknown only: an expression with the gold value ("5 - 3 - 6") and another variable score 0."""
    node = parse_answer(answer)
    if node[0] == "rel" and _stated_value(node, data.get("variable")) is node:
        return False  # an equation that is not "unknown = value": "y = 13", "5 - 3 - 6 = -4"
    return is_equiv(answer, data["gold"], timeout=VERIFY_TIMEOUT, literal=True)


def _fraction_ok(answer: str, data: dict) -> bool:
    node = parse_answer(answer)
    whole = integer_literal(node) is not None and Fraction(data["gold"]).denominator == 1  # "3" when the gold is whole
    return (whole or reduced_fraction(node)) and is_equiv(answer, data["gold"], timeout=VERIFY_TIMEOUT)


def _constant(node) -> bool:
    """A root as a value: no symbols in it (after an optional leading "x =")."""
    return not symbols(node)


def _roots_ok(answer: str, data: dict) -> bool:
    if data["n_roots"] == 0:
        return re.sub(r"[\s.$]", "", answer).lower() in _NO_ROOTS
    node = parse_answer(answer)
    items = node[1] if node[0] in ("list", "set") else (node,)
    if not items or not all(_constant(_stated_value(x, data.get("variable"))) for x in items):
        return False
    return is_equiv(answer, data["gold"], timeout=VERIFY_TIMEOUT)


def _countdown_value(node, pool: list[int]):
    """The exact value of a countdown tree, taking each literal out of `pool`; None when the tree is not allowed
    (another operator, a decimal, a number not left in the pool, division by zero)."""
    kind = node[0]
    if kind == "num":
        value = node[1]
        if node[2] is not None or value.denominator != 1 or int(value) not in pool:
            return None
        pool.remove(int(value))
        return value
    if kind == "neg":  # -a + b is b - a: the generator's own answers are written that way
        a = _countdown_value(node[1], pool)
        return None if a is None else -a
    if kind not in _CD_OPS:
        return None
    a = _countdown_value(node[1], pool)
    b = None if a is None else _countdown_value(node[2], pool)
    if b is None:
        return None
    try:
        return binary(kind, a, b, ZeroDivisionError)
    except ZeroDivisionError:
        return None


def countdown_ok(answer: str, numbers: list[int], target: int, use_all: bool) -> bool:
    """Whether `answer` (an expression, or "expression = target") reaches the target with the numbers."""
    text = answer.translate(_UNICODE_OPS).strip().rstrip(".")
    left, eq, right = text.rpartition("=")
    if eq:
        if right.strip() != str(target) or "=" in left:
            return False
        text = left
    if len(re.findall(r"\d+", text)) > len(numbers):
        return False  # more literals than numbers: rejected before parsing
    node = parse_arithmetic(text.strip())
    pool = list(numbers)
    value = _countdown_value(node, pool)
    return value is not None and value == target and (not use_all or not pool)


def _grade(text, check) -> bool:
    data = parse_check(check)
    answer = _answer(text)
    if answer is None:
        return False
    grader = data["grader"]
    if grader == "countdown":
        return countdown_ok(answer, data["numbers"], data["target"], data["use_all"])
    if grader == "number":
        return _number_ok(answer, data)
    if grader == "fraction":
        return _fraction_ok(answer, data)
    return _roots_ok(answer, data)


def gym_score(text, check) -> float:
    """1.0 when the response's final answer solves the gym problem (see the module docstring), else 0.0."""
    try:
        return 1.0 if _grade(text, check) else 0.0
    except (ParseError, RecursionError, ValueError, TypeError, KeyError, ArithmeticError):
        return 0.0
    except Exception:  # noqa: BLE001 - a reward never crashes the loop
        return 0.0
