"""One reward entry point for every task family: a problem's own reward (math, code, instructions) plus format
and language consistency, with the same result keys as rewards.combine.score.

    from rewards.task_score import score_task, target_of
    tgt = target_of(problem.reward, problem.answer, problem.check)   # a str: crosses process boundaries
    r = score_task(text, tgt, RewardConfig(lang="zh"), n_tokens=57)
    r["total"], r["outcome"], r["solved"], r["family"]

The reward pool (rewards.pool) sends each worker a (text, gold string) pair, so a problem's reward travels as
its *target*: a math problem's target is its gold answer unchanged (so any plain gold string still scores as
math), the other families' targets are "\\x1f<reward>\\x1f<check JSON>" (the unit separator never occurs in a
gold answer; rl.tasks.base validates payloads). How each family is scored:

    math          rewards.combine.score: verified outcome, steps, format, penalties (unchanged)
    code          outcome = share of hidden tests passed (rewards.code_reward, in the sandbox); process, format
                  and penalties as for math but on the text with its fenced code blocks removed (the steps and
                  the answer line stay; a Python block must not count as language mixing or repetition)
    instructions  outcome = share of constraints met (rewards.instructions); the constraints are this task's
                  format, so `format` reports that share and w_format adds nothing; the language penalty uses
                  the language the constraints require
    gym           outcome = 1 when our grader of the reasoning-gym family accepts the final answer
                  (rewards.gym_check: number / fraction / roots through rewards.verify, countdown by an exact
                  literal tree walk; never reasoning-gym's own score_answer); process, format and penalties as
                  for math; `family` is "gym/<generator>"

`solved` is 1.0 when the problem counts as solved (math: outcome; code: every test passes; instructions: every
constraint holds): pass@1, accuracies and rejection sampling read it. `family` names the reward used.
Never raises: an internal error gives rewards.combine.error_result.
"""
from __future__ import annotations

import dataclasses
import json
import re

from rewards.code_reward import code_score
from rewards.combine import RewardConfig, error_result, score
from rewards.gym_check import gym_score
from rewards.instructions import instruction_score
from rewards.parse import as_text
from rewards.penalties import text_length

__all__ = ["SEP", "FAMILIES", "FORMAT_IS_OUTCOME", "target_of", "split_target", "score_task", "format_counts"]

SEP = "\x1f"
FAMILIES = ("math", "code", "instructions", "gym")
FORMAT_IS_OUTCOME = ("instructions",)  # families whose `format` reports their outcome: no format weight applies
_FENCED = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]{0,3}\1[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)
_DEFAULT = RewardConfig()


def target_of(reward: str, answer: str, check: str = "") -> str:
    """The target string of a problem (see the module docstring)."""
    if reward == "math":
        return answer
    if reward not in FAMILIES:
        raise ValueError(f"reward must be one of {FAMILIES}, got {reward!r}")
    return f"{SEP}{reward}{SEP}{check}"


def split_target(target) -> tuple[str, str]:
    """(family, gold answer or check JSON) of a target."""
    target = as_text(target)
    if target.startswith(SEP):
        family, _, check = target[1:].partition(SEP)
        if family in FAMILIES[1:]:
            return family, check
    return "math", target


def format_counts(result: dict) -> bool:
    """Whether a format weight applies to this scored result: not for the families whose format is their outcome
    (w_format adds nothing there, and a stage's format_weight must not add the outcome a second time)."""
    return result.get("family") not in FORMAT_IS_OUTCOME


def _strip_code(text: str) -> str:
    return _FENCED.sub("", text)


def score_task(text, target, cfg: RewardConfig | None = None, *, n_tokens=None) -> dict:
    """All reward components of one (response, target) pair; see the module docstring."""
    cfg = _DEFAULT if cfg is None else cfg
    try:
        family, payload = split_target(target)
        if family == "math":
            return score(text, payload, cfg, n_tokens=n_tokens)
        text = as_text(text)[-cfg.max_chars:]
        n_tokens = text_length(text) if n_tokens is None else n_tokens
        if family == "code":
            outcome = float(code_score(text, payload))
            r = score(_strip_code(text), "", cfg, n_tokens=n_tokens)  # format, steps and penalties only
            r["total"] += cfg.w_outcome * outcome
        elif family == "gym":
            outcome = float(gym_score(text, payload))
            r = score(text, "", cfg, n_tokens=n_tokens)  # format, steps and penalties only
            r["total"] += cfg.w_outcome * outcome
            family = f"gym/{json.loads(payload)['family']}"
        else:
            outcome = float(instruction_score(text, payload))
            lang = json.loads(payload).get("lang", cfg.lang)
            r = score(text, "", dataclasses.replace(cfg, lang=lang if lang in ("zh", "en") else cfg.lang),
                      n_tokens=n_tokens)
            r["total"] += cfg.w_outcome * outcome - cfg.w_format * r["format"]
            r["format"] = outcome
        if r["error"]:
            return error_result(r["error_kind"])
        r.update(outcome=outcome, correct=float(outcome == 1.0), solved=float(outcome == 1.0), family=family)
        return r
    except Exception as e:  # noqa: BLE001 - a reward never crashes the training loop
        return error_result(type(e).__name__)
