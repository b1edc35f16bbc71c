"""Problems from reasoning-gym's procedural generators (`gym@NAME`), graded by our own rewards/gym_check.py.

    load_mix("gym@basic_arithmetic:1,gym@countdown:1,arith:1", n=300, seed=0, split="train")
    load_mix("gym@chain_sum@max_terms=3,max_digits=2", n=64, seed=0, split="test")      # generator settings
    load_mix("gym@countdown@min_numbers=3,max_numbers=3,operators=+|-|*", 64, 0, "test")  # a tuple: a|b|c

Needs the optional extra (`pip install -e '.[gym]'`, reasoning-gym==0.1.25); without it a `gym@...` source raises
a ValueError that says so. Only the generators are used: reasoning-gym's `score_answer` functions (several call
eval() or sympy's parse_expr on the answer) are never imported or called. Each problem has reward "gym" and a
check payload naming one of our graders (rewards/gym_check.py), so `rewards.task_score.score_task` grades it:

    family                     grader     Problem.answer (the SFT target)      notes
    basic_arithmetic           number     "-4"                                 gold recomputed exactly (see _arithmetic)
    chain_sum                  number     "214"
    simple_equations           number     "13"                                 "e = 13" also accepted
    gsm_symbolic               number     "288"
    fraction_simplification    fraction   "138/583" (the question's style)     must be in lowest terms
    polynomial_equations       roots      "-0.7757, 0, 1.9717" (4 decimals)    gold: exact real roots (sympy)
    countdown                  countdown  "94*4 - 61 - 6"                      numbers and target in the payload

Questions are the generator's own text, except that two format blocks are cut, because they contradict the
project's answer-line layout (render_prompt / render_solution): countdown's "Final answer format instructions"
("Do not include any other text") and polynomial_equations' "In solving equations, please follow these
instructions" (4-decimal answers, an empty string for no root; our grader accepts any rounding to 2+ decimals and
exact forms). No family has worked steps (`steps=None`): a cold start on them imitates the answer line only.

Seeds and splits: the items of one draw come from the generator in chunks of CHUNK items, chunk c built with seed
sha256("gym|<name>|<seed>|<split>|c") (the run's seed and the split), item i of a chunk being the generator's own
item i; as for every source, an item is kept only when its question hashes into the requested split
(rl/tasks/base.py), so train / validation / test never share a question, and a draw is deterministic and
prefix-stable. Generators have no levels 1..5: their settings set the difficulty (difficulty must be None). Each
setting has a range (SETTINGS), checked with the config: a setting out of it (`max_terms=100000` once hung the dry
run, `max_terms=1e999` tracebacked) is a config error naming it; a generator that fails on an item is a ValueError
naming the source.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from fractions import Fraction

from rewards._verify_eval import exact
from rewards.mathparse import parse_arithmetic
from rl.tasks.base import GeneratedSource, Problem
from schema import key_values

__all__ = ["FAMILIES", "SETTINGS", "CHUNK", "PIN", "check_spec", "settings_error", "from_spec", "parse_settings",
           "to_problem", "roots_gold"]

PIN = "reasoning-gym==0.1.25"
CHUNK = 1024  # items per generator instance (their datasets draw item i from Random(seed + i))
_COUNTDOWN_FORMAT = "\n\nFinal answer format instructions:"
_POLY_FORMAT = "\nIn solving equations, please follow these instructions:"
_ROOT_DIGITS = 40  # decimals kept of an irrational root in the gold (as an exact rational)


def _number(item: dict) -> dict:
    return {"question": item["question"], "answer": item["answer"].strip(),
            "check": {"grader": "number", "gold": item["answer"].strip()}}


def _fraction_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _arithmetic(item: dict) -> dict:
    """basic_arithmetic with the gold recomputed exactly from the expression (rewards.mathparse's arithmetic parser,
    exact rationals): reasoning-gym 0.1.25 answers with floor division where a division is not exact (about 1% of
    items at default settings: "-1 / -( -( -( -2 - 9 ) ) + -3 + -13 )" gives -1, the value is -1/27) and, with
    allow_parentheses=false, evaluates left to right ("8 - 3 * 6" gives 30)."""
    gold = _fraction_text(exact(parse_arithmetic(item["metadata"]["expression"])))
    return {"question": item["question"], "answer": gold, "check": {"grader": "number", "gold": gold}}


def _equation(item: dict) -> dict:
    out = _number(item)
    out["check"]["variable"] = item["metadata"]["variable"]
    return out


def _fraction(item: dict) -> dict:
    m = item["metadata"]
    n, d = m["simplified_numerator"], m["simplified_denominator"]
    return {"question": item["question"], "answer": item["answer"].strip(),
            "check": {"grader": "fraction", "gold": f"{n}/{d}" if d != 1 else str(n)}}


def _countdown(item: dict) -> dict:
    m = item["metadata"]
    question = item["question"].split(_COUNTDOWN_FORMAT)[0].strip()
    return {"question": question, "answer": item["answer"].strip(),
            "check": {"grader": "countdown", "numbers": [int(x) for x in m["numbers"]], "target": int(m["target"]),
                      "use_all": True}}  # every question template says "using all (of these) numbers"


def _decimal4(value: Fraction) -> str:
    """A root as a model writes it: at most 4 decimals, trailing zeros dropped (0, -3.625, 1.9717)."""
    scaled = round(value * 10**4)  # Fraction rounds half to even: within half a unit of the 4th decimal
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**4)
    frac_text = f"{frac:04d}".rstrip("0")
    return f"{sign}{whole}" + (f".{frac_text}" if frac_text else "")


def roots_gold(expr: str, variable: str) -> list[Fraction]:
    """The real roots of the generator's polynomial (sorted), exact when rational, else to _ROOT_DIGITS decimals.

    `expr` is reasoning-gym's own generated text (integer coefficients, e.g. "51*h**3 - 61*h**2 - 78*h"), trusted
    like the rest of the item; model text never comes here."""
    import sympy  # here: slow to import, and only the polynomial family needs it (rl.tasks imports this module)

    x = sympy.Symbol(variable)
    poly = sympy.Poly(sympy.parse_expr(expr, local_dict={variable: x}), x)
    out = []
    for r in sympy.real_roots(poly):
        if r.is_Rational:
            out.append(Fraction(int(r.p), int(r.q)))
        else:
            out.append(Fraction(str(sympy.N(r, _ROOT_DIGITS + 10))).limit_denominator(10**_ROOT_DIGITS))
    return sorted(set(out))


def _polynomial(item: dict) -> dict:
    m = item["metadata"]
    question = item["question"].split(_POLY_FORMAT)[0].strip()
    roots = roots_gold(m["polynomial_expr"], m["variable"])
    answer = ", ".join(_decimal4(r) for r in roots) or "no real solutions"
    gold = ", ".join(_fraction_text(r) for r in roots)
    return {"question": question, "answer": answer,
            "check": {"grader": "roots", "gold": gold or "none", "n_roots": len(roots), "variable": m["variable"]}}


# name -> item converter; docs/tasks.md lists which other generators the number grader would serve unchanged
FAMILIES = {
    "basic_arithmetic": _arithmetic,
    "chain_sum": _number,
    "simple_equations": _equation,
    "gsm_symbolic": _number,
    "fraction_simplification": _fraction,
    "polynomial_equations": _polynomial,
    "countdown": _countdown,
}
_SETTING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED = ("seed", "size")  # set by this module


# ---- the settings' ranges: what the config check holds each generator setting to -------------------------------------
def _integer(lo: int, hi: int):
    def check(v):
        ok = isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
        return None if ok else f"must be an integer in [{lo}, {hi}], got {v!r}"
    return check


def _real(lo: float, hi: float):
    def check(v):
        ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and lo <= x <= hi
                 for x in (v if isinstance(v, tuple) else (v,)))  # a number, or a|b|c of numbers (weights)
        return None if ok else f"must be a number (or numbers a|b|c) in [{lo:g}, {hi:g}], got {v!r}"
    return check


def _flag(v):
    return None if isinstance(v, bool) else f"must be true or false, got {v!r}"


def _one_of(*choices: str):
    def check(v):
        return None if v in choices else f"must be one of {'|'.join(choices)}, got {v!r}"
    return check


def _some_of(*choices: str):
    def check(v):
        items = v if isinstance(v, tuple) else (v,)
        ok = items and all(isinstance(x, str) and x in choices for x in items)
        return None if ok else f"must be some of {'|'.join(choices)} (as a|b), got {v!r}"
    return check


# family -> setting -> check, in the generator's own field order. The upper bounds keep the dry run and a draw
# bounded (measured on 2 cores, 8 items): basic_arithmetic's division search runs to the square root of a dividend
# that grows with terms x digits (15 terms of 10 digits: > 40 s; 10 of 5: 1 s); countdown's search and
# polynomial_equations' exact roots (sympy) grow with the numbers and the degree (degree 8: 0.3 s an item, degree
# 60 and 999,999 numbers: never). The generators' own checks (min <= max, ...) still apply after these.
SETTINGS = {
    "basic_arithmetic": {"min_terms": _integer(1, 10), "max_terms": _integer(1, 10), "min_digits": _integer(1, 5),
                         "max_digits": _integer(1, 5), "operators": _some_of("+", "-", "*", "/"),
                         "allow_parentheses": _flag, "allow_negation": _flag,
                         "format_style": _one_of("simple", "natural"),
                         "whitespace": _one_of("no_space", "single", "random")},
    "chain_sum": {"min_terms": _integer(1, 20), "max_terms": _integer(1, 20), "min_digits": _integer(1, 10),
                  "max_digits": _integer(1, 10), "allow_negation": _flag},
    "simple_equations": {"min_terms": _integer(1, 10), "max_terms": _integer(1, 10), "min_value": _integer(1, 10**6),
                         "max_value": _integer(1, 10**6), "operators": _some_of("+", "-", "*"),
                         "operators_weights": _real(0, 1)},
    "gsm_symbolic": {"difficulty": _real(1, 1)},  # reasoning-gym 0.1.25 supports 1.0 only
    "fraction_simplification": {"min_value": _integer(1, 10**6), "max_value": _integer(1, 10**6),
                                "min_factor": _integer(1, 10**4), "max_factor": _integer(1, 10**4),
                                "styles": _some_of("plain", "latex_inline", "latex_frac", "latex_dfrac")},
    "polynomial_equations": {"min_terms": _integer(1, 6), "max_terms": _integer(1, 6), "min_value": _integer(1, 1000),
                             "max_value": _integer(1, 1000), "min_degree": _integer(1, 6),
                             "max_degree": _integer(1, 6), "operators": _some_of("+", "-")},
    "countdown": {"min_numbers": _integer(2, 8), "max_numbers": _integer(2, 8), "min_value": _integer(1, 1000),
                  "max_value": _integer(1, 1000), "min_target": _integer(1, 10**5),
                  "max_target": _integer(1, 10**5), "operators": _some_of("+", "-", "*", "/"), "shuffle": _flag},
}


def settings_error(family: str, settings: dict) -> str | None:
    """Why `settings` are not settings of `family` within SETTINGS' ranges (None when they are), naming the first
    setting that is not."""
    known = SETTINGS[family]
    for key, value in settings.items():
        if key not in known:
            return f"gym@{family}: unknown setting {key!r}; its settings: {', '.join(known)}"
        if (why := known[key](value)) is not None:
            return f"gym@{family}: setting {key} {why}"
    return None


def _import_gym():
    try:  # here: reasoning_gym is an optional extra, and a missing one is reported only where a gym@ source is used
        import reasoning_gym  # noqa: F401  (registers the generators)
        from reasoning_gym.factory import DATASETS
    except ImportError as e:
        raise ValueError(f"task source 'gym@...' needs the optional extra: pip install -e '.[gym]' ({PIN}); "
                         f"importing reasoning_gym failed: {e}") from None
    return DATASETS


def _value(text: str):
    """A setting's value: int, float, true / false, a tuple a|b|c of those, else the string."""
    if "|" in text:
        return tuple(_value(t) for t in text.split("|"))
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_settings(text: str) -> dict:
    """"max_terms=3,max_digits=2" -> {"max_terms": 3, "max_digits": 2} (ValueError naming a malformed item)."""
    out = {}
    for key, value in key_values(text, "gym setting", "key=value (e.g. max_terms=3; a tuple as a|b|c)"):
        if not _SETTING.match(key) or not value:
            raise ValueError(f"gym setting '{key}={value}' must be key=value (e.g. max_terms=3; a tuple as a|b|c)")
        out[key] = _value(value)
    return out


def _settings_text(settings: dict) -> str:
    def one(v):
        return "|".join(one(x) for x in v) if isinstance(v, tuple) else str(v).lower() if isinstance(v, bool) else str(v)

    return ",".join(f"{k}={one(v)}" for k, v in settings.items())


@functools.lru_cache(maxsize=256)
def _dataset(family: str, settings_key: str, seed: int):
    """One generator instance of CHUNK items (cached: a draw walks its chunks in order)."""
    datasets = _import_gym()
    cls, config_cls = datasets[family]
    settings = parse_settings(settings_key) if settings_key else {}
    try:
        config = config_cls(**settings, seed=seed, size=CHUNK)
        return cls(config)
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"gym@{family}: settings {settings_key!r} rejected by the generator: {e or 'invalid value'}") from None


def to_problem(source: str, family: str, item: dict) -> dict:
    """A generator item as GeneratedSource's make() result (question, answer, steps None, reward, check)."""
    made = FAMILIES[family](item)
    made["check"]["family"] = family
    return {"question": made["question"], "answer": made["answer"], "steps": None, "source": source,
            "reward": "gym", "check": made["check"]}


@dataclasses.dataclass(frozen=True)
class GymSource:
    """A reasoning-gym generator with fixed settings; `sample` has the GeneratedSource contract."""

    name: str
    family: str
    settings: str = ""  # canonical "key=value,..." text ('' = the generator's defaults)
    levels: tuple[int, ...] = (1,)
    description: str = ""

    def _items(self, seed: int, split):
        chunk = 0
        while True:
            key = f"gym|{self.name}|{seed}|{split}|{chunk}"
            ds = _dataset(self.family, self.settings, int(hashlib.sha256(key.encode()).hexdigest()[:8], 16))
            for i in range(CHUNK):
                try:
                    item = ds[i]
                except Exception as e:  # noqa: BLE001 - the generator's own failure (IndexError, ...) on these settings
                    raise ValueError(f"{self.name}: the generator failed on item {i} of chunk {chunk} "
                                     f"({type(e).__name__}: {e}); try other settings") from None
                yield item
            chunk += 1

    def sample(self, n: int, seed: int, split, difficulty: int | None = None,
               unique: bool | None = None) -> list[Problem]:
        if difficulty is not None:
            raise ValueError(f"source {self.name!r}: reasoning-gym generators have no levels 1..5, so difficulty must "
                             f"be None (got {difficulty!r}); set the generator's own settings instead: "
                             f"gym@{self.family}@key=value,...")
        items = self._items(seed, split)
        inner = GeneratedSource(self.name, lambda rng, level: to_problem(self.name, self.family, next(items)),
                                levels=(1,), description=self.description)
        return inner.sample(n, seed, split, None, unique)


def check_spec(arg: str) -> tuple[str, dict]:
    """(family, settings) of "countdown@min_numbers=3": the generator is one we grade and the settings parse and lie
    in their ranges (SETTINGS; without importing reasoning-gym: mix specs are checked with the config, before any
    compute)."""
    family, _, settings_text = (arg or "").partition("@")
    family = family.strip()
    if family not in FAMILIES:
        raise ValueError(f"unknown reasoning-gym generator {family!r} in 'gym@{arg}'; supported: {', '.join(FAMILIES)}")
    settings = parse_settings(settings_text) if settings_text.strip() else {}
    if (why := settings_error(family, settings)) is not None:
        raise ValueError(why)
    return family, settings


def from_spec(arg: str) -> GymSource:
    """"countdown" or "countdown@min_numbers=3,max_numbers=3" -> its GymSource (ValueError for a missing extra, an
    unknown or unsupported generator, or settings the generator does not have)."""
    family, settings = check_spec(arg)
    datasets = _import_gym()
    if family not in datasets:
        raise ValueError(f"reasoning-gym has no generator {family!r} (installed version is not {PIN}?)")
    known = [f.name for f in dataclasses.fields(datasets[family][1]) if f.name not in _RESERVED]
    bad = [k for k in settings if k not in known]
    if bad:
        raise ValueError(f"gym@{family}: unknown setting {bad[0]!r}; its settings: {', '.join(known)}")
    canonical = _settings_text(settings)
    name = f"gym@{family}" + (f"@{canonical}" if canonical else "")
    src = GymSource(name=name, family=family, settings=canonical,
                    description=f"reasoning-gym generator {family}" + (f" ({canonical})" if canonical else ""))
    _dataset(family, canonical, 0)  # settings the generator's own validation rejects fail here, before any draw
    return src
