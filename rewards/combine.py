"""The combined reward of one solution, with every component returned for logging.

    from rewards.combine import RewardConfig, score
    r = score("步骤一：3+4=7\\n答案：7", "7", RewardConfig(w_process=0.2))
    r["total"], r["outcome"], r["process"], r["format"], r["error"]

    total = w_outcome   * outcome            outcome: 1.0 when the text has a final answer (extract_answer: an
                                             answer occurrence, or without one the final sentence's one value;
                                             an answer naming several values has none) and
                                             is_equiv(text, gold, literal=True): the verifier reads that same
                                             answer through rewards.parse.answer_candidates, and a gold written as
                                             number literals needs a literal ("34+48" does not state 82) (0.0
                                             without an answer, and 0.0 without reasoning when requires_reasoning
                                             is on)
          + w_process   * process            mean of the non-None step scores of rewards.steps.check_steps
                                             (process_default when no step has a checkable claim)
          + w_format    * format             rewards.format.format_reward(text, lang) in [0, 1], in the layout
                                             format_mode ("steps" or "think_answer")
          - w_overlong  * overlong           DAPO soft overlong magnitude in [0, 1] (off when overlong_max_len=0)
          - w_repetition* repetition         repeated n-gram share above repetition_threshold, in [0, 1]
          - w_language  * language           1 - share of the expected script in the reasoning, in [0, 1]
                                             (always returned, whatever its weight: RL stages can add their own)

The process reward model is a model, not a text function: the trainer scores it in a batched forward beside the
policy (prm/reward.py, a wing above rl/) and adds prm.weight * its score to this total; its settings are the wing's
own config section (prm/config.py: prm.path, prm.weight, prm.agg, prm.steps). The names a stage's prm_calibration
accepts are declared here (PRM_CALIBRATIONS), below the wing, so the stage config (rl/) checks them without
importing the PRM; prm/metrics.py implements them under these names.

Every penalty is stored as a non-negative magnitude and subtracted. score() never raises: any internal
error gives total 0.0 with error=1 (and error_kind) in the returned dict. The length for the overlong penalty
is n_tokens when the caller passes it (the sampler's response length), else the UTF-8 byte length of the
whole text (the byte tokenizer's count).

Cost cap: only the last `max_chars` characters of the text (default 65,536; the final answer is at the end)
reach the parser, the verifier, the step checker, the format check and the penalties; a longer text is scored
on that tail with truncated=1 (its steps before the cut are not seen, so its format order usually fails). This
bounds the cost of one item whatever its length (about 0.2 s for a 1M-character text on one core, most of it
the UTF-8 length), well under the reward pool's 5 s default deadline.

Returned keys (all numbers except step_scores, answer, error_kind and family):
    total outcome correct process format overlong repetition language has_reasoning n_steps n_checked
    step_scores answer length truncated error error_kind solved family
(solved = outcome here, family = "math"; rewards.task_score scores the other task families with the same keys.)
(step_scores and n_steps describe the scored text, i.e. the tail when truncated=1.)
"""
from __future__ import annotations

import dataclasses
import math
import numbers

from rewards import penalties
from rewards.format import LANGS, MODES, FormatConfig, format_reward
from rewards.parse import ANSWER_WINDOW, as_text, extract_answer
from rewards.steps import check_steps, step_score
from rewards.verify import is_equiv
from schema import Checked, boolean, choice, field, integer, num

__all__ = ["RewardConfig", "RewardSection", "RewardWeights", "score", "error_result", "gold_text", "RESULT_KEYS",
           "PRM_CALIBRATIONS"]

PRM_CALIBRATIONS = ("none", "temperature", "platt")  # the maps a PRM checkpoint stores (prm.metrics.calibrate)

MAX_ANSWER_LOG_CHARS = 200  # the answer is returned for logging only; hostile answers are cut


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardConfig(Checked):
    """Weights and switches of the combined reward (seed practice: w_process 0.1-0.3 when on, w_format 0.05-0.1).
    Each field carries its default, doc and range check (schema/).

    w_format defaults to 0: under std-normalised GRPO (scale_by_std) a format term's small differences inside a
    group whose answers are all wrong become advantages as large as a right answer's (docs/rewards.md)."""

    w_outcome: float = field(1.0, "weight of the verified final answer (0/1)", num(0.0, 100.0))
    w_process: float = field(0.0, "weight of the mean step score (rule-checked arithmetic); 0 = off", num(0.0, 100.0))
    w_format: float = field(0.0, "weight of the format reward in [0, 1]; 0 = off (std-normalised GRPO inflates it)",
                            num(0.0, 100.0))
    lang: str = field("zh", "expected solution language: \"zh\" (步骤一：/答案：) or \"en\" (Step 1:/Answer:)",
                      choice(*LANGS))
    format_mode: str = field("steps", "format layout: \"steps\" (markers + answer line) or \"think_answer\" "
                                      "(<think>/<answer>)", choice(*MODES))
    accept_boxed: bool = field(True, "a \\boxed{} answer satisfies the format's final-answer marker", boolean)
    overlong_max_len: int = field(0, "DAPO overlong: hard length (tokens); 0 = penalty off", integer(0, 10**7))
    overlong_buffer: int = field(0, "DAPO overlong: soft buffer before overlong_max_len (tokens)", integer(0, 10**7))
    w_overlong: float = field(1.0, "weight of the overlong magnitude (only used when overlong_max_len > 0)",
                              num(0.0, 100.0))
    w_repetition: float = field(0.0, "weight of the repetition magnitude; 0 = off", num(0.0, 100.0))
    repetition_n: int = field(4, "n-gram size for the repetition share", integer(1, 10**4))
    repetition_threshold: float = field(0.3, "repeated share tolerated before the penalty starts", num(0.0, 0.99))
    w_language: float = field(0.0, "weight of the language-mixing penalty (1 - expected-script share); 0 = off",
                              num(0.0, 100.0))
    requires_reasoning: bool = field(False, "outcome reward only when the solution has >= min_reasoning_steps steps",
                                     boolean)
    min_reasoning_steps: int = field(1, "steps needed to count as a reasoning process", integer(1, 10**4))
    process_default: float = field(0.0, "process score when no step has a checkable claim", num(0.0, 1.0))
    verify_timeout: float = field(1.0, "seconds per is_equiv call", num(1e-3, 600.0))
    max_chars: int = field(65_536, "only the last max_chars characters are scored (cost cap); longer -> truncated=1",
                           integer(1000, 10**9))

    def cross_checks(self):
        if self.overlong_buffer > self.overlong_max_len:
            yield "overlong_buffer", f"({self.overlong_buffer}) must be <= overlong_max_len ({self.overlong_max_len})"


def _section_lang(v) -> str | None:
    return None if v in ("", *LANGS) else f"must be '' (= tasks.lang), en or zh, got {v!r}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardSection(RewardConfig):
    """A run config's reward section: RewardConfig's fields, with lang "" (its default) following tasks.lang, so one
    language setting drives the prompts and the reward."""

    lang: str = field("", "expected solution language (zh | en); '' = tasks.lang", _section_lang)

    def resolve(self, tasks_lang: str) -> RewardConfig:
        """The RewardConfig the reward workers score with."""
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(RewardConfig)}
        return RewardConfig(**{**kw, "lang": self.lang or tasks_lang})


RewardWeights = RewardConfig  # the name the team contract also uses


RESULT_KEYS = ("total", "outcome", "correct", "process", "format", "overlong", "repetition", "language",
               "has_reasoning", "n_steps", "n_checked", "step_scores", "answer", "length", "truncated", "error",
               "error_kind", "solved", "family")


def error_result(kind: str = "error") -> dict:
    """The result of an item that could not be scored: every number 0, error=1."""
    return {"total": 0.0, "outcome": 0.0, "correct": 0.0, "process": 0.0, "format": 0.0, "overlong": 0.0,
            "repetition": 0.0, "language": 0.0, "has_reasoning": 0.0, "n_steps": 0, "n_checked": 0,
            "step_scores": [], "answer": None, "length": 0, "truncated": 0, "error": 1, "error_kind": str(kind),
            "solved": 0.0, "family": ""}


_DEFAULT = RewardConfig()


def gold_text(gold) -> str:
    """The gold answer as text: numbers (7, 0.5, Fraction(1, 2)) via str, bytes decoded, anything else ""."""
    if isinstance(gold, numbers.Number) and not isinstance(gold, bool):
        return str(gold)
    return as_text(gold)


def score(text, gold, cfg: RewardConfig | None = None, *, n_tokens=None) -> dict:
    """All reward components of one (solution text, gold answer) pair; see the module docstring."""
    try:
        cfg = _DEFAULT if cfg is None else cfg
        text = as_text(text)
        gold = gold_text(gold)
        length = penalties.text_length(text) if n_tokens is None else int(n_tokens)
        truncated = len(text) > cfg.max_chars
        if truncated:
            text = text[-cfg.max_chars:]  # the cost cap: nothing below sees more (the answer is at the end)
        answer = extract_answer(text)
        correct = bool(answer is not None and gold
                       and is_equiv(text[-ANSWER_WINDOW:], gold, timeout=cfg.verify_timeout, literal=True))
        reasoning = penalties.has_reasoning(text, cfg.min_reasoning_steps)
        outcome = 1.0 if correct and (reasoning or not cfg.requires_reasoning) else 0.0

        step_scores = check_steps(text)
        mean_step = step_score(step_scores)
        process = cfg.process_default if mean_step is None else float(mean_step)

        fmt = format_reward(text, cfg.lang, FormatConfig(accept_boxed=cfg.accept_boxed, mode=cfg.format_mode))
        overlong = (penalties.overlong_penalty(length, cfg.overlong_max_len, cfg.overlong_buffer)
                    if cfg.overlong_max_len > 0 else 0.0)
        repetition = (penalties.repetition_penalty(text, cfg.repetition_n, cfg.repetition_threshold)
                      if cfg.w_repetition > 0 else 0.0)
        language = penalties.language_penalty(text, cfg.lang)  # always measured: a stage may weight it (rl.stages)

        total = (cfg.w_outcome * outcome + cfg.w_process * process + cfg.w_format * fmt
                 - cfg.w_overlong * overlong - cfg.w_repetition * repetition - cfg.w_language * language)
        if not math.isfinite(total):
            return error_result("non-finite total")
        return {
            "total": float(total), "outcome": outcome, "correct": float(correct), "process": process,
            "format": float(fmt), "overlong": float(overlong), "repetition": float(repetition),
            "language": float(language), "has_reasoning": float(reasoning), "n_steps": len(step_scores),
            "n_checked": sum(1 for s in step_scores if s is not None), "step_scores": list(step_scores),
            "answer": None if answer is None else answer[:MAX_ANSWER_LOG_CHARS], "length": length,
            "truncated": int(truncated), "error": 0, "error_kind": "", "solved": outcome, "family": "math",
        }
    except Exception as e:  # noqa: BLE001 - a reward never crashes the training loop
        return error_result(f"{type(e).__name__}")
