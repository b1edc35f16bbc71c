"""Realistic Chinese and English answers through the one extractor, the verifier and the combined reward.

tests/data/answers_zh_en.jsonl holds whole model responses with {"kind", "lang", "text", "gold", "expected",
"answer"}: measure words and units after a number (6个, 31岁, 6元, 6（个）, 60千米/小时, 40个苹果), Chinese
multipliers and fractions (5万元, 3千米, 3分之2, 百分之25), full-width digits and brackets (最终答案：６个, （３，４）),
qualifiers (约6个, 大约6, 约3.33 vs 约3.3 for 10/3, approximately / about), GSM8K's `#### 72` (with markdown
headings that are not answers), R1-style <think>/<answer> responses, English units, and LaTeX solutions; every
kind with true and false pairs. `answer` is what rewards.parse.extract_answer must return, as written.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rewards.combine import RewardConfig, score
from rewards.format import FormatConfig, format_reward
from rewards.parse import answer_candidates, clean_answer, extract_answer, find_answer_markers
from rewards.verify import is_equiv

ROWS = [json.loads(line) for line in (Path(__file__).parent / "data" / "answers_zh_en.jsonl").read_text(
    encoding="utf-8").splitlines() if line.strip()]


def test_table_covers_every_kind_both_ways():
    kinds = {r["kind"] for r in ROWS}
    assert {"measure_word", "multiplier", "chinese_fraction", "full_width", "qualifier", "gsm8k", "r1_tags",
            "english_unit", "latex"} <= kinds
    for kind in kinds:
        assert {r["expected"] for r in ROWS if r["kind"] == kind} == {True, False}, kind
    assert {r["lang"] for r in ROWS} == {"zh", "en"}


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['kind']}-{i}" for i, r in enumerate(ROWS)])
def test_answer_table(row):
    text, gold, expected = row["text"], row["gold"], row["expected"]
    answer = extract_answer(text)
    assert answer == row["answer"]
    assert clean_answer(answer_candidates(text)[0]) == answer  # verification reads the same answer first
    assert is_equiv(text, gold, timeout=30.0) is expected          # the whole response
    assert is_equiv(answer, gold, timeout=30.0) is expected        # the extracted answer alone says the same
    mode = "think_answer" if row["kind"] == "r1_tags" else "steps"
    r = score(text, gold, RewardConfig(lang=row["lang"], format_mode=mode, verify_timeout=30.0))
    assert r["error"] == 0 and r["correct"] == float(expected) and r["answer"] == answer


@pytest.mark.parametrize("pred", ["6个", "31岁", "6元", "6（个）", "最终答案：６个", "６", "约6个", "大约6", "6 dollars", "6 cm",
                                  "答案：6个", "6 个", "6\\text{个}", "约为6", "≈6"])
def test_issue_examples_verify(pred):
    gold = "31" if "31" in pred else "6"
    assert is_equiv(pred, gold)
    assert not is_equiv(pred, "7")


def test_qualifiers_do_not_loosen_the_comparison():
    assert is_equiv("约3.33", "10/3") and is_equiv("大约3.333", "10/3")
    assert not is_equiv("约3.3", "10/3") and not is_equiv("约3", "10/3")  # one decimal or none: not a rounding
    assert not is_equiv("约6个", "6.4")


def test_units_after_non_numbers_are_text():
    assert not is_equiv("三角形", "3") and is_equiv("三角形", "三角形") and not is_equiv("甲", "乙")


def test_gsm8k_marker_and_headings():
    assert extract_answer("#### 72") == "72" and is_equiv("#### 72", "72")
    assert extract_answer("so 3 + 4 = 7\n#### -7.5") == "-7.5"
    assert extract_answer("#### Step 1\nwork") is None and extract_answer("#### 1. Setup\nwork") is None
    assert find_answer_markers("a #### 72") == []  # not at the start of a line (an unmarked sentence, then)


def test_r1_format_mode():
    r1 = "<think>\nStep 1: 48/2 = 24\nStep 2: 48 + 24 = 72\n</think>\n<answer>72</answer>"
    assert format_reward(r1, "en") == 0.5  # the step layout: steps but no Answer: line
    assert format_reward(r1, "en", FormatConfig(mode="think_answer")) == 1.0
    r = score(r1, "72", RewardConfig(lang="en", format_mode="think_answer", w_process=0.2))
    assert (r["outcome"], r["format"], r["process"], r["n_steps"]) == (1.0, 1.0, 1.0, 2)


def test_word_zh_gold_endings_verify():
    """The generated word_zh gold solutions end their last step with a number and a unit; a policy that copies
    that ending into its answer line is right."""
    from rl.tasks import get_source, render_solution

    problems = get_source("word_zh").sample(200, 0, "train", unique=False)
    for p in problems:
        solution = render_solution(p, "zh")
        last_step = [line for line in solution.splitlines() if line.startswith("步骤")][-1]
        ending = last_step.rsplit("=", 1)[-1]
        assert ending != p.answer and ending.startswith(p.answer)  # a number followed by a unit, e.g. 31岁
        text = solution.rsplit("答案：", 1)[0] + "答案：" + ending
        r = score(text, p.answer, RewardConfig(w_process=0.2))
        assert (r["outcome"], r["format"], r["process"]) == (1.0, 1.0, 1.0), text
