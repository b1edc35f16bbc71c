"""GSM8K-like word problems from templates (rates, totals, differences, sharing, purchases with change),
each with its arithmetic written as steps.

Two sources, one per language, because the question text is natural language:
    word      English   "Tom buys 3 pens at 4 dollars each ..."      step "Pens: 3*4=12 dollars"
    word_zh   Chinese   "小明买了3支笔，每支4元……"                      step "笔：3*4=12元"
Every step holds exactly one arithmetic claim `a op b = c` (ASCII + - * / and =, no spaces inside the claim)
so `rewards.steps.check_steps` can check it; the answer is a plain integer string.

Difficulty levels (1..5) pick templates by the number of operations and scale the numbers:
  1  one operation, numbers <= 10      (rate, total, difference, how many hours)
  2  two operations, numbers <= 20     (sharing then eating, saving then spending, ages, two-day totals)
  3  two or three operations, <= 50    (level-2 templates and purchases of two items)
  4  three or four operations, <= 100  (purchases, purchases with change)
  5  four operations, <= 500           (purchases with change, larger numbers)
"""
from __future__ import annotations

import random

from rl.tasks.base import GeneratedSource

_NAMES = {"en": ("Tom", "Anna", "Lily", "Ben", "Mia", "Sam", "Lucy", "Jack"),
          "zh": ("小明", "小红", "小刚", "小丽", "小华", "小军", "小芳", "小强")}
_LIMIT = {1: 10, 2: 20, 3: 50, 4: 100, 5: 500}


def _two_names(rng: random.Random, lang: str) -> tuple[str, str]:
    a, b = rng.sample(_NAMES[lang], 2)
    return a, b


def _rate(rng, level, lang):
    v, t = rng.randint(2, _LIMIT[level]), rng.randint(2, 9)
    d = v * t
    if lang == "zh":
        return (f"一辆车每小时行驶{v}千米，{t}小时行驶多少千米？", d, [f"{t}小时行驶{v}*{t}={d}千米"])
    return (f"A car travels {v} km per hour. How many km does it travel in {t} hours?", d,
            [f"In {t} hours: {v}*{t}={d} km"])


def _total(rng, level, lang):
    a, b = rng.randint(1, _LIMIT[level]), rng.randint(1, _LIMIT[level])
    x, y = _two_names(rng, lang)
    if lang == "zh":
        return (f"{x}有{a}颗弹珠，{y}有{b}颗弹珠。他们一共有多少颗弹珠？", a + b, [f"一共{a}+{b}={a + b}颗"])
    return (f"{x} has {a} marbles and {y} has {b} marbles. How many marbles do they have in total?", a + b,
            [f"Together: {a}+{b}={a + b} marbles"])


def _difference(rng, level, lang):
    a, b = rng.randint(2, _LIMIT[level]), rng.randint(1, _LIMIT[level])
    if a <= b:
        a, b = b + 1, a
    x, y = _two_names(rng, lang)
    if lang == "zh":
        return (f"{x}有{a}张邮票，{y}有{b}张邮票。{x}比{y}多几张？", a - b, [f"多{a}-{b}={a - b}张"])
    return (f"{x} has {a} stamps and {y} has {b} stamps. How many more stamps does {x} have than {y}?", a - b,
            [f"Difference: {a}-{b}={a - b} stamps"])


def _hours(rng, level, lang):
    r, h = rng.randint(2, _LIMIT[level]), rng.randint(2, 9)
    n = r * h
    if lang == "zh":
        return (f"一台机器每小时做{r}个玩具，做{n}个玩具需要几小时？", h, [f"需要{n}/{r}={h}小时"])
    return (f"A machine makes {r} toys per hour. How many hours does it take to make {n} toys?", h,
            [f"Hours: {n}/{r}={h}"])


def _sharing(rng, level, lang):
    k, q = rng.randint(2, 9), rng.randint(2, _LIMIT[level])
    e = rng.randint(1, q - 1)
    n = k * q
    if lang == "zh":
        return (f"{n}块饼干平均分给{k}个孩子，每个孩子吃了{e}块，每个孩子还剩几块？", q - e,
                [f"每人分到{n}/{k}={q}块", f"每人还剩{q}-{e}={q - e}块"])
    return (f"{n} cookies are shared equally among {k} children. Each child eats {e} cookies. "
            f"How many cookies does each child have left?", q - e,
            [f"Each child gets {n}/{k}={q} cookies", f"Left: {q}-{e}={q - e} cookies"])


def _savings(rng, level, lang):
    s, w = rng.randint(2, _LIMIT[level]), rng.randint(2, 9)
    t = s * w
    spend = rng.randint(1, t - 1)
    x, _ = _two_names(rng, lang)
    if lang == "zh":
        return (f"{x}每周存{s}元，存了{w}周，然后花了{spend}元。{x}还剩多少元？", t - spend,
                [f"共存了{s}*{w}={t}元", f"还剩{t}-{spend}={t - spend}元"])
    return (f"{x} saves {s} dollars each week for {w} weeks, then spends {spend} dollars. "
            f"How many dollars does {x} have left?", t - spend,
            [f"Saved: {s}*{w}={t} dollars", f"Left: {t}-{spend}={t - spend} dollars"])


def _ages(rng, level, lang):
    a, k, n = rng.randint(2, min(_LIMIT[level], 30)), rng.randint(2, 4), rng.randint(1, 9)
    b = a * k
    x, y = _two_names(rng, lang)
    if lang == "zh":
        return (f"{x}今年{a}岁，{y}的年龄是{x}的{k}倍。{n}年后{y}多少岁？", b + n,
                [f"{y}今年{a}*{k}={b}岁", f"{n}年后{b}+{n}={b + n}岁"])
    return (f"{x} is {a} years old. {y} is {k} times as old as {x}. How old will {y} be in {n} years?", b + n,
            [f"{y} is {a}*{k}={b} now", f"In {n} years: {b}+{n}={b + n}"])


def _two_days(rng, level, lang):
    a, d = rng.randint(1, _LIMIT[level]), rng.randint(1, _LIMIT[level])
    x, _ = _two_names(rng, lang)
    if lang == "zh":
        return (f"{x}周一读了{a}页书，周二比周一多读了{d}页。{x}两天一共读了多少页？", 2 * a + d,
                [f"周二读了{a}+{d}={a + d}页", f"一共{a}+{a + d}={2 * a + d}页"])
    return (f"{x} reads {a} pages on Monday and {d} more pages on Tuesday than on Monday. "
            f"How many pages does {x} read on the two days?", 2 * a + d,
            [f"Tuesday: {a}+{d}={a + d} pages", f"Total: {a}+{a + d}={2 * a + d} pages"])


def _purchase_parts(rng, level, lang):
    n1, n2 = rng.randint(2, 9), rng.randint(2, 9)
    p1, p2 = rng.randint(2, _LIMIT[level] // 2), rng.randint(2, _LIMIT[level] // 2)
    x, _ = _two_names(rng, lang)
    c1, c2 = n1 * p1, n2 * p2
    if lang == "zh":
        q = f"{x}买了{n1}支笔，每支{p1}元，又买了{n2}本笔记本，每本{p2}元。"
        steps = [f"笔：{n1}*{p1}={c1}元", f"笔记本：{n2}*{p2}={c2}元", f"一共{c1}+{c2}={c1 + c2}元"]
    else:
        q = f"{x} buys {n1} pens at {p1} dollars each and {n2} notebooks at {p2} dollars each."
        steps = [f"Pens: {n1}*{p1}={c1} dollars", f"Notebooks: {n2}*{p2}={c2} dollars",
                 f"Total: {c1}+{c2}={c1 + c2} dollars"]
    return q, x, c1 + c2, steps


def _purchase(rng, level, lang):
    q, x, total, steps = _purchase_parts(rng, level, lang)
    ask = f"{x}一共花了多少元？" if lang == "zh" else f" How many dollars does {x} spend?"
    return q + ask, total, steps


def _change(rng, level, lang):
    q, x, total, steps = _purchase_parts(rng, level, lang)
    bill = next(b for b in (10, 20, 50, 100, 200, 500, 1000, 5000) if b > total)
    if lang == "zh":
        return (q + f"{x}付了{bill}元，应找回多少元？", bill - total, steps + [f"找回{bill}-{total}={bill - total}元"])
    return (q + f" {x} pays with {bill} dollars. How much change, in dollars, does {x} get?", bill - total,
            steps + [f"Change: {bill}-{total}={bill - total} dollars"])


_BY_LEVEL = {
    1: (_rate, _total, _difference, _hours),
    2: (_sharing, _savings, _ages, _two_days),
    3: (_sharing, _savings, _ages, _two_days, _purchase),
    4: (_purchase, _change),
    5: (_change,),
}


def make_word(lang: str):
    def make(rng: random.Random, difficulty: int):
        template = rng.choice(_BY_LEVEL[difficulty])
        question, answer, steps = template(rng, difficulty, lang)
        return question, str(answer), steps
    return make


WORD = GeneratedSource("word", make_word("en"), description="GSM8K-like template word problems, English")
WORD_ZH = GeneratedSource("word_zh", make_word("zh"), description="GSM8K-like template word problems, Chinese")
SOURCES = (WORD, WORD_ZH)
