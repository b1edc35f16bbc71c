"""JSONL import / export of problem sets, validated line by line.

One JSON object per line:
    {"question": "3+4", "answer": "7", "steps": ["3+4=7"], "difficulty": 1, "id": "my-1"}
    question    required, non-empty string
    answer      required, non-empty string (an int is accepted and written as its decimal string)
    steps       optional, list of non-empty strings (or null: no worked solution)
    difficulty  optional, int >= 1 (default 1)
    id          optional, non-empty string (default: source name + question hash)
    source      optional, non-empty string (default: the `source` argument)
    reward      optional, "math" (default), "code" or "instructions" (rl/tasks/base.py)
    check       the reward's payload, a JSON object (required for code / instructions, absent for math)
Any other key is an error (it catches typos such as "anwser"). Blank lines are skipped.

Error policy: reading never drops a malformed line silently. `validate_jsonl(path)` returns
(problems, errors) where each `LineError` names the 1-based line number, the field and the reason;
`read_jsonl(path)` raises a single `JsonlError` listing EVERY bad line (its `.errors` holds them) when there is
at least one, otherwise returns the problems. Whatever a line holds (an integer over Python's 4,300-digit
limit, nesting deeper than the decoder allows, a lone surrogate from a \\ud800 escape, a huge value), it becomes
an error with its line number, never an exception; messages show at most ~80 characters of a value.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable

from rl.tasks.base import Problem, make_id

REQUIRED = ("question", "answer")
OPTIONAL = ("steps", "difficulty", "id", "source", "reward", "check")


@dataclasses.dataclass(frozen=True)
class LineError:
    line: int
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" + (f", field {self.field!r}" if self.field else "")
        return f"{where}: {self.message}"


class JsonlError(ValueError):
    """Raised by read_jsonl with every malformed line; `.errors` is the list of LineError."""

    def __init__(self, path: str, errors: list[LineError]):
        self.path, self.errors = path, errors
        lines = "\n  ".join(str(e) for e in errors)
        super().__init__(f"{path}: {len(errors)} malformed line(s):\n  {lines}")


def _nonempty_str(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _short(value, limit: int = 80) -> str:
    """repr() for an error message: bounded length, and never an exception (deep nesting, huge values)."""
    try:
        text = repr(value)
    except (RecursionError, ValueError, MemoryError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _lone_surrogate(obj) -> tuple[str | None, str] | None:
    """(top-level field, where) of the first string holding a lone surrogate (\\ud800-\\udfff from a JSON
    escape: not Unicode text, it cannot be encoded as UTF-8), or None."""
    stack = [(None, obj)]
    while stack:
        field, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                return field, f"a lone surrogate {value[e.start]!r} at character {e.start}"
        elif isinstance(value, dict):
            for k, v in value.items():
                stack.append((k if field is None else field, k))
                stack.append((k if field is None else field, v))
        elif isinstance(value, list):
            stack.extend((field, v) for v in value)
    return None


def parse_record(obj, line_no: int, source: str) -> tuple[Problem | None, list[LineError]]:
    """One decoded JSON value -> (Problem, []) or (None, errors naming the fields)."""
    if not isinstance(obj, dict):
        return None, [LineError(line_no, None, f"expected a JSON object, got {type(obj).__name__}")]
    bad_text = _lone_surrogate(obj)
    if bad_text is not None:
        return None, [LineError(line_no, bad_text[0], f"contains {bad_text[1]}: not valid Unicode text")]
    errors = []
    for key in obj:
        if key not in REQUIRED + OPTIONAL:
            errors.append(LineError(line_no, key, f"unknown field (allowed: {', '.join(REQUIRED + OPTIONAL)})"))
    for key in REQUIRED:
        if key not in obj:
            errors.append(LineError(line_no, key, "missing required field"))
    question, answer = obj.get("question"), obj.get("answer")
    if "question" in obj and not _nonempty_str(question):
        errors.append(LineError(line_no, "question", f"must be a non-empty string, got {_short(question)}"))
    if isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)
    if "answer" in obj and not _nonempty_str(answer):
        errors.append(LineError(line_no, "answer",
                                f"must be a non-empty string or an int, got {_short(obj['answer'])}"))
    steps = obj.get("steps")
    if steps is not None and not (isinstance(steps, list) and all(_nonempty_str(s) for s in steps)):
        errors.append(LineError(line_no, "steps",
                                f"must be a list of non-empty strings or null, got {_short(steps)}"))
    difficulty = obj.get("difficulty", 1)
    if not isinstance(difficulty, int) or isinstance(difficulty, bool) or difficulty < 1:
        errors.append(LineError(line_no, "difficulty", f"must be an int >= 1, got {_short(difficulty)}"))
    for key in ("id", "source"):
        if key in obj and not _nonempty_str(obj[key]):
            errors.append(LineError(line_no, key, f"must be a non-empty string, got {_short(obj[key])}"))
    if errors:
        return None, errors
    src = obj.get("source", source)
    try:
        # reward and check are validated by Problem itself (the payload by the family's reward module).
        return Problem(id=obj.get("id") or make_id(src, question), question=question, answer=answer,
                       steps=None if steps is None else tuple(steps), difficulty=difficulty, source=src,
                       reward=obj.get("reward", "math"), check=obj.get("check", "")), []
    except ValueError as e:
        field = "reward" if str(e).startswith("Problem.reward") else "check"
        return None, [LineError(line_no, field, str(e))]


def validate_jsonl(path: str, source: str = "jsonl", parse=None) -> tuple[list[Problem], list[LineError]]:
    """All good problems and all errors (line numbers are 1-based; blank lines are skipped).

    parse(obj, line_no, source) -> (Problem | None, [LineError]) reads one decoded line: `parse_record` (this
    module's format) by default; rl/tasks/gsm8k_math.py passes the GSM8K and MATH record readers."""
    parse = parse_record if parse is None else parse
    if not os.path.exists(path):
        raise FileNotFoundError(f"JSONL file not found: {path}")
    problems, errors = [], []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                errors.append(LineError(line_no, None, f"not valid UTF-8 ({e.reason} at byte {e.start})"))
                continue
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                errors.append(LineError(line_no, None, f"invalid JSON: {e.msg} (column {e.colno})"))
                continue
            except ValueError as e:  # e.g. an integer longer than Python's 4,300-digit conversion limit
                errors.append(LineError(line_no, None, f"invalid JSON value: {_short(str(e), 160)} "
                                                       f"(write very long numbers as strings)"))
                continue
            except RecursionError:
                errors.append(LineError(line_no, None, "invalid JSON: nested too deeply"))
                continue
            try:
                problem, errs = parse(obj, line_no, source)
            except Exception as e:  # noqa: BLE001 - a line that breaks the checks is still reported by number
                problem, errs = None, [LineError(line_no, None, f"cannot be read: {type(e).__name__}: "
                                                                f"{_short(str(e), 160)}")]
            errors.extend(errs)
            if problem is not None:
                problems.append(problem)
    return problems, errors


def read_jsonl(path: str, source: str = "jsonl", parse=None) -> list[Problem]:
    """The problems in the file; raises JsonlError listing every malformed line if there is any."""
    problems, errors = validate_jsonl(path, source, parse)
    if errors:
        raise JsonlError(path, errors)
    return problems


def problem_record(p: Problem) -> dict:
    """The JSONL object written for a problem (steps omitted when there are none)."""
    rec = {"id": p.id, "question": p.question, "answer": p.answer}
    if p.steps is not None:
        rec["steps"] = list(p.steps)
    rec["difficulty"] = p.difficulty
    rec["source"] = p.source
    if p.reward != "math":
        rec["reward"] = p.reward
        rec["check"] = p.check_data
    return rec


def write_jsonl(problems: Iterable[Problem], path: str) -> int:
    """Write one JSON object per problem (UTF-8, Chinese kept readable); returns the number written."""
    count = 0
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(problem_record(p), ensure_ascii=False) + "\n")
            count += 1
    return count
