"""Tests for rewards.steps: exact arithmetic claims per step, safety and limits."""
import os
import time
from fractions import Fraction

import numpy as np
import pytest

from rewards.steps import check_step, check_steps, evaluate, find_claims, step_score


def _random_expr(rng, depth):
    """A random expression string and its float64 value computed independently (NumPy, not our parser)."""
    if depth == 0 or rng.random() < 0.3:
        n = int(rng.integers(1, 50))
        return str(n), np.float64(n)
    op = rng.choice(["+", "-", "*", "/"])
    a, va = _random_expr(rng, depth - 1)
    b, vb = _random_expr(rng, depth - 1)
    if op == "/" and vb == 0:
        op = "+"
    value = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[op](va, vb)
    return f"({a} {op} {b})", np.float64(value)


def test_evaluate_matches_float64_reference():
    rng = np.random.default_rng(0)
    for _ in range(300):
        expr, ref = _random_expr(rng, 4)
        got = evaluate(expr)
        assert got is not None, expr
        np.testing.assert_allclose(float(got), ref, rtol=1e-9, atol=1e-9)


def test_evaluate_precedence_and_forms():
    assert evaluate("2+3*4") == 14
    assert evaluate("-3^2") == -9
    assert evaluate("2^3^2") == 512
    assert evaluate("(1/2 + 1/3)") == Fraction(5, 6)
    assert evaluate("2(3+4)") == 14
    assert evaluate("50%") == Fraction(1, 2)
    assert evaluate("7×2") == 14 and evaluate("12÷3") == 4 and evaluate("5−7") == -2
    assert evaluate("１２＋３") == 15
    assert evaluate(r"\frac{3}{4}") == Fraction(3, 4)
    assert evaluate("2^-2") == Fraction(1, 4)
    assert evaluate(".5 + 1.") == Fraction(3, 2)


@pytest.mark.parametrize("expr", [
    "", "1/0", "2^(1/2)", "0^-1", "9^9^9^9", "2^100000", "2^10001", "3^7000*3^7000", "(" * 50 + "1" + ")" * 50,
    "1 +", "abc", "3 4", "1 000", "2x", "__import__('os')", None, 5, "1" * 1000,
])
def test_evaluate_rejects(expr):
    assert evaluate(expr) is None


def test_evaluate_limits_are_the_verifiers():
    """Exact arithmetic stops where rewards._verify_eval stops: exponents up to 10,000, results under 20,000 bits."""
    assert evaluate("1" * 100) == int("1" * 100)
    assert evaluate("2^10000") == 2 ** 10000
    assert evaluate("3^6000*3^6000") == 3 ** 12000


@pytest.mark.parametrize("step,score", [
    ("3 + 4 = 7", 1.0), ("3+4=8", 0.0), ("12*3=36 = 6*6", 1.0), ("12*3=36=6*7", 0.0),
    ("1/2 + 1/3 = 5/6", 1.0), ("7×2＝14", 1.0), ("20% × 50 = 10", 1.0), ("2^{10} = 1024", 1.0),
    (r"\frac{3}{4} = 0.75", 1.0), (r"\dfrac{1}{4} + \dfrac{1}{4} = \frac{1}{2}", 1.0), ("1/3 = 0.33", 1.0),
    ("1/3 = 0.34", 0.0), ("所以3+4=7，再7×2=14。", 1.0), ("所以3+4=7，再7×2=15。", 0.0), ("3 + 4 = 7.", 1.0),
    ("2(3+4) = 14", 1.0), ("-3 - 5 = -8", 1.0), (r"3 \times 4 = 12", 1.0), ("2**3 = 8", 1.0),
    ("total 3 + 4 = 7 apples", 1.0), ("(see 3+4=7)", 1.0), ("$3+4=7$", 1.0), ("3 + 4 = 7 and 5 + 6 = 12", 0.0),
    # No checkable claim: variables, function calls, ratios, separators, superscripts, lone letters.
    ("2x + 3 = 7", None), ("f(3) = 9", None), ("3:4 = 6:8", None), ("1,000 + 2 = 1,002", None),
    ("3² = 9", None), ("x = 3", None), ("7 = 7", None), ("2 x 3 = 6", None), ("x - 3 = 4", None),
    ("5/0 = 1", None), ("no numbers here", None), ("", None), ("3 + 4 = y", None),
    # Expressions side by side on one line; space-grouped thousands are not split into false claims.
    ("2 + 3 = 5 (correct)", 1.0), ("2 + 3 = 6 (wrong)", 0.0), ("2×3+4=10 → 10-4=6", 1.0), ("1 + 1 = 2 (mod 3)", 1.0),
    ("√16 = 4", None), ("|-3| = 3", None), ("sin(30) = 0.5", None), ("5 m × 3 = 15 m", None), ("3!=6", None),
    ("3+4=7 5+6=11", 1.0), ("3+4=7 5+6=12", 0.0), ("1 000 + 2 = 1 002", None), ("2 (3+4) = 14", 1.0),
    # The verifier's rules: one rounding rule (>= 2 decimals), percentages, signs after * and /, mixed numbers.
    ("1/3 = 0.3", 0.0), ("10/3 = 3.33", 1.0), ("50% = 0.5", 1.0), ("6 / -2 * 3 = -9", 1.0), ("6÷-2×3=-1", 0.0),
    ("2\\frac{1}{2} = 1", None), ("1 + \\frac{1}{2} = 1.5", 1.0),
])
def test_check_step(step, score):
    assert check_step(step) == score


def test_check_steps_per_step():
    text = "问题：?\n解答：\n步骤一：3+4=7\n步骤二：7×2=15\n步骤三：所以结果是15\n答案：15"
    assert check_steps(text) == [1.0, 0.0, None]
    assert check_steps("Step 1: 2*3 = 6\nStep 2: 6 + 1 = 7\nAnswer: 7") == [1.0, 1.0]
    assert check_steps("no steps 3+4=7") == []


def test_answer_line_claims_are_not_in_a_step():
    assert check_steps("Step 1: 3+4=7\nAnswer: 1+1=3") == [1.0]


def test_find_claims_returns_sides():
    claims = find_claims("12*3=36")
    assert [(c.lhs, c.rhs, c.ok) for c in claims] == [("12*3", "36", True)]


def test_step_score():
    assert step_score([1.0, 0.0, None]) == 0.5
    assert step_score([None, None]) is None
    assert step_score([]) is None
    assert step_score(None) is None


def test_never_evaluates_text(tmp_path):
    sentinel = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {sentinel}') = 0 + 1 = 1"
    check_steps("Step 1: " + payload)
    check_step(payload)
    assert not os.path.exists(sentinel)


@pytest.mark.parametrize("text", [
    "Step 1: " + "1+" * 50_000 + "1 = 2",
    "Step 1: " + "(" * 100_000 + "1" + ")" * 100_000 + " = 1",
    "Step 1: " + "9^" * 10_000 + "9 = 1",
    "Step 1: " + "1=" * 100_000,
    "Step 1: " + "3+4=7 " * 20_000,
    "Step 1: " + "1 " * 100_000 + "= 1",
    "".join(f"Step {i}: {i}*{i}={i * i}\n" for i in range(1, 3000)),
    b"Step 1: \xff\xfe 3+4=7",
    "\x00" * 100_000,
    None,
])
def test_hostile_steps_fast(text):
    t0 = time.process_time()  # CPU seconds: a busy machine does not change the verdict
    out = check_steps(text)
    assert isinstance(out, list)
    assert all(s in (0.0, 1.0, None) for s in out)
    assert time.process_time() - t0 < 5.0


def test_random_claims_true_and_corrupted():
    """Random `a op b = c` claims in both layouts: the true result scores 1.0, an off-by-one result 0.0."""
    rng = np.random.default_rng(1)
    ops = {"+": np.add, "-": np.subtract, "×": np.multiply, "*": np.multiply, "÷": np.divide}
    for _ in range(200):
        a, b = (int(x) for x in rng.integers(1, 1000, size=2))
        sym = str(rng.choice(list(ops)))
        if sym == "÷":
            a = a * b  # exact quotient
        c = ops[sym](np.float64(a), np.float64(b))
        c_txt = str(int(c))
        for good, expected in ((c_txt, 1.0), (str(int(c) + 1), 0.0)):
            zh = f"步骤一：先算{a}{sym}{b}={good}。\n答案：{good}"
            en = f"Step 1: {a} {sym} {b} = {good}.\nAnswer: {good}"
            assert check_steps(zh) == [expected], zh
            assert check_steps(en) == [expected], en
