"""Tests for verifiable-instruction problems (rl/tasks/instructions.py) and their checkers
(rewards/instructions.py): hand-written cases for every checker, every gold response meets all of its
constraints, a corrupted gold breaks exactly the constraint it targets, hostile input never raises,
determinism, splits and rendering in both languages.
"""
import json
import re

import pytest

from rewards.format import format_reward
from rewards.instructions import (
    CONSTRAINT_TYPES, MAX_TEXT_CHARS, check_constraint, constraint_results, instruction_score, parse_constraints,
    script_share,
)
from rewards.parse import split_steps
from rl.tasks import Problem, get_source, load_mix, render_prompt, render_solution
from rl.tasks import instructions as itasks
from rl.tasks.base import SPLITS, question_hash, split_of

SOURCES = ("instructions", "instructions_zh", "instructions_en")


def ok(text, **constraint):
    return check_constraint(text, constraint)


# ------------------------------------------------------------------------------------------ checkers


def test_language():
    assert ok("步骤一：3+4=7\n答案：7", type="language", lang="zh")
    assert not ok("步骤一：3+4=7\n答案：7", type="language", lang="en")
    assert ok("Step 1: 3+4=7\nAnswer: 7", type="language", lang="en")
    # Single Latin letters are math variables, not English.
    assert ok("设 x 为未知数，x+3=7，所以 x=4。", type="language", lang="zh")
    # The threshold is a share of 0.9: 18 Han characters against the 2 letters of "ok" pass, 17 do not.
    assert ok("好" * 18 + " ok", type="language", lang="zh")
    assert not ok("好" * 17 + " ok", type="language", lang="zh")
    assert not ok("12+7=19", type="language", lang="zh")  # no letters at all is not Chinese
    assert not ok("Привет мир", type="language", lang="en")


def test_script_share_matches_a_by_hand_count():
    # Han 4, Latin words of 2+ letters: "ok" (2) and "yes" (3); "x" is ignored; "é" is another script.
    text = "四个汉字 ok yes x é"
    assert script_share(text, "zh") == pytest.approx(4 / 10)
    assert script_share(text, "en") == pytest.approx(5 / 10)
    assert script_share("", "zh") == 0.0 and script_share("123 + 4", "en") == 0.0


def test_num_steps():
    text = "步骤一：3+4=7\n步骤二：7*2=14\n答案：14"
    assert ok(text, type="num_steps", n=2)
    assert not ok(text, type="num_steps", n=3) and not ok(text, type="num_steps", n=1)
    assert ok("Step 1: a\nStep 2: b\nStep 3: c", type="num_steps", n=3)
    assert not ok("Step 1: a\nStep 2:\nAnswer: b", type="num_steps", n=2)  # an empty step does not count
    assert not ok("no steps at all", type="num_steps", n=1)


def test_answer_line():
    assert ok("步骤一：3+4=7\n答案：7\n", type="answer_line", lang="zh")
    assert ok("最终答案：7", type="answer_line", lang="zh")
    assert ok("Step 1: ...\nFinal Answer: 7", type="answer_line", lang="en")
    assert ok("**Answer:** 7", type="answer_line", lang="en") and ok("**Answer: 7**", type="answer_line", lang="en")
    assert not ok("Answer: **", type="answer_line", lang="en")  # emphasis is not a value
    assert not ok("答案：7\n完毕", type="answer_line", lang="zh")  # something follows the answer line
    assert not ok("答案：", type="answer_line", lang="zh")  # no value
    assert not ok("Answer: 7", type="answer_line", lang="zh")  # the other language's marker
    assert not ok("The answer: 7", type="answer_line", lang="en")  # the line must start with the marker


def test_max_chars():
    assert ok("  abcde \n", type="max_chars", k=5)
    assert not ok("abcdef", type="max_chars", k=5)
    assert ok("五个汉字啊", type="max_chars", k=5)  # characters, not bytes


def test_include_and_avoid_word():
    assert ok("I like the Cat.", type="include_word", word="cat")
    assert not ok("a category of things", type="include_word", word="cat")  # whole words for Latin
    assert ok("a category of things", type="avoid_word", word="cat")
    assert ok("我喜欢熊猫", type="include_word", word="熊猫")
    assert not ok("我喜欢熊猫", type="avoid_word", word="熊")  # substrings for Chinese
    assert ok("Maybe.", type="include_word", word="maybe") and not ok("Maybe.", type="avoid_word", word="maybe")


def test_list_items():
    text = "Here are three:\n- a\n* b\n• c\n1. d\n2) e\n3、f\n-not an item\n- \n"
    assert ok(text, type="list_items", n=6)
    assert not ok(text, type="list_items", n=5)
    assert ok("以下是：\n- 苹果\n- 香蕉", type="list_items", n=2)
    assert not ok("Step 1. a\nStep 2. b", type="list_items", n=2)


def test_every_constraint_fails_on_empty_and_overlong_text():
    constraints = [{"type": "language", "lang": "zh"}, {"type": "max_chars", "k": 10},
                   {"type": "avoid_word", "word": "maybe"}, {"type": "num_steps", "n": 1}]
    for text in ("", "  \n\t", None, 42):
        assert constraint_results(text, constraints) == [False] * 4
    assert constraint_results("maybe", constraints) == [False, True, False, False]
    assert instruction_score("maybe", constraints) == 0.25
    long_zh = "步骤一：" + "好" * MAX_TEXT_CHARS
    assert check_constraint(long_zh[:MAX_TEXT_CHARS], {"type": "language", "lang": "zh"})
    assert not check_constraint(long_zh, {"type": "language", "lang": "zh"})


def test_score_is_the_share_met():
    check = {"constraints": [{"type": "language", "lang": "en"}, {"type": "num_steps", "n": 2},
                             {"type": "answer_line", "lang": "en"}, {"type": "max_chars", "k": 80}]}
    assert instruction_score("Step 1: 3+4=7\nStep 2: 7*2=14\nAnswer: 14", check) == 1.0
    assert constraint_results("Step 1: 3+4=7\nAnswer: 7", check) == [True, False, True, True]
    assert instruction_score("Step 1: 3+4=7\nAnswer: 7", json.dumps(check)) == 0.75
    assert instruction_score("Step 1: 3+4=7\nAnswer: 7", check["constraints"]) == 0.75


def test_parse_constraints_validates():
    assert parse_constraints([{"type": "num_steps", "n": 2}]) == ({"type": "num_steps", "n": 2},)
    for bad in ([], {}, "[", [{"type": "nope"}], [{"type": "num_steps", "n": 0}], [{"type": "num_steps", "n": "2"}],
                [{"type": "num_steps", "n": True}], [{"type": "language", "lang": "fr"}],
                [{"type": "include_word", "word": " x"}], [{"type": "include_word", "word": "a\nb"}],
                [{"type": "max_chars", "k": 10, "extra": 1}], ["language"], None):
        with pytest.raises(ValueError):
            parse_constraints(bad)
    assert set(CONSTRAINT_TYPES) == {"language", "num_steps", "answer_line", "max_chars", "include_word",
                                     "avoid_word", "list_items"}


def test_hostile_input_never_raises():
    check = {"constraints": [{"type": t, **p} for t, p in [
        ("language", {"lang": "en"}), ("num_steps", {"n": 2}), ("answer_line", {"lang": "zh"}),
        ("max_chars", {"k": 50}), ("include_word", {"word": "a.*b"}), ("avoid_word", {"word": "(("}),
        ("list_items", {"n": 3})]]}
    texts = [None, b"\xff\xfe\x00\x01", "\x00" * 10_000, "步骤一：" * 50_000, "- x\n" * 100_000,
             "a" * 1_000_000, "答案：" * 1000, "\ud800 lone surrogate", bytearray(b"Step 1: a"), 1e308, ["x"]]
    for text in texts:
        s = instruction_score(text, check)
        assert 0.0 <= s <= 1.0
    # Regex metacharacters in a word are literal.
    assert check_constraint("x a.*b y", {"type": "include_word", "word": "a.*b"})
    assert not check_constraint("x aXXb y", {"type": "include_word", "word": "a.*b"})
    for bad_check in (None, "{", 5, {"constraints": "all"}, [{"type": "language"}], [None]):
        assert instruction_score("Step 1: x", bad_check) == 0.0
        assert constraint_results("Step 1: x", bad_check) == []
    assert check_constraint("Step 1: x", "language") is False


# ------------------------------------------------------------------------------------------ the sources


def _problems(name, seed=0, per_level=12):
    src = get_source(name)
    return [p for level in range(1, 6) for p in src.sample(per_level, seed, "train", difficulty=level)]


@pytest.mark.parametrize("name", SOURCES)
def test_every_gold_response_meets_all_its_constraints(name):
    for p in _problems(name):
        data = p.check_data
        assert p.reward == "instructions" and data["constraints"][0] == {"type": "language", "lang": data["lang"]}
        assert len(data["constraints"]) == 1 + min(p.difficulty, 5 if data["task"] in ("sum", "sort") else 4)
        assert instruction_score(p.answer, p.check) == 1.0, (p.question, p.answer)
        assert render_solution(p, "zh") == render_solution(p, "en") == p.answer
        if name != "instructions":
            assert data["lang"] == name[-2:]


def test_steps_layout_gold_also_has_the_math_format():
    for p in _problems("instructions", seed=3):
        if p.check_data["task"] in ("sum", "sort"):
            assert format_reward(p.answer, p.check_data["lang"]) == 1.0
            n = [c["n"] for c in p.check_data["constraints"] if c["type"] == "num_steps"]
            assert not n or len(split_steps(p.answer)) == n[0]


def _corrupt(kind: str, c: dict, gold: str, lang: str) -> str:
    """Gold text changed so that constraint `c` (of type `kind`) no longer holds."""
    if kind == "language":
        other = "This whole reply is written in English words instead. " * 3 if lang == "zh" else "这个回答是用中文写的。" * 6
        return other + gold
    if kind == "num_steps":
        marker = "Step 99: one more" if lang == "en" else "步骤九十九：多写一步"
        lines = gold.split("\n")
        return "\n".join(lines[:-1] + [marker, lines[-1]])
    if kind == "answer_line":
        return gold + ("\nThat is all." if lang == "en" else "\n以上。")
    if kind == "max_chars":
        return gold.replace("\n", "\n" + " " * (c["k"] // 2) + "\n", 2)  # blank padding inside, same content
    if kind == "include_word":
        if re.fullmatch(r"[A-Za-z]+", c["word"]):
            return re.sub(rf"(?i)(?<![A-Za-z]){re.escape(c['word'])}(?![A-Za-z])", "thing", gold)
        return gold.replace(c["word"], "东西")
    if kind == "avoid_word":
        lines = gold.split("\n")
        return "\n".join([lines[0] + " " + c["word"]] + lines[1:])
    if kind == "list_items":
        return "\n".join(line for i, line in enumerate(gold.split("\n")) if not (line.startswith("- ") and i == 1))
    raise AssertionError(kind)


def test_each_corruption_breaks_its_constraint():
    seen = set()
    for p in _problems("instructions", seed=5, per_level=10):
        constraints = p.check_data["constraints"]
        lang = p.check_data["lang"]
        for i, c in enumerate(constraints):
            bad = _corrupt(c["type"], c, p.answer, lang)
            results = constraint_results(bad, p.check)
            assert not results[i], (c, bad)
            assert instruction_score(bad, p.check) < 1.0
            seen.add(c["type"])
    assert seen == set(CONSTRAINT_TYPES)


def test_deterministic_prefix_stable_and_disjoint_splits():
    for name in SOURCES:
        assert load_mix(name, 25, 2, "train") == load_mix(name, 25, 2, "train")
        src = get_source(name)
        assert src.sample(10, 1, "validation") == src.sample(20, 1, "validation")[:10]
    hashes = {}
    for split in SPLITS:
        for p in get_source("instructions").sample(60, 9, split, unique=False):
            assert split_of(p.question) == split
            hashes.setdefault(question_hash(p.question), set()).add(split)
    assert all(len(s) == 1 for s in hashes.values())
    assert len(get_source("instructions").sample(40, 0, "test")) == 40  # enough distinct problems to evaluate


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_rendering_in_both_languages(lang):
    for p in load_mix("instructions", 30, 4, "train"):
        prompt = render_prompt(p, lang)
        data = p.check_data
        assert prompt == (f"问题：{data['prompt']['zh']}\n解答：\n" if lang == "zh"
                          else f"Question: {data['prompt']['en']}\nSolution:\n")
        # The prompt is in the prompt language and names the response language and every word constraint.
        assert script_share(prompt, lang) >= 0.6
        asked = {"zh": ("请用中文回答。", "Answer in Chinese."), "en": ("请用英文回答。", "Answer in English.")}
        assert asked[data["lang"]][0 if lang == "zh" else 1] in prompt
        for c in data["constraints"]:
            if c["type"] in ("include_word", "avoid_word"):
                assert c["word"] in prompt
            if c["type"] in ("num_steps", "list_items", "max_chars"):
                assert str(c.get("n", c.get("k"))) in prompt
    assert p.question == p.check_data["prompt"]["en"]


def test_response_lang_and_problem_validation():
    p = load_mix("instructions_zh", 1, 0, "train")[0]
    assert itasks.response_lang(p) == "zh"
    base = {**p.to_dict(), "check": p.check_data}
    Problem(**base)
    for change in ({"lang": "fr"}, {"constraints": []}, {"prompt": {"zh": "x"}},
                   {"constraints": [{"type": "num_steps", "n": -1}]}):
        with pytest.raises(ValueError, match="Problem.check"):
            Problem(**{**base, "check": {**p.check_data, **change}})


def test_same_problems_in_another_process_with_another_hash_seed():
    import os
    import subprocess
    import sys

    spec = "code:1,instructions:1"
    here = [p.to_dict() for p in load_mix(spec, 20, 3, "validation")]
    script = ("import json; from rl.tasks import load_mix; "
              f"print(json.dumps([p.to_dict() for p in load_mix({spec!r}, 20, 3, 'validation')]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, cwd=os.path.dirname(os.path.dirname(__file__)))
    there = json.loads(out.stdout)
    assert there == json.loads(json.dumps(here))
