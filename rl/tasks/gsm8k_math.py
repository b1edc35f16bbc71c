"""GSM8K- and MATH-style JSONL files as problem sources, read line by line with numbered errors.

    gsm8k@PATH   one JSON object per line: {"question": ..., "answer": "<reasoning lines>\\n#### 72"}
                 (the layout of GSM8K's train.jsonl / test.jsonl). answer = the text after the last "####",
                 thousands separators dropped ("#### 1,200" -> "1200"); steps = the reasoning lines with the
                 calculator notes <<48/2=24>> removed; difficulty 1.
    math@PATH    {"problem": ..., "solution": "... \\boxed{\\frac{1}{2}}.", "level": "Level 3", "type": ...} (the
                 MATH / MATH-500 layout). answer = the content of the last \\boxed{} (or \\fbox{}) of the
                 solution, read by the reward's own extractor (rewards.parse), else the record's "answer" field
                 when it has one; difficulty = the level's digit ("Level 3" or 3; a level without a digit, as in
                 MATH's two "Level ?" records, counts as 1); steps None (the solution is prose).
Other keys of a record (type, subject, unique_id, ...) are ignored: dataset dumps carry various extra columns.
A record without its required fields, or without a final answer, is an error naming the line and the field;
`read(path, kind)` raises rl.tasks.jsonl_io.JsonlError listing every such line (nothing is dropped silently).

Official splits: each file is one split of its dataset. Give the official test file as the test set with
`tasks.test_source = "gsm8k@.../test.jsonl"` and the train file as `tasks.mix` (train and validation are then
drawn from it by question hash, 8/9 and 1/9), or every split its own file (docs/tasks.md, "Explicit splits").
The same field mapping serves the TFDS catalog datasets huggingface:gsm8k and competition_math
(rl/tasks/tfds_builder.py).
"""
from __future__ import annotations

import re

from rewards.parse import answer_value, find_answer_markers
from rl.tasks.base import Problem, make_id
from rl.tasks.jsonl_io import LineError, _lone_surrogate, _nonempty_str, _short, read_jsonl

KINDS = ("gsm8k", "math")
_GSM8K_CALC = re.compile(r"<<[^<>]*>>")


def gsm8k_to_fields(question: str, answer_text: str) -> tuple[str, str, tuple[str, ...] | None]:
    """(question, final answer, reasoning steps) of a GSM8K record; ValueError when there is no '#### answer'."""
    reasoning, sep, final = answer_text.rpartition("####")
    answer = final.strip().replace(",", "")
    if not sep or not answer:
        raise ValueError(f"has no final answer after '####': {_short(answer_text[-80:])}")
    steps = tuple(line.strip() for line in _GSM8K_CALC.sub("", reasoning).splitlines() if line.strip())
    return question.strip(), answer, steps or None


def last_boxed(solution: str) -> str | None:
    """The cleaned content of the last \\boxed{...} / \\fbox{...} of a solution (nested braces kept), or None.
    The same reading the reward applies to a model's boxed answer (rewards.parse)."""
    boxes = [m for m in find_answer_markers(solution) if m.kind == "boxed" and m.vstart >= 0]
    for m in reversed(boxes):
        value = answer_value(solution, m)
        if value:
            return value
    return None


def math_level(level) -> int:
    """'Level 3' or 3 -> 3 (clamped to 1..5); no digit ('Level ?', missing) -> 1."""
    if isinstance(level, int) and not isinstance(level, bool):
        return min(5, max(1, level))
    m = re.search(r"\d+", level if isinstance(level, str) else "")
    return min(5, max(1, int(m.group()))) if m else 1


def math_to_fields(problem: str, solution: str, level, answer=None) -> tuple[str, str, int]:
    """(problem, final answer, difficulty) of a MATH record; ValueError when no answer can be read."""
    final = last_boxed(solution)
    if final is None and _nonempty_str(answer):
        final = answer.strip()
    if not final:
        raise ValueError(f"has no \\boxed{{}} final answer (and no 'answer' field): {_short(solution[-80:])}")
    return problem.strip(), final, math_level(level)


def _required(obj, line_no: int, names) -> list[LineError]:
    if not isinstance(obj, dict):
        return [LineError(line_no, None, f"expected a JSON object, got {type(obj).__name__}")]
    bad_text = _lone_surrogate(obj)
    if bad_text is not None:
        return [LineError(line_no, bad_text[0], f"contains {bad_text[1]}: not valid Unicode text")]
    errors = []
    for key in names:
        if key not in obj:
            errors.append(LineError(line_no, key, "missing required field"))
        elif not _nonempty_str(obj[key]):
            errors.append(LineError(line_no, key, f"must be a non-empty string, got {_short(obj[key])}"))
    return errors


def parse_gsm8k(obj, line_no: int, source: str):
    """One GSM8K record -> (Problem, []) or (None, errors naming the fields)."""
    errors = _required(obj, line_no, ("question", "answer"))
    if errors:
        return None, errors
    try:
        q, a, steps = gsm8k_to_fields(obj["question"], obj["answer"])
    except ValueError as e:
        return None, [LineError(line_no, "answer", str(e))]
    return Problem(id=make_id(source, q), question=q, answer=a, steps=steps, difficulty=1, source=source), []


def parse_math(obj, line_no: int, source: str):
    """One MATH record -> (Problem, []) or (None, errors naming the fields)."""
    errors = _required(obj, line_no, ("problem", "solution"))
    if errors:
        return None, errors
    level = obj.get("level")
    if isinstance(level, bool) or (level is not None and not isinstance(level, (str, int))):
        return None, [LineError(line_no, "level", f"must be a string like 'Level 3' or an int, got {_short(level)}")]
    try:
        q, a, d = math_to_fields(obj["problem"], obj["solution"], level, obj.get("answer"))
    except ValueError as e:
        return None, [LineError(line_no, "solution", str(e))]
    return Problem(id=make_id(source, q), question=q, answer=a, steps=None, difficulty=d, source=source), []


_PARSERS = {"gsm8k": parse_gsm8k, "math": parse_math}


def read(path: str, kind: str, source: str | None = None) -> list[Problem]:
    """Every problem of a GSM8K (kind "gsm8k") or MATH (kind "math") JSONL file, in file order; JsonlError
    listing every malformed line otherwise."""
    if kind not in _PARSERS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return read_jsonl(path, source or f"{kind}@{path}", parse=_PARSERS[kind])
