"""Tests for the code task family (rl/tasks/code.py), its reward (rewards/code_reward.py) and the Problem fields
that carry a problem's reward and payload (rl/tasks/base.py), with their JSONL round trip and mixes.

Gold solutions are scored through the real sandbox (rewards.code_exec.run_function_tests): one problem per
template in the default run (a few seconds), a larger sweep under @pytest.mark.slow. The expected values of the
hidden tests come from each template's reference implementation, a separate implementation from the gold
source, so a gold score of 1.0 cross-checks the two.
"""
import json
import random

import pytest

from rewards import code_reward
from rewards.code_exec import ExecConfig, ExecResult
from rewards.code_reward import code_score, code_score_detailed, extract_code, parse_check
from rewards.format import format_reward
from rl.tasks import Problem, get_source, load_mix, render_prompt, render_solution
from rl.tasks import code as code_tasks
from rl.tasks import jsonl_io
from rl.tasks.base import SPLITS, question_hash, split_of

ALL_TEMPLATES = [(level, t) for level, ts in sorted(code_tasks.TEMPLATES.items()) for t in ts]


def _problem(made: dict, difficulty: int = 1) -> Problem:
    return Problem(id="t-1", question=made["question"], answer=made["answer"], steps=None, difficulty=difficulty,
                   source="code", reward=made["reward"], check=made["check"])


def _broken(source: str, func: str) -> str:
    """The gold function with every result shifted (ints +1, strings +"x", lists +[0], bools negated, None -> 0):
    it fails every hidden test."""
    return source + (
        f"\n_gold = {func}\n"
        f"def {func}(*args):\n"
        "    r = _gold(*args)\n"
        "    if isinstance(r, bool):\n        return not r\n"
        "    if r is None:\n        return 0\n"
        "    if isinstance(r, int):\n        return r + 1\n"
        "    if isinstance(r, str):\n        return r + 'x'\n"
        "    return r + [0]\n")


@pytest.fixture(autouse=True)
def _generous_sandbox(monkeypatch):
    """Limits a correct program never meets, however busy the machine (the verdicts here are not about time)."""
    monkeypatch.setattr(code_reward, "EXEC_CONFIG", ExecConfig(timeout_s=60.0, per_test_timeout_s=30.0))


def _fenced(code: str, lang: str = "en") -> str:
    return ("Step 1: write it\n" if lang == "en" else "步骤一：写出函数\n") + f"```python\n{code}```\n"


# ------------------------------------------------------------------------------------------ generator


@pytest.mark.parametrize("level,t", ALL_TEMPLATES, ids=[t.func for _, t in ALL_TEMPLATES])
def test_gold_passes_hidden_tests_and_shifted_gold_fails_them(level, t):
    made = code_tasks.from_template(random.Random(f"gold|{t.func}"), t)
    p = _problem(made, level)
    data = p.check_data
    assert data["func"] == t.func and len(data["tests"]) == code_tasks.N_TESTS
    assert len(data["examples"]) == code_tasks.N_EXAMPLES
    # Hidden tests use other inputs than the examples shown in the prompt.
    shown = {json.dumps(a) for a, _ in data["examples"]}
    assert not shown & {json.dumps(a) for a, _ in data["tests"]}
    detail = code_score_detailed(render_solution(p, "en"), p.check)
    assert detail["score"] == 1.0 and detail["extracted"] and all(detail["passed"]), detail
    assert code_score(_fenced(_broken(p.answer, t.func)), p.check) == 0.0


def test_expected_values_are_json_values_that_round_trip():
    for level, t in ALL_TEMPLATES:
        for seed in range(5):
            data = code_tasks.from_template(random.Random(seed), t)["check"]
            for args, expected in data["tests"] + data["examples"]:
                assert json.loads(json.dumps([args, expected])) == [args, expected]


def test_every_level_has_enough_distinct_problems_for_evaluation():
    src = get_source("code")
    for level in range(1, 6):
        problems = src.sample(5, 0, "validation", difficulty=level)
        assert len({question_hash(p.question) for p in problems}) == 5
        assert all(p.difficulty == level and p.reward == "code" for p in problems)


def test_deterministic_prefix_stable_and_split_by_question():
    a = load_mix("code", 30, 4, "train")
    assert a == load_mix("code", 30, 4, "train")
    assert load_mix("code", 12, 4, "train") != load_mix("code", 12, 5, "train")
    src = get_source("code")
    assert src.sample(10, 1, "train") == src.sample(20, 1, "train")[:10]
    seen = {}
    for split in SPLITS:
        for p in src.sample(30, 2, split, unique=False):
            assert split_of(p.question) == split
            seen.setdefault(question_hash(p.question), set()).add(split)
    assert all(len(s) == 1 for s in seen.values())


def test_question_is_the_statement_without_examples():
    p = load_mix("code", 1, 0, "train")[0]
    data = p.check_data
    assert p.question.startswith(f"Write a Python function `{data['signature']}`")
    assert "Examples" not in p.question
    for args, _ in data["examples"] + data["tests"]:
        assert f"{data['func']}({', '.join(repr(a) for a in args)})" not in p.question


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_rendering_in_both_languages(lang):
    for p in load_mix("code", 10, 1, "train"):
        data = p.check_data
        prompt, solution = render_prompt(p, lang), render_solution(p, lang)
        assert data["signature"] in prompt and "```python" in prompt
        for args, expected in data["examples"]:
            assert f"{data['func']}({', '.join(repr(a) for a in args)}) == {expected!r}" in prompt
        for args, _ in data["tests"]:  # hidden inputs never appear in the prompt
            assert f"{data['func']}({', '.join(repr(a) for a in args)})" not in prompt
        if lang == "zh":
            assert prompt.startswith("问题：编写 Python 函数") and "示例：" in prompt and prompt.endswith("解答：\n")
            assert solution.startswith("步骤一：") and solution.endswith(f"答案：{data['func']}")
        else:
            assert prompt.startswith("Question: Write a Python function") and prompt.endswith("Solution:\n")
            assert solution.startswith("Step 1: ") and solution.endswith(f"Answer: {data['func']}")
        # The gold layout keeps the math format (steps, then the answer line) and holds the gold code.
        assert format_reward(solution, lang) == 1.0
        assert extract_code(solution) == p.answer


# ------------------------------------------------------------------------------------------ extraction


def test_extract_code_forms():
    assert extract_code("```python\ndef f():\n    return 1\n```") == "def f():\n    return 1\n"
    assert extract_code("text\n~~~py\nx = 1\n~~~\nmore") == "x = 1\n"
    # The last python block wins; a python block beats a later untagged one; an untagged one is the fallback.
    two = "```python\na = 1\n```\n```python\nb = 2\n```"
    assert extract_code(two) == "b = 2\n"
    assert extract_code("```python\na = 1\n```\n```\nplain\n```") == "a = 1\n"
    assert extract_code("```\nplain = 1\n```") == "plain = 1\n"
    assert extract_code("```text\nnot code\n```") is None
    # An unclosed final block (a truncated generation) runs to the end.
    assert extract_code("```python\ndef g(x):\n    return x") == "def g(x):\n    return x\n"
    # A fence inside a block only closes it when bare and of the same kind.
    assert extract_code("````python\ns = '''\n```\n'''\n````") == "s = '''\n```\n'''\n"
    for none in ("", "def f(): return 1", "```python\n```", None, 12, "```python\n   \n```"):
        assert extract_code(none) is None
    assert extract_code(b"```python\nx = 1\n```") == "x = 1\n"
    assert extract_code("```python\n" + "x = 1\n" * 20_000 + "```") is None  # over MAX_RESPONSE_CHARS


def test_parse_check_validates_payloads():
    assert parse_check({"func": "f", "tests": [[[1], 2]]}) == ("f", (([1], 2),))
    assert parse_check(json.dumps({"func": "f", "tests": [[[], None]]}))[0] == "f"
    for bad in ({"func": "1f", "tests": [[[1], 2]]}, {"func": "class", "tests": [[[1], 2]]},
                {"func": "f", "tests": []}, {"func": "f", "tests": [[1, 2]]}, {"func": "f", "tests": [[[1]]]},
                {"func": "f", "tests": [[[float("nan")], 1]]}, {"func": "f"}, [], "not json", None):
        with pytest.raises(ValueError):
            parse_check(bad)


def test_scoring_goes_through_the_value_based_sandbox_api(monkeypatch):
    calls = []

    def fake(code, func, cases, cfg=None):
        calls.append((code, func, cases, cfg))
        return ExecResult([True, False, True, True], 0.75)

    monkeypatch.setattr(code_reward, "run_function_tests_detailed", fake)
    check = {"func": "f", "tests": [[[1], 1], [[2], 4], [[3], 9], [[4], 16]], "prompt": {"zh": "x", "en": "x"}}
    cfg = ExecConfig(timeout_s=3)
    detail = code_score_detailed("Answer:\n```python\ndef f(x):\n    return x * x\n```", check, cfg)
    assert detail["score"] == 0.75 and detail["passed"] == [True, False, True, True]
    assert calls == [("def f(x):\n    return x * x\n", "f", (([1], 1), ([2], 4), ([3], 9), ([4], 16)), cfg)]
    # No code block, or a malformed payload: nothing reaches the sandbox.
    assert code_score("def f(x): return x * x", check) == 0.0
    assert code_score("```python\nx\n```", {"func": "f"}) == 0.0
    assert len(calls) == 1


def test_wrong_and_hostile_code_in_the_sandbox(tmp_path):
    check = {"func": "add", "tests": [[[1, 2], 3], [[0, 0], 0], [[-5, 5], 0], [[10, 7], 17]]}
    cfg = ExecConfig(timeout_s=60, per_test_timeout_s=30)  # generous: a correct run never meets it, busy or not
    assert code_score(_fenced("def add(a, b):\n    return a + b\n"), check, cfg) == 1.0
    assert code_score(_fenced("def add(a, b):\n    return a - b\n"), check, cfg) == 0.25  # only 0 + 0
    assert code_score(_fenced("def plus(a, b):\n    return a + b\n"), check, cfg) == 0.0  # wrong name
    assert code_score(_fenced("def add(a, b) return a + b\n"), check, cfg) == 0.0  # syntax error
    # Writes outside the sandbox's directory are refused; a function that never returns times out.
    target = tmp_path / "written_by_candidate"
    hostile = (f"try:\n    open({str(target)!r}, 'w').write('x')\nexcept Exception:\n    pass\n"
               "def add(a, b):\n    while True:\n        pass\n")
    short = ExecConfig(timeout_s=5, per_test_timeout_s=1)  # the loop never ends: it meets any limit
    detail = code_score_detailed(_fenced(hostile), {"func": "add", "tests": [[[1, 2], 3]]}, short)
    assert detail["score"] == 0.0 and detail["extracted"] and detail["passed"] == [False]
    assert not target.exists()


def test_hostile_text_never_raises():
    check = {"func": "f", "tests": [[[1], 1]]}
    junk = [None, b"\xff\xfe\x00", "\x00" * 1000, "```" * 10_000, "```python\n" * 5_000, "x" * 1_000_000,
            "~~~\n~~~\n```python", "```python " + "a" * 100_000, 3.5, ["```python\nx\n```"], object()]
    for text in junk:
        assert code_score_detailed(text, check)["score"] == 0.0
        assert extract_code(text) is None or isinstance(extract_code(text), str)
    for bad_check in (None, "{", {"func": "f", "tests": "all"}, {"tests": [[[1], 1]]}, 42):
        assert code_score("```python\ndef f(x):\n    return x\n```", bad_check) == 0.0


# ------------------------------------------------------------------------------------------ Problem fields


def test_problem_reward_and_check_fields():
    made = code_tasks.from_template(random.Random(0), code_tasks.TEMPLATES[1][0])
    p = _problem(made)
    assert p.reward == "code" and isinstance(p.check, str) and p.check_data == json.loads(json.dumps(made["check"]))
    assert hash(p) == hash(_problem(made)) and p == _problem(made)  # hashable, canonical payload text
    assert Problem(**{**p.to_dict(), "check": p.check_data}) == p
    math_p = Problem(id="m", question="3+4", answer="7", steps=("3+4=7",), difficulty=1, source="arith")
    assert math_p.reward == "math" and math_p.check == "" and math_p.check_data is None
    base = dict(id="x", question="q", answer="a", steps=None, difficulty=1, source="s")
    for reward, check, field in [("maths", "", "reward"), ("math", {"func": "f"}, "check"),
                                 ("code", "", "check"), ("code", "{not json", "check"),
                                 ("code", {"func": "f", "tests": [[[1], 1]]}, "check"),  # no prompt
                                 ("code", {**made["check"], "func": "not an identifier"}, "check"),
                                 ("code", {**made["check"], "plan": {"zh": "x"}}, "check"),
                                 ("instructions", made["check"], "check")]:
        with pytest.raises(ValueError, match=f"Problem.{field}"):
            Problem(**base, reward=reward, check=check)


def test_jsonl_round_trip_keeps_reward_and_check(tmp_path):
    problems = load_mix("code:1,instructions:1,add:1", 12, 0, "validation")
    path = tmp_path / "mix.jsonl"
    jsonl_io.write_jsonl(problems, str(path))
    back = jsonl_io.read_jsonl(str(path))
    assert back == problems
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert {rec.get("reward", "math") for rec in lines} == {"math", "code", "instructions"}
    assert all(isinstance(rec["check"], dict) for rec in lines if "reward" in rec)  # readable objects
    assert all("check" not in rec for rec in lines if "reward" not in rec)  # math records unchanged
    # A broken payload is reported with its line and field, never dropped silently.
    bad = dict(lines[[i for i, r in enumerate(lines) if r.get("reward") == "code"][0]])
    bad["check"] = {**bad["check"], "tests": []}
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n", encoding="utf-8")
    _, errors = jsonl_io.validate_jsonl(str(tmp_path / "bad.jsonl"))
    assert len(errors) == 1 and errors[0].line == 1 and errors[0].field == "check"


def test_mixed_families_in_one_mix():
    problems = load_mix("code:0.3,instructions:0.3,add:0.4", 40, 0, "train")
    counts = {r: sum(p.reward == r for p in problems) for r in ("code", "instructions", "math")}
    assert counts == {"code": 12, "instructions": 12, "math": 16}
    for p in problems:
        for lang in ("zh", "en"):
            assert render_prompt(p, lang) and render_solution(p, lang)


def test_tfds_export_refuses_problems_with_a_payload(tmp_path):
    from rl.tasks import tfds_builder
    with pytest.raises(ValueError, match="jsonl"):
        tfds_builder.build_dataset("code", str(tmp_path), n_train=3, n_validation=0, n_test=0)


@pytest.mark.slow
def test_gold_sweep_all_levels_both_languages():
    """750 gold renderings through the sandbox (about a minute on 2 cores)."""
    for level in range(1, 6):
        for split in SPLITS:
            for p in get_source("code").sample(25, 11, split, difficulty=level, unique=False):
                for lang in ("zh", "en"):
                    assert code_score(render_solution(p, lang), p.check) == 1.0, (p.question, lang)
