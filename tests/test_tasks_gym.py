"""reasoning-gym task sources (rl/tasks/gym.py) graded by our own rewards/gym_check.py.

Per family: generated gold answers, rendered as the model writes them (the answer line), score 1.0 through
rewards.task_score.score_task and wrong answers 0 (50 items each here, 500 in the slow test); the suite's hostile
corpus (tests/test_verify.py INJECTIONS and BOMBS, tests/test_parse.py HOSTILE) plus print(...),
__import__('os').system(...) and open(...) score 0 and run nothing (a sentinel file is never created, nothing is
printed); reasoning-gym's own score_answer is never called; draws are deterministic (also across processes) and
the splits disjoint; mixes, settings and the errors for a missing extra / unknown generator / unknown setting.
Tests that need the extra skip without it (`pip install -e '.[gym]'`); the grader and error tests run anyway.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from rewards.gym_check import countdown_ok, gym_score, parse_check
from rewards.task_score import score_task, target_of
from rl import tasks
from rl.tasks import gym, load_mix, render_solution
from rl.tasks.base import question_hash, split_of

ROOT = Path(__file__).resolve().parents[1]
try:
    import reasoning_gym  # noqa: F401
    HAVE_GYM = True
except ImportError:
    HAVE_GYM = False
needs_gym = pytest.mark.skipif(not HAVE_GYM, reason="optional extra not installed: pip install -e '.[gym]'")
FAMILIES = tuple(gym.FAMILIES)


def _target(p) -> str:
    return target_of(p.reward, p.answer, p.check)


def _solved(text: str, p) -> float:
    return score_task(text, _target(p))["solved"]


def _wrong_answers(p) -> list[str]:
    """Answers that must score 0: a wrong value, and for each grader the tempting near-miss."""
    data = p.check_data
    grader = data["grader"]
    if grader == "number":
        v = Fraction(data["gold"])
        return [str(v + 1), str(-v - 1)]
    if grader == "fraction":
        n, _, d = data["gold"].partition("/")
        n, d = int(n), int(d or 1)
        return [f"{n + 1}/{d}", f"{3 * n}/{3 * d}", f"{n * d}/{d * d}" if d > 1 else f"{n + 1}"]
    if grader == "roots":
        roots = [Fraction(r) for r in data["gold"].split(", ")]
        shifted = ", ".join(str(float(r + 1)) for r in roots)
        out = [shifted]
        if len(roots) > 1:
            out.append(", ".join(gym._decimal4(r) for r in roots[1:]))  # a root missing
        return out
    first = data["numbers"][0]
    return [f"({p.answer}) + {first}",   # reuses a number (and misses the target)
            f"({p.answer}) - {first} + {first}",  # reaches the target but uses a number twice
            f"({p.answer}) * 2 + 1"]      # misses the target


def _family_problems(family: str, n: int, split: str = "train"):
    return load_mix(f"gym@{family}", n, 0, split)


# ---------------------------------------------------------------------------------------------
# gold 1.0, wrong 0: every supported family

def _check_family(family: str, n: int):
    probs = _family_problems(family, n)
    assert len(probs) == n and len({p.id for p in probs}) > n // 2
    for p in probs:
        assert p.reward == "gym" and p.family == f"gym/{family}" and p.steps is None and p.source == f"gym@{family}"
        gold_text = render_solution(p, "en")
        assert gold_text == f"Answer: {p.answer}"
        r = score_task(gold_text, _target(p))
        assert (r["solved"], r["outcome"], r["family"]) == (1.0, 1.0, f"gym/{family}"), (p.question, p.answer, p.check)
        assert _solved(render_solution(p, "zh"), p) == 1.0
        for wrong in _wrong_answers(p):
            assert _solved(f"Answer: {wrong}", p) == 0.0, (p.question, p.check, wrong)


@needs_gym
@pytest.mark.parametrize("family", FAMILIES)
def test_gold_scores_one_and_wrong_answers_zero(family):
    _check_family(family, 50)


@needs_gym
@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_gold_scores_one_500_items(family):
    _check_family(family, 500)


@needs_gym
def test_mix_of_the_issue_scores_gold_and_never_calls_their_graders(monkeypatch):
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS

    def forbidden(*a, **k):
        raise AssertionError("reasoning-gym's score_answer was called")

    for cls, _ in DATASETS.values():
        monkeypatch.setattr(cls, "score_answer", forbidden)
    monkeypatch.setattr(ProceduralDataset, "score_answer", forbidden)
    probs = load_mix("gym@basic_arithmetic:1,gym@countdown:1,arith:1", 30, 0, "train")
    assert {p.source for p in probs} == {"gym@basic_arithmetic", "gym@countdown", "arith"}
    for p in probs:
        assert score_task(render_solution(p, "en"), _target(p))["solved"] == 1.0


# ---------------------------------------------------------------------------------------------
# hostile answers: 0, nothing runs

PAYLOADS = {  # golds no hostile text below happens to state
    "number": {"grader": "number", "family": "basic_arithmetic", "gold": "-417"},
    "equation": {"grader": "number", "family": "simple_equations", "gold": "-417", "variable": "x"},
    "fraction": {"grader": "fraction", "family": "fraction_simplification", "gold": "5/7"},
    "roots": {"grader": "roots", "family": "polynomial_equations", "gold": "-3/7, 5/11", "n_roots": 2, "variable": "x"},
    "countdown": {"grader": "countdown", "family": "countdown", "numbers": [7, 11, 13], "target": 31, "use_all": False},
}


def _hostile(sentinel: Path) -> list[str]:
    from test_parse import HOSTILE
    from test_verify import BOMBS, INJECTIONS

    s = str(sentinel)
    ours = [f"print('{s}')", f"__import__('os').system('touch {s}')", f"open('{s}', 'w').write('x')",
            f"print(open('{s}', 'w'))", f"7+11+13 or __import__('os').system('touch {s}')",
            f"(lambda: open('{s}', 'w'))() + 10", "0 if print('x') else 1", "exec('1')", "eval('1/2')", "(7+11)(print(1))"]
    return [t.format(s=s) for t in INJECTIONS] + ours + list(BOMBS) + list(HOSTILE)


@pytest.mark.parametrize("which", list(PAYLOADS))
def test_hostile_answers_score_zero_and_run_nothing(which, tmp_path, monkeypatch, capfd):
    sentinel = tmp_path / "SENTINEL"
    monkeypatch.chdir(tmp_path)
    target = target_of("gym", "-417", json.dumps(PAYLOADS[which]))
    for text in _hostile(sentinel):
        short = len(text) < 1000  # the long ones are about size, the short ones about code: try them in steps too
        for response in [f"Answer: {text}"] + ([f"Step 1: {text}\nAnswer: {text}", text] if short else []):
            r = score_task(response, target)
            assert r["solved"] == 0.0 and r["outcome"] == 0.0, (which, response[:120])
        assert not sentinel.exists(), text[:120]
    out, err = capfd.readouterr()
    assert str(sentinel) not in out and "SENTINEL" not in err


def test_gym_graders_source_never_evaluates_text():
    import re

    banned = re.compile(r"(?<![\w.])(eval|exec|sympify|parse_expr|parse_latex|compile|__import__|S)\s*\(|"
                        r"score_answer\s*\(|import reasoning_gym|from reasoning_gym")
    assert not banned.search((ROOT / "rewards" / "gym_check.py").read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------
# our graders on hand-written answers (no extra needed)

def _score(payload: dict, answer: str) -> float:
    return gym_score(f"Step 1: thinking\nAnswer: {answer}", payload)


def test_number_grader_wants_a_number_not_the_question():
    p = {"grader": "number", "family": "basic_arithmetic", "gold": "-4"}
    assert _score(p, "-4") == 1.0 and _score(p, "-4.0") == 1.0 and _score(p, r"\boxed{-4}") == 1.0
    assert _score(p, "5 - 3 - 6") == 0.0  # the question's expression has the gold value: not an answer
    assert _score(p, "-8/2") == 0.0 and _score(p, "4") == 0.0 and _score(p, "") == 0.0
    eq = {"grader": "number", "family": "simple_equations", "gold": "13", "variable": "e"}
    assert _score(eq, "13") == 1.0 and _score(eq, "e = 13") == 1.0
    assert _score(eq, "x = 13") == 0.0 and _score(eq, "e = 12") == 0.0 and _score(eq, "e = 26/2") == 0.0


def test_fraction_grader_wants_lowest_terms():
    p = {"grader": "fraction", "family": "fraction_simplification", "gold": "138/583"}
    for ok in ("138/583", r"\frac{138}{583}", r"\dfrac{138}{583}", "$138/583$"):
        assert _score(p, ok) == 1.0, ok
    for bad in ("13524/57134", "276/1166", "0.2367", "139/583", "138/584"):
        assert _score(p, bad) == 0.0, bad
    whole = {"grader": "fraction", "family": "fraction_simplification", "gold": "3"}
    assert _score(whole, "3") == 1.0 and _score(whole, "6/2") == 0.0 and _score(whole, "3/1") == 0.0
    neg = {"grader": "fraction", "family": "fraction_simplification", "gold": "-2/3"}
    assert _score(neg, "-2/3") == 1.0 and _score(neg, "2/3") == 0.0 and _score(neg, "-4/6") == 0.0


def test_roots_grader_rounding_order_and_exact_forms():
    # roots of 51h^3 - 61h^2 - 78h: 0 and (61 +- sqrt(19633))/102
    r1, r2 = (61 - 19633 ** 0.5) / 102, (61 + 19633 ** 0.5) / 102
    gold = ", ".join(f"{f.numerator}/{f.denominator}" for f in sorted(
        [Fraction(0), Fraction(r1).limit_denominator(10**30), Fraction(r2).limit_denominator(10**30)]))
    p = {"grader": "roots", "family": "polynomial_equations", "gold": gold, "n_roots": 3, "variable": "h"}
    assert _score(p, f"{r1:.4f}, 0, {r2:.4f}") == 1.0
    assert _score(p, f"{r2:.2f}, {r1:.3f}, 0.0") == 1.0  # any order, 2+ decimals
    assert _score(p, f"h = {r1:.4f}, h = 0, h = {r2:.4f}") == 1.0
    assert _score(p, "(61 - sqrt(19633))/102, 0, (61 + sqrt(19633))/102") == 1.0
    assert _score(p, f"{r1:.4f}, {r2:.4f}") == 0.0  # a root missing
    assert _score(p, f"{r1 + 0.001:.4f}, 0, {r2:.4f}") == 0.0
    assert _score(p, f"{r1:.1f}, 0, {r2:.1f}") == 0.0  # one decimal is not the root
    assert _score(p, "51*h**3 - 61*h**2 - 78*h") == 0.0 and _score(p, "h") == 0.0
    none = {"grader": "roots", "family": "polynomial_equations", "gold": "none", "n_roots": 0, "variable": "x"}
    assert _score(none, "no real solutions") == 1.0 and _score(none, "∅") == 1.0 and _score(none, "0") == 0.0


def test_countdown_checker():
    nums = [6, 61, 94, 4]
    assert countdown_ok("94*4 - 61 - 6", nums, 309, True)
    assert countdown_ok("-6 - 61 + 94*4", nums, 309, True)  # unary minus, as the generator writes
    assert countdown_ok("94*4 - 61 - 6 = 309", nums, 309, True)
    assert countdown_ok("94 × 4 − 61 − 6", nums, 309, True)
    assert not countdown_ok("94*4 - 61 - 6 = 310", nums, 309, True)
    assert not countdown_ok("94*4 - 67", nums, 309, True)    # 67 is not given
    assert not countdown_ok("94*4 - 61 - 6 + 4 - 4", nums, 309, True)  # 4 twice
    assert not countdown_ok("94*4 - 61", nums, 315, True)    # not all numbers used
    assert countdown_ok("94*4 - 61", nums, 315, False)       # ... which use_all=False allows
    assert not countdown_ok("94*4 - 61 - 6.0", nums, 309, True)  # a decimal literal
    assert not countdown_ok("94*4^1 - 61 - 6", nums, 309, True)  # a power
    assert not countdown_ok("309", [309], 309, False) is False  # the target itself when it is given
    assert countdown_ok("(6 + 4) / (94 - 94)", [6, 4, 94, 94], 1, True) is False  # division by zero
    assert countdown_ok("6/4*4", [6, 4, 4], 6, True)  # exact rationals, not floats or floor division
    assert not countdown_ok("6/4", [6, 4], 1, True)


@pytest.mark.parametrize("bad", [
    {"grader": "eval", "family": "x", "gold": "1"}, {"grader": "number", "gold": "1"},
    {"grader": "number", "family": "x", "gold": ""}, {"grader": "roots", "family": "x", "gold": "1"},
    {"grader": "countdown", "family": "x", "numbers": [1, -2], "target": 3, "use_all": True},
    {"grader": "countdown", "family": "x", "numbers": [1, 2], "target": 3},
    {"grader": "number", "family": "x", "gold": "1", "variable": "__import__"}, [1, 2], "not json",
])
def test_malformed_payloads_are_refused_and_score_zero(bad):
    with pytest.raises((ValueError, TypeError)):
        parse_check(bad)
    assert gym_score("Answer: 1", bad) == 0.0
    with pytest.raises(ValueError, match="Problem.check for reward 'gym'"):
        tasks.Problem(id="x", question="q", answer="1", steps=None, difficulty=1, source="gym@x", reward="gym",
                      check=bad if isinstance(bad, dict) else json.dumps(bad))


# ---------------------------------------------------------------------------------------------
# determinism, splits, mixes, settings, errors

@needs_gym
def test_deterministic_prefix_stable_and_seeded():
    spec = "gym@basic_arithmetic:1,gym@countdown:1,gym@gsm_symbolic:1"
    a = load_mix(spec, 12, 3, "train")
    assert a == load_mix(spec, 12, 3, "train")
    assert [p.id for p in a] != [p.id for p in load_mix(spec, 12, 4, "train")]
    src = tasks.get_source("gym@chain_sum")
    assert src.sample(40, 1, "train")[:25] == src.sample(25, 1, "train")


@needs_gym
def test_same_problems_in_another_process():
    spec = "gym@simple_equations:1,gym@gsm_symbolic:1,gym@countdown:1"
    code = (f"from rl.tasks import load_mix; print([p.id for p in load_mix({spec!r}, 12, 5, 'train')])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True).stdout.strip()
    assert out == str([p.id for p in load_mix(spec, 12, 5, "train")])


@needs_gym
@pytest.mark.parametrize("family,n", [("basic_arithmetic", 20), ("chain_sum", 20), ("fraction_simplification", 20),
                                      ("countdown", 5)])  # countdown's generator is the slow one (~10 ms an item)
def test_splits_are_disjoint(family, n):
    draws = {s: load_mix(f"gym@{family}", m, 0, s) for s, m in (("train", 10 * n), ("validation", n), ("test", n))}
    keys = {s: {question_hash(p.question) for p in ps} for s, ps in draws.items()}
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]
    for s, ps in draws.items():
        assert all(split_of(p.question) == s for p in ps)
    assert len(keys["test"]) == n  # evaluation splits are distinct problems


def test_mix_spec_keeps_a_gym_items_settings():
    items = tasks.parse_mix("gym@chain_sum@max_terms=3,max_digits=2:3,arith:1")
    assert items == [("gym@chain_sum@max_terms=3,max_digits=2", 0.75), ("arith", 0.25)]
    assert tasks.parse_mix("gym@countdown,gym@chain_sum") == [("gym@countdown", 0.5), ("gym@chain_sum", 0.5)]
    assert not tasks.takes_difficulty("gym@countdown") and tasks.takes_difficulty("arith")


def test_unknown_generator_lists_the_supported_ones():
    with pytest.raises(ValueError, match="unknown reasoning-gym generator 'sudoku'.*basic_arithmetic.*countdown"):
        tasks.parse_mix("gym@sudoku:1,arith:1")
    with pytest.raises(ValueError, match="must be key=value"):
        tasks.parse_mix("gym@chain_sum@max_terms")
    assert "gym" in tasks.list_sources()


def test_missing_extra_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ImportError
    tasks.get_source.cache_clear()
    gym._dataset.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"pip install -e '\.\[gym\]'.*reasoning-gym==0\.1\.25"):
            load_mix("gym@countdown:1,arith:1", 4, 0, "train")
    finally:
        tasks.get_source.cache_clear()
        gym._dataset.cache_clear()


@needs_gym
def test_settings_reach_the_generator_and_bad_ones_are_named():
    probs = load_mix("gym@chain_sum@min_terms=2,max_terms=2,max_digits=1", 40, 0, "train", unique=False)
    assert all(p.source == "gym@chain_sum@min_terms=2,max_terms=2,max_digits=1" for p in probs)
    assert all(p.question.count("+") + p.question.count(" - ") == 1 for p in probs)
    cd = load_mix("gym@countdown@min_numbers=3,max_numbers=3,operators=+|-", 10, 0, "train")
    assert all(len(p.check_data["numbers"]) == 3 and "*" not in p.answer for p in cd)
    with pytest.raises(ValueError, match="unknown setting 'max_term'; its settings: min_terms, max_terms"):
        tasks.get_source("gym@chain_sum@max_term=3")
    with pytest.raises(ValueError, match="rejected by the generator"):
        tasks.get_source("gym@chain_sum@min_terms=5,max_terms=2")
    with pytest.raises(ValueError, match="difficulty must be None"):
        load_mix("gym@chain_sum", 4, 0, "train", difficulty=2)



@pytest.mark.parametrize("spec,named", [
    ("basic_arithmetic@max_terms=100000", "setting max_terms must be an integer in [1, 10], got 100000"),
    ("countdown@min_numbers=999999,max_numbers=999999", "setting min_numbers must be an integer in [2, 8]"),
    ("polynomial_equations@min_degree=60,max_degree=60", "setting min_degree must be an integer in [1, 6], got 60"),
    ("chain_sum@max_terms=1e999", "setting max_terms must be an integer in [1, 20], got inf"),
    ("countdown@operators=+|x", "setting operators must be some of +|-|*|/"),
    ("basic_arithmetic@allow_negation=3", "setting allow_negation must be true or false, got 3"),
    ("chain_sum@max_term=3", "unknown setting 'max_term'; its settings: min_terms, max_terms"),
])
def test_generator_settings_out_of_range_are_named_with_the_config(spec, named):
    """The first three hung the dry run past 240 s (no ranges), the fourth tracebacked: the mix check (no import of
    reasoning-gym) names the setting and its range."""
    with pytest.raises(ValueError) as e:
        tasks.parse_mix(f"gym@{spec}:1,arith:1")
    assert f"gym@{spec.partition('@')[0]}: {named}" in str(e.value)


def test_launcher_exits_2_naming_the_gym_setting(capsys):
    from experiments import launch

    rc = launch.main(["--config", "experiments/configs/quickstart.py:variant=tiny", "--dry_run",
                      "--config.tasks.mix=gym@chain_sum@max_terms=1e999"])
    assert rc == 2 and "tasks.mix" in capsys.readouterr().err


def test_every_setting_has_a_range_and_the_shipped_mixes_are_inside():
    from experiments.configs import gym_mix

    tasks.parse_mix(gym_mix.get_config().tasks.mix)
    if HAVE_GYM:  # the table covers each generator's own settings, in its order
        import dataclasses

        from reasoning_gym.factory import DATASETS
        for family, table in gym.SETTINGS.items():
            own = [f.name for f in dataclasses.fields(DATASETS[family][1]) if f.name not in ("seed", "size")]
            assert list(table) == own, family


@needs_gym
def test_a_generator_failing_on_an_item_is_a_value_error_naming_the_source():
    spec = "gym@basic_arithmetic@min_terms=8,max_terms=8,operators=/"  # reasoning-gym raises IndexError here
    with pytest.raises(ValueError, match=r"gym@basic_arithmetic@min_terms=8,max_terms=8,operators=/: the generator "
                                         r"failed on item \d+ of chunk 0 \(IndexError"):
        load_mix(spec, 8, 0, "train")

@needs_gym
def test_jsonl_round_trip(tmp_path):
    from rl.tasks import jsonl_io

    probs = load_mix("gym@countdown:1,gym@polynomial_equations:1", 6, 0, "train")
    jsonl_io.write_jsonl(probs, tmp_path / "g.jsonl")
    assert jsonl_io.read_jsonl(tmp_path / "g.jsonl") == probs


def _exact_reference(expression: str) -> Fraction:
    """An independent exact evaluation of a generator's arithmetic (Python's own grammar via ast, Fractions)."""
    import ast

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.Div: lambda a, b: a / b}
        return ops[type(node.op)](walk(node.left), walk(node.right))

    return walk(ast.parse(expression, mode="eval"))


@needs_gym
@pytest.mark.parametrize("settings", ["", "@allow_parentheses=false,min_terms=3,max_terms=3,operators=+|-|*"])
def test_basic_arithmetic_gold_is_the_exact_value(settings):
    # reasoning-gym's own answers use floor division (default settings) or left-to-right order (no parentheses)
    probs = load_mix(f"gym@basic_arithmetic{settings}", 300, 0, "train")
    for p in probs:
        expression = p.question.removeprefix("Calculate ").removesuffix(".")
        assert Fraction(p.answer) == _exact_reference(expression), p.question
        assert _solved(f"Answer: {p.answer}", p) == 1.0


@needs_gym
@pytest.mark.slow  # a tiny run (~2 min on 2 cores)
def test_gym_mix_recipe_eval_cli_and_family_table(tmp_path, capsys):
    from experiments import eval as eval_cmd
    from experiments import family_table, launch

    wd = tmp_path / "gym"
    assert launch.main(["--config", str(ROOT / "experiments/configs/gym_mix.py") + ":variant=tiny",
                        "--workdir", str(wd)]) == 0
    summary = json.loads((wd / "summary.json").read_text())
    assert list(summary["eval"]) == ["cold_start", "grpo"]
    fams = ("gym/basic_arithmetic", "gym/chain_sum", "gym/countdown")
    for entry in summary["eval"].values():
        assert all(0.0 <= entry[f"pass@1/{f}"] <= 1.0 and entry[f"n_problems/{f}"] > 0 for f in fams)
    capsys.readouterr()
    assert family_table.main([str(wd)]) == 0
    assert "| stage | gym/basic_arithmetic pass@1 | gym/chain_sum pass@1 | gym/countdown pass@1 |" in capsys.readouterr().out
    mix = "gym@chain_sum@max_terms=2,max_digits=1:1,gym@basic_arithmetic@max_terms=2,max_digits=1:1"
    assert eval_cmd.main(["--workdir", str(wd), "--ckpt", "last", "--mix", mix, "--n", "8", "--k", "0"]) == 0
    out = capsys.readouterr().out
    assert "gym/chain_sum" in out and "gym/basic_arithmetic" in out
