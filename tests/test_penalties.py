"""Tests for rewards.penalties against independent references, plus hostile input."""
import time

import numpy as np
import pytest

from rewards.penalties import (
    has_reasoning, language_consistency, language_penalty, overlong_penalty, reasoning_text, repetition_penalty,
    repetition_share, text_length,
)


def test_overlong_matches_numpy_interp():
    max_len, buffer = 512, 128
    lengths = np.arange(0, 700, 7, dtype=np.float64)
    ref = np.interp(lengths, [max_len - buffer, max_len], [0.0, 1.0])  # 0 before, 1 after
    got = np.array([overlong_penalty(length, max_len, buffer) for length in lengths])
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
    assert overlong_penalty(max_len - buffer + 32, max_len, buffer) == pytest.approx(0.25)


@pytest.mark.parametrize("args,expected", [
    ((10, None, 5), 0.0), ((10, 0, 5), 0.0), ((100, 50, 0), 1.0), ((49, 50, 0), 0.0), ((60, 50, 1000), 1.0),
    ((float("nan"), 50, 5), 0.0), (("abc", 50, 5), 0.0), ((48, 50, -3), 0.0), ((10**30, 50, 5), 1.0),
])
def test_overlong_edges(args, expected):
    assert overlong_penalty(*args) == expected


def _reference_repetition(text, n):
    """Independent reference: tokenise by hand and count repeated n-grams with a dict."""
    toks, word = [], ""
    for c in text:
        if c.isascii() and c.isalnum():
            word += c
            continue
        if word:
            toks.append(word)
            word = ""
        if not c.isspace():
            toks.append(c)
    if word:
        toks.append(word)
    grams = [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]
    if len(grams) <= 1:
        return 0.0
    counts = {}
    for g in grams:
        counts[g] = counts.get(g, 0) + 1
    return float(np.float64(sum(c - 1 for c in counts.values())) / len(grams))


@pytest.mark.parametrize("text", [
    "步骤一：3+4=7\n步骤二：7×2=14\n答案：14",
    "the cat sat on the mat the cat sat on the mat the cat",
    "abc " * 100,
    "一二三四五六七八九十" * 7 + "末尾",
    "Step 1: x = 3\nStep 2: y = 4\nStep 3: x + y = 7\nAnswer: 7",
    "",
    "a",
])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_repetition_share_matches_reference(text, n):
    assert repetition_share(text, n) == pytest.approx(_reference_repetition(text, n), abs=1e-12)


def test_repetition_penalty_scaling():
    assert repetition_penalty("步骤一：3+4=7\n步骤二：7×2=14\n答案：14") == 0.0
    loop = "the answer is seven " * 200
    assert repetition_penalty(loop) > 0.95
    share = repetition_share(loop)
    assert repetition_penalty(loop, threshold=0.5) == pytest.approx((share - 0.5) / 0.5)
    assert 0.0 <= repetition_penalty("x y z " * 10, threshold=float("nan")) <= 1.0


@pytest.mark.parametrize("text,lang,share", [
    ("步骤一：设x=3，则x+1=4\n答案：4", "zh", 1.0),
    ("步骤一：we have 3+4=7\n答案：7", "zh", 3 / 9),  # 步骤一 (3 Han) vs "we have" (6 Latin)
    ("Step 1: we add\nAnswer: 7", "en", 1.0),
    ("Step 1: 我们 add\nAnswer: 7", "en", 7 / 9),
    ("Step 1: \\frac{1}{2} \\cdot 3\nAnswer: x", "en", 1.0),  # only "Step" counts
    ("3+4=7", "zh", 1.0),  # no letters
    ("步骤一：计算\n答案：seven hundred", "zh", 1.0),  # the answer line is not reasoning
])
def test_language_consistency(text, lang, share):
    assert language_consistency(text, lang) == pytest.approx(share)
    assert language_penalty(text, lang) == pytest.approx(1 - share)


def test_language_unknown_lang_is_zero_share():
    assert language_consistency("hello world", "fr") == 0.0


def test_reasoning_text_and_has_reasoning():
    assert reasoning_text("步骤一：a\n答案：1") == "步骤一：a\n"
    assert has_reasoning("步骤一：a\n答案：1")
    assert not has_reasoning("答案：1")
    assert not has_reasoning("步骤一：\n答案：1")
    assert has_reasoning("Step 1: a\nStep 2: b\nAnswer: 1", min_steps=2)
    assert not has_reasoning("Step 1: a\nAnswer: 1", min_steps=2)


def test_think_block_counts_as_reasoning_without_step_markers():
    assert has_reasoning("<think>48/2 = 24</think><answer>24</answer>")
    assert has_reasoning("48/2 = 24</think><answer>24</answer>")  # <think> was in the prompt
    assert not has_reasoning("<think> </think><answer>24</answer>")
    assert not has_reasoning("<think>a</think><answer>1</answer>", min_steps=2)
    assert has_reasoning("<think>Step 1: a\nStep 2: b</think><answer>1</answer>", min_steps=2)
    assert reasoning_text("<think>work</think><answer>1</answer>") == "<think>work</think>"


def test_text_length_is_utf8_bytes():
    assert text_length("答案：1") == len("答案：1".encode())
    assert text_length(None) == 0


@pytest.mark.parametrize("text", [
    None, 3.5, b"\xff" * 100, "\ud800", "\x00" * 100_000, "步骤一：" * 50_000, "ab " * 400_000, "字" * 1_000_000,
])
def test_hostile(text):
    t0 = time.process_time()  # CPU seconds: a busy machine does not change the verdict
    for v in (repetition_share(text), repetition_penalty(text), language_consistency(text, "zh"),
              language_consistency(text, "en")):
        assert 0.0 <= v <= 1.0
    assert isinstance(has_reasoning(text), bool)
    assert time.process_time() - t0 < 10.0
