"""Tests for rewards.format: components, languages, config validation, hostile input."""
import time

import pytest

from rewards.format import FormatConfig, format_components, format_reward


@pytest.mark.parametrize("text,lang", [
    ("步骤一：3+4=7\n步骤二：7×2=14\n答案：14", "zh"),
    ("问题前言\n步骤1：a\n步骤2：b\n最终答案：14。\n", "zh"),
    ("第一步：a\n第二步：b\n答案：$5$", "zh"),
    ("Step 1: a\nStep 2: b\nAnswer: 14", "en"),
    ("Step 1. a\nStep 2. b\nFinal Answer: 14.", "en"),
    ("Step 1: a\nStep 2: b\nAnswer: \\boxed{14}", "en"),
    ("Step 1: a\nStep 2: so x = \\boxed{14}", "en"),
    ("Step 1: so the answer is 3\nAnswer: 3", "en"),
    ("步骤一：3+3=6\n答案是6个", "zh"), ("步骤一：3+3=6\n答：6个", "zh"), ("步骤一：所以答案是6\n答案：6", "zh"),
])
def test_perfect_format(text, lang):
    assert format_reward(text, lang) == 1.0


@pytest.mark.parametrize("text,lang,expected", [
    # (steps, order, answer, end)
    ("步骤一：a\n步骤三：b\n答案：1", "zh", (1, 0, 1, 1)),
    ("步骤二：a\n步骤一：b\n答案：1", "zh", (1, 0, 1, 1)),
    ("步骤一：a\n答案：1\n答案：2", "zh", (1, 1, 0, 0)),
    ("步骤一：a\n答案：1\nmore text", "zh", (1, 1, 1, 0)),
    ("答案：1", "zh", (0, 0, 1, 1)),
    ("步骤一：a", "zh", (1, 1, 0, 0)),
    ("步骤一：a\n答案：", "zh", (1, 1, 0, 0)),
    ("Step 1: a\nAnswer: 1", "zh", (0, 0, 0, 0)),
    ("步骤一：a\n答案：1", "en", (0, 0, 0, 0)),
    ("步骤一：a\nStep 2: b\n答案：1", "zh", (1, 0, 1, 1)),
    ("答案：1\n步骤一：a", "zh", (1, 1, 1, 0)),
    ("Step 1: a\nStep 2: b\n\\boxed{3}\nAnswer: 3", "en", (1, 1, 0, 0)),
    ("", "zh", (0, 0, 0, 0)),
])
def test_components(text, lang, expected):
    c = format_components(text, lang)
    assert (c["steps"], c["order"], c["answer"], c["end"]) == expected
    assert c["total"] == pytest.approx(0.25 * sum(expected))


def test_boxed_flag():
    text = "Step 1: a\nStep 2: b\n\\boxed{14}"
    assert format_reward(text, "en") == 1.0
    no_box = FormatConfig(accept_boxed=False)
    c = format_components(text, "en", no_box)
    assert c["answer"] == 0.0 and c["end"] == 0.0


def test_preamble_flag_and_min_steps():
    text = "Let me think.\nStep 1: a\nAnswer: 1"
    assert format_reward(text, "en") == 1.0
    assert format_components(text, "en", FormatConfig(allow_preamble=False))["steps"] == 0.0
    assert format_components(text, "en", FormatConfig(min_steps=2))["steps"] == 0.0


def test_custom_weights():
    cfg = FormatConfig(w_steps=0.5, w_order=0.0, w_answer=0.5, w_end=0.0)
    assert format_reward("答案：1", "zh", cfg) == 0.5


R1 = FormatConfig(mode="think_answer")


@pytest.mark.parametrize("text,expected", [
    # (steps = reasoning block, order = tags well formed, answer, end)
    ("<think>48/2 = 24, 48 + 24 = 72</think><answer>72</answer>", (1, 1, 1, 1)),
    ("<think>\nwork\n</think>\n\n<answer>\n72\n</answer>\n", (1, 1, 1, 1)),
    ("work</think><answer>72</answer>", (1, 1, 1, 1)),  # <think> was in the prompt
    ("<think>work</think>72", (1, 0, 0, 0)),
    ("<answer>72</answer>", (0, 0, 1, 1)),
    ("<think> </think><answer>72</answer>", (0, 1, 1, 1)),
    ("<think>work</think><answer>72</answer> and more", (1, 1, 1, 0)),
    ("<think>work<answer>1</answer></think><answer>72</answer>", (1, 0, 1, 1)),
    ("Sure! <think>work</think><answer>72</answer>", (0, 0, 1, 1)),
    ("<think>work</think>so<answer>72</answer>", (1, 0, 1, 1)),
    ("<think>work</think><answer> </answer>", (1, 1, 0, 0)),
    ("<think>work</think><answer>72", (1, 0, 0, 0)),
    ("<think>a</think><think>b</think><answer>7</answer>", (1, 0, 1, 1)),
    ("<THINK>work</THINK><ANSWER>72</ANSWER>", (1, 1, 1, 1)),
    ("Step 1: 3+4=7\nAnswer: 7", (0, 0, 0, 0)),
    ("", (0, 0, 0, 0)),
])
def test_think_answer_components(text, expected):
    c = format_components(text, "en", R1)
    assert (c["steps"], c["order"], c["answer"], c["end"]) == expected
    assert c["total"] == pytest.approx(0.25 * sum(expected))
    assert format_components(text, "zh", R1) == c  # the tag layout does not depend on the language


def test_modes_disagree_on_each_others_layout():
    r1 = "<think>\nStep 1: 3+4=7\nStep 2: 7*2=14\n</think>\n<answer>14</answer>"
    steps = "Step 1: 3+4=7\nStep 2: 7*2=14\nAnswer: 14"
    assert format_reward(r1, "en") == 0.5 and format_reward(r1, "en", R1) == 1.0
    assert format_reward(steps, "en") == 1.0 and format_reward(steps, "en", R1) == 0.0


@pytest.mark.parametrize("kwargs,field", [
    ({"w_steps": 2.0}, "w_steps"), ({"w_end": -0.1}, "w_end"), ({"w_steps": 0.5}, "sum to 1"),
    ({"min_steps": 0}, "min_steps"), ({"accept_boxed": 1}, "accept_boxed"), ({"w_order": "a"}, "w_order"),
    ({"mode": "r1"}, "mode"),
])
def test_config_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        FormatConfig(**kwargs)


def test_bad_lang_is_a_config_error():
    with pytest.raises(ValueError, match="lang"):
        format_reward("答案：1", "fr")


@pytest.mark.parametrize("text", [
    None, 12, b"\xff\xfe\x00", "\x00" * 1000, "步骤一：" * 50_000, "答案：" * 50_000, "\\boxed{" * 50_000,
    "Step 1: " + "a" * 1_000_000 + "\nAnswer: 1", "<think>" * 100_000, "</answer><answer>" * 50_000,
])
def test_hostile(text):
    t0 = time.process_time()  # CPU seconds: a busy machine does not change the verdict
    r = format_reward(text, "zh")
    assert 0.0 <= r <= 1.0
    assert 0.0 <= format_reward(text, "zh", R1) <= 1.0
    assert time.process_time() - t0 < 5.0


def test_many_boxes_and_lines_fast():
    text = ("答案：1 \\boxed{2}\n" * 20_000)
    t0 = time.process_time()
    assert format_components(text, "zh")["answer"] == 0.0
    assert time.process_time() - t0 < 5.0
