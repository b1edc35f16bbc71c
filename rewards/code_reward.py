"""The code reward: take the program out of a model response and score it on hidden tests in the sandbox.

    from rewards.code_reward import code_score, extract_code
    check = {"func": "add", "tests": [[[1, 2], 3], [[0, 0], 0]]}
    extract_code("Step 1: ...\\n```python\\ndef add(a, b):\\n    return a + b\\n```\\nAnswer: add")  # the def
    code_score(response, check)        # share of hidden tests passed, in [0, 1]
    code_score_detailed(response, check)["error"]   # "" or why the score is 0 (no code, too long, ...)

`check` is a code problem's payload (`Problem.check` of the `code` source in rl/tasks/code.py, a dict or its
JSON text): "func" names the function to call, "tests" lists hidden cases [args, expected] with args a list of
JSON values and expected a JSON value. Scoring goes through the sandbox's value-based API,
`rewards.code_exec.run_function_tests`: the candidate's function runs in an isolated process, its return values
come back as JSON and are compared with `expected` on the trusted side. Model text is never executed here.

Response format: the program is the LAST fenced block tagged python / py / python3 (```python ... ```, also
with ~~~ fences); without a tagged block, the last untagged fenced block. A block left unclosed at the end of
the response (a truncated generation) runs to the end of the text. No fenced block, or a response longer than
MAX_RESPONSE_CHARS, scores 0.0 (with `error` set in the detailed result). Never raises.
"""
from __future__ import annotations

import json
import keyword
import re

from rewards.code_exec import ExecConfig, run_function_tests_detailed
from rewards.parse import as_text

__all__ = ["MAX_RESPONSE_CHARS", "MAX_TESTS", "EXEC_CONFIG", "extract_code", "parse_check", "code_score",
           "code_score_detailed"]

EXEC_CONFIG = ExecConfig()  # the sandbox's limits when no cfg is given (score_task's code family; the reward pool's
                            # deadline covers rewards.code_exec.wall_limit_s of these: rl/setup.reward_deadline)

MAX_RESPONSE_CHARS = 50_000  # longer responses are not scored (degenerate output); the sandbox caps code too
MAX_TESTS = 200  # hidden cases per problem
_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})[ \t]*([A-Za-z0-9_+.-]*)[^\n]*$", re.MULTILINE)
_PYTHON_TAGS = ("python", "py", "python3")


def extract_code(text) -> str | None:
    """The program in a response (see the module docstring), or None when there is no fenced block."""
    try:
        text = as_text(text)
        if len(text) > MAX_RESPONSE_CHARS:
            return None
        blocks = []  # (is_python, code)
        opening = None  # (fence, tag, content start)
        for m in _FENCE.finditer(text):
            fence, tag = m.group(1), m.group(2).lower()
            if opening is None:
                opening = (fence, tag, m.end() + 1)
            elif fence[0] == opening[0][0] and len(fence) >= len(opening[0]) and not tag:
                # A closing fence: the same character, at least as long, nothing after it.
                blocks.append((opening[1] in _PYTHON_TAGS, opening[1], text[opening[2]:m.start()]))
                opening = None
        if opening is not None:
            blocks.append((opening[1] in _PYTHON_TAGS, opening[1], text[opening[2]:]))
        tagged = [code for is_py, _, code in blocks if is_py]
        untagged = [code for is_py, tag, code in blocks if not is_py and not tag]
        chosen = tagged or untagged
        if not chosen or not chosen[-1].strip():
            return None
        return chosen[-1].rstrip() + "\n"
    except Exception:  # noqa: BLE001 - never raise on model text
        return None


def parse_check(check) -> tuple[str, tuple]:
    """(function name, hidden cases) of a code payload (dict or JSON text). Raises ValueError naming what is
    wrong; used when a problem is built (trusted data) and, guarded, when scoring."""
    if isinstance(check, str):
        try:
            check = json.loads(check)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"code check is not valid JSON: {e}") from None
    if not isinstance(check, dict):
        raise ValueError(f"code check must be a dict with 'func' and 'tests', got {type(check).__name__}")
    func = check.get("func")
    if not isinstance(func, str) or not func.isidentifier() or keyword.iskeyword(func):
        raise ValueError(f"code check 'func' must be a Python identifier, got {func!r}")
    tests = check.get("tests")
    if not isinstance(tests, (list, tuple)) or not 1 <= len(tests) <= MAX_TESTS:
        raise ValueError(f"code check 'tests' must be a list of 1..{MAX_TESTS} [args, expected] cases, got {tests!r}"[:300])
    cases = []
    for i, case in enumerate(tests):
        if not (isinstance(case, (list, tuple)) and len(case) == 2 and isinstance(case[0], (list, tuple))):
            raise ValueError(f"code check test {i} must be [args (a list), expected], got {case!r}"[:300])
        try:
            json.dumps(case, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"code check test {i} is not plain JSON: {e}") from None
        cases.append((list(case[0]), case[1]))
    return func, tuple(cases)


def code_score_detailed(text, check, cfg: ExecConfig | None = None) -> dict:
    """{"score", "passed" (per test), "extracted" (bool), "error" (str)}. Never raises."""
    try:
        func, cases = parse_check(check)
    except Exception as e:  # noqa: BLE001 - a malformed payload scores 0 with the reason
        return {"score": 0.0, "passed": [], "extracted": False, "error": f"bad check: {e}"[:300]}
    text = as_text(text)
    if len(text) > MAX_RESPONSE_CHARS:
        return {"score": 0.0, "passed": [False] * len(cases), "extracted": False, "error": "too long"}
    code = extract_code(text)
    if code is None:
        return {"score": 0.0, "passed": [False] * len(cases), "extracted": False, "error": "no code block"}
    try:
        res = run_function_tests_detailed(code, func, cases, cfg or EXEC_CONFIG)
        passed = [bool(p) for p in res.passed] or [False] * len(cases)
        score = float(res.fraction)
        score = min(1.0, max(0.0, score)) if score == score else 0.0
        return {"score": score, "passed": passed, "extracted": True, "error": res.error or ""}
    except Exception as e:  # noqa: BLE001
        return {"score": 0.0, "passed": [False] * len(cases), "extracted": True,
                "error": f"sandbox: {type(e).__name__}"}


def code_score(text, check, cfg: ExecConfig | None = None) -> float:
    """Share of the hidden tests the response's program passes, in [0, 1]. Never raises."""
    return code_score_detailed(text, check, cfg)["score"]
