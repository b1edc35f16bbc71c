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
    gsm8k@PATH  math@PATH        a GSM8K-style / MATH-style JSONL file (rl/tasks/gsm8k_math.py)
    tfds@NAME[@DATA_DIR]         a locally prepared TFDS dataset (read by rl/tasks/tfds_reader.py): a project one
                                 (written by rl/tasks/tfds_builder.py) or a catalog one (math_dataset/...,
                                 huggingface:gsm8k/main, ...)
    gym@NAME[@key=value,...]     a reasoning-gym generator with its settings (reward "gym", graded by
                                 rewards/gym_check.py; optional extra: pip install -e '.[gym]'; rl/tasks/gym.py)

Mix spec: comma-separated `name[:weight]` items, e.g. "arith:0.5,linear:0.5", "word,word_zh" (equal
weights), "mathdataset@numbers__gcd:1,arith:3", "gym@chain_sum@max_terms=3,max_digits=2:1,arith:1" (the commas
of a gym item's settings belong to it: a `key=value` item after a gym@ item continues it). Weights are positive numbers, normalised to sum to 1; counts
are allocated by largest remainder, so they always add up to n. Splits: see rl/tasks/base.py (by question
hash, disjoint, 80/10/10; `split` may also be a base.Split: an explicit source served whole, or the hash split
over fewer splits, with questions of other splits excluded). A mix may combine families ("code:0.3,instructions:0.3,add:0.4"): each problem's
`reward` names the reward that scores it and `check` carries that reward's payload (rl/tasks/base.py).
"""
from __future__ import annotations

import functools
import random
import re

from rl.tasks import (arith, code, fractions_, gsm8k_math, gym, instructions, jsonl_io, linear, mathdataset, tool_arith,
                      word)
from rl.tasks.base import (
    LEVELS, REWARDS, SPLITS, FixedSource, GeneratedSource, Problem, ShortSupply, Split, check_split, question_hash,
    split_of,
)
from rl.tasks.render import render_example, render_prompt, render_solution

__all__ = [
    "Problem", "SPLITS", "LEVELS", "REWARDS", "Split", "split_of", "get_source", "list_sources", "parse_mix", "allocate",
    "load_mix", "load_splits", "SplitSourceError", "is_fixed", "takes_difficulty", "mix_error", "split_source_errors",
    "render_prompt", "render_solution", "render_example",
]

_GENERATED: dict[str, GeneratedSource] = {
    s.name: s for s in arith.SOURCES + fractions_.SOURCES + linear.SOURCES + word.SOURCES + code.SOURCES
    + instructions.SOURCES + tool_arith.SOURCES
}
_PARAMETERISED = {
    "mathdataset": "DeepMind mathematics_dataset: `mathdataset` (default modules) or `mathdataset@m1+m2`",
    "jsonl": "a JSONL problem file: `jsonl@path/to/file.jsonl`",
    "gsm8k": "a GSM8K-style JSONL file (question, answer ending in '#### N'): `gsm8k@path/to/test.jsonl`",
    "math": "a MATH-style JSONL file (problem, solution with a final \\boxed{}, level): `math@path/to/test.jsonl`",
    "tfds": "a prepared TFDS dataset: `tfds@name` or `tfds@name@data_dir` (array_record, read offline)",
    "gym": "a reasoning-gym generator graded by rewards/gym_check.py: `gym@countdown` or "
           "`gym@chain_sum@max_terms=3,max_digits=2` (optional extra: pip install -e '.[gym]')",
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
        return mathdataset.from_spec(arg or None)
    if base == "jsonl":
        if not arg:
            raise ValueError("source 'jsonl' needs a path: jsonl@path/to/file.jsonl")
        return FixedSource.build(name, jsonl_io.read_jsonl(arg, source=name), description=f"JSONL file {arg}")
    if base in ("gsm8k", "math"):
        if not arg:
            raise ValueError(f"source {base!r} needs a path: {base}@path/to/file.jsonl")
        return FixedSource.build(name, gsm8k_math.read(arg, base, source=name),
                                 description=f"{base.upper()}-style JSONL file {arg}")
    if base == "tfds":
        if not arg:
            raise ValueError("source 'tfds' needs a dataset name: tfds@name or tfds@name@data_dir")
        from rl.tasks import tfds_reader  # deliberate lazy import: tensorflow_datasets loads only for a tfds source
        ds_name, _, data_dir = arg.partition("@")
        return FixedSource.build(name, tfds_reader.load_problems(ds_name, data_dir=data_dir or None),
                                 description=f"TFDS dataset {ds_name}")
    if base == "gym":
        return gym.from_spec(arg)
    raise ValueError(f"unknown task source {name!r}; known: {sorted(list_sources())}")


FIXED = ("jsonl", "gsm8k", "math", "tfds")  # sources that serve a finite set of stored problems


def is_fixed(name: str) -> bool:
    """Whether a mix item names stored problems (a file or dataset) rather than a generator: each of its problems
    keeps its own difficulty, so the run's tasks.difficulty does not filter it."""
    return name.strip().partition("@")[0] in FIXED


def takes_difficulty(name: str) -> bool:
    """Whether a mix item's source takes the run's tasks.difficulty: not stored problems (is_fixed) nor reasoning-gym
    generators, whose own settings set their difficulty (rl/tasks/gym.py)."""
    return not is_fixed(name) and name.strip().partition("@")[0] != "gym"


_GYM_SETTING = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=")


def _split_items(spec: str) -> list[str]:
    """The comma-separated items of a mix spec, a gym item's `key=value` settings kept with it."""
    parts: list[str] = []
    for part in spec.split(","):
        if parts and parts[-1].strip().startswith("gym@") and _GYM_SETTING.match(part):
            parts[-1] += "," + part
        else:
            parts.append(part)
    return parts


def parse_mix(spec: str) -> list[tuple[str, float]]:
    """"arith:0.5,linear:0.5" -> [("arith", 0.5), ("linear", 0.5)], weights normalised to sum 1.

    A missing weight means 1. The weight is whatever follows the LAST colon when it parses as a number, so
    names containing colons (tfds@huggingface:gsm8k/main) work. Names are checked against the registry."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mix spec must be a non-empty string like 'arith:0.5,linear:0.5', got {spec!r}")
    items: list[tuple[str, float]] = []
    for part in _split_items(spec):
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
        if base == "gym":
            try:
                gym.check_spec(name.partition("@")[2])
            except ValueError as e:
                raise ValueError(f"mix spec {spec!r}: {e}") from None
        if any(name == other for other, _ in items):
            raise ValueError(f"mix spec {spec!r} names {name!r} twice")
        items.append((name, weight))
    total = sum(w for _, w in items)
    return [(name, w / total) for name, w in items]


def mix_error(spec, allow_empty: bool = False) -> str | None:
    """Why `spec` is not a mix spec (None when it is; '' is accepted with allow_empty), for config checks."""
    if not isinstance(spec, str):
        return f"must be a string ('' or a mix spec like 'gsm8k@data/test.jsonl'), got {spec!r}"
    if allow_empty and not spec.strip():
        return None
    try:
        parse_mix(spec)
    except ValueError as e:
        return f"is not a valid mix spec: {e}"
    return None


def split_source_errors(mix: str, sources: dict) -> list[tuple[str, str]]:
    """(field, message) pairs for a mix and its explicit split sources ({field: spec or ''}): the mix must parse
    unless every split has its own source (then it must be ''), and no two sources may be the same spec."""
    given = {f: v.strip() for f, v in sources.items() if isinstance(v, str) and v.strip()}
    out = []
    if len(given) == len(sources):
        if mix.strip():
            out.append(("mix", f" ({mix!r}) is not used when {', '.join(sources)} are all set; set it to '' (or "
                               "leave a split to it)"))
    else:
        try:
            parse_mix(mix)
        except ValueError as e:
            out.append(("mix", f": {e}"))
    seen = {}
    for f, spec in given.items():
        if spec in seen:
            out.append((f, f" names the same source as tasks.{seen[spec]} ({spec!r}); the splits must be disjoint"))
        seen.setdefault(spec, f)
    return out


def allocate(weights: list[float], n: int) -> list[int]:
    """Integer counts proportional to weights that sum to n (largest remainder, ties to the earlier item)."""
    raw = [w * n for w in weights]
    counts = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def _largest_fitting(weights, i: int, available: int, n: int) -> int:
    """The largest mix size m <= n whose allocation gives source i at most `available` problems."""
    lo, hi = 0, n  # allocate(weights, m)[i] grows with m
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if allocate(weights, mid)[i] <= available:
            lo = mid
        else:
            hi = mid - 1
    return lo


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
    want_unique = str(split) != "train" if unique is None else bool(unique)
    sources = [get_source(name) for name, _ in items]
    extra = [0] * len(items)
    for _ in range(8):
        # Sampling is prefix-stable (asking for more returns the same first problems), so topping up a
        # source after cross-source duplicates keeps everything deterministic.
        levels = ([difficulty.get(name) for name, _ in items] if isinstance(difficulty, dict)
                  else [difficulty] * len(items))
        drawn = []
        for i, (src, c, e, lv) in enumerate(zip(sources, counts, extra, levels)):
            try:
                drawn.append(src.sample(c + e, seed, split, lv, unique))
            except ShortSupply as err:  # the mix's size that this source can serve (its share by the weights)
                fits = _largest_fitting(weights=[w for _, w in items], i=i, available=err.available - e, n=n)
                raise ShortSupply(str(err), fits) from None
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
        raise ValueError(f"mix {spec!r}: could not find {n} distinct problems in split {str(split)!r} across sources")
    random.Random(f"mix|{spec}|{seed}|{split}|{difficulty}").shuffle(merged)
    return merged


class SplitSourceError(ValueError):
    """A split could not be assembled: `.split` names it, `.explicit` says whether it has its own source,
    `.available` how many problems it could hold (None when the source itself failed)."""

    def __init__(self, message: str, split: str, explicit: bool, available: int | None = None):
        super().__init__(message)
        self.split, self.explicit, self.available = split, explicit, available


def load_splits(mix: str, n: dict, seed: int, sources: dict | None = None,
                difficulty: int | None | dict = None) -> dict[str, list[Problem]]:
    """{split: problems} for train / validation / test: each split with a spec in `sources` takes its n[split]
    problems from that spec as given (every question, whatever its hash); the others are drawn from `mix` by
    question hash among themselves (base.Split). Splits never share a question: the explicit splits must be
    disjoint (SplitSourceError otherwise) and the hash-drawn ones skip every question an explicit split holds.
    Without `sources` this is load_mix(mix, n[s], seed, s, difficulty) for each split, unchanged."""
    sources = {s: spec for s, spec in (sources or {}).items() if spec}
    unknown = sorted(set(sources) - set(SPLITS))
    if unknown:
        raise ValueError(f"sources names unknown split(s) {unknown}; splits are {SPLITS}")
    out, held = {}, {}
    for s in ("test", "validation", "train"):  # explicit splits first; evaluation sets named first in messages
        if s not in sources:
            continue
        try:
            out[s] = load_mix(sources[s], n[s], seed, Split(s, among=()), difficulty, unique=s != "train")
        except (ValueError, OSError) as e:  # a malformed or missing file too
            raise SplitSourceError(str(e), s, True, getattr(e, "available", None)) from None
        keys = {question_hash(p.question) for p in out[s]}
        for other, other_keys in held.items():
            shared = keys & other_keys
            if shared:
                example = next(p.question for p in out[s] if question_hash(p.question) in shared)
                raise SplitSourceError(f"the {s} and {other} sources share {len(shared)} question(s), e.g. "
                                       f"{example[:80]!r}; splits must be disjoint", s, True)
        held[s] = keys
    hashed = tuple(s for s in SPLITS if s not in sources)
    exclude = frozenset().union(*held.values()) if held else frozenset()
    for s in hashed:
        try:
            out[s] = load_mix(mix, n[s], seed, Split(s, among=hashed, exclude=exclude), difficulty)
        except (ValueError, OSError) as e:  # a malformed or missing file too
            raise SplitSourceError(str(e), s, False, getattr(e, "available", None)) from None
    return {s: out[s] for s in SPLITS}
