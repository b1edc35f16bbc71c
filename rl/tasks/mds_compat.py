"""Compatibility shim that lets DeepMind's `mathematics_dataset` 1.0.1 (2019) run on sympy 1.14 and NumPy 2.

Call `import_modules()` instead of importing `mathematics_dataset.modules.modules` directly. The three breaking
incompatibilities (1-3) live in ONE file of the package, `mathematics_dataset/sample/polynomials.py`; the shim
patches that module's own view of its dependencies and leaves sympy and numpy themselves exactly as they were.
Three more patches (4-6) keep it working on Python 3.12+ and make it reproducible from a seed:

1. Import time:  `from sympy.solvers.diophantine import base_solution_linear`
   sympy 1.7 turned `sympy.solvers.diophantine` into a package whose `__init__` no longer re-exports
   `base_solution_linear`; the function still exists in `sympy.solvers.diophantine.diophantine`. The shim sets
   the attribute on the package only for the duration of the import, then removes it again (so the patch is
   invisible to every other importer of sympy).
2. Call time:    `np.object` (in `np.empty(..., dtype=np.object)` / `np.zeros(..., dtype=np.object)`)
   The `np.object` alias was removed in NumPy 1.24; the builtin `object` is what it always meant.
3. Call time:    `ndarray.itemset(index, value)`
   Removed in NumPy 2.0; `a[index] = value` is the documented replacement.
   For 2 and 3, the module-level name `np` inside `mathematics_dataset.sample.polynomials` is replaced by a
   small proxy module: attribute access falls through to numpy, except `object` (the builtin) and `zeros` /
   `empty`, which return arrays of `_ItemsetArray`, an ndarray subclass that adds back `itemset`.

4. Call time:    `random.randint(-divisor / 2, divisor / 2)` in `mathematics_dataset/modules/numbers.py`
   (the round_number modules) passes integral floats; Python 3.10 deprecated that and 3.12 raises TypeError.
   That module's `random` name is replaced by a proxy whose `randint` turns integral floats into ints
   (same values, same random stream) and forwards everything else to the real `random` module.
5. Determinism:  `Context.pop` in `mathematics_dataset/util/composition.py` picks a variable letter with
   `random.choice(list(a_set_of_str))`, whose order depends on PYTHONHASHSEED, so problems with variables
   (algebra__linear_1d, polynomials__expand, ...) differed between processes. The method is replaced by one
   that draws from the sorted letters: same randomness consumed, same distribution, reproducible.
6. Determinism:  `expand_entities` in the same file collects the entities a question mentions into a `set` of
   objects (ordered by memory address) and then shuffles that order, so composed questions ("Let a = ...
   Let b = ...") differed from run to run even within one process. It is replaced by a version that keeps
   the entities in first-seen order before the same `random.shuffle`.

Nothing else in the package needs patching for the modules it ships (tests/test_tasks_mathdataset.py draws from
every one of them). `import_modules()` is idempotent and safe to call from many places.
"""
from __future__ import annotations

import importlib
import random
import sys
import types

import numpy as np

_TARGET = "mathematics_dataset.sample.polynomials"
_COMPOSITION = "mathematics_dataset.util.composition"
_NUMBERS = "mathematics_dataset.modules.numbers"
_PATCHED_FLAG = "_mathrl_compat_patched"


class _ItemsetArray(np.ndarray):
    """ndarray with NumPy 1.x's `itemset` (removed in NumPy 2.0)."""

    def itemset(self, index, value):
        self[index] = value


class _NumpyProxy(types.ModuleType):
    """`numpy` as seen by mathematics_dataset.sample.polynomials: the real module plus the removed names."""

    object = object

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def zeros(*args, **kwargs):
        return np.zeros(*args, **kwargs).view(_ItemsetArray)

    @staticmethod
    def empty(*args, **kwargs):
        return np.empty(*args, **kwargs).view(_ItemsetArray)


def _import_polynomials_sample():
    """Import mathematics_dataset.sample.polynomials with `base_solution_linear` exposed only meanwhile."""
    if _TARGET in sys.modules:
        return sys.modules[_TARGET]
    package = importlib.import_module("sympy.solvers.diophantine")
    inner = importlib.import_module("sympy.solvers.diophantine.diophantine")
    added = not hasattr(package, "base_solution_linear")
    if added:
        package.base_solution_linear = inner.base_solution_linear
    try:
        return importlib.import_module(_TARGET)
    finally:
        if added:
            del package.base_solution_linear


class _RandomProxy(types.ModuleType):
    """`random` as seen by mathematics_dataset.modules.numbers: randint accepts integral floats (patch 4)."""

    def __getattr__(self, name):
        return getattr(random, name)

    @staticmethod
    def randint(a, b):
        a = int(a) if isinstance(a, float) and a.is_integer() else a
        b = int(b) if isinstance(b, float) and b.is_integer() else b
        return random.randint(a, b)


def _deterministic_pop(self):
    """`Context.pop` drawing from the SORTED unused letters (the original draws from `list(a_set_of_str)`,
    whose order depends on PYTHONHASHSEED). Same randomness consumed, same uniform distribution."""
    allowed = (composition_allowed_symbols()
               .difference(self._relation_symbols)
               .difference(self._self_symbols)
               .difference(self._child_symbols))
    if not allowed:
        raise ValueError("Ran out of symbols")
    symbol = random.choice(sorted(allowed))
    self._self_symbols.add(symbol)
    return symbol


def _ordered_expand_entities(context, **kwargs):
    """`expand_entities` with the entities in first-seen order (not set order) before the shuffle."""
    composition = importlib.import_module(_COMPOSITION)
    entities = list(dict.fromkeys(context.child_entities))  # Entity hashes by identity: dedup, keep order
    kwargs = dict(kwargs)
    for key, value in list(kwargs.items()):
        if isinstance(value, composition.Entity):
            if value not in entities:
                entities.append(value)
            kwargs[key] = value.handle
    random.shuffle(entities)
    parts = []
    for entity in entities:
        parts.append(entity.child_description)
        if not entity.expression_used:
            parts.append(entity.description)
    return " ".join(p for p in parts if p), kwargs


def composition_allowed_symbols() -> set:
    return importlib.import_module(_COMPOSITION)._ALLOWED_SYMBOLS


def patch() -> types.ModuleType:
    """Apply the six patches (idempotent); returns the patched polynomials sample module."""
    poly = _import_polynomials_sample()
    if not getattr(poly, _PATCHED_FLAG, False):
        poly.np = _NumpyProxy("numpy (mathematics_dataset compat proxy)")
        setattr(poly, _PATCHED_FLAG, True)
    composition = importlib.import_module(_COMPOSITION)
    composition.Context.pop = _deterministic_pop
    composition.expand_entities = _ordered_expand_entities
    numbers = importlib.import_module(_NUMBERS)
    if not isinstance(numbers.random, _RandomProxy):
        numbers.random = _RandomProxy("random (mathematics_dataset compat proxy)")
    return poly


def import_modules() -> types.ModuleType:
    """`mathematics_dataset.modules.modules`, importable and runnable after `patch()`."""
    patch()
    return importlib.import_module("mathematics_dataset.modules.modules")
