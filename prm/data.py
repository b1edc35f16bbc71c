"""Labelled solutions for the process reward model: which steps it reads, and three label sources.

    ends = step_ends(solution)                 # character end of every PRM step: the step lines, then the answer
    exact_labels(solution, gold)               # the checker: check_steps per step line, the verified answer last
    gold_examples(problems, lang, seed, ...)   # (a) corrupted gold solutions, labelled by exact_labels
    mc_labels(solutions, golds, rollout, n)    # (b) Math-Shepherd: good if some of n rollouts reach the answer
    Example(prompt, solution, labels, ...)     # one labelled solution; the mix (c) is a concatenation

Steps. A solution's PRM steps are the step lines of rewards.parse.step_spans, each read at its last character,
plus the final answer (rewards.parse.final_answer_marker) read at the solution's last non-space character when
the answer comes after the last step. The answer step makes a solution's weakest step a verdict on the whole
solution (a wrong answer after right steps is an error too), as in process GRPO (rl/stages/grpo.py).
Imports no JAX (rewards/ and rl.tasks only): the labels are plain Python.

Labels are 1.0 (good), 0.0 (wrong) or None (undecided: left out of training and metrics).
  exact      rewards.steps.check_steps for the step lines (exact Fraction arithmetic; None where a step has no
             checkable claim), and for the answer whether it verifies against the gold (rewards.combine.score).
  corrupted  gold step solutions (rl.tasks) with one step corrupted, labelled exactly (see corrupt_steps).
  mc         Math-Shepherd's hard estimate: step i is good when some rollout from the solution up to and including
             step i reaches the gold answer. The solution's own ending is one such rollout, and a rollout from step
             i that succeeds also continues every earlier prefix, so labels are monotone: a correct solution is
             good everywhere without rollouts; a wrong one is rolled out from its last step backwards until one
             step succeeds (it and every step before it are good; the steps after are wrong). Its answer step is
             wrong. `rollout(prefix_texts, n)` is any sampler (the trainer passes the policy's).
"""
from __future__ import annotations

import random
import re
from typing import Callable, NamedTuple, Sequence

from rewards.combine import score
from rewards.parse import as_text, final_answer_marker, step_spans
from rewards.steps import check_steps
from rl.tasks.render import render_prompt, render_steps

__all__ = ["Example", "CORRUPTIONS", "step_ends", "exact_labels", "corrupt_steps", "corrupted_solution",
           "gold_examples", "mc_labels", "first_error_index"]

CORRUPTIONS = ("digit", "operand", "carry")
_RESULT = re.compile(r"=\s*(\d+)")  # a number right after "=": a claimed result
_OPERAND = re.compile(r"(\d+)(?=\s*[-+*/×÷])")  # a number followed by an operator: an operand


class Example(NamedTuple):
    """One labelled solution: the PRM reads prompt + solution and scores each of step_ends(solution)."""

    prompt: str  # the question as the policy sees it (rl.tasks.render_prompt)
    solution: str  # the response
    labels: tuple  # one per step_ends(solution): 1.0 / 0.0 / None
    source: str  # "corrupted", "mc", "exact" (exact labels on sampled solutions)
    problem_id: str = ""
    kind: str = "sample"  # corrupted: "clean" or one of CORRUPTIONS; sampled: "sample"
    rollouts: int = 0  # rollouts spent on the labels (mc)


def step_ends(solution) -> list[int]:
    """Character end (exclusive) of every PRM step of `solution`: each step line's, then the answer's (the
    solution's last non-space character) when a final answer follows the last step."""
    text = as_text(solution)
    ends = [e for _, e in step_spans(text)]
    marker = final_answer_marker(text)
    end = len(text.rstrip())
    if marker is not None and marker.start >= (ends[-1] if ends else 0) and end > (ends[-1] if ends else 0):
        ends.append(end)
    return ends


def _has_answer_step(text: str, ends: list[int]) -> bool:
    return len(ends) > len(step_spans(text))


def exact_labels(solution, gold: str) -> tuple:
    """The checker's label of every PRM step (see the module docstring)."""
    text = as_text(solution)
    ends = step_ends(text)
    labels = list(check_steps(text))
    if _has_answer_step(text, ends):
        labels.append(float(score(text, gold)["correct"]))
    return tuple(labels)


def first_error_index(labels) -> int:
    """Index of the first wrong step, -1 when none is wrong (None labels are skipped)."""
    return next((i for i, y in enumerate(labels) if y is not None and y < 0.5), -1)


# ---- (a) corrupted gold solutions -----------------------------------------------------------------------------------
def _change_digit(num: str, rng: random.Random) -> str:
    """The same number with one digit changed (never a new leading zero)."""
    i = rng.randrange(len(num))
    choices = [d for d in "0123456789" if d != num[i] and not (i == 0 and d == "0" and len(num) > 1)]
    return num[:i] + rng.choice(choices) + num[i + 1:]


def _off_by_carry(num: str, rng: random.Random) -> str:
    value, k = int(num), rng.randrange(len(num))
    delta = 10 ** k
    if value - delta < 0 or rng.random() < 0.5:
        return str(value + delta)
    return str(value - delta)


def _replace_number(text: str, old: str, new: str) -> str:
    """Every whole-number occurrence of old (not part of a longer number or decimal) replaced by new."""
    return re.sub(rf"(?<![\d.]){re.escape(old)}(?![\d]|\.\d)", new, text)


def corrupt_steps(steps: tuple, answer: str, kind: str, propagate: bool, rng: random.Random):
    """(new steps, new answer, index of the corrupted step), or None when no step has a number to corrupt.

    digit: one digit of a result (a number right after "=") changes; operand: one digit of an operand; carry: a
    result is off by 10**k. With `propagate` the wrong result is carried into later steps and the answer (every
    whole-number occurrence of the old value), so later steps may stay consistent with the error."""
    rx = _OPERAND if kind == "operand" else _RESULT
    candidates = [(i, m) for i, s in enumerate(steps) if "=" in s for m in rx.finditer(s)]
    if not candidates:
        return None
    i, m = rng.choice(candidates)
    old = m.group(1)
    new = _off_by_carry(old, rng) if kind == "carry" else _change_digit(old, rng)
    steps = list(steps)
    steps[i] = steps[i][:m.start(1)] + new + steps[i][m.end(1):]
    if propagate and kind != "operand":
        steps[i + 1:] = [_replace_number(s, old, new) for s in steps[i + 1:]]
        answer = _replace_number(answer, old, new)
    return tuple(steps), answer, i


def corrupted_solution(problem, lang: str, kind: str, propagate: bool, rng: random.Random) -> tuple[str, str]:
    """(rendered solution, kind actually applied): the gold steps with one step corrupted, or clean."""
    steps, answer = problem.steps, problem.answer
    if kind != "clean":
        out = corrupt_steps(steps, answer, kind, propagate, rng)
        if out is None:
            kind = "clean"
        else:
            steps, answer, _ = out
    return render_steps(steps, answer, lang), kind


def gold_examples(problems: Sequence, lang: str, seed: int, *, corrupt_prob: float = 0.7,
                  propagate_prob: float = 0.5) -> list[Example]:
    """One labelled, possibly corrupted gold solution per problem with gold steps (others are skipped), the prompt
    rendered as the policy sees it. Deterministic in (problems, lang, seed)."""
    rng = random.Random(f"prm-gold|{lang}|{seed}")
    out = []
    for p in problems:
        if not p.steps:
            continue
        kind = rng.choice(CORRUPTIONS) if rng.random() < corrupt_prob else "clean"
        solution, kind = corrupted_solution(p, lang, kind, rng.random() < propagate_prob, rng)
        out.append(Example(render_prompt(p, lang), solution, exact_labels(solution, p.answer), "corrupted",
                           p.id, kind))
    return out


# ---- (b) Monte Carlo labels (Math-Shepherd) -------------------------------------------------------------------------
def mc_labels(prompts: Sequence[str], solutions: Sequence[str], golds: Sequence[str],
              rollout: Callable[[list[str], int], list[list[str]]], n: int) -> list[tuple[tuple, int]]:
    """(labels, rollouts spent) per solution, Math-Shepherd's hard estimate with monotone labels (module docstring).

    rollout(prefixes, n) returns n continuations of each prefix (prompt + solution up to a step's end); steps are
    resolved in rounds, one step of every unresolved solution per round, last step first."""
    ends = [step_ends(s) for s in solutions]
    labels = [[None] * len(e) for e in ends]
    spent = [0] * len(solutions)
    todo = {}  # solution -> index of the next step to roll out from
    for i, (s, g, e) in enumerate(zip(solutions, golds, ends)):
        if not e:
            continue
        if score(s, g)["correct"]:
            labels[i] = [1.0] * len(e)  # its own ending reaches the answer from every prefix
            continue
        last = len(e) - 1
        if _has_answer_step(as_text(s), e):
            labels[i][last] = 0.0  # a wrong final answer is wrong, whatever could follow
            last -= 1
        if last >= 0:
            todo[i] = last
        else:
            labels[i] = [0.0] * len(e)
    while todo:
        items = sorted(todo.items())
        prefixes = [prompts[i] + as_text(solutions[i])[:ends[i][j]] for i, j in items]
        conts = rollout(prefixes, n)
        for (i, j), pre, cs in zip(items, prefixes, conts):
            spent[i] += n
            if any(score(pre[len(prompts[i]):] + c, golds[i])["correct"] for c in cs):
                labels[i][: j + 1] = [1.0] * (j + 1)
                del todo[i]
            else:
                labels[i][j] = 0.0
                if j == 0:
                    del todo[i]
                else:
                    todo[i] = j - 1
    return [(tuple(lb), k) for lb, k in zip(labels, spent)]
