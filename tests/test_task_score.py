"""rewards.task_score: each problem scored by its own family's reward, with the keys of rewards.combine.score."""
import json

import pytest

from rewards.combine import RESULT_KEYS, RewardConfig, score
from rewards.task_score import score_task, split_target, target_of
from rl import tasks
from rl.tasks.render import render_solution


@pytest.fixture(autouse=True)
def _generous_sandbox(monkeypatch):
    """Limits a correct program never meets, however busy the machine (the verdicts here are not about time)."""
    from rewards import code_reward
    from rewards.code_exec import ExecConfig

    monkeypatch.setattr(code_reward, "EXEC_CONFIG", ExecConfig(timeout_s=60.0, per_test_timeout_s=30.0))


def _problems(source, n=6, difficulty=1):
    return tasks.load_mix(f"{source}:1.0", n, 0, "train", difficulty=difficulty)


@pytest.mark.parametrize("source,lang", [("code", "en"), ("code", "zh"), ("instructions", "en"), ("instructions", "zh"),
                                         ("add", "en")])
def test_gold_solutions_are_solved(source, lang):
    for p in _problems(source):
        r = score_task(render_solution(p, lang), target_of(p.reward, p.answer, p.check), RewardConfig(lang=lang))
        assert set(r) == set(RESULT_KEYS)
        assert r["solved"] == 1.0 and r["outcome"] == 1.0 and r["family"] == p.reward and r["error"] == 0, (p, r)


def test_corrupted_code_and_broken_constraints_are_not_solved():
    p = _problems("code", 1)[0]
    wrong = render_solution(p, "en").replace("return ", "return 1 + ")
    r = score_task(wrong, target_of(p.reward, p.answer, p.check))
    assert r["solved"] == 0.0 and r["outcome"] < 1.0 and r["family"] == "code"
    q = next(p for p in _problems("instructions", 20) if any(c["type"] == "max_chars" for c in p.check_data["constraints"]))
    long = render_solution(q, "en") + " padding" * 100
    r = score_task(long, target_of(q.reward, q.answer, q.check))
    assert r["solved"] == 0.0 and 0.0 <= r["outcome"] < 1.0 and r["format"] == r["outcome"]


def test_math_target_is_the_answer_and_scores_like_combine():
    cfg = RewardConfig(lang="en", w_format=0.3)
    text = "Step 1: 3+4=7\nAnswer: 7"
    assert target_of("math", "7") == "7" and split_target("7") == ("math", "7")
    assert score_task(text, "7", cfg) == score(text, "7", cfg)


def test_code_weights_and_language_ignore_the_code_block():
    p = _problems("code", 1)[0]
    tgt = target_of(p.reward, p.answer, p.check)
    text = render_solution(p, "zh")
    r = score_task(text, tgt, RewardConfig(lang="zh", w_format=0.5, w_language=1.0))
    # the Python block is not language mixing; the zh steps are all Han script
    assert r["language"] < 0.2, r
    assert r["total"] == pytest.approx(1.0 + 0.5 * r["format"] - r["language"])


def test_instruction_language_penalty_uses_the_required_language():
    p = next(p for p in _problems("instructions", 30) if p.check_data["lang"] == "zh")
    r = score_task(render_solution(p, "en"), target_of(p.reward, p.answer, p.check), RewardConfig(lang="en"))
    assert r["solved"] == 1.0 and r["language"] == 0.0  # a Chinese answer to an "answer in Chinese" constraint


@pytest.mark.parametrize("text", ["", None, b"\xff\xfe", "```python\nimport os\nos.system('true')\n```", "x" * 200_000])
def test_hostile_responses_never_raise(text):
    for p in (_problems("code", 1)[0], _problems("instructions", 1)[0]):
        r = score_task(text, target_of(p.reward, p.answer, p.check))
        assert set(r) == set(RESULT_KEYS) and r["solved"] == 0.0


def test_malformed_target_payload_scores_zero():
    r = score_task("Answer: 3", "\x1fcode\x1f{not json")
    assert r["solved"] == 0.0 and r["total"] <= 0.1 + 1e-9
    r = score_task("Answer: 3", "\x1finstructions\x1f" + json.dumps({"constraints": "bad"}))
    assert r["solved"] == 0.0
    with pytest.raises(ValueError):
        target_of("poetry", "x")
