"""Evaluation of `rewards.mathparse` node trees, and the one equality rule for numbers.

Two evaluators walk the tuples here (rewards._sympy_child's to_sympy is the third), none ever executes text:
  exact(node)          -> Fraction, or NotExact when the value is not a (small) rational
  numeric(node, env)   -> complex, at a point env {symbol name: complex}; EvalError outside the
                          domain, Bomb when a value overflows a float (answers such as 10**10**10)

The equality rule for numbers, shared by answer verification (rewards.verify) and step checking
(rewards.steps), so `check_step("a = b")` and `is_equiv("a", "b")` agree wherever both decide:
  exact_equal(a, b)    -> True / False when both trees are exact rationals, None otherwise
  numbers_equal(x, dx, y, dy)   the same rule on values (dx, dy: decimals written, None if not a literal)
  * Equal values are equal.
  * ROUNDING: a decimal literal written with d >= 2 digits after the point also equals a value that
    needs more precision than d digits (an irrational, a repeating decimal, or a finite decimal
    with more than d digits) when it is that value rounded to d digits, |decimal - value| <= 10^-d / 2
    (either way at an exact tie).  Two decimal literals are equal only when equal.  So 1/3 = 0.33 and
    0.333 hold, 1/3 = 0.3 (one digit) does not, 3.14 = pi holds, 2.718 = 2.7183 does not.
  * PERCENT: a top-level percentage states its number and its fraction: 28% = 28 and 28% = 0.28
    (and two percentages compare their numbers).
Used by rewards.verify (exact, numeric, the rule), rewards.steps (exact, the rule) and
rewards._sympy_child (binary, Bomb, the sympy limits; its to_sympy is the third evaluator, in the worker process).
"""
from __future__ import annotations

import cmath
import math
import zlib
from fractions import Fraction

MAX_EXACT_BITS = 20_000     # exact rational arithmetic stops here (then floats decide)
MAX_EXPONENT = 10_000       # |constant exponent| above this is not exact arithmetic (verify rejects it as a bomb)
MAX_SYMPY_POW = 10_000      # |integer exponent| the sympy builder accepts on a numeric base
MAX_SYMPY_FACT = 1_000      # largest factorial argument the sympy builder accepts
HUGE = 1e250                # a float beyond this is a bomb, not an answer


class EvalError(ValueError):
    """The node cannot be evaluated this way (or at this point)."""


class NotExact(EvalError):
    """The value is not a rational number of reasonable size."""


class Bomb(ValueError):
    """The value is absurdly large: the answer is rejected."""


# ---------------------------------------------------------------------------------------------
# helpers over trees

def walk(node):
    """Yields every node of the tree (iteratively, so deep trees are safe)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if not isinstance(item, tuple) or not item:
            continue
        if isinstance(item[0], str):  # a node: (kind, ...)
            yield item
            stack.extend(c for c in item[1:] if isinstance(c, tuple))
        else:  # a tuple of nodes (args, items) or of rows
            stack.extend(c for c in item if isinstance(c, tuple))


def symbols(node) -> set[str]:
    return {nd[1] for nd in walk(node) if nd[0] == "sym"} | {
        "call:" + nd[1] for nd in walk(node) if nd[0] == "call"}


# ---------------------------------------------------------------------------------------------
# number literals: a result as written, not an expression that evaluates to it (the graders' literal rule)

def integer_literal(node) -> int | None:
    """The value of an integer literal, signed or not ("-2" is ('neg', 2)), else None."""
    sign = 1
    if node[0] == "neg":
        sign, node = -1, node[1]
    if node[0] == "num" and node[2] is None and node[1].denominator == 1:
        return sign * int(node[1])
    return None


def reduced_fraction(node) -> bool:
    """A fraction n/d of integer literals in lowest terms with d > 1 (-2/3 parses as (-2)/3 or -(2/3))."""
    node = node[1] if node[0] == "neg" else node
    if node[0] != "/":
        return False
    n, d = integer_literal(node[1]), integer_literal(node[2])
    return n is not None and d is not None and d > 1 and math.gcd(n, d) == 1


def literal(node) -> bool:
    """A number as written: an integer or a decimal (13, -4, 2.5), a fraction in lowest terms (-3/4, \\frac{3}{4}),
    a percentage of one (28%), or a decimal times a power of ten (5 x 10^4, which is also how 5万 parses); no
    other operation, so the question's own 34+48, 8*9, 12/18 or 2\\frac{1}{2} (2 + 1/2) is not a literal."""
    kind = node[0]
    if kind == "pct":
        return literal(node[1]) and node[1][0] != "pct"
    if kind == "*" and node[2][0] == "^" and integer_literal(node[2][1]) == 10:
        return _decimal(node[1]) and integer_literal(node[2][2]) is not None
    return _decimal(node) or reduced_fraction(node)


def _decimal(node) -> bool:
    return (node[1] if node[0] == "neg" else node)[0] == "num"


# ---------------------------------------------------------------------------------------------
# exact rationals

def binary(kind: str, a, b, zero_division: type[Exception]):
    """a (+ - * /) b for Fractions, complex floats and sympy objects alike; division by zero raises the
    evaluator's own error class."""
    if kind == "+":
        return a + b
    if kind == "-":
        return a - b
    if kind == "*":
        return a * b
    if b == 0:
        raise zero_division("division by zero")
    return a / b


def _sized(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_EXACT_BITS:
        raise NotExact("too large for exact arithmetic")
    return value


def exact(node) -> Fraction:
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "neg":
        return -exact(node[1])
    if kind in ("+", "-", "*", "/"):
        return _sized(binary(kind, exact(node[1]), exact(node[2]), NotExact))
    if kind == "^":
        base, ex = exact(node[1]), exact(node[2])
        if ex.denominator != 1:
            raise NotExact("fractional power")
        e = ex.numerator
        bits = max(base.numerator.bit_length(), base.denominator.bit_length(), 1)
        if abs(e) > MAX_EXPONENT or abs(e) * bits > MAX_EXACT_BITS:
            raise NotExact("power too large for exact arithmetic")
        if base == 0 and e < 0:
            raise NotExact("division by zero")
        return base ** e
    if kind == "fact":
        v = exact(node[1])
        if v.denominator != 1 or not 0 <= v <= 300:
            raise NotExact("factorial argument")
        return Fraction(math.factorial(int(v)))
    if kind == "pct":
        return exact(node[1]) / 100
    raise NotExact(kind)


# ---------------------------------------------------------------------------------------------
# the equality rule for numbers (see the module docstring)

HUNDRED = ("num", Fraction(100), None)


def decimal_places(node) -> int | None:
    """Digits written after the decimal point when the node is a decimal literal (or its negation)."""
    if node[0] == "neg":
        return decimal_places(node[1])
    return node[2] if node[0] == "num" else None


def _finite_decimal_digits(value: Fraction) -> int | None:
    """Number of decimals needed to write value exactly, None if it is not a finite decimal."""
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    return max(twos, fives) if den == 1 else None


def rounded_match(dec_value, ndec: int | None, other_value, other_ndec: int | None) -> bool:
    """Whether a decimal written with ndec >= 2 digits is the other value rounded to ndec digits, where
    the other value is more precise (irrational, repeating, or a longer finite decimal)."""
    if not ndec or ndec < 2:
        return False
    if other_ndec is not None:
        return False  # two decimal literals: both were rounded by someone, only equality counts
    if isinstance(other_value, Fraction):
        digits = _finite_decimal_digits(other_value)
        if digits is not None and digits <= ndec:
            return False
        return abs(Fraction(dec_value) - other_value) <= Fraction(1, 2 * 10 ** ndec)
    return abs(complex(dec_value) - complex(other_value)) <= 0.5 * 10.0 ** -ndec * (1 + 1e-9) + 1e-12


def numbers_equal(a, a_ndec: int | None, b, b_ndec: int | None) -> bool:
    """The equality rule on two values (Fractions or complex floats) with their written decimals."""
    if a == b:
        return True
    return rounded_match(a, a_ndec, b, b_ndec) or rounded_match(b, b_ndec, a, a_ndec)


def percent_readings(a, b) -> list[tuple]:
    """The pairs to compare under the percent rule: "28%" against x means 28 = x or 0.28 = x."""
    if a[0] == "pct" and b[0] == "pct":
        return [(a[1], b[1])]
    if a[0] == "pct":
        return [(a[1], b), (("/", a[1], HUNDRED), b)]
    if b[0] == "pct":
        return [(a, b[1]), (a, ("/", b[1], HUNDRED))]
    return [(a, b)]


def exact_equal(a, b) -> bool | None:
    """The equality rule on two trees: True / False when both are exact rationals, None when not."""
    if a[0] == "num" and b[0] == "num":  # the common case, without the general machinery
        return numbers_equal(a[1], a[2], b[1], b[2])
    try:
        return any(numbers_equal(exact(x), decimal_places(x), exact(y), decimal_places(y))
                   for x, y in percent_readings(a, b))
    except NotExact:
        return None


# ---------------------------------------------------------------------------------------------
# complex floats

def _check(z: complex) -> complex:
    if not (math.isfinite(z.real) and math.isfinite(z.imag)):
        if math.isnan(z.real) or math.isnan(z.imag):
            raise EvalError("nan")
        raise Bomb("overflow")
    if abs(z) > HUGE:
        raise Bomb("overflow")
    return z


def _pow(a: complex, b: complex) -> complex:
    if a == 0:
        if b.real > 0:
            return 0j
        raise EvalError("0 to a non-positive power")
    try:
        if a.imag == 0 and b.imag == 0 and a.real > 0:
            if b.real * math.log(a.real) > 700:
                raise Bomb("overflow")
            return complex(a.real ** b.real)
        if b.imag == 0 and b.real == int(b.real) and abs(b.real) <= 1e6:
            if abs(a) > 1 and abs(b.real) * math.log(abs(a)) > 700:
                raise Bomb("overflow")
            return complex(a ** int(b.real))
        lg = cmath.log(a) * b
        if lg.real > 700:
            raise Bomb("overflow")
        return cmath.exp(lg)
    except OverflowError as exc:
        raise Bomb("overflow") from exc
    except ZeroDivisionError as exc:
        raise EvalError("division by zero") from exc


def _real(z: complex) -> float:
    if abs(z.imag) > 1e-12 * max(1.0, abs(z.real)):
        raise EvalError("not real")
    return z.real


def _factorial(z: complex) -> complex:
    x = _real(z)
    if x > 170:
        raise Bomb("factorial overflow")
    if x == int(x):
        if x < 0:
            raise EvalError("factorial of a negative integer")
        return complex(math.factorial(int(x)))
    return complex(math.gamma(x + 1))


def _binomial(n: complex, k: complex) -> complex:
    nn, kk = _real(n), _real(k)
    if nn > 170 and nn == int(nn) and kk == int(kk) and 0 <= kk <= nn:
        kk = min(kk, nn - kk)
        if kk * math.log2(nn) > 1000:
            raise Bomb("binomial overflow")
        return complex(math.comb(int(nn), int(kk)))
    return _factorial(n) / (_factorial(k) * _factorial(n - k))


def _undefined_function(name: str, args: list[complex]) -> complex:
    """A fixed smooth function per name, so f(x) == f(x) but f(x) != g(x) and != f(y)."""
    seed = zlib.crc32(name.encode())
    total = complex(0.1 + (seed % 97) / 50.0)
    for i, a in enumerate(args):
        c = 0.3 + ((seed >> (3 * i)) % 13) / 7.0
        total += c * a + cmath.sin(a * (0.7 + i * 0.31))
    return total


_UNARY = {
    "sqrt": cmath.sqrt, "sin": cmath.sin, "cos": cmath.cos, "tan": cmath.tan,
    "cot": lambda z: 1 / cmath.tan(z), "sec": lambda z: 1 / cmath.cos(z),
    "csc": lambda z: 1 / cmath.sin(z), "asin": cmath.asin, "acos": cmath.acos, "atan": cmath.atan,
    "sinh": cmath.sinh, "cosh": cmath.cosh, "tanh": cmath.tanh, "ln": cmath.log,
    "log10": cmath.log10, "exp": cmath.exp, "abs": lambda z: complex(abs(z)),
    "floor": lambda z: complex(math.floor(_real(z))), "ceiling": lambda z: complex(math.ceil(_real(z))),
    "factorial": _factorial,
}


def numeric(node, env: dict[str, complex]) -> complex:
    kind = node[0]
    if kind == "num":
        return complex(float(node[1]))
    if kind == "sym":
        if node[1] not in env:
            raise EvalError(f"unbound symbol {node[1]}")
        return env[node[1]]
    if kind == "const":
        if node[1] == "pi":
            return complex(math.pi)
        if node[1] == "E":
            return complex(math.e)
        raise EvalError("infinity")
    if kind == "neg":
        return -numeric(node[1], env)
    if kind in ("+", "-", "*", "/"):
        try:
            return _check(binary(kind, numeric(node[1], env), numeric(node[2], env), EvalError))
        except OverflowError as exc:
            raise Bomb("overflow") from exc
    if kind == "^":
        return _check(_pow(numeric(node[1], env), numeric(node[2], env)))
    if kind == "fact":
        return _check(_factorial(numeric(node[1], env)))
    if kind == "pct":
        return numeric(node[1], env) / 100
    if kind == "fn":
        name, args = node[1], [numeric(a, env) for a in node[2]]
        try:
            if name == "log":
                if any(a == 0 for a in args):
                    raise EvalError("log of zero")
                val = cmath.log(args[0]) if len(args) == 1 else cmath.log(args[0]) / cmath.log(args[1])
                return _check(val)
            if name == "binomial" and len(args) == 2:
                return _check(_binomial(*args))
            fn = _UNARY.get(name)
            if fn is None or len(args) != 1:
                raise EvalError(f"function {name}")
            return _check(fn(args[0]))
        except (ValueError, ZeroDivisionError) as exc:
            if isinstance(exc, (Bomb, EvalError)):
                raise
            raise EvalError(str(exc)) from exc
        except OverflowError as exc:
            raise Bomb("overflow") from exc
    if kind == "call":
        return _check(_undefined_function(node[1], [numeric(a, env) for a in node[2]]))
    raise EvalError(kind)


def sample_points(names: set[str], n_real: int = 3, n_complex: int = 2) -> list[dict[str, complex]]:
    """Deterministic random points: positive reals, then complex values with positive real part
    (so principal branches of roots and logs agree with the positive-real identities)."""
    points = []
    for k in range(n_real + n_complex):
        env = {}
        for name in names:
            h = zlib.crc32(f"{name}/{k}".encode())
            re_part = 0.35 + (h % 10007) / 10007 * 2.2
            im_part = ((h >> 14) % 9973) / 9973 * 1.6 - 0.8 if k >= n_real else 0.0
            env[name] = complex(re_part, im_part)
        points.append(env)
    return points
