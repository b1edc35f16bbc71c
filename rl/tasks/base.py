"""The problem record, split assignment by question hash, and the two source shapes every task source uses.

A `Problem` is what every stage consumes: a question, a gold answer string that `rewards.verify.is_equiv`
accepts, optional gold steps (for the cold-start SFT target), a difficulty level and the source name. Problems
of the other task families also name the reward that scores them and carry its payload:
    reward  "math" (default: rewards.verify on `answer`), "code" (rewards.code_reward: hidden tests run in the
            sandbox; `answer` is the gold Python source), "instructions" (rewards.instructions: the share of
            constraints met; `answer` is a gold response) or "gym" (a reasoning-gym generator's problem, graded by
            rewards.gym_check; `answer` is the gold answer line's value)
    check   "" for math; otherwise the payload as canonical JSON text (sorted keys, no spaces), so a Problem
            stays hashable and serialisable. Construct with a dict or its JSON text; `check_data` parses it.
            Both families' payloads hold "prompt": {"zh": ..., "en": ...}, the task statement in each language
            (rl/tasks/render.py renders it); code adds "func", "tests" [[args, expected], ...] and optionally
            "plan": {"zh", "en"}; instructions add "lang" (the language the response must be in) and
            "constraints". gym payloads name their grader and generator instead ("grader", "family", the gold
            or the countdown numbers; rewards/gym_check.py) and render the question itself. The payload is
            validated on construction by the family's reward module. `Problem.family` is the name metrics use:
            the reward, or "gym/<generator>".

Splits. A problem's split is a pure function of its normalised question (`split_of`): a SHA-256 of the
normalised text is mapped to train (80%), validation (10%) or test (10%). Two problems with the same normalised
question therefore always land in the same split, whichever source, seed or difficulty produced them, so the
splits can never share a problem.

Explicit splits. A config may give a split its own source (tasks.test_source, ...: a user's test file, an official
test set) and draw the others from a mix by hash. `Split(name, among, exclude)` says which questions a source
serves for that: `among` = the splits the hash divides the source between (fractions renormalised, so with an
explicit test set the mix gives train 8/9 and validation 1/9); `among=()` = every question, the split used as
given; `exclude` = question hashes held by another split (never served, so the splits stay disjoint). A plain
split name is Split(name) over all three splits, the default above; str(Split) is its name (seeds stay the same).

Sources. Two shapes cover everything under rl/tasks/:
  * `GeneratedSource` wraps a function `make(rng, difficulty) -> (question, answer, steps[, source])`, draws
    problems from a seeded `random.Random` and keeps those whose hash falls in the requested split.
  * `FixedSource` wraps a finite list of problems (JSONL, TFDS, catalog datasets) and serves a deterministic,
    seeded selection of the ones in the requested split.
Both implement `sample(n, seed, split, difficulty=None, unique=None) -> list[Problem]`.

`unique`: None (default) means "distinct problems for validation/test, i.i.d. draws (repeats allowed) for
train", matching how RL samples training problems but keeping evaluation sets free of duplicates. When
distinct problems are required and the split holds fewer than n, `sample` raises a ValueError that says how
many exist (no silent truncation or padding).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import unicodedata
from typing import Callable, Iterable

from rewards.code_reward import parse_check
from rewards.gym_check import parse_check as parse_gym_check
from rewards.instructions import parse_constraints

SPLITS = ("train", "validation", "test")
# Fractions of the 2**64 hash range given to each split, in SPLITS order.
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
LEVELS = (1, 2, 3, 4, 5)
REWARDS = ("math", "code", "instructions", "gym")
LANGS = ("zh", "en")

_WS = re.compile(r"\s+")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem. `steps` is None when the source has no worked solution (outcome-reward only)."""

    id: str
    question: str
    answer: str
    steps: tuple[str, ...] | None
    difficulty: int
    source: str
    reward: str = "math"
    check: str = ""

    def __post_init__(self):
        for name in ("id", "question", "answer", "source"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Problem.{name} must be a non-empty string, got {value!r}")
        if self.steps is not None:
            if not isinstance(self.steps, tuple) or not all(isinstance(s, str) and s.strip() for s in self.steps):
                raise ValueError(f"Problem.steps must be None or a tuple of non-empty strings, got {self.steps!r}")
        if not isinstance(self.difficulty, int) or isinstance(self.difficulty, bool) or self.difficulty < 1:
            raise ValueError(f"Problem.difficulty must be an int >= 1, got {self.difficulty!r}")
        if self.reward not in REWARDS:
            raise ValueError(f"Problem.reward must be one of {REWARDS}, got {self.reward!r}")
        object.__setattr__(self, "check", canonical_check(self.reward, self.check))

    @property
    def family(self) -> str:
        """The task family metrics are reported under: the reward, or "gym/<generator>" for reasoning-gym problems."""
        return f"gym/{self.check_data['family']}" if self.reward == "gym" else self.reward

    @property
    def check_data(self) -> dict | None:
        """The parsed check payload (None for math problems)."""
        return json.loads(self.check) if self.check else None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["steps"] = None if self.steps is None else list(self.steps)
        return d


def canonical_check(reward: str, check) -> str:
    """Validate a check payload (dict or JSON text) for `reward` and return its canonical JSON text.

    Math problems take no payload (""). Code and instruction payloads need "prompt" with a non-empty zh and en
    statement, and pass their reward module's own validation (rewards.code_reward.parse_check,
    rewards.instructions.parse_constraints). Raises ValueError naming Problem.check."""
    if reward == "math":
        if check not in ("", None):
            raise ValueError(f"Problem.check must be empty for reward 'math', got {check!r}"[:300])
        return ""
    if reward == "gym":  # a reasoning-gym problem: the grader's payload, no prompt of its own (rl/tasks/gym.py)
        try:
            data = parse_gym_check(check)
            return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        except (ValueError, TypeError) as e:
            raise ValueError(f"Problem.check for reward 'gym': {e}"[:500]) from None
    data = check
    if isinstance(check, str):
        try:
            data = json.loads(check)
        except ValueError as e:
            raise ValueError(f"Problem.check is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"Problem.check for reward {reward!r} must be a JSON object, got {check!r}"[:300])
    prompt = data.get("prompt")
    if not isinstance(prompt, dict) or not all(isinstance(prompt.get(k), str) and prompt[k].strip() for k in LANGS):
        raise ValueError(f"Problem.check needs 'prompt': {{'zh': ..., 'en': ...}} with non-empty statements, "
                         f"got {prompt!r}"[:300])
    try:
        if reward == "code":
            parse_check(data)
            plan = data.get("plan")
            if plan is not None and not (isinstance(plan, dict)
                                         and all(isinstance(plan.get(k), str) and plan[k].strip() for k in LANGS)):
                raise ValueError(f"'plan' must be {{'zh': ..., 'en': ...}} with non-empty texts, got {plan!r}")
        else:
            parse_constraints(data)
            if data.get("lang") not in LANGS:
                raise ValueError(f"'lang' (the response language) must be one of {LANGS}, got {data.get('lang')!r}")
        return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except ValueError as e:
        raise ValueError(f"Problem.check for reward {reward!r}: {e}"[:500]) from None
    except TypeError as e:  # values json cannot write
        raise ValueError(f"Problem.check for reward {reward!r} is not JSON-serialisable: {e}") from None


def normalise_question(question: str) -> str:
    """The text used for dedup and split assignment: NFKC (full-width -> ASCII), case-folded, all whitespace
    removed (so "3 + 4" and "3+4" are the same problem), and a trailing question mark / period dropped."""
    text = unicodedata.normalize("NFKC", question).casefold()
    text = _WS.sub("", text)
    return text.rstrip("?？.。")


def question_hash(question: str) -> str:
    """Hex SHA-256 of the normalised question (stable across processes, unlike Python's hash())."""
    return hashlib.sha256(normalise_question(question).encode("utf-8")).hexdigest()


def split_of(question: str, among: tuple[str, ...] = SPLITS) -> str:
    """The split a question belongs to, from the first 64 bits of its hash; `among` restricts the choice to some
    splits, their fractions renormalised (the default is the 80/10/10 split over all three)."""
    names = [s for s in SPLITS if s in among]
    if not names:
        raise ValueError(f"among must name at least one of {SPLITS}, got {among!r}")
    fracs = [f for s, f in zip(SPLITS, SPLIT_FRACTIONS) if s in among]
    total = sum(fracs) if len(names) < len(SPLITS) else 1.0  # all three: exactly the historical thresholds
    u = int(question_hash(question)[:16], 16) / 2.0**64
    acc = 0.0
    for name, frac in zip(names, fracs):
        acc += frac / total
        if u < acc:
            return name
    return names[-1]


@dataclasses.dataclass(frozen=True)
class Split:
    """Which questions a source serves for one split (see "Explicit splits" in the module docstring)."""

    name: str
    among: tuple[str, ...] = SPLITS  # () = every question (an explicit source, used as given)
    exclude: frozenset = frozenset()  # question hashes (question_hash) held by other splits

    def __post_init__(self):
        check_split(self.name)
        bad = [s for s in self.among if s not in SPLITS]
        if bad or (self.among and self.name not in self.among):
            raise ValueError(f"Split.among must be () or splits including {self.name!r}, got {self.among!r}")

    def __str__(self) -> str:
        return self.name

    def contains(self, question: str, key: str | None = None) -> bool:
        """Whether the question belongs to this split (key: its question_hash, when already computed)."""
        if self.exclude and (key or question_hash(question)) in self.exclude:
            return False
        return not self.among or split_of(question, self.among) == self.name


def as_split(split) -> Split:
    """A Split from a split name or a Split (ValueError naming the allowed names otherwise)."""
    return split if isinstance(split, Split) else Split(check_split(split))


def make_id(source: str, question: str) -> str:
    """Deterministic id: the source name and 16 hex digits of the question hash."""
    return f"{source}-{question_hash(question)[:16]}"


def check_split(split):
    if isinstance(split, Split):
        return split
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


class ShortSupply(ValueError):
    """A source (or a mix) holds fewer distinct problems than asked for; `available` is how many it can give."""

    def __init__(self, message: str, available: int):
        super().__init__(message)
        self.available = available


def _want_unique(unique: bool | None, split) -> bool:
    return str(split) != "train" if unique is None else bool(unique)


def _check_n(n) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    return n


MakeFn = Callable[[random.Random, int], tuple]


@dataclasses.dataclass(frozen=True)
class GeneratedSource:
    """A procedural source: `make(rng, difficulty)` returns (question, answer, steps or None[, source]), or a
    dict with those keys plus optional "source", "reward" and "check" (the code and instruction families).

    `max_tries_per_problem` bounds the rejection loop (split filter and dedup): when no new problem turns up
    within that many consecutive draws the space is considered exhausted and, if distinct problems were asked
    for, a ValueError is raised."""

    name: str
    make: MakeFn
    levels: tuple[int, ...] = LEVELS
    description: str = ""
    max_tries_per_problem: int = 2000

    def check_difficulty(self, difficulty: int | None) -> None:
        if difficulty is not None and difficulty not in self.levels:
            raise ValueError(f"difficulty for source {self.name!r} must be one of {self.levels} or None, got {difficulty!r}")

    def problem(self, rng: random.Random, difficulty: int) -> Problem:
        made = self.make(rng, difficulty)
        extra = {}
        if isinstance(made, dict):
            question, answer, steps = made["question"], made["answer"], made.get("steps")
            source = made.get("source", self.name)
            extra = {k: made[k] for k in ("reward", "check") if k in made}
        else:
            # A 4th element names a sub-source (e.g. "mathdataset/numbers__gcd"); it defaults to the source name.
            question, answer, steps = made[:3]
            source = made[3] if len(made) > 3 else self.name
        return Problem(id=make_id(source, question), question=question, answer=answer,
                       steps=None if steps is None else tuple(steps), difficulty=difficulty, source=source, **extra)

    def sample(self, n: int, seed: int, split: str, difficulty: int | None = None,
               unique: bool | None = None) -> list[Problem]:
        n = _check_n(n)
        split = as_split(split)
        self.check_difficulty(difficulty)
        want_unique = _want_unique(unique, split)
        # A string seed is hashed with SHA-512 by random.Random: deterministic across processes and platforms.
        rng = random.Random(f"{self.name}|{seed}|{split}|{difficulty}")
        out: list[Problem] = []
        seen: set[str] = set()
        misses = 0
        while len(out) < n:
            level = difficulty if difficulty is not None else rng.choice(self.levels)
            p = self.problem(rng, level)
            key = question_hash(p.question)
            if not split.contains(p.question, key) or (want_unique and key in seen):
                misses += 1
                if misses > self.max_tries_per_problem:
                    raise ShortSupply(
                        f"source {self.name!r} (difficulty={difficulty}) has only {len(out)} distinct problems in split "
                        f"{str(split)!r} (asked for {n}); ask for fewer, use another difficulty, or pass unique=False",
                        len(out))
                continue
            misses = 0
            seen.add(key)
            out.append(p)
        return out


@dataclasses.dataclass(frozen=True)
class FixedSource:
    """A finite problem set (JSONL file, TFDS dataset). Problems are deduplicated by question hash on
    construction (first occurrence wins) and served in a seeded order; each keeps its stored difficulty."""

    name: str
    problems: tuple[Problem, ...]
    description: str = ""

    @staticmethod
    def build(name: str, problems: Iterable[Problem], description: str = "") -> "FixedSource":
        seen, kept = set(), []
        for p in problems:
            key = question_hash(p.question)
            if key not in seen:
                seen.add(key)
                kept.append(p)
        return FixedSource(name=name, problems=tuple(kept), description=description)

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(sorted({p.difficulty for p in self.problems}))

    def in_split(self, split, difficulty: int | None = None) -> list[Problem]:
        split = as_split(split)
        return [p for p in self.problems
                if split.contains(p.question) and (difficulty is None or p.difficulty == difficulty)]

    def sample(self, n: int, seed: int, split: str, difficulty: int | None = None,
               unique: bool | None = None) -> list[Problem]:
        n = _check_n(n)
        pool = self.in_split(split, difficulty)
        rng = random.Random(f"{self.name}|{seed}|{split}|{difficulty}")
        if _want_unique(unique, split):
            if len(pool) < n:
                raise ShortSupply(
                    f"source {self.name!r} has {len(pool)} problems in split {str(split)!r}"
                    f"{'' if difficulty is None else f' at difficulty {difficulty}'} (asked for {n}); "
                    "ask for fewer or pass unique=False", len(pool))
            order = list(pool)
            rng.shuffle(order)
            return order[:n]
        if not pool and n:
            raise ValueError(f"source {self.name!r} has no problems in split {str(split)!r}"
                             f"{'' if difficulty is None else f' at difficulty {difficulty}'}")
        return [rng.choice(pool) for _ in range(n)]
