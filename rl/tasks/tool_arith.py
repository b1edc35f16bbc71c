"""Multiplication the tiny policy cannot do in its head, with gold solutions that ask the Python tool.

    tool_mul   a*b with 3-4 digit factors; gold: "Step 1: <py>print(a*b)</py><out>c\n</out>" then "Answer: c"
    mul_cols   the same problems (same generator draws), gold: partial products in columns (the no-tool arm)

The tool markers are the byte tokenizer's (rewards/python_tool.byte_markers, docs/tools.md); the demonstration's
output block is what rewards.python_tool.PythonTool returns for that call, so a cold start on tool_mul shows the
policy the exact trajectory the tool rollout (rl/tool_rollout.py) produces. Difficulty = factor digits:
1: 3x2, 2: 3x3, 3: 4x3, 4 and 5: 4x4.
"""
from __future__ import annotations

import random

from rewards.python_tool import byte_markers
from rl.tasks.arith import _rand_digits, multiplication_steps
from rl.tasks.base import GeneratedSource

DIGITS = {1: (3, 2), 2: (3, 3), 3: (4, 3), 4: (4, 4), 5: (4, 4)}


def _factors(rng: random.Random, difficulty: int) -> tuple[int, int]:
    da, db = DIGITS[difficulty]
    return _rand_digits(rng, da), _rand_digits(rng, db)


def tool_step(a: int, b: int) -> str:
    """The one tool-using step: the call and the output block the Python tool returns for it."""
    m = byte_markers()
    return f"{m.call_start}print({a}*{b}){m.call_end}{m.out_start}{a * b}\n{m.out_end}"


def make_tool_mul(rng: random.Random, difficulty: int):
    a, b = _factors(rng, difficulty)
    return f"{a}*{b}", str(a * b), [tool_step(a, b)]


def make_mul_cols(rng: random.Random, difficulty: int):
    a, b = _factors(rng, difficulty)
    return f"{a}*{b}", str(a * b), multiplication_steps(a, b)


TOOL_MUL = GeneratedSource("tool_mul", make_tool_mul,
                           description="3-4 digit multiplication; gold solutions call the Python tool (<py>...</py>)")
MUL_COLS = GeneratedSource("mul_cols", make_mul_cols,
                           description="tool_mul's problems with partial-product column solutions (no tool)")
SOURCES = (TOOL_MUL, MUL_COLS)
