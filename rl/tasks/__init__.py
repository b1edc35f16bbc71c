"""Problem sources behind one small interface: a registry, a mix-spec parser and `load_mix`.

    from rl.tasks import load_mix, get_source, render_prompt, render_solution
    problems = load_mix("arith:0.5,linear:0.5", n=1000, seed=0, split="train")
    prompt, target = render_prompt(problems[0], "zh"), render_solution(problems[0], "zh")

Source names (`list_sources()` prints them with descriptions):
    arith add sub mul            integer arithmetic with column steps (arith level 1 = single-digit a+b)
    fractions                    add / subtract / simplify fractions
    linear linear1 linear2       linear equations in one / two unknowns
    word word_zh                 GSM8K-like template word problems (English / Chinese)
    code                         function-writing problems with hidden tests (reward "code", rl/tasks/code.py)
    instructions                 verifiable instructions, IFEval-style (reward "instructions",
    instructions_zh/_en          rl/tasks/instructions.py); response language drawn per problem / fixed
    mathdataset                  DeepMind mathematics_dataset, default modules (no steps)
    mathdataset@m1+m2            the named mathematics_dataset modules
    jsonl@PATH                   a user's JSONL file (rl/tasks/jsonl_io.py)
    tfds@NAME[@DATA_DIR]         a locally prepared TFDS dataset: a project one (rl/tasks/tfds_builder.py) or
                                 a catalog one (math_dataset/..., huggingface:gsm8k/main, ...)

Mix spec: comma-separated `name[:weight]` items, e.g. "arith:0.5,linear:0.5", "word,word_zh" (equal
weights), "mathdataset@numbers__gcd:1,arith:3". Weights are positive numbers, normalised to sum to 1; counts
are allocated by largest remainder, so they always add up to n. Splits: see rl/tasks/base.py (by question
hash, disjoint, 80/10/10). A mix may combine families ("code:0.3,instructions:0.3,add:0.4"): each problem's
`reward` names the reward that scores it and `check` carries that reward's payload (rl/tasks/base.py).
"""
from __future__ import annotations

import functools
import random

from rl.tasks import arith, code, fractions_, instructions, linear, word
from rl.tasks.base import (
    LEVELS, REWARDS, SPLITS, FixedSource, GeneratedSource, Problem, check_split, question_hash, split_of,
)
from rl.tasks.render import render_example, render_prompt, render_solution

__all__ = [
    "Problem", "SPLITS", "LEVELS", "REWARDS", "split_of", "get_source", "list_sources", "parse_mix", "allocate", "load_mix",
    "render_prompt", "render_solution", "render_example",
]

_GENERATED: dict[str, GeneratedSource] = {
    s.name: s for s in arith.SOURCES + fractions_.SOURCES + linear.SOURCES + word.SOURCES + code.SOURCES
    + instructions.SOURCES
}
_PARAMETERISED = {
    "mathdataset": "DeepMind mathematics_dataset: `mathdataset` (default modules) or `mathdataset@m1+m2`",
    "jsonl": "a JSONL problem file: `jsonl@path/to/file.jsonl`",
    "tfds": "a prepared TFDS dataset: `tfds@name` or `tfds@name@data_dir` (array_record, read offline)",
}


def list_sources() -> dict[str, str]:
    """Name -> one-line description of every registered source."""
    out = {name: s.description for name, s in _GENERATED.items()}
    out.update(_PARAMETERISED)
    return out


@functools.lru_cache(maxsize=64)
def get_source(name: str):
    """The source object for a registry name (see the module docstring). Cached: JSONL / TFDS files are read
    once per process."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"source name must be a non-empty string, got {name!r}")
    name = name.strip()
    if name in _GENERATED:
        return _GENERATED[name]
    base, _, arg = name.partition("@")
    if base == "mathdataset":
        from rl.tasks import mathdataset
        return mathdataset.from_spec(arg or None)
    if base == "jsonl":
        if not arg:
            raise ValueError("source 'jsonl' needs a path: jsonl@path/to/file.jsonl")
        from rl.tasks import jsonl_io
        return FixedSource.build(name, jsonl_io.read_jsonl(arg, source=name), description=f"JSONL file {arg}")
    if base == "tfds":
        if not arg:
            raise ValueError("source 'tfds' needs a dataset name: tfds@name or tfds@name@data_dir")
        from rl.tasks import tfds_builder
        ds_name, _, data_dir = arg.partition("@")
        return FixedSource.build(name, tfds_builder.load_problems(ds_name, data_dir=data_dir or None),
                                 description=f"TFDS dataset {ds_name}")
    raise ValueError(f"unknown task source {name!r}; known: {sorted(list_sources())}")


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """"arith:0.5,linear:0.5" -> [("arith", 0.5), ("linear", 0.5)], weights normalised to sum 1.

    A missing weight means 1. The weight is whatever follows the LAST colon when it parses as a number, so
    names containing colons (tfds@huggingface:gsm8k/main) work. Names are checked against the registry."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mix spec must be a non-empty string like 'arith:0.5,linear:0.5', got {spec!r}")
    items: list[tuple[str, float]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"mix spec {spec!r} has an empty item (check the commas)")
        name, weight = part, 1.0
        head, sep, tail = part.rpartition(":")
        if sep:
            try:
                weight = float(tail)
                name = head.strip()
            except ValueError:
                name, weight = part, 1.0  # the colon belongs to the name
        if not weight > 0 or weight == float("inf"):
            raise ValueError(f"mix spec {spec!r}: weight of {name!r} must be a positive finite number, got {tail!r}")
        base = name.partition("@")[0]
        if name not in _GENERATED and base not in _PARAMETERISED:
            raise ValueError(f"mix spec {spec!r}: unknown source {name!r}; known: {sorted(list_sources())}")
        if any(name == other for other, _ in items):
            raise ValueError(f"mix spec {spec!r} names {name!r} twice")
        items.append((name, weight))
    total = sum(w for _, w in items)
    return [(name, w / total) for name, w in items]


def allocate(weights: list[float], n: int) -> list[int]:
    """Integer counts proportional to weights that sum to n (largest remainder, ties to the earlier item)."""
    raw = [w * n for w in weights]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def load_mix(spec: str, n: int, seed: int, split: str, difficulty: int | None | dict = None,
             unique: bool | None = None) -> list[Problem]:
    """n problems from the mix, deterministic in (spec, n, seed, split, difficulty, unique), shuffled together.

    difficulty: None draws each problem's level uniformly from the source's levels; an int fixes it; a dict
    {source name: int | None} sets it per source (sources it does not name get None).
    unique: None = distinct problems for validation/test, i.i.d. draws for train (see rl/tasks/base.py);
    distinctness then also holds across the sources of the mix (the same question from two sources counts
    once, and the source that lost it draws more)."""
    check_split(split)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    items = parse_mix(spec)
    counts = allocate([w for _, w in items], n)
    want_unique = split != "train" if unique is None else bool(unique)
    sources = [get_source(name) for name, _ in items]
    extra = [0] * len(items)
    for _ in range(8):
        # Sampling is prefix-stable (asking for more returns the same first problems), so topping up a
        # source after cross-source duplicates keeps everything deterministic.
        levels = ([difficulty.get(name) for name, _ in items] if isinstance(difficulty, dict)
                  else [difficulty] * len(items))
        drawn = [src.sample(c + e, seed, split, lv, unique) for src, c, e, lv in zip(sources, counts, extra, levels)]
        if not want_unique:
            merged = [p for batch in drawn for p in batch]
            break
        seen, merged, short = set(), [], [0] * len(items)
        for i, batch in enumerate(drawn):
            kept = 0
            for p in batch:
                key = question_hash(p.question)
                if key not in seen and kept < counts[i]:
                    seen.add(key)
                    merged.append(p)
                    kept += 1
            short[i] = counts[i] - kept
        if not any(short):
            break
        extra = [e + s for e, s in zip(extra, short)]
    else:
        raise ValueError(f"mix {spec!r}: could not find {n} distinct problems in split {split!r} across sources")
    random.Random(f"mix|{spec}|{seed}|{split}|{difficulty}").shuffle(merged)
    return merged
