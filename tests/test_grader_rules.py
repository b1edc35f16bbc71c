"""The grader rules of issue 52 (docs/rewards.md, "Grader rules"): an answer names one value, an answer is a result
and not the question restated, and an answer without a marker is the final sentence's one value. Each rule is
checked where training and pass@1 read it: rewards.combine.score (the math reward), rewards.task_score.score_task
(what the reward pool runs for training, pass@1 and experiments.eval) and the reward pool itself."""
from __future__ import annotations

import time

import pytest

from rewards.combine import RewardConfig, score
from rewards.parse import MAX_SENTENCE_CHARS, answer_candidates, extract_answer
from rewards.pool import RewardPool
from rewards.task_score import score_task, target_of
from rewards.verify import is_equiv
from rl.tasks import get_source, render_solution


def outcome(text: str, gold: str) -> float:
    """The math outcome as training and pass@1 see it; the two entry points must agree."""
    a = score(text, gold)["solved"]
    b = score_task(text, target_of("math", gold))["solved"]
    assert a == b, (text, gold)
    return a


# ---------------------------------------------------------------------------------------------------------------
# 1. an answer names one value

ISSUE_HEDGES = ["Answer: it is either 71 or 72", "Answer: maybe 70, maybe 71, maybe 72", "Answer: not 71 but 72",
                "Answer: 71 or 72", "Answer: 70, 71, 72"]
HEDGES = ISSUE_HEDGES + [
    "答案：71或72", "答案：71或者72", "答案：不是71而是72", "答案：可能是71，也可能是72", "答案：大约71或72",
    "答：71～72", "最终答案：72或71", "答案是71或72。",
    "Answer: 72, maybe 71", "Answer: 72 or maybe 71", "Answer: 72 (or 71)", "Answer: 71 and 72", "Answer: 71/72",
    "Answer: not 71, it is 72", "Answer: it is 72, not 71", "Answer: between 71 and 72", "Answer: 71 to 72",
    "Answer: 71-72", "Answer: 71 ~ 72", "Answer: 72 apples, 71 pears", "Answer: probably 72 but 71 is possible",
    "The answer is 71 or 72.", "The answer is either 71 or 72.", "Final Answer: 71 or 72",
    "Answer: it could be $71$, but I think it is $72$", "Answer: $71$ or $72$", "Answer: \\boxed{71} or \\boxed{72}",
    "\\boxed{71 \\text{ or } 72}", "<answer>71 or 72</answer>", "<answer>maybe 71, maybe 72</answer>",
    "#### 71 or 72", "Step 1: 8*9=72\nAnswer: either 71 or 72 marbles",
    "Answer: 72.\u200b or 71", "Answer: 72 ٧١", "Answer: ７２或７１",
]
SINGLE = ["Answer: 72", "Answer: 72 marbles", "The answer is 72.", "Answer: 8 * 9 = 72", "Answer: x = 72",
          "Final Answer: The total is 72.", "Answer: $72$", "\\boxed{72}", "<answer>72</answer>", "#### 72",
          "答案：72个", "答案：７２", "答：一共72颗弹珠。", "Answer: 72 or 72", "Answer: 9 + 63 = 72 marbles",
          "Step 1: 8*9=72\nStep 2: 72 - 0 = 72\nAnswer: 72"]


@pytest.mark.parametrize("text", HEDGES)
def test_an_answer_naming_several_values_scores_0(text):
    assert outcome(text, "72") == 0.0
    assert outcome(text, "71") == 0.0


@pytest.mark.parametrize("text", SINGLE)
def test_an_answer_naming_one_value_scores_1(text):
    assert outcome(text, "72") == 1.0


def test_prose_hedges_have_no_answer_while_formulas_are_read_whole():
    # prose that names several values states none; a formula naming several is a collection, compared as one
    assert extract_answer("Answer: it is either 71 or 72") is None and answer_candidates("Answer: not 71 but 72") == []
    assert extract_answer("Answer: 71 or 72") == "71 or 72" and answer_candidates("答案：71或72") == ["71或72"]
    # ... so a collection answer still matches a collection gold
    assert outcome("Answer: 71 or 72", "71, 72") == 1.0 and outcome("Answer: x = 3, y = 2", "x=3, y=2") == 1.0
    assert outcome("Answer: the solutions are $x = 1$ and $x = 2$", "1, 2") == 1.0
    # a hedge never brings an earlier answer back
    assert outcome("Answer: 72\nAnswer: 71 or 72", "72") == 0.0
    # a correction with a second marker is the last answer (the documented "last occurrence wins")
    assert outcome("Answer: 71. Sorry, the answer is 72.", "72") == 1.0


# ---------------------------------------------------------------------------------------------------------------
# 2. an answer is a result, not the question restated

def test_the_issue_examples_of_restated_questions():
    assert outcome("Answer: 34+48", "82") == 0.0
    assert outcome("Mia has 8 bags of 9 apples.\nAnswer: 8*9", "72") == 0.0
    assert outcome("Answer: 34 + 48 = 82", "82") == 1.0  # the working, then the result
    assert outcome("Answer: 82", "82") == 1.0
    # plain value equivalence (the step checker's rule) is unchanged: only the graders ask for a literal
    assert is_equiv("34+48", "82") and not is_equiv("34+48", "82", literal=True)
    assert is_equiv("Answer: 82", "82", literal=True)


@pytest.mark.parametrize("answer, gold, want", [
    ("82", "82", 1.0), ("82.0", "82", 1.0), ("-344", "-344", 1.0), ("2/3", "2/3", 1.0), ("\\frac{2}{3}", "2/3", 1.0),
    ("0.67", "2/3", 1.0), ("50%", "0.5", 1.0), ("5万", "50000", 1.0), ("5 \\times 10^4", "50000", 1.0),
    ("x = 6", "6", 1.0), ("$1,250", "1250", 1.0), ("72 km", "72", 1.0),
    ("12/18", "2/3", 0.0), ("4/6", "2/3", 0.0), ("144/2", "72", 0.0), ("72/1", "72", 0.0), ("2\\frac{1}{2}", "5/2", 0.0),
    ("8*9", "72", 0.0), ("70 + 2", "72", 0.0), ("2^{3}", "8", 0.0), ("\\sqrt{4}", "2", 0.0), ("x = 28 - 22", "6", 0.0),
    ("x = 14/2, y = -2", "x=7, y=-2", 0.0), ("x = 7, y = -2", "x=7, y=-2", 1.0),
])
def test_a_number_gold_needs_a_literal(answer, gold, want):
    assert outcome(f"Answer: {answer}", gold) == want


@pytest.mark.parametrize("answer, gold", [
    ("5*(o - 283)*(o - 12)", "5*o**2 - 1475*o + 16980"), ("c*c**3", "c**4"), ("\\sqrt{12}/2", "\\sqrt{3}"),
    ("2 \\cdot \\frac{\\pi}{4}", "\\pi/2"), ("\\frac{2}{4}x", "x/2"),
])
def test_an_expression_gold_keeps_symbolic_equivalence(answer, gold):
    assert outcome(f"Answer: {answer}", gold) == 1.0


@pytest.mark.parametrize("family", ["arith", "add", "sub", "mul", "fractions", "linear", "word", "word_zh"])
def test_each_number_family_refuses_its_question_restated_and_accepts_its_gold(family):
    """Per family (docs/rewards.md table): the gold solution scores 1; the question written as the answer (the
    arithmetic families and fractions: the question is the expression), or the gold as an expression, scores 0."""
    for p in get_source(family).sample(40, 0, "train", unique=False):
        lang = "zh" if family == "word_zh" else "en"
        assert score(render_solution(p, lang), p.answer, RewardConfig(lang=lang))["solved"] == 1.0, p
        assert outcome(f"Answer: ({p.answer.split('=')[-1]}) * 1", p.answer.split("=")[-1]) == 0.0
        if family in ("arith", "add", "sub", "mul", "fractions"):
            assert outcome(f"Answer: {p.question}", p.answer) == 0.0, p.question
        if family == "linear" and "," not in p.answer:
            assert outcome(f"Answer: x = {p.answer} + 0", p.answer) == 0.0
            assert outcome(f"Answer: x = {p.answer}", p.answer) == 1.0


# ---------------------------------------------------------------------------------------------------------------
# 3. an answer without a marker: the final sentence's one value

@pytest.mark.parametrize("text, gold, want", [
    ("Mia has 9 marbles and Tom has 6.\n...So, Mia has 15 marbles.", "15", 1.0),
    ("They have 15 marbles in total.", "15", 1.0),
    ("The total number of marbles is 9 + 6 = 15.", "15", 1.0),
    ("Step 1: 9+6=15\nStep 2: 15", "15", 1.0),
    ("所以他们一共有15颗弹珠。", "15", 1.0), ("15", "15", 1.0), ("15个", "15", 1.0),
    ("So Mia has 15 marbles and Tom has 6 marbles.", "15", 0.0),  # two values
    ("They have 14 or 15 marbles.", "15", 0.0), ("他们有14或15颗。", "15", 0.0),
    ("So Mia has 15 marbles. I hope this helps!", "15", 0.0),  # the final sentence names no number
    ("Mia has 15 marbles. Tom has", "15", 0.0),  # cut off
    ("They have 9 + 6 marbles.", "15", 0.0),  # the question restated
    ("import os; 15", "15", 0.0),  # code-like text states no answer
])
def test_an_unmarked_answer_is_the_final_sentence_one_value(text, gold, want):
    assert outcome(text, gold) == want


def test_a_long_final_sentence_states_no_value():
    assert outcome("So " + "x " * MAX_SENTENCE_CHARS + "15", "15") == 0.0
    assert outcome("-" * 5000 + "1", "1") == 0.0  # hostile: a chain of signs the parser refuses
    assert outcome("Answer: " + "-" * 5000 + "1", "1") == 0.0


def test_the_reward_pool_reads_the_same_rules():
    """Training, pass@1 and experiments.eval score through the reward pool with score_task (rl.setup)."""
    texts = ["They have 15 marbles in total.", "Answer: either 14 or 15", "Answer: 9+6", "Answer: 15"]
    with RewardPool(n_workers=0, score_fn=score_task) as pool:
        got = [r["solved"] for r in pool.score_batch(texts, ["15"] * 4)]
    assert got == [1.0, 0.0, 0.0, 1.0]


# ---------------------------------------------------------------------------------------------------------------
# hostile text: never raises, stays fast

@pytest.mark.parametrize("text", [
    "1=" * 100_000, " " * 100_000 + "= 5", "1 " * 100_000 + "= 5", "Answer: " + "1, " * 50_000 + "= 5",
    "$1$ " * 20_000 + "or $2$", "答案：" + "或".join(str(i) for i in range(20_000)), "7=" * 50_000 + "\n15",
    ("9 + 6 = " * 30_000) + "15.", "\udcff" * 1000 + " 15", "Answer: " + "٧" * 10_000,
])
def test_hostile_sentences_are_linear_and_never_raise(text):
    start = time.monotonic()
    r = score(text, "15")
    assert r["error"] == 0 and r["solved"] in (0.0, 1.0)
    assert time.monotonic() - start < 10.0


def test_regrade_compares_recorded_scores_with_this_grader(tmp_path):
    """experiments.regrade: per evaluation, pass@1 as recorded (the old rule) and under this tree's grader."""
    import json

    from experiments.regrade import main as regrade

    recs = [("So, Mia has 15 marbles.", "15", 0.0), ("Answer: it is either 14 or 15", "15", 1.0),
            ("Answer: 15", "15", 1.0), ("Answer: 7", "15", 0.0)]
    path = tmp_path / "samples.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i, (text, gold, solved) in enumerate(recs):
            fh.write(json.dumps({"step": 0, "stage": "initial", "split": "test", "problem_id": f"word-{i}",
                                 "kind": "greedy", "response": text, "gold": gold, "reward": {"solved": solved}}) + "\n")
        fh.write(json.dumps({"stage": "initial", "split": "test", "problem_id": "code-1", "kind": "greedy",
                             "response": "x", "gold": "y", "reward": {"solved": 1.0}}) + "\n")
    [row] = regrade([str(path), "--json", str(tmp_path / "rows.json")])
    assert (row["n"], row["before"], row["after"], row["up"], row["down"]) == (4, 0.5, 0.5, 1, 1)
    assert row["examples_up"][0]["gold"] == "15" and "Mia" in row["examples_up"][0]["end"]
    assert json.loads((tmp_path / "rows.json").read_text())[0]["changed"] == 2
