"""Tests for the mathematics_dataset adapter (rl/tasks/mathdataset.py) and its compatibility shim
(rl/tasks/mds_compat.py): what the shim patches, that every module of the package runs, >= 10 modules in the
default mix, seeding, RNG isolation and reproducibility across processes."""
import importlib
import os
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest

from rl.tasks import get_source, load_mix, mds_compat
from rl.tasks.base import split_of
from rl.tasks.mathdataset import DEFAULT_MODULES, MathDatasetSource, available_modules

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_unpatched_package_fails_to_import_in_a_fresh_process():
    """The reason the shim exists: a plain import breaks under the installed sympy."""
    code = "import mathematics_dataset.modules.modules"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert res.returncode != 0 and "base_solution_linear" in res.stderr


def test_shim_patches_exactly_the_polynomials_module():
    poly = mds_compat.patch()
    assert poly.__name__ == "mathematics_dataset.sample.polynomials"
    # Patch 1 is scoped to the import: sympy's package namespace is left as it was.
    assert not hasattr(importlib.import_module("sympy.solvers.diophantine"), "base_solution_linear")
    assert poly.diophantine_solve_linear_2d is importlib.import_module(
        "sympy.solvers.diophantine.diophantine").base_solution_linear
    # Patches 2 and 3 live in the module's private numpy proxy; numpy itself is untouched.
    assert poly.np is not np and poly.np.object is object
    assert "object" not in vars(np) and not hasattr(np.ndarray, "itemset")
    arr = poly.np.zeros((2, 3), dtype=np.int64)
    arr.itemset((1, 2), 7)
    assert arr[1, 2] == 7 and isinstance(arr, np.ndarray)
    obj = poly.np.empty((2,), dtype=poly.np.object)
    obj.itemset(0, [1, 2])
    assert obj[0] == [1, 2]
    assert poly.np.asarray is np.asarray  # everything else falls through to numpy
    assert mds_compat.patch() is poly  # idempotent


def test_shim_randint_and_determinism_patches():
    mds_compat.patch()
    numbers = importlib.import_module("mathematics_dataset.modules.numbers")
    composition = importlib.import_module("mathematics_dataset.util.composition")
    assert numbers.random is not random and numbers.random.choice == random.choice
    random.seed(5)
    expect = random.randint(-50, 49)
    random.seed(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Python 3.10-3.11 warn, 3.12 raises, on float arguments
        got = numbers.random.randint(-100 / 2, 100 / 2 - 1)
    assert got == expect and isinstance(got, int)
    assert composition.expand_entities is mds_compat._ordered_expand_entities
    assert composition.Context.pop is mds_compat._deterministic_pop
    ctx = composition.Context()
    random.seed(0)
    first = [ctx.pop() for _ in range(5)]
    ctx, _ = composition.Context(), random.seed(0)
    assert [ctx.pop() for _ in range(5)] == first and "e" not in first


def test_every_package_module_runs_after_the_shim():
    modules = available_modules()
    assert len(modules) == 56
    for name in modules:
        src = MathDatasetSource(name=f"m-{name}", modules=(name,))
        (p,) = src.sample(1, 0, "train", difficulty=1)
        assert p.question and p.answer and p.steps is None and p.source == f"mathdataset/{name}"


def test_default_mix_covers_at_least_ten_modules():
    assert len(DEFAULT_MODULES) >= 10
    problems = load_mix("mathdataset", 200, 0, "train")
    modules = {p.source.split("/", 1)[1] for p in problems}
    assert len(modules) >= 10 and modules <= set(DEFAULT_MODULES)
    assert all(p.steps is None and 1 <= p.difficulty <= 5 for p in problems)
    assert all(len(p.question) <= 160 and len(p.answer) <= 30 for p in problems)


def test_named_modules_spec_and_errors():
    src = get_source("mathdataset@numbers__gcd+algebra__linear_1d")
    problems = src.sample(20, 1, "test")
    assert {p.source for p in problems} <= {"mathdataset/numbers__gcd", "mathdataset/algebra__linear_1d"}
    assert all(split_of(p.question) == "test" for p in problems)
    assert len({p.question for p in problems}) == 20
    with pytest.raises(ValueError, match="unknown mathematics_dataset module"):
        MathDatasetSource(modules=("numbers__nope",))


def test_seeded_and_leaves_global_rngs_alone():
    import sympy.core.random as sympy_random

    random.seed(123)
    np.random.seed(123)
    expect_py, expect_np = random.random(), np.random.random()
    random.seed(123)
    np.random.seed(123)
    sympy_state = sympy_random.rng.getstate()
    src = MathDatasetSource()
    a = src.sample(15, 5, "train", difficulty=2)
    assert random.random() == expect_py and np.random.random() == expect_np
    assert sympy_random.rng.getstate() == sympy_state
    assert a == src.sample(15, 5, "train", difficulty=2)
    assert a != src.sample(15, 6, "train", difficulty=2)
    assert all(p.difficulty == 2 for p in a)


_DIGEST = """
import hashlib
from rl.tasks import load_mix
ps = load_mix("arith,fractions,linear,word,word_zh,mathdataset:3", 120, 4, "train")
ps += load_mix("mathdataset", 20, 4, "test")
from rl.tasks.mathdataset import MathDatasetSource, available_modules
for m in available_modules():  # every module, composed ones included
    ps += MathDatasetSource(name="all", modules=(m,)).sample(2, 0, "train", difficulty=3)
print(hashlib.sha256(repr(ps).encode()).hexdigest())
"""


def test_reproducible_across_processes_and_hash_seeds():
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        res = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True, cwd=REPO, env=env,
                             timeout=300)
        assert res.returncode == 0, res.stderr
        digests.add(res.stdout.strip())
    assert len(digests) == 1
