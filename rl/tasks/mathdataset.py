"""Problems from DeepMind's `mathematics_dataset` (PyPI 1.0.1), drawn from named modules, seeded.

These problems have no worked solutions (`steps=None`): they are for outcome-reward RL and evaluation.
The package is imported through rl/tasks/mds_compat.py, which patches its three sympy / NumPy 2
incompatibilities (see that file).

Mix names:
    mathdataset                              the DEFAULT_MODULES below, uniformly
    mathdataset@numbers__gcd+algebra__linear_1d   the named modules (any of `available_modules()`)
Each problem's `source` is `mathdataset/<module>`, e.g. `mathdataset/numbers__gcd`.

Difficulty 1..5 restricts the package's "train" entropy range [lo, hi] to its k-th fifth
[lo + (k-1)(hi-lo)/5, lo + k(hi-lo)/5] (the package's own train-easy/medium/hard split uses thirds the same way).
Questions longer than 160 characters or answers longer than 30 are redrawn, as the package's generator does.

Reproducibility: the package draws from Python's global `random`, NumPy's global RandomState and sympy's own
`sympy.core.random` generator. `sample()` seeds all three from (seed, split, difficulty, modules) and restores
their previous states afterwards, so it neither depends on nor disturbs anyone else's global RNG use. With
the shim's determinism patches every module gives identical problems across processes, whatever the
PYTHONHASHSEED (tests/test_tasks_mathdataset.py checks all 56).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import random

import numpy as np

from rl.tasks import mds_compat
from rl.tasks.base import LEVELS, GeneratedSource, Problem

# Modules whose answers are single numbers or expressions `rewards.verify.is_equiv` can compare.
DEFAULT_MODULES = (
    "algebra__linear_1d",
    "algebra__linear_2d",
    "algebra__sequence_next_term",
    "arithmetic__add_or_sub",
    "arithmetic__add_sub_multiple",
    "arithmetic__div",
    "arithmetic__mixed",
    "arithmetic__mul",
    "arithmetic__mul_div_multiple",
    "calculus__differentiate",
    "numbers__div_remainder",
    "numbers__gcd",
    "numbers__lcm",
    "numbers__place_value",
    "numbers__round_number",
    "polynomials__evaluate",
    "polynomials__expand",
)
MAX_QUESTION_LENGTH = 160
MAX_ANSWER_LENGTH = 30
_MAX_REDRAWS = 1000


def _flatten(tree: dict, prefix: str | None = None, out: dict | None = None) -> dict:
    """{"algebra": {"linear_1d": fn}} -> {"algebra__linear_1d": fn} (the package's naming)."""
    out = {} if out is None else out
    for key, value in tree.items():
        name = key if prefix is None else f"{prefix}__{key}"
        if isinstance(value, dict):
            _flatten(value, name, out)
        else:
            out[name] = value
    return out


def _level_entropy_fn(level: int):
    lower, upper = (level - 1) / len(LEVELS), level / len(LEVELS)

    def entropy_fn(range_):
        lo, hi = range_
        return lo + lower * (hi - lo), lo + upper * (hi - lo)

    return entropy_fn


@functools.lru_cache(maxsize=None)
def _modules_at_level(level: int) -> dict:
    modules = mds_compat.import_modules()
    return _flatten(modules.train(_level_entropy_fn(level)))


def available_modules() -> tuple[str, ...]:
    """Every module name the package offers (56 in 1.0.1), sorted."""
    return tuple(sorted(_modules_at_level(LEVELS[0])))


def _int_seed(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)  # NumPy wants [0, 2**32)


@contextlib.contextmanager
def seeded_globals(key: str):
    """Seed Python's, NumPy's and sympy's global generators from `key`; restore their states on exit."""
    import sympy.core.random as sympy_random  # here: sympy is slow to import; rl.tasks imports this module

    saved = (random.getstate(), np.random.get_state(), sympy_random.rng.getstate(),
             sympy_random._assumptions_rng.getstate())
    random.seed(key)
    np.random.seed(_int_seed(key))
    sympy_random.seed(key)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        sympy_random.rng.setstate(saved[2])
        sympy_random._assumptions_rng.setstate(saved[3])


def draw(module_name: str, level: int) -> tuple[str, str]:
    """One (question, answer) from a module at a level, redrawn while too long. Uses the global RNGs."""
    fn = _modules_at_level(level)[module_name]
    for _ in range(_MAX_REDRAWS):
        p = fn()
        question, answer = str(p.question).strip(), str(p.answer).strip()
        if len(question) <= MAX_QUESTION_LENGTH and len(answer) <= MAX_ANSWER_LENGTH and question and answer:
            return question, answer
    raise RuntimeError(f"mathematics_dataset module {module_name!r} gave no short enough problem in "
                       f"{_MAX_REDRAWS} draws at difficulty {level}")


@dataclasses.dataclass(frozen=True)
class MathDatasetSource:
    """Problems from the named modules (uniformly), without worked steps."""

    name: str = "mathdataset"
    modules: tuple[str, ...] = DEFAULT_MODULES
    levels: tuple[int, ...] = LEVELS
    description: str = "DeepMind mathematics_dataset modules (no worked solutions)"

    def __post_init__(self):
        if not self.modules:
            raise ValueError("MathDatasetSource.modules must name at least one module")
        known = set(available_modules())
        unknown = [m for m in self.modules if m not in known]
        if unknown:
            raise ValueError(f"unknown mathematics_dataset module(s) {unknown}; available: {sorted(known)}")

    def _make(self, rng: random.Random, difficulty: int):
        module = rng.choice(self.modules)
        question, answer = draw(module, difficulty)
        return question, answer, None, f"mathdataset/{module}"

    def sample(self, n: int, seed: int, split: str, difficulty: int | None = None,
               unique: bool | None = None) -> list[Problem]:
        inner = GeneratedSource(self.name, self._make, self.levels)
        with seeded_globals(f"{self.name}|{'+'.join(self.modules)}|{seed}|{split}|{difficulty}"):
            return inner.sample(n, seed, split, difficulty, unique)


def from_spec(arg: str | None) -> MathDatasetSource:
    """`None` -> default modules; "numbers__gcd+algebra__linear_1d" -> those modules."""
    if not arg:
        return MathDatasetSource()
    modules = tuple(m.strip() for m in arg.split("+") if m.strip())
    return MathDatasetSource(name=f"mathdataset@{'+'.join(modules)}", modules=modules)
