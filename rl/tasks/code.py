"""Code problems: small function-writing tasks with hidden tests, scored in the sandbox (rewards.code_reward).

    from rl.tasks import load_mix, render_prompt, render_solution
    p = load_mix("code", n=1, seed=0, split="train")[0]
    p.reward          # "code"
    p.answer          # the gold solution, Python source that passes every hidden test
    p.check_data      # {"func": ..., "tests": [[args, expected], ...], "prompt": {"zh", "en"}, "plan": {...}, ...}
    render_prompt(p, "en")   # statement with the signature, two examples, and the ```python block request

Each problem comes from a template (a function name, a signature, a statement and a plan in zh and en, a gold
solution and an independent reference implementation) and a few parameters drawn from the seed, e.g.
"`scale_add(x: int) -> int` returns x multiplied by 3, plus 7". The question (what the split hash and dedup
see) is the English statement with the signature and WITHOUT examples, so one task is one problem whatever
examples and hidden tests a draw shows; its two examples and its hidden tests are fresh inputs, the tests
distinct from the examples, their expected values computed by the reference implementation (the gold source
is a separate implementation, so the tests cross-check the two).

Difficulty levels pick the templates:
  1  arithmetic helpers        scale_add, clamp, is_multiple, last_digits, round_down
  2  string manipulations      count_char, repeat_chars, remove_char, pad_left, every_kth
  3  list manipulations        sum_multiples, count_above, scale_list, clip_list, running_total
  4  tiny number algorithms    digit_sum_base, gcd_with, fib_mod, to_base, power_mod
  5  tiny sequence algorithms  run_length, most_common, longest_run_above, rotate_right, count_pair_sums,
                               balanced
Every argument and return value is a JSON value (int, bool, str, list), as the sandbox's value-based API needs.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import string
from typing import Callable

from rl.tasks.base import GeneratedSource

N_EXAMPLES = 2  # shown in the prompt
N_TESTS = 8  # hidden


@dataclasses.dataclass(frozen=True)
class Template:
    """One task shape. `params(rng)` draws its parameters; `inputs(rng, p)` one argument list; `ref(p, *args)`
    the expected value; `en`/`zh` the statement after the signature; `plan_en`/`plan_zh` the one-step plan of the
    gold solution; `gold(p)` its Python source; `edge` argument lists always among the hidden tests."""

    func: str
    sig: str
    params: Callable
    inputs: Callable
    ref: Callable
    en: Callable
    zh: Callable
    plan_en: Callable
    plan_zh: Callable
    gold: Callable
    edge: tuple = ()


def _ints(rng, n, lo, hi):
    return [rng.randint(lo, hi) for _ in range(n)]


def _word(rng, alphabet, lo, hi):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def _round_down(p, x):
    return next(m for m in range(x, x - p["k"], -1) if m % p["k"] == 0)


def _to_base(n, b):
    digits = []
    while n:
        n, r = divmod(n, b)
        digits.append(str(r))
    return "".join(reversed(digits)) or "0"


def _fib_mod(n, m):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % m
    return a % m


def _run_length(p, s):
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f"{s[i]}{j - i}" if p["order"] == "char_count" else f"{j - i}{s[i]}")
        i = j
    return "".join(out)


def _most_common(p, xs):
    if not xs:
        return None
    counts = {x: xs.count(x) for x in xs}
    best = max(counts.values())
    tied = [x for x in counts if counts[x] == best]
    return min(tied) if p["tie"] == "smallest" else max(tied)


def _longest_run(p, xs):
    best = cur = 0
    for x in xs:
        cur = cur + 1 if x > p["t"] else 0
        best = max(best, cur)
    return best


def _balanced(p, s):
    pairs = dict(zip(p["pairs"][1::2], p["pairs"][0::2]))
    stack = []
    for c in s:
        if c in p["pairs"][0::2]:
            stack.append(c)
        elif c in pairs:
            if not stack or stack[-1] != pairs[c]:
                return False
            stack.pop()
    return not stack


_LETTERS = "abcde"  # small alphabets make repeats (and therefore interesting cases) likely

TEMPLATES: dict[int, tuple[Template, ...]] = {
    1: (
        Template(
            "scale_add", "scale_add(x: int) -> int",
            lambda rng: {"k": rng.randint(2, 9), "c": rng.randint(1, 20)},
            lambda rng, p: [rng.randint(-50, 50)],
            lambda p, x: x * p["k"] + p["c"],
            lambda p: f"returns x multiplied by {p['k']}, plus {p['c']}.",
            lambda p: f"返回 x 乘以 {p['k']} 再加 {p['c']} 的结果。",
            lambda p: f"Multiply x by {p['k']}, then add {p['c']}.",
            lambda p: f"先把 x 乘以 {p['k']}，再加 {p['c']}。",
            lambda p: f"def scale_add(x):\n    y = {p['k']} * x\n    return y + {p['c']}\n",
            ([0],)),
        Template(
            "clamp", "clamp(x: int) -> int",
            lambda rng: (lambda lo: {"lo": lo, "hi": lo + rng.randint(1, 30)})(rng.randint(-20, 20)),
            lambda rng, p: [rng.randint(p["lo"] - 15, p["hi"] + 15)],
            lambda p, x: min(max(x, p["lo"]), p["hi"]),
            lambda p: f"returns x limited to the range from {p['lo']} to {p['hi']} (inclusive): values below "
                      f"{p['lo']} become {p['lo']}, values above {p['hi']} become {p['hi']}.",
            lambda p: f"把 x 限制在 {p['lo']} 到 {p['hi']} 之间（含两端）：小于 {p['lo']} 的返回 {p['lo']}，"
                      f"大于 {p['hi']} 的返回 {p['hi']}，其余原样返回。",
            lambda p: f"Compare x with both bounds {p['lo']} and {p['hi']}.",
            lambda p: f"把 x 分别与下界 {p['lo']} 和上界 {p['hi']} 比较。",
            lambda p: (f"def clamp(x):\n    if x < {p['lo']}:\n        return {p['lo']}\n"
                       f"    if x > {p['hi']}:\n        return {p['hi']}\n    return x\n")),
        Template(
            "is_multiple", "is_multiple(n: int) -> bool",
            lambda rng: {"k": rng.randint(2, 13)},
            lambda rng, p: [rng.choice([p["k"] * rng.randint(-20, 20), rng.randint(-200, 200)])],
            lambda p, n: n % p["k"] == 0,
            lambda p: f"returns True when n is a multiple of {p['k']} and False otherwise.",
            lambda p: f"n 是 {p['k']} 的倍数时返回 True，否则返回 False。",
            lambda p: f"n is a multiple of {p['k']} exactly when the remainder of n divided by {p['k']} is 0.",
            lambda p: f"n 除以 {p['k']} 的余数为 0 时，n 就是 {p['k']} 的倍数。",
            lambda p: f"def is_multiple(n):\n    return n - (n // {p['k']}) * {p['k']} == 0\n",
            ([0],)),
        Template(
            "last_digits", "last_digits(n: int) -> int",
            lambda rng: {"k": rng.randint(1, 4)},
            lambda rng, p: [rng.randint(0, 10 ** rng.randint(1, 7))],
            lambda p, n: int(str(n)[-p["k"]:]),
            lambda p: f"returns the number formed by the last {p['k']} digits of the non-negative integer n "
                      f"(all of n when it has fewer digits).",
            lambda p: f"返回非负整数 n 的最后 {p['k']} 位数字组成的数（位数不够时返回 n 本身）。",
            lambda p: f"The last {p['k']} digits are the remainder of n divided by 10 to the power {p['k']}.",
            lambda p: f"最后 {p['k']} 位就是 n 除以 10 的 {p['k']} 次方的余数。",
            lambda p: f"def last_digits(n):\n    return n % {10 ** p['k']}\n",
            ([0], [7])),
        Template(
            "round_down", "round_down(x: int) -> int",
            lambda rng: {"k": rng.randint(2, 25)},
            lambda rng, p: [rng.randint(-100, 100)],
            _round_down,
            lambda p: f"returns the largest multiple of {p['k']} that is not greater than x (x may be negative).",
            lambda p: f"返回不大于 x 的最大的 {p['k']} 的倍数（x 可以是负数）。",
            lambda p: f"Subtract the remainder of x modulo {p['k']} (Python's % is never negative here).",
            lambda p: f"用 x 减去 x 除以 {p['k']} 的余数（Python 的 % 在这里不会是负数）。",
            lambda p: f"def round_down(x):\n    return x - x % {p['k']}\n",
            ([0],)),
    ),
    2: (
        Template(
            "count_char", "count_char(s: str) -> int",
            lambda rng: {"ch": rng.choice(string.ascii_lowercase)},
            lambda rng, p: [_word(rng, _LETTERS + p["ch"] * 2, 0, 12)],
            lambda p, s: s.count(p["ch"]),
            lambda p: f"returns how many times the letter {p['ch']!r} occurs in the string s.",
            lambda p: f"返回字母 {p['ch']!r} 在字符串 s 中出现的次数。",
            lambda p: f"Go through s and count the characters equal to {p['ch']!r}.",
            lambda p: f"逐个检查 s 的字符，数出等于 {p['ch']!r} 的个数。",
            lambda p: f"def count_char(s):\n    n = 0\n    for c in s:\n        if c == {p['ch']!r}:\n"
                      f"            n += 1\n    return n\n",
            ([""],)),
        Template(
            "repeat_chars", "repeat_chars(s: str) -> str",
            lambda rng: {"k": rng.randint(2, 4)},
            lambda rng, p: [_word(rng, string.ascii_lowercase + "0123456789", 0, 8)],
            lambda p, s: "".join(c * p["k"] for c in s),
            lambda p: f"returns s with every character repeated {p['k']} times (\"ab\" becomes "
                      f"\"{'a' * p['k']}{'b' * p['k']}\").",
            lambda p: f"返回把 s 中每个字符重复 {p['k']} 次后的字符串（\"ab\" 变成 \"{'a' * p['k']}{'b' * p['k']}\"）。",
            lambda p: f"Build the result character by character, writing each one {p['k']} times.",
            lambda p: f"逐个字符构造结果，每个字符写 {p['k']} 次。",
            lambda p: f"def repeat_chars(s):\n    out = []\n    for c in s:\n        out.append(c * {p['k']})\n"
                      f"    return ''.join(out)\n",
            ([""],)),
        Template(
            "remove_char", "remove_char(s: str) -> str",
            lambda rng: {"ch": rng.choice(string.ascii_lowercase)},
            lambda rng, p: [_word(rng, _LETTERS + p["ch"] * 2 + " ", 0, 12)],
            lambda p, s: s.replace(p["ch"], ""),
            lambda p: f"returns s with every occurrence of the letter {p['ch']!r} removed.",
            lambda p: f"返回删去 s 中所有字母 {p['ch']!r} 之后的字符串。",
            lambda p: f"Keep the characters that are not {p['ch']!r}.",
            lambda p: f"只保留不等于 {p['ch']!r} 的字符。",
            lambda p: f"def remove_char(s):\n    return ''.join(c for c in s if c != {p['ch']!r})\n",
            ([""],)),
        Template(
            "pad_left", "pad_left(s: str) -> str",
            lambda rng: {"w": rng.randint(3, 12), "fill": rng.choice("*-#0.")},
            lambda rng, p: [_word(rng, string.ascii_lowercase, 0, p["w"] + 3)],
            lambda p, s: s.rjust(p["w"], p["fill"]),
            lambda p: f"returns s padded on the left with {p['fill']!r} to length {p['w']}; a string that is "
                      f"already at least {p['w']} characters long is returned unchanged.",
            lambda p: f"在 s 左边补 {p['fill']!r} 直到长度为 {p['w']}；长度已经不小于 {p['w']} 的字符串原样返回。",
            lambda p: f"Prepend {p['w']} minus len(s) copies of {p['fill']!r} when that number is positive.",
            lambda p: f"若 {p['w']} 减去 len(s) 为正数，就在前面补上这么多个 {p['fill']!r}。",
            lambda p: f"def pad_left(s):\n    missing = {p['w']} - len(s)\n    if missing <= 0:\n        return s\n"
                      f"    return {p['fill']!r} * missing + s\n",
            ([""],)),
        Template(
            "every_kth", "every_kth(s: str) -> str",
            lambda rng: {"k": rng.randint(2, 5), "start": rng.randint(0, 2)},
            lambda rng, p: [_word(rng, string.ascii_lowercase, 0, 14)],
            lambda p, s: s[p["start"]::p["k"]],
            lambda p: f"returns the characters of s at positions {p['start']}, {p['start'] + p['k']}, "
                      f"{p['start'] + 2 * p['k']}, ... (0-based, every {p['k']}th one starting at {p['start']}).",
            lambda p: f"返回 s 中下标为 {p['start']}、{p['start'] + p['k']}、{p['start'] + 2 * p['k']}……的字符"
                      f"（下标从 0 开始，从 {p['start']} 起每隔 {p['k']} 个取一个）。",
            lambda p: f"Walk the indices from {p['start']} in steps of {p['k']}.",
            lambda p: f"下标从 {p['start']} 开始，每次加 {p['k']}。",
            lambda p: f"def every_kth(s):\n    out = ''\n    i = {p['start']}\n    while i < len(s):\n"
                      f"        out += s[i]\n        i += {p['k']}\n    return out\n",
            ([""],)),
    ),
    3: (
        Template(
            "sum_multiples", "sum_multiples(xs: list[int]) -> int",
            lambda rng: {"k": rng.randint(2, 9)},
            lambda rng, p: [_ints(rng, rng.randint(0, 8), -30, 60)],
            lambda p, xs: sum(x for x in xs if x % p["k"] == 0),
            lambda p: f"returns the sum of the elements of xs that are divisible by {p['k']} (0 when there are none).",
            lambda p: f"返回列表 xs 中能被 {p['k']} 整除的元素之和（没有时返回 0）。",
            lambda p: f"Add up the elements whose remainder modulo {p['k']} is 0.",
            lambda p: f"把除以 {p['k']} 余数为 0 的元素加起来。",
            lambda p: f"def sum_multiples(xs):\n    total = 0\n    for x in xs:\n        if x % {p['k']} == 0:\n"
                      f"            total += x\n    return total\n",
            ([[]],)),
        Template(
            "count_above", "count_above(xs: list[int]) -> int",
            lambda rng: {"t": rng.randint(-10, 30)},
            lambda rng, p: [_ints(rng, rng.randint(0, 9), p["t"] - 20, p["t"] + 20)],
            lambda p, xs: sum(1 for x in xs if x > p["t"]),
            lambda p: f"returns how many elements of xs are strictly greater than {p['t']}.",
            lambda p: f"返回列表 xs 中严格大于 {p['t']} 的元素个数。",
            lambda p: f"Count the elements x with x > {p['t']}.",
            lambda p: f"数出满足 x > {p['t']} 的元素。",
            lambda p: f"def count_above(xs):\n    return len([x for x in xs if x > {p['t']}])\n",
            ([[]],)),
        Template(
            "scale_list", "scale_list(xs: list[int]) -> list[int]",
            lambda rng: {"k": rng.choice([-3, -2, -1, 2, 3, 4, 5, 6, 7]), "c": rng.randint(-5, 5)},
            lambda rng, p: [_ints(rng, rng.randint(0, 7), -20, 20)],
            lambda p, xs: [x * p["k"] + p["c"] for x in xs],
            lambda p: f"returns a new list where each element x of xs becomes x * {p['k']} + {p['c']}, in the same order.",
            lambda p: f"返回一个新列表：把 xs 的每个元素 x 变成 x * {p['k']} + {p['c']}，顺序不变。",
            lambda p: f"Map every element through x * {p['k']} + {p['c']}.",
            lambda p: f"对每个元素计算 x * {p['k']} + {p['c']}。",
            lambda p: f"def scale_list(xs):\n    out = []\n    for x in xs:\n        out.append({p['k']} * x + {p['c']})\n"
                      f"    return out\n",
            ([[]],)),
        Template(
            "clip_list", "clip_list(xs: list[int]) -> list[int]",
            lambda rng: (lambda lo: {"lo": lo, "hi": lo + rng.randint(2, 25)})(rng.randint(-15, 15)),
            lambda rng, p: [_ints(rng, rng.randint(0, 8), p["lo"] - 15, p["hi"] + 15)],
            lambda p, xs: [min(max(x, p["lo"]), p["hi"]) for x in xs],
            lambda p: f"returns a new list where every element of xs below {p['lo']} becomes {p['lo']} and every "
                      f"element above {p['hi']} becomes {p['hi']}.",
            lambda p: f"返回一个新列表：xs 中小于 {p['lo']} 的元素变成 {p['lo']}，大于 {p['hi']} 的变成 {p['hi']}，其余不变。",
            lambda p: f"Clip each element to the range [{p['lo']}, {p['hi']}].",
            lambda p: f"把每个元素截到区间 [{p['lo']}, {p['hi']}] 内。",
            lambda p: (f"def clip_list(xs):\n    out = []\n    for x in xs:\n        if x < {p['lo']}:\n"
                       f"            x = {p['lo']}\n        elif x > {p['hi']}:\n            x = {p['hi']}\n"
                       f"        out.append(x)\n    return out\n"),
            ([[]],)),
        Template(
            "running_total", "running_total(xs: list[int]) -> list[int]",
            lambda rng: {"start": rng.randint(0, 20)},
            lambda rng, p: [_ints(rng, rng.randint(0, 7), -10, 30)],
            lambda p, xs: [p["start"] + sum(xs[:i + 1]) for i in range(len(xs))],
            lambda p: f"returns the running totals of xs starting from {p['start']}: the i-th output is {p['start']} "
                      f"plus the sum of the first i+1 elements.",
            lambda p: f"返回从 {p['start']} 开始的累计和：第 i 个输出是 {p['start']} 加上前 i+1 个元素之和。",
            lambda p: f"Keep a total that starts at {p['start']} and add each element to it in turn.",
            lambda p: f"用一个从 {p['start']} 开始的累加变量，依次加上每个元素。",
            lambda p: f"def running_total(xs):\n    total = {p['start']}\n    out = []\n    for x in xs:\n"
                      f"        total += x\n        out.append(total)\n    return out\n",
            ([[]],)),
    ),
    4: (
        Template(
            "digit_sum_base", "digit_sum_base(n: int) -> int",
            lambda rng: {"b": rng.randint(2, 10)},
            lambda rng, p: [rng.randint(0, 5000)],
            lambda p, n: sum(int(d) for d in _to_base(n, p["b"])),
            lambda p: f"returns the sum of the digits of the non-negative integer n written in base {p['b']}.",
            lambda p: f"返回非负整数 n 写成 {p['b']} 进制后各位数字之和。",
            lambda p: f"Repeatedly take n % {p['b']} as the last digit and divide n by {p['b']}.",
            lambda p: f"反复取 n % {p['b']} 作为最后一位，再把 n 整除 {p['b']}。",
            lambda p: f"def digit_sum_base(n):\n    total = 0\n    while n > 0:\n        total += n % {p['b']}\n"
                      f"        n //= {p['b']}\n    return total\n",
            ([0],)),
        Template(
            "gcd_with", "gcd_with(n: int) -> int",
            lambda rng: {"m": rng.randint(6, 120)},
            lambda rng, p: [rng.randint(1, 500)],
            lambda p, n: math.gcd(n, p["m"]),
            lambda p: f"returns the greatest common divisor of the positive integer n and {p['m']}.",
            lambda p: f"返回正整数 n 与 {p['m']} 的最大公约数。",
            lambda p: f"Use Euclid's algorithm on n and {p['m']}.",
            lambda p: f"对 n 和 {p['m']} 用辗转相除法。",
            lambda p: f"def gcd_with(n):\n    a, b = n, {p['m']}\n    while b:\n        a, b = b, a % b\n    return a\n",
            ([1],)),
        Template(
            "fib_mod", "fib_mod(n: int) -> int",
            lambda rng: {"m": rng.randint(7, 100)},
            lambda rng, p: [rng.randint(0, 200)],
            lambda p, n: _fib_mod(n, p["m"]),
            lambda p: f"returns the n-th Fibonacci number modulo {p['m']}, where F(0) = 0, F(1) = 1 and "
                      f"F(n) = F(n-1) + F(n-2).",
            lambda p: f"返回第 n 个斐波那契数除以 {p['m']} 的余数，其中 F(0) = 0，F(1) = 1，F(n) = F(n-1) + F(n-2)。",
            lambda p: f"Iterate the pair (F(i), F(i+1)) n times, reducing modulo {p['m']} as you go.",
            lambda p: f"把 (F(i), F(i+1)) 迭代 n 次，过程中对 {p['m']} 取余。",
            lambda p: f"def fib_mod(n):\n    fs = [0, 1]\n    while len(fs) <= n:\n"
                      f"        fs.append((fs[-1] + fs[-2]) % {p['m']})\n    return fs[n] % {p['m']}\n",
            ([0], [1])),
        Template(
            "to_base", "to_base(n: int) -> str",
            lambda rng: {"b": rng.randint(2, 9)},
            lambda rng, p: [rng.randint(0, 3000)],
            lambda p, n: _to_base(n, p["b"]),
            lambda p: f"returns the non-negative integer n written in base {p['b']} as a string of digits "
                      f"(\"0\" for 0).",
            lambda p: f"返回非负整数 n 的 {p['b']} 进制表示，结果是数字字符串（0 返回 \"0\"）。",
            lambda p: f"Collect the remainders of repeated division by {p['b']}, then reverse them.",
            lambda p: f"反复除以 {p['b']} 收集余数，最后倒过来。",
            lambda p: f"def to_base(n):\n    if n == 0:\n        return '0'\n    s = ''\n    while n:\n"
                      f"        s = str(n % {p['b']}) + s\n        n //= {p['b']}\n    return s\n",
            ([0],)),
        Template(
            "power_mod", "power_mod(n: int) -> int",
            lambda rng: {"b": rng.randint(2, 9), "m": rng.randint(5, 97)},
            lambda rng, p: [rng.randint(0, 60)],
            lambda p, n: (p["b"] ** n) % p["m"],
            lambda p: f"returns {p['b']} to the power n, modulo {p['m']}, for a non-negative integer n.",
            lambda p: f"对非负整数 n，返回 {p['b']} 的 n 次方除以 {p['m']} 的余数。",
            lambda p: f"Multiply by {p['b']} n times and reduce modulo {p['m']} after each step.",
            lambda p: f"乘 n 次 {p['b']}，每乘一次都对 {p['m']} 取余。",
            lambda p: f"def power_mod(n):\n    r = 1 % {p['m']}\n    for _ in range(n):\n"
                      f"        r = r * {p['b']} % {p['m']}\n    return r\n",
            ([0],)),
    ),
    5: (
        Template(
            "run_length", "run_length(s: str) -> str",
            lambda rng: {"order": rng.choice(["char_count", "count_char"])},
            lambda rng, p: [_word(rng, "aab", 0, 12)],
            _run_length,
            lambda p: "returns the run-length encoding of s: each run of equal characters becomes "
                      + ("the character followed by the run length (\"aaab\" -> \"a3b1\")."
                         if p["order"] == "char_count" else "the run length followed by the character (\"aaab\" -> \"3a1b\")."),
            lambda p: "返回 s 的游程编码：每一段连续相同的字符写成"
                      + ("字符加段长（\"aaab\" -> \"a3b1\"）。" if p["order"] == "char_count" else "段长加字符（\"aaab\" -> \"3a1b\"）。"),
            lambda p: "Scan s, extend the current run while the character repeats, and emit each finished run.",
            lambda p: "扫描 s，字符重复时延长当前段，每段结束时输出它。",
            lambda p: ("def run_length(s):\n    out = ''\n    i = 0\n    while i < len(s):\n        j = i\n"
                       "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
                       + ("        out += s[i] + str(j - i)\n" if p["order"] == "char_count"
                          else "        out += str(j - i) + s[i]\n")
                       + "        i = j\n    return out\n"),
            ([""],)),
        Template(
            "most_common", "most_common(xs: list[int]) -> int | None",
            lambda rng: {"tie": rng.choice(["smallest", "largest"])},
            lambda rng, p: [_ints(rng, rng.randint(0, 10), 0, 6)],
            _most_common,
            lambda p: f"returns the most frequent element of xs; among equally frequent elements return the "
                      f"{p['tie']} one; return None for an empty list.",
            lambda p: f"返回 xs 中出现次数最多的元素；次数相同时返回其中{'最小' if p['tie'] == 'smallest' else '最大'}的；"
                      f"空列表返回 None。",
            lambda p: f"Count every element, then pick the highest count and break ties by the {p['tie']} value.",
            lambda p: f"先统计每个元素的次数，再取次数最多的，次数相同取{'最小' if p['tie'] == 'smallest' else '最大'}的值。",
            lambda p: ("def most_common(xs):\n    if not xs:\n        return None\n    counts = {}\n"
                       "    for x in xs:\n        counts[x] = counts.get(x, 0) + 1\n"
                       + ("    return min(counts, key=lambda x: (-counts[x], x))\n" if p["tie"] == "smallest"
                          else "    return max(counts, key=lambda x: (counts[x], x))\n")),
            ([[]],)),
        Template(
            "longest_run_above", "longest_run_above(xs: list[int]) -> int",
            lambda rng: {"t": rng.randint(-5, 40)},
            lambda rng, p: [_ints(rng, rng.randint(0, 12), p["t"] - 10, p["t"] + 10)],
            _longest_run,
            lambda p: f"returns the length of the longest stretch of consecutive elements of xs that are all "
                      f"greater than {p['t']} (0 when there is none).",
            lambda p: f"返回 xs 中连续且都大于 {p['t']} 的元素组成的最长一段的长度（没有时返回 0）。",
            lambda p: f"Track the length of the current stretch of elements above {p['t']} and the best so far.",
            lambda p: f"记录当前连续大于 {p['t']} 的段长和目前为止的最大值。",
            lambda p: f"def longest_run_above(xs):\n    best = 0\n    cur = 0\n    for x in xs:\n"
                      f"        if x > {p['t']}:\n            cur += 1\n            if cur > best:\n"
                      f"                best = cur\n        else:\n            cur = 0\n    return best\n",
            ([[]],)),
        Template(
            "rotate_right", "rotate_right(xs: list[int]) -> list[int]",
            lambda rng: {"k": rng.randint(1, 9)},
            lambda rng, p: [_ints(rng, rng.randint(0, 8), 0, 50)],
            lambda p, xs: [xs[(i - p["k"]) % len(xs)] for i in range(len(xs))] if xs else [],
            lambda p: f"returns xs rotated right by {p['k']} positions (the last element moves to the front, "
                      f"{p['k']} times); the list may be shorter than {p['k']} or empty.",
            lambda p: f"返回把 xs 向右循环移动 {p['k']} 位后的列表（每次把最后一个元素移到最前面，共 {p['k']} 次）；"
                      f"列表可能比 {p['k']} 短，也可能为空。",
            lambda p: f"Rotating by {p['k']} is the same as rotating by {p['k']} modulo the length.",
            lambda p: f"移动 {p['k']} 位等于移动 {p['k']} 对长度取余位。",
            lambda p: f"def rotate_right(xs):\n    if not xs:\n        return []\n    k = {p['k']} % len(xs)\n"
                      f"    return xs[len(xs) - k:] + xs[:len(xs) - k]\n",
            ([[]], [[5]])),
        Template(
            "count_pair_sums", "count_pair_sums(xs: list[int]) -> int",
            lambda rng: {"t": rng.randint(0, 40)},
            lambda rng, p: [_ints(rng, rng.randint(0, 9), 0, p["t"])],
            lambda p, xs: sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[i] + xs[j] == p["t"]),
            lambda p: f"returns the number of index pairs i < j with xs[i] + xs[j] == {p['t']}.",
            lambda p: f"返回满足 i < j 且 xs[i] + xs[j] == {p['t']} 的下标对 (i, j) 的个数。",
            lambda p: f"For each element, count the earlier elements equal to {p['t']} minus it.",
            lambda p: f"对每个元素，数一数它前面有多少个元素等于 {p['t']} 减去它。",
            lambda p: f"def count_pair_sums(xs):\n    seen = {{}}\n    pairs = 0\n    for x in xs:\n"
                      f"        pairs += seen.get({p['t']} - x, 0)\n        seen[x] = seen.get(x, 0) + 1\n"
                      f"    return pairs\n",
            ([[]],)),
        Template(
            "balanced", "balanced(s: str) -> bool",
            lambda rng: {"pairs": rng.choice(["()", "[]", "()[]", "(){}", "()[]{}"])},
            lambda rng, p: [_word(rng, p["pairs"] + "x", 0, 10)],
            _balanced,
            lambda p: f"returns True when the brackets {' '.join(p['pairs'])} in s are balanced and properly nested "
                      f"(other characters are ignored), False otherwise.",
            lambda p: f"s 中的括号 {' '.join(p['pairs'])} 配对且正确嵌套时返回 True，否则返回 False（其他字符忽略）。",
            lambda p: "Push each opening bracket on a stack and pop it at the matching closing bracket.",
            lambda p: "遇到左括号入栈，遇到右括号时检查并弹出对应的左括号。",
            lambda p: (f"def balanced(s):\n    match = {dict(zip(p['pairs'][1::2], p['pairs'][0::2]))!r}\n"
                       f"    stack = []\n    for c in s:\n        if c in {p['pairs'][0::2]!r}:\n"
                       f"            stack.append(c)\n        elif c in match:\n"
                       f"            if not stack or stack.pop() != match[c]:\n                return False\n"
                       f"    return len(stack) == 0\n"),
            ([""],)),
    ),
}


def _call(func: str, args: list) -> str:
    return f"{func}({', '.join(repr(a) for a in args)})"


def _draw_cases(rng: random.Random, t: Template, p: dict) -> tuple[list, list]:
    """Two example cases and N_TESTS hidden ones, all with distinct arguments (edge cases among the hidden)."""
    seen, inputs = set(), []
    for args in list(t.edge):
        seen.add(json.dumps(args))
    for _ in range(60 * (N_EXAMPLES + N_TESTS)):
        if len(inputs) == N_EXAMPLES + N_TESTS - len(t.edge):
            break
        args = t.inputs(rng, p)
        key = json.dumps(args)
        if key not in seen:
            seen.add(key)
            inputs.append(args)
    examples = inputs[:N_EXAMPLES]
    hidden = [list(a) for a in t.edge] + inputs[N_EXAMPLES:]
    return ([[a, t.ref(p, *a)] for a in examples], [[a, t.ref(p, *a)] for a in hidden])


def _prompt(t: Template, p: dict, examples: list, lang: str) -> str:
    shown = "\n".join(f"{_call(t.func, a)} == {e!r}" for a, e in examples)
    if lang == "zh":
        return (f"编写 Python 函数 `{t.sig}`：{t.zh(p)}\n示例：\n{shown}\n把函数写在 ```python 代码块里。")
    return f"Write a Python function `{t.sig}` that {t.en(p)}\nExamples:\n{shown}\nPut the function in a ```python block."


def make_code(rng: random.Random, difficulty: int) -> dict:
    """One code problem at `difficulty` (see the module docstring), as GeneratedSource's make returns it."""
    return from_template(rng, rng.choice(TEMPLATES[difficulty]))


def from_template(rng: random.Random, t: Template) -> dict:
    """One problem of template `t`: parameters, examples and hidden tests drawn from `rng`."""
    p = t.params(rng)
    examples, tests = _draw_cases(rng, t, p)
    check = {
        "task": t.func, "func": t.func, "signature": t.sig, "params": p, "examples": examples, "tests": tests,
        "prompt": {lang: _prompt(t, p, examples, lang) for lang in ("zh", "en")},
        "plan": {"zh": t.plan_zh(p), "en": t.plan_en(p)},
    }
    return {"question": f"Write a Python function `{t.sig}` that {t.en(p)}", "answer": t.gold(p), "steps": None,
            "reward": "code", "check": check}


CODE = GeneratedSource("code", make_code, description="function-writing problems with hidden tests, scored in the code sandbox")
SOURCES = (CODE,)
