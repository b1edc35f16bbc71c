"""Format reward: does a solution follow the expected layout?

    format_reward(text, lang="zh", cfg=None) -> float in [0, 1]
    format_components(text, lang="zh", cfg=None) -> dict of the four components (each 0 or 1) and the total

Two layouts, chosen by FormatConfig.mode (RewardConfig.format_mode):

mode="steps" (default; what rl.tasks.render.render_solution writes):
    zh: 步骤一：…\\n步骤二：…\\n答案：x          (步骤1：, 第一步：, 最终答案：, 答： also accepted)
    en: Step 1: …\\nStep 2: …\\nAnswer: x       (Step 1., Final Answer:, and, with accept_boxed, \\boxed{x})
  steps    at least `min_steps` step markers of the expected language (and, unless allow_preamble, nothing
           but whitespace before the first one)
  order    the markers are numbered 1, 2, ..., n in order, all in the expected language's style
  answer   exactly one final-answer marker of an accepted kind, with a non-empty value
           ("Answer: \\boxed{5}" is one marker: a box on the answer line belongs to it)
  end      that answer comes after the last step (a box may end the last step itself) and nothing but
           whitespace and closing punctuation ($ . 。) follows its value

mode="think_answer" (DeepSeek-R1 style): <think> reasoning </think> <answer> x </answer>
  steps    a non-empty reasoning block that ends at </think>; the opening <think> may be missing (chat
           templates often put it in the prompt) but, when present, nothing but whitespace comes before it
  order    the tags are well formed: at most one <think> (first), exactly one </think>, then exactly one
           <answer> ... </answer> pair, with only whitespace between </think> and <answer>
  answer   the <answer> block has a non-empty value
  end      nothing but whitespace follows </answer>
  (min_steps, allow_preamble and accept_boxed apply to mode="steps" only; lang is still validated.)

The total is the weighted sum of the four components (weights in FormatConfig, summing to 1); the keys are the
same in both modes. Never raises on model text: non-text input scores 0.
"""
from __future__ import annotations

import bisect
import dataclasses
import re

from rewards.parse import answer_value, as_text, find_answer_markers, is_answer_line, parse_steps

__all__ = ["FormatConfig", "format_components", "format_reward", "LANGS", "MODES"]

LANGS = ("zh", "en")
MODES = ("steps", "think_answer")
_TRAILING_OK = re.compile(r"[\s$.。]*\Z")
_TAGS = re.compile(r"<(/?)(think|answer)>", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FormatConfig:
    """Weights and switches of the format reward."""

    w_steps: float = 0.25  # step markers present
    w_order: float = 0.25  # numbered 1..n in order, expected style
    w_answer: float = 0.25  # exactly one final-answer marker with a value
    w_end: float = 0.25  # answer at the end, nothing after it
    min_steps: int = 1  # fewest step markers that count as "present"
    accept_boxed: bool = True  # a \boxed{} / \fbox{} value may serve as the final answer marker
    allow_preamble: bool = True  # text before the first step marker is allowed
    mode: str = "steps"  # "steps" (步骤一：… 答案：x / Step 1: … Answer: x) or "think_answer" (<think>…</think><answer>…</answer>)

    def __post_init__(self):
        for name in ("w_steps", "w_order", "w_answer", "w_end"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
                raise ValueError(f"FormatConfig.{name} must be a number in [0, 1], got {v!r}")
        total = self.w_steps + self.w_order + self.w_answer + self.w_end
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"FormatConfig weights w_steps+w_order+w_answer+w_end must sum to 1, got {total}")
        if not isinstance(self.min_steps, int) or isinstance(self.min_steps, bool) or self.min_steps < 1:
            raise ValueError(f"FormatConfig.min_steps must be an int >= 1, got {self.min_steps!r}")
        for name in ("accept_boxed", "allow_preamble"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FormatConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.mode not in MODES:
            raise ValueError(f"FormatConfig.mode must be one of {MODES}, got {self.mode!r}")


_DEFAULT = FormatConfig()
_ANSWER_LANGS = {"zh": ("zh", "zh_is"), "en": ("en", "en_is")}


def _final_answers(text: str, lang: str, cfg: FormatConfig, markers):
    """Final-answer markers that count for the format: answer lines, plus boxes not on an answer line.
    Returns [(marker, whether it is of an accepted kind)] in order."""
    line_starts = [m.start for m in markers if is_answer_line(m)]
    newlines = [i for i, c in enumerate(text) if c == "\n"] if any(m.kind == "boxed" for m in markers) else []
    out = []
    for m in markers:
        if m.kind == "line":
            if is_answer_line(m):
                out.append((m, m.lang in _ANSWER_LANGS[lang]))
            continue
        # A box on the same line as (after) an answer-line marker is that line's value, not a second answer.
        j = bisect.bisect_left(newlines, m.start)  # the line of the box starts after newlines[j - 1]
        line_start = newlines[j - 1] + 1 if j > 0 else 0
        k = bisect.bisect_left(line_starts, m.start)  # nearest answer line starting before the box
        if k > 0 and line_starts[k - 1] >= line_start:
            continue
        out.append((m, cfg.accept_boxed))
    return out


def _answer_value_end(text: str, marker) -> int:
    """End of the answer including a box on its line: for "Answer: \\boxed{5}" the closing brace."""
    if marker.kind == "boxed":
        return marker.vend + 1 if marker.vstart >= 0 else len(text)
    line_end = text.find("\n", marker.vstart)
    return len(text) if line_end < 0 else line_end


def _think_answer_components(text: str) -> tuple[float, float, float, float]:
    """(steps, order, answer, end) of mode="think_answer" (see the module docstring)."""
    tags = [(m.start(), m.end(), ("/" if m.group(1) else "") + m.group(2).lower()) for m in _TAGS.finditer(text)]
    opens = [t for t in tags if t[2] == "think"]
    closes = [t for t in tags if t[2] == "/think"]
    answer_tags = [t for t in tags if t[2] in ("answer", "/answer")]
    lead_ok = not opens or not text[:opens[0][0]].strip()
    c_steps = c_order = c_answer = c_end = 0.0
    if closes:
        close = closes[0]
        block_start = opens[0][1] if opens and opens[0][0] < close[0] else 0
        c_steps = float(lead_ok and bool(text[block_start:close[0]].strip()))
        c_order = float(
            len(closes) == 1 and len(opens) <= 1 and lead_ok and (not opens or opens[0][0] < close[0])
            and [t[2] for t in answer_tags] == ["answer", "/answer"] and answer_tags[0][0] >= close[1]
            and not text[close[1]:answer_tags[0][0]].strip())
    if answer_tags and answer_tags[-1][2] == "/answer" and len(answer_tags) >= 2 and answer_tags[-2][2] == "answer":
        value = text[answer_tags[-2][1]:answer_tags[-1][0]]
        c_answer = float(bool(value.strip()))
        c_end = float(c_answer > 0 and not text[answer_tags[-1][1]:].strip())
    return c_steps, c_order, c_answer, c_end


def _steps_components(text: str, lang: str, cfg: FormatConfig) -> tuple[float, float, float, float]:
    """(steps, order, answer, end) of mode="steps" (see the module docstring)."""
    steps = parse_steps(text)
    own = [s for s in steps if s.style == lang]
    preamble_ok = cfg.allow_preamble or not steps or not text[: steps[0].start].strip()
    c_steps = float(len(own) >= cfg.min_steps and preamble_ok)
    c_order = float(bool(steps) and len(own) == len(steps)
                    and [s.number for s in steps] == list(range(1, len(steps) + 1)))
    markers = [m for m in find_answer_markers(text) if m.kind != "tag"]
    boxes_all = [m for m in markers if m.kind == "boxed"]
    answers = _final_answers(text, lang, cfg, markers)
    c_answer = c_end = 0.0
    if len(answers) == 1:
        marker, accepted = answers[0]
        has_value = answer_value(text, marker) is not None
        if marker.kind == "line" and not has_value:
            # "Answer: \boxed{5}": the line value is the box; its value is the answer.
            boxes = [m for m in boxes_all if m.start >= marker.start]
            has_value = bool(boxes) and answer_value(text, boxes[0]) is not None
        c_answer = float(accepted and has_value)
        # A box may close the last step ("Step 2: so x = \boxed{5}"); an answer line must follow the steps.
        after_steps = marker.kind == "boxed" or not steps or marker.start >= steps[-1].end
        end = _answer_value_end(text, marker)
        if marker.kind == "line":
            boxes = [m for m in boxes_all if marker.start < m.start < end]
            if boxes and boxes[-1].vstart >= 0:
                end = max(end, boxes[-1].vend + 1)
        c_end = float(c_answer > 0 and after_steps and _TRAILING_OK.match(text, end) is not None)
    return c_steps, c_order, c_answer, c_end


def format_components(text, lang: str = "zh", cfg: FormatConfig | None = None) -> dict:
    """The four 0/1 components and their weighted total (see module docstring)."""
    zero = {"steps": 0.0, "order": 0.0, "answer": 0.0, "end": 0.0, "total": 0.0}
    try:
        cfg = _DEFAULT if cfg is None else cfg
        if lang not in LANGS:
            raise ValueError(f"format_reward: lang must be one of {LANGS}, got {lang!r}")
        text = as_text(text)
        if cfg.mode == "think_answer":
            c_steps, c_order, c_answer, c_end = _think_answer_components(text)
        else:
            c_steps, c_order, c_answer, c_end = _steps_components(text, lang, cfg)
        total = cfg.w_steps * c_steps + cfg.w_order * c_order + cfg.w_answer * c_answer + cfg.w_end * c_end
        return {"steps": c_steps, "order": c_order, "answer": c_answer, "end": c_end,
                "total": float(min(1.0, max(0.0, total)))}
    except ValueError:
        raise
    except Exception:  # noqa: BLE001 - never raise on model text
        return zero


def format_reward(text, lang: str = "zh", cfg: FormatConfig | None = None) -> float:
    """Format score in [0, 1] (weighted components, see module docstring). Raises only for a bad `lang`
    (a configuration error, not a model-text error)."""
    return format_components(text, lang, cfg)["total"]
