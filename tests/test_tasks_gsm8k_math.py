"""GSM8K- and MATH-style JSONL sources (rl/tasks/gsm8k_math.py): gold answers read from realistic records, the
reward reading realistic model answers against them, numbered errors, and the files as mix sources / official splits.

tests/data/gsm8k/{train,test}.jsonl and tests/data/math/test.jsonl are small hand-written files in the datasets'
layouts (GSM8K: calculator notes and "#### 1,625"; MATH: nested braces, two boxes, \\fbox, "Level ?", a MATH-500
record with answer / subject / unique_id and an int level)."""
import json
import os

import pytest

from rewards.parse import extract_answer
from rewards.verify import is_equiv
from rl.tasks import get_source, gsm8k_math, jsonl_io, load_splits, render_solution

DATA = os.path.join(os.path.dirname(__file__), "data")
GSM_TRAIN, GSM_TEST = os.path.join(DATA, "gsm8k", "train.jsonl"), os.path.join(DATA, "gsm8k", "test.jsonl")
MATH_TEST = os.path.join(DATA, "math", "test.jsonl")


def _write(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_gsm8k_gold_answers_and_steps():
    problems = gsm8k_math.read(GSM_TRAIN, "gsm8k")
    assert [p.answer for p in problems] == ["255", "1625", "20.5", "74", "255", "9"]  # "#### 1,625" -> "1625"
    p = problems[1]
    assert p.steps == ("The boxes hold 3 * 125 = 375 books.", "The library now has 1,250 + 375 = 1,625 books.")
    assert all("<<" not in s for q in problems for s in q.steps)  # calculator notes removed
    assert p.difficulty == 1 and p.source == f"gsm8k@{GSM_TRAIN}" and p.reward == "math"
    # the gold renders as the project's worked solution: the answer line parses back to the gold
    assert extract_answer(render_solution(p, "en")) == "1625"


def test_math_gold_answers_levels_and_extra_fields():
    problems = gsm8k_math.read(MATH_TEST, "math")
    got = [(p.answer, p.difficulty) for p in problems]
    assert got == [(r"\frac{5}{6}", 1), (r"2\sqrt{3}", 3), ("12", 2), (r"\text{(A)}", 1), (r"(-\infty, 2]", 4),
                   (r"\frac{70}{3}", 5)]  # nested braces, the LAST box, Level ?, int level, \fbox{$...$}
    assert all(p.steps is None for p in problems)


@pytest.mark.parametrize("response,gold", [
    # GSM8K-style answers a model writes
    ("The muffins bring in 45 * 3 = 135 dollars and the cookies 60 * 2 = $120, so 135 + 120 = $255.\n#### 255", "255"),
    ("Step 1: 3 * 125 = 375\nStep 2: 1250 + 375 = 1625\nAnswer: 1,625", "1625"),
    ("She runs 12.5 miles on weekdays and 8 on the weekend, so the answer is $\\boxed{20.5}$ miles.", "20.5"),
    ("第一步：80÷4=20\n第二步：80-20=60\n第三步：60+14=74\n答案：74", "74"),
    # MATH-style answers
    (r"So the sum is $\frac{3}{6}+\frac{2}{6}=\boxed{\dfrac{5}{6}}$.", r"\frac{5}{6}"),
    (r"Hence $s^2=12$ and $s=\boxed{2\sqrt3}$.", r"2\sqrt{3}"),
    (r"The largest is $2^{10}$, choice $\boxed{\text{(A)}}$.", r"\text{(A)}"),
    (r"Thus $x\in\boxed{(-\infty,2]}$.", r"(-\infty, 2]"),
    (r"$p = 21/0.9$, so the price was $\boxed{\frac{70}{3}}$ dollars.", r"\frac{70}{3}"),
])
def test_reward_reads_realistic_answers_against_the_golds(response, gold):
    assert is_equiv(extract_answer(response), gold)


@pytest.mark.parametrize("response,gold", [
    ("So she has 74 stickers left... wait, she bought 14 more: 60 + 14 = 74.\n#### 60", "74"),  # the last answer wins
    (r"First $a=\boxed{4}$, then $ab=\boxed{13}$.", "12"),
])
def test_wrong_final_answers_are_wrong(response, gold):
    assert not is_equiv(extract_answer(response), gold)


def test_malformed_records_are_numbered_errors(tmp_path):
    path = _write(tmp_path, "bad.jsonl", [
        {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"},
        {"question": "No final answer?", "answer": "It is 4."},
        {"question": "", "answer": "#### 3"},
        {"answer": "#### 3"},
        {"question": "Empty answer?", "answer": "####   "},
        "[1, 2]",
    ])
    with pytest.raises(jsonl_io.JsonlError) as e:
        gsm8k_math.read(path, "gsm8k")
    errs = [(x.line, x.field) for x in e.value.errors]
    assert errs == [(2, "answer"), (3, "question"), (4, "question"), (5, "answer"), (6, None)]
    assert "no final answer after '####'" in str(e.value)
    path = _write(tmp_path, "bad_math.jsonl", [
        {"problem": "1+1?", "solution": "It is 2."},
        {"problem": "1+2?", "solution": r"So $\boxed{3}$.", "level": ["Level 1"]},
        {"problem": "1+3?", "solution": "It is 4.", "answer": "4"},  # no box: the answer field is used
    ])
    problems, errors = jsonl_io.validate_jsonl(path, "m", gsm8k_math.parse_math)
    assert [(x.line, x.field) for x in errors] == [(1, "solution"), (2, "level")]
    assert [p.answer for p in problems] == ["4"]


def test_sources_in_a_mix_and_official_splits_kept():
    assert len(get_source(f"gsm8k@{GSM_TRAIN}").problems) == 6 and get_source(f"math@{MATH_TEST}").levels == (1, 2, 3, 4, 5)
    # the official test file is the test split as given; train and validation come from the train file by hash
    out = load_splits(f"gsm8k@{GSM_TRAIN}", {"train": 20, "validation": 1, "test": 3}, 0,
                      {"test": f"gsm8k@{GSM_TEST}"})
    test_qs = {p.question for p in gsm8k_math.read(GSM_TEST, "gsm8k")}
    assert {p.question for p in out["test"]} == test_qs
    train_file = {p.question for p in gsm8k_math.read(GSM_TRAIN, "gsm8k")}
    assert {p.question for p in out["train"] + out["validation"]} <= train_file
    assert not {p.question for p in out["train"]} & {p.question for p in out["validation"]}
    # every split explicit (tasks.mix unused); MATH keeps all its levels
    every = load_splits("", {"train": 1, "validation": 1, "test": 6}, 0,
                        {"test": f"math@{MATH_TEST}", "validation": f"gsm8k@{GSM_TEST}", "train": f"gsm8k@{GSM_TRAIN}"})
    assert sorted(p.difficulty for p in every["test"]) == [1, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="needs a path"):
        get_source("math")
