"""Tests for rl/tasks: the Problem record, splits, rendering, the built-in generators, mixes and JSONL.

Gold solutions are checked three ways: the rewards helpers (rewards.parse, rewards.steps, rewards.verify) on the
rendered text, and an independent sympy evaluation, written here, of every `=` chain in our own generated steps
(sympy only ever sees text this project generated, never model output).
"""
import json
import random
import re

import pytest
import sympy

from rewards.format import format_reward
from rewards.parse import extract_answer, split_steps
from rewards.steps import check_steps
from rewards.verify import is_equiv
from rl.tasks import (
    SPLITS, Problem, allocate, get_source, list_sources, load_mix, parse_mix, render_prompt, render_solution,
)
from rl.tasks import jsonl_io
from rl.tasks.base import FixedSource, normalise_question, question_hash, split_of
from rl.tasks.render import int_to_cn, render_example

GENERATORS = ["arith", "add", "sub", "mul", "fractions", "linear", "linear1", "linear2", "word", "word_zh"]


# ------------------------------------------------------------------------------------------ Problem / splits


def test_problem_validates_fields():
    ok = dict(id="a-1", question="3+4", answer="7", steps=("3+4=7",), difficulty=1, source="arith")
    Problem(**ok)
    for field, bad in [("question", ""), ("answer", "  "), ("steps", ["3+4=7"]), ("steps", ("",)),
                       ("difficulty", 0), ("difficulty", True), ("source", None)]:
        with pytest.raises(ValueError, match=field):
            Problem(**{**ok, field: bad})


def test_normalised_question_ignores_spacing_case_and_width():
    assert normalise_question(" 3 + 4 ") == normalise_question("3+4") == normalise_question("３＋４?")
    assert question_hash("Solve X = 2") == question_hash("solve x=2")
    assert split_of("3 + 4") == split_of("3+4")


def test_split_fractions_roughly_80_10_10():
    counts = {s: 0 for s in SPLITS}
    for i in range(20000):
        counts[split_of(f"q{i}")] += 1
    assert abs(counts["train"] / 20000 - 0.8) < 0.02
    assert abs(counts["validation"] / 20000 - 0.1) < 0.01
    assert abs(counts["test"] / 20000 - 0.1) < 0.01


@pytest.mark.parametrize("name", GENERATORS)
def test_splits_are_disjoint_and_consistent(name):
    src = get_source(name)
    hashes = {}
    for split in SPLITS:
        problems = src.sample(40, 7, split, unique=False)
        assert all(split_of(p.question) == split for p in problems)
        hashes[split] = {question_hash(p.question) for p in problems}
    assert not hashes["train"] & hashes["validation"]
    assert not hashes["train"] & hashes["test"]
    assert not hashes["validation"] & hashes["test"]


def test_eval_splits_are_distinct_by_default_and_train_may_repeat():
    val = get_source("arith").sample(8, 0, "validation", difficulty=2)
    assert len({question_hash(p.question) for p in val}) == 8
    train = get_source("arith").sample(300, 0, "train", difficulty=1)  # only ~80 single-digit sums in train
    assert len({p.question for p in train}) < 100
    assert all(p.id == f"arith-{question_hash(p.question)[:16]}" for p in train)


def test_exhausted_space_raises_clear_error():
    with pytest.raises(ValueError, match="distinct problems in split 'test'.*unique=False"):
        get_source("arith").sample(60, 0, "test", difficulty=1)
    assert len(get_source("arith").sample(60, 0, "test", difficulty=1, unique=False)) == 60


def test_sample_argument_errors():
    src = get_source("arith")
    with pytest.raises(ValueError, match="split"):
        src.sample(3, 0, "dev")
    with pytest.raises(ValueError, match="difficulty"):
        src.sample(3, 0, "train", difficulty=9)
    with pytest.raises(ValueError, match="n must be"):
        src.sample(-1, 0, "train")


# ------------------------------------------------------------------------------------------ determinism


@pytest.mark.parametrize("name", GENERATORS)
def test_generators_deterministic(name):
    src = get_source(name)
    a = src.sample(30, 11, "train")
    assert a == src.sample(30, 11, "train")
    assert a != src.sample(30, 12, "train")
    # Prefix-stable: asking for more gives the same first problems (load_mix's top-up relies on it).
    assert src.sample(40, 11, "train")[:30] == a
    assert {p.difficulty for p in src.sample(200, 0, "train")} == set(src.levels)


def test_load_mix_deterministic_and_sized():
    a = load_mix("arith:0.5,linear:0.3,word_zh:0.2", 101, 3, "train")
    assert len(a) == 101 and a == load_mix("arith:0.5,linear:0.3,word_zh:0.2", 101, 3, "train")
    counts = {s: sum(p.source == s for p in a) for s in ("arith", "linear", "word_zh")}
    assert counts == {"arith": 51, "linear": 30, "word_zh": 20}
    assert [p.source for p in a] != sorted(p.source for p in a)  # shuffled together
    assert all(p.difficulty == 2 for p in load_mix("arith,fractions", 20, 0, "train", difficulty=2))


def test_load_mix_distinct_across_overlapping_sources():
    # "arith" and "add" generate the same two-digit sums; the eval split must still hold distinct questions.
    mix = load_mix("arith:1,add:1", 40, 0, "test", difficulty=2)
    assert len({question_hash(p.question) for p in mix}) == 40
    assert {p.source for p in mix} == {"arith", "add"}


# ------------------------------------------------------------------------------------------ mix spec


def test_parse_mix():
    assert parse_mix("arith:0.5,linear:0.5") == [("arith", 0.5), ("linear", 0.5)]
    assert parse_mix("word, word_zh") == [("word", 0.5), ("word_zh", 0.5)]
    assert parse_mix("arith:3,mathdataset@numbers__gcd:1") == [("arith", 0.75), ("mathdataset@numbers__gcd", 0.25)]
    assert parse_mix("tfds@huggingface:gsm8k/main") == [("tfds@huggingface:gsm8k/main", 1.0)]
    assert parse_mix("tfds@huggingface:gsm8k/main:2,arith:2")[0] == ("tfds@huggingface:gsm8k/main", 0.5)


@pytest.mark.parametrize("spec,msg", [
    ("", "non-empty"), ("arith,,linear", "empty item"), ("arith:-1", "positive"), ("arith:0", "positive"),
    ("arith:nan", "positive"), ("nope:1", "unknown source 'nope'"), ("arith,arith", "twice"),
])
def test_parse_mix_errors(spec, msg):
    with pytest.raises(ValueError, match=msg):
        parse_mix(spec)


def test_allocate_sums_to_n():
    rng = random.Random(0)
    for _ in range(200):
        w = [rng.random() + 1e-3 for _ in range(rng.randint(1, 6))]
        n = rng.randint(0, 1000)
        counts = allocate([x / sum(w) for x in w], n)
        assert sum(counts) == n
        assert all(abs(c - x / sum(w) * n) < 1 for c, x in zip(counts, w))


def test_registry():
    names = list_sources()
    for name in GENERATORS + ["mathdataset", "jsonl", "tfds"]:
        assert name in names and names[name]
    with pytest.raises(ValueError, match="unknown task source"):
        get_source("nope")
    with pytest.raises(ValueError, match="jsonl@"):
        get_source("jsonl")


# ------------------------------------------------------------------------------------------ rendering


def test_int_to_cn():
    expected = {1: "一", 9: "九", 10: "十", 11: "十一", 19: "十九", 20: "二十", 21: "二十一", 99: "九十九",
                100: "一百", 101: "一百零一", 110: "一百一十", 1010: "一千零一十", 3005: "三千零五"}
    for n, s in expected.items():
        assert int_to_cn(n) == s
    with pytest.raises(ValueError):
        int_to_cn(0)


def test_render_exact_format():
    p = Problem(id="x", question="3+4*2", answer="11", steps=("4*2=8", "3+8=11"), difficulty=2, source="t")
    assert render_prompt(p, "zh") == "问题：3+4*2\n解答：\n"
    assert render_prompt(p, "en") == "Question: 3+4*2\nSolution:\n"
    assert render_solution(p, "zh") == "步骤一：4*2=8\n步骤二：3+8=11\n答案：11"
    assert render_solution(p, "en") == "Step 1: 4*2=8\nStep 2: 3+8=11\nAnswer: 11"
    assert render_example(p, "en") == (render_prompt(p, "en"), render_solution(p, "en"))
    no_steps = Problem(id="y", question="q", answer="5", steps=None, difficulty=1, source="t")
    assert render_solution(no_steps, "zh") == "答案：5"
    with pytest.raises(ValueError, match="lang"):
        render_prompt(p, "fr")


def test_render_twelve_steps_zh_parses():
    p = Problem(id="x", question="q", answer="12", steps=tuple(f"{i}+1={i + 1}" for i in range(12)),
                difficulty=1, source="t")
    text = render_solution(p, "zh")
    assert "步骤十二：11+1=12" in text
    assert split_steps(text) == list(p.steps)


def test_quickstart_level_is_tiny():
    for p in get_source("arith").sample(50, 0, "train", difficulty=1):
        a, b = (int(x) for x in p.question.split("+"))
        assert 0 <= a <= 9 and 0 <= b <= 9 and p.steps == (f"{a}+{b}={a + b}",)
        assert render_solution(p, "en") == f"Step 1: {a}+{b}={a + b}\nAnswer: {a + b}"
        assert len((render_prompt(p, "en") + render_solution(p, "en")).encode()) <= 50


# ------------------------------------------------------------------------------------------ gold solutions


_SYMS = {"x": sympy.Symbol("x"), "y": sympy.Symbol("y")}
_CLAIM = re.compile(r"-?[0-9xy(][0-9xy+\-*/().]*(?:=[0-9xy+\-*/().]+)+")


def _solution_values(p: Problem) -> dict:
    """x (and y) at the gold answer, for the linear sources."""
    if "=" in p.answer:
        return {_SYMS[k]: sympy.Rational(v) for k, v in re.findall(r"([xy])=(-?\d+)", p.answer)}
    return {_SYMS["x"]: sympy.Rational(p.answer)}


def _sympy_check(p: Problem) -> int:
    """Every `=` chain in every step holds (at the solution for equations). Returns the number of chains."""
    subs = _solution_values(p) if p.source.startswith("linear") else {}
    n_chains = 0
    for step in p.steps:
        chains = _CLAIM.findall(step)
        assert chains, f"{p.source}: no arithmetic claim in step {step!r}"
        for chain in chains:
            values = [sympy.sympify(part, locals=_SYMS).subs(subs) for part in chain.split("=")]
            assert all(sympy.simplify(v - values[0]) == 0 for v in values), f"{p.source}: false claim {chain!r}"
            n_chains += 1
    return n_chains


def _gold_sample(per_level: int):
    for name in GENERATORS:
        src = get_source(name)
        for level in src.levels:
            yield from src.sample(per_level, 2024, "train", difficulty=level)


def test_every_gold_solution_verifies_with_rewards_helpers():
    n = 0
    for p in _gold_sample(per_level=8):  # 10 sources x 5 levels x 8 = 400 problems, both languages
        assert p.steps, p
        for lang in ("zh", "en"):
            text = render_solution(p, lang)
            assert text.splitlines()[-1] == ("答案：" if lang == "zh" else "Answer: ") + p.answer
            assert split_steps(text) == list(p.steps)
            answer = extract_answer(text)
            assert answer == p.answer and is_equiv(answer, p.answer), (p, answer)
            scores = check_steps(text)
            assert len(scores) == len(p.steps) and all(s == 1.0 for s in scores), (p, scores)
            assert format_reward(text, lang=lang) == 1.0, text
            n += 1
    assert n == 800


def test_every_gold_solution_checks_with_sympy():
    n_chains = sum(_sympy_check(p) for p in _gold_sample(per_level=4))  # 200 problems
    assert n_chains > 500


def test_gold_answers_are_the_true_values():
    """Independent recomputation of the answers from the questions (not from our steps)."""
    for p in _gold_sample(per_level=4):
        if p.source in ("arith", "add", "sub", "mul", "fractions"):
            assert sympy.Rational(p.answer) == sympy.sympify(p.question), p
        elif p.source.startswith("linear"):
            eqs = [sympy.Eq(*(sympy.sympify(side, locals=_SYMS) for side in eq.split("=")))
                   for eq in p.question.split(", ")]
            sol = sympy.solve(eqs, list(_SYMS.values()) if len(eqs) == 2 else [_SYMS["x"]], dict=True)
            assert len(sol) == 1 and all(sol[0][k] == v for k, v in _solution_values(p).items()), p


def test_step_checker_catches_a_corrupted_solution():
    p = get_source("mul").sample(1, 0, "train", difficulty=3)[0]
    bad_steps = list(p.steps)
    bad_steps[0] = re.sub(r"=(\d+)$", lambda m: f"={int(m.group(1)) + 1}", bad_steps[0])
    text = render_solution(Problem(**{**p.to_dict(), "steps": tuple(bad_steps)}), "en")
    assert check_steps(text)[0] == 0.0


# ------------------------------------------------------------------------------------------ JSONL


def test_jsonl_round_trip(tmp_path):
    problems = load_mix("arith,word_zh,linear2", 30, 0, "train")
    path = tmp_path / "sub" / "p.jsonl"
    assert jsonl_io.write_jsonl(problems, str(path)) == 30
    assert "小" in path.read_text(encoding="utf-8")  # Chinese kept readable
    assert jsonl_io.read_jsonl(str(path)) == problems


def test_jsonl_minimal_records_and_as_mix_source(tmp_path):
    path = tmp_path / "mine.jsonl"
    lines = [json.dumps({"question": f"What is {i} squared?", "answer": i * i}) for i in range(200)]
    path.write_text("\n".join(lines[:100]) + "\n\n" + "\n".join(lines[100:]) + "\n", encoding="utf-8")
    problems = jsonl_io.read_jsonl(str(path), source="mine")
    assert len(problems) == 200 and problems[3].answer == "9" and problems[3].steps is None
    assert problems[3].difficulty == 1 and problems[3].source == "mine"
    spec = f"jsonl@{path}"
    test = load_mix(spec, 5, 0, "test")
    assert len(test) == 5 and all(split_of(p.question) == "test" for p in test)
    assert isinstance(get_source(spec), FixedSource)


def test_jsonl_malformed_lines_reported_not_dropped(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"question": "1+1", "answer": "2", "steps": ["1+1=2"]})
    raw = [
        good,                                                      # 1 ok
        "{not json",                                               # 2 invalid JSON
        json.dumps({"question": "2+2"}),                           # 3 missing answer
        json.dumps({"question": "3+3", "answer": "6", "steps": "3+3=6"}),  # 4 steps not a list
        json.dumps({"question": "", "answer": "1"}),               # 5 empty question
        json.dumps({"question": "4+4", "anwser": "8", "answer": "8"}),     # 6 unknown field
        json.dumps({"question": "5+5", "answer": "10", "difficulty": 0}),  # 7 bad difficulty
        json.dumps([1, 2]),                                        # 8 not an object
        "",                                                        # 9 blank: skipped
        json.dumps({"question": "6+6", "answer": 12}),             # 10 ok (int answer)
    ]
    path.write_bytes(("\n".join(raw) + "\n").encode() + b"\xff\xfe\n")  # 11 not UTF-8
    problems, errors = jsonl_io.validate_jsonl(str(path))
    assert [p.question for p in problems] == ["1+1", "6+6"]
    assert [(e.line, e.field) for e in errors] == [
        (2, None), (3, "answer"), (4, "steps"), (5, "question"), (6, "anwser"), (7, "difficulty"), (8, None),
        (11, None)]
    with pytest.raises(jsonl_io.JsonlError) as info:
        jsonl_io.read_jsonl(str(path))
    message = str(info.value)
    assert "8 malformed line(s)" in message
    for fragment in ["line 2: invalid JSON", "line 3, field 'answer': missing", "line 4, field 'steps'",
                     "line 6, field 'anwser': unknown field", "line 11: not valid UTF-8"]:
        assert fragment in message
    assert len(info.value.errors) == 8


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        jsonl_io.read_jsonl(str(tmp_path / "nope.jsonl"))
