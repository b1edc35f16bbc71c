"""Tests for rewards.combine: the weighted total, config validation, never raising."""
import dataclasses
import time

import numpy as np
import pytest

from rewards.combine import RESULT_KEYS, RewardConfig, error_result, score

ZH_OK = "步骤一：3+4=7\n步骤二：7×2=14\n答案：14"
ZH_BAD_STEP = "步骤一：3+4=8\n步骤二：8×2=16\n答案：14"
EN_OK = "Step 1: 3 + 4 = 7\nStep 2: 7 * 2 = 14\nAnswer: 14"


def _reference_total(r, cfg):
    """Independent float64 recomputation of the documented formula from the returned components."""
    terms = np.array([r["outcome"], r["process"], r["format"], r["overlong"], r["repetition"], r["language"]], np.float64)
    w = np.array([cfg.w_outcome, cfg.w_process, cfg.w_format, -cfg.w_overlong, -cfg.w_repetition, -cfg.w_language])
    return float(np.dot(w, terms))


CFGS = [
    RewardConfig(),
    RewardConfig(w_process=0.2, w_format=0.05),
    RewardConfig(w_process=0.3, overlong_max_len=40, overlong_buffer=20, w_repetition=0.5, w_language=0.3),
    RewardConfig(lang="en", w_language=1.0, requires_reasoning=True),
]


@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("text,gold", [
    (ZH_OK, "14"), (ZH_BAD_STEP, "14"), (EN_OK, "14"), ("答案：14", "14"), ("nothing", "14"),
    ("步骤一：we compute 3+4=7\n答案：7", "7"), ("the answer is " * 30, "7"),
])
def test_total_matches_formula(cfg, text, gold):
    r = score(text, gold, cfg)
    assert set(r) == set(RESULT_KEYS)
    assert r["error"] == 0
    assert r["total"] == pytest.approx(_reference_total(r, cfg), abs=1e-12)


def test_components_on_known_cases():
    r = score(ZH_OK, "14", RewardConfig(w_process=0.2, w_format=0.1))
    assert (r["outcome"], r["process"], r["format"], r["n_steps"], r["n_checked"]) == (1.0, 1.0, 1.0, 2, 2)
    assert r["total"] == pytest.approx(1.0 + 0.2 + 0.1)
    assert r["answer"] == "14" and r["step_scores"] == [1.0, 1.0]

    r = score(ZH_BAD_STEP, "14", RewardConfig(w_process=0.2))
    assert r["outcome"] == 1.0 and r["process"] == 0.5 and r["step_scores"] == [0.0, 1.0]

    r = score(ZH_OK, "15")  # the default reward is the outcome alone (w_format 0)
    assert r["outcome"] == 0.0 and r["correct"] == 0.0 and r["format"] == 1.0 and r["total"] == 0.0
    assert score(ZH_OK, "15", RewardConfig(w_format=0.1))["total"] == pytest.approx(0.1)

    r = score(EN_OK, "14", RewardConfig(lang="en"))
    assert r["format"] == 1.0 and r["outcome"] == 1.0


def test_numeric_gold():
    assert score(ZH_OK, 14)["outcome"] == 1.0
    assert score("答案：0.5", 0.5)["outcome"] == 1.0
    assert score(ZH_OK, True)["outcome"] == 0.0  # a bool is not an answer


def test_requires_reasoning():
    bare = "答案：14"
    assert score(bare, "14")["outcome"] == 1.0
    r = score(bare, "14", RewardConfig(requires_reasoning=True))
    assert r["outcome"] == 0.0 and r["correct"] == 1.0 and r["has_reasoning"] == 0.0
    assert score(ZH_OK, "14", RewardConfig(requires_reasoning=True))["outcome"] == 1.0


def test_overlong_uses_n_tokens_when_given():
    cfg = RewardConfig(overlong_max_len=100, overlong_buffer=50, w_format=0.1)
    assert score(ZH_OK, "14", cfg)["overlong"] == 0.0
    r = score(ZH_OK, "14", cfg, n_tokens=75)
    assert r["overlong"] == pytest.approx(0.5) and r["length"] == 75
    assert r["total"] == pytest.approx(1.1 - 0.5)
    assert score(ZH_OK, "14", cfg, n_tokens=500)["overlong"] == 1.0


def test_language_and_repetition_penalties():
    mixed = "步骤一：first we add 3+4=7\n答案：7"
    r = score(mixed, "7", RewardConfig(w_language=1.0))
    assert 0.0 < r["language"] < 1.0
    loop = "步骤一：" + "一加一等于二。" * 100 + "\n答案：2"
    r = score(loop, "2", RewardConfig(w_repetition=1.0))
    assert r["repetition"] > 0.8


def test_process_default_when_nothing_checkable():
    text = "步骤一：先想一想\n答案：7"
    assert score(text, "7", RewardConfig(w_process=0.3))["process"] == 0.0
    assert score(text, "7", RewardConfig(w_process=0.3, process_default=0.5))["process"] == 0.5


@pytest.mark.parametrize("field,value", [
    ("w_outcome", -1.0), ("w_process", float("nan")), ("w_format", "0.1"), ("overlong_max_len", -1),
    ("overlong_buffer", 1.5), ("repetition_n", 0), ("repetition_threshold", 1.0), ("lang", "fr"),
    ("requires_reasoning", 1), ("verify_timeout", 0.0), ("process_default", 2.0), ("min_reasoning_steps", 0),
    ("w_language", True), ("format_mode", "r1"), ("max_chars", 10), ("max_chars", 1.5e5),
])
def test_config_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        RewardConfig(**{field: value})


def test_buffer_larger_than_max_len_rejected():
    with pytest.raises(ValueError, match="overlong_buffer"):
        RewardConfig(overlong_max_len=10, overlong_buffer=20)


def test_config_defaults_and_frozen():
    cfg = RewardConfig()
    assert (cfg.w_outcome, cfg.w_process, cfg.w_format) == (1.0, 0.0, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.w_outcome = 2.0


def test_error_result_shape():
    r = error_result("timeout")
    assert set(r) == set(RESULT_KEYS) and r["total"] == 0.0 and r["error"] == 1 and r["error_kind"] == "timeout"


def test_internal_error_becomes_flag(monkeypatch):
    import rewards.combine as combine

    def boom(*a, **k):
        raise RuntimeError("verifier exploded")

    monkeypatch.setattr(combine, "is_equiv", boom)
    r = score(ZH_OK, "14")
    assert r["total"] == 0.0 and r["error"] == 1 and r["error_kind"] == "RuntimeError"


@pytest.mark.parametrize("text,gold", [
    (None, None), (b"\xff\xfe", "1"), (123, 5), ("答案：" + "9" * 100_000, "9"), ("\\boxed{" * 20_000, "1"),
    ("答案：__import__('os').system('true')", "0"), ("步骤一：" + "1+" * 20_000 + "1=2\n答案：2", "2"),
    ("\n" * 250 + "Answer: 3", "3"), (" " * 60_000 + "$ 3 %", "3%"),  # once polynomial backtracking (minutes)
])
def test_hostile_never_raises(text, gold):
    t0 = time.process_time()  # CPU seconds: a busy machine does not change the verdict
    r = score(text, gold, RewardConfig(w_process=0.2, w_repetition=0.1, w_language=0.1))
    assert set(r) == set(RESULT_KEYS)
    assert np.isfinite(r["total"])
    assert r["answer"] is None or len(r["answer"]) <= 200
    assert time.process_time() - t0 < 10.0


def test_format_mode_reaches_the_format_reward():
    r1 = "<think>3+4=7</think><answer>7</answer>"
    assert score(r1, "7", RewardConfig(lang="en"))["format"] == 0.0
    r = score(r1, "7", RewardConfig(lang="en", format_mode="think_answer"))
    assert (r["format"], r["outcome"], r["answer"]) == (1.0, 1.0, "7")
    assert score(r1, "7", RewardConfig(format_mode="think_answer", requires_reasoning=True))["outcome"] == 1.0


def test_outcome_needs_an_extracted_answer():
    # no answer marker: the final sentence counts when it names exactly one value (issue 52; docs/rewards.md)
    assert score("I think it is 14", "14")["outcome"] == 1.0
    assert score("I think it is 13 or 14", "14")["outcome"] == 0.0
    assert score("Step 1: 7*2 = 14, 14 + 1 = 15", "15")["outcome"] == 0.0  # two results: no answer
    assert score("步骤一：7×2=14\n答案：14个", "14")["outcome"] == 1.0
    assert score("Step 1: 4*3 = 12\nFinal Answer: The total is 12.", "12", RewardConfig(lang="en"))["outcome"] == 1.0


def test_inputs_are_capped_before_the_expensive_parts(monkeypatch):
    """Timing-free: every function score() calls sees at most max_chars characters of the text."""
    import rewards.combine as combine

    seen = []

    def spy(fn):
        def wrapped(text, *args, **kwargs):
            seen.append((fn.__name__, len(text)))
            return fn(text, *args, **kwargs)
        return wrapped

    for name in ("extract_answer", "is_equiv", "check_steps", "format_reward"):
        monkeypatch.setattr(combine, name, spy(getattr(combine, name)))
    for name in ("has_reasoning", "repetition_penalty", "language_penalty"):
        monkeypatch.setattr(combine.penalties, name, spy(getattr(combine.penalties, name)))
    cfg = RewardConfig(w_process=0.2, w_repetition=0.1, w_language=0.1, max_chars=5000)
    step = "步骤一：3+4=7，7×2=14\n"
    text = step * 50_000 + "答案：14"  # about 1M characters
    r = score(text, "14", cfg)
    assert r["truncated"] == 1 and r["error"] == 0 and r["outcome"] == 1.0 and r["answer"] == "14"
    assert r["length"] == len(text.encode())  # the overlong length is the whole response's
    names = {n for n, _ in seen}
    assert names == {"extract_answer", "is_equiv", "check_steps", "format_reward", "has_reasoning",
                     "repetition_penalty", "language_penalty"}
    assert max(n for _, n in seen) <= cfg.max_chars
    seen.clear()
    short = score(step * 3 + "答案：14", "14", cfg)
    assert short["truncated"] == 0 and short["format"] == pytest.approx(0.75)  # 步骤一 thrice: order fails
    assert max(n for _, n in seen) == len(step * 3 + "答案：14")


@pytest.mark.slow
def test_million_character_items_score_within_the_pool_deadline():
    """A generous wall-clock sanity bound (the pool's default deadline is 5 s per item)."""
    cfg = RewardConfig(w_process=0.3, w_repetition=0.1, w_language=0.1)
    for text in ("".join(f"Step {i}: {i}*{i}={i * i} and 3 + 4 = 7.\n" for i in range(1, 30_000)) + "Answer: 7",
                 "步骤一：" + "1+" * 400_000 + "1=2\n答案：2", "<think>" + "3+4=7 " * 170_000 + "</think><answer>7</answer>"):
        t0 = time.process_time()  # CPU seconds, what a worker spends of its deadline
        r = score(text, "7", cfg)
        assert r["error"] == 0 and r["truncated"] == 1
        assert time.process_time() - t0 < 2.5
