"""Verifiable-instruction problems (IFEval-style): a small task plus constraints a program checks.

    from rl.tasks import load_mix, render_prompt, render_solution
    p = load_mix("instructions_en", n=1, seed=0, split="train")[0]
    render_prompt(p, "zh")   # '问题：把98、73、39、99和70依次相加，每一步写一个部分和。请用英文回答。恰好写4步
                             #  （“Step 1:”、“Step 2:”……）。全文不超过150个字符。回答中要用到“total”。\\n解答：\\n'
    render_solution(p, "zh") # the gold response (p.answer), in the language the constraints ask for
    p.check_data["constraints"]   # [{"type": "language", "lang": "en"}, {"type": "num_steps", "n": 4}, ...]
    rewards.instructions.instruction_score(response, p.check)   # share of constraints met

Sources:
    instructions      the response language is drawn per problem (zh or en)
    instructions_zh   responses in Chinese           instructions_en   responses in English
The response language is fixed by the problem (its payload's "lang" and its always-present `language`
constraint), not by the language the prompt is rendered in: a Chinese prompt may ask for an English answer.
Pick instructions_zh / instructions_en to keep a run in one language; `response_lang(problem)` tells the
language a scorer (e.g. the language-consistency penalty) should expect.

Tasks (the content, which the constraints do not grade) and their layouts:
    sum        add m numbers one at a time: one step per partial sum, then an answer line        (steps)
    sort       sort m distinct numbers: one step per number in order, then an answer line       (steps)
    list       name n things of a category (fruits, animals, colours, sports)                   (list)
    multiples  write the first n multiples of k                                                 (list)
Constraints (checked by rewards/instructions.py): always `language`; then, by difficulty level L, the first L
of a random order of the layout's extras: steps layout num_steps, answer_line, max_chars, include_word,
avoid_word; list layout list_items, max_chars, include_word, avoid_word. Sizes grow with L (m = L+2 numbers,
n = L+1 items, larger numbers). max_chars allows the gold response's length times 1.25 plus 10, rounded up to
a multiple of 10. The gold response meets every constraint (tests/test_instructions.py checks every level and
language).

The question (what the split hash and dedup see) is the English prompt; the payload holds the prompt in both
languages ("prompt": {"zh", "en"}), the task name, the response language and the constraints.
"""
from __future__ import annotations

import math
import random

from rewards.instructions import word_occurs
from rl.tasks.base import GeneratedSource, Problem
from rl.tasks.render import int_to_cn

LANGS = ("zh", "en")
STEPS_EXTRAS = ("num_steps", "answer_line", "max_chars", "include_word", "avoid_word")
LIST_EXTRAS = ("list_items", "max_chars", "include_word", "avoid_word")

CATEGORIES = {
    "fruits": {"en": ("fruits", ("apple", "banana", "orange", "pear", "grape", "peach", "cherry", "lemon", "mango",
                                 "melon", "plum", "kiwi")),
               "zh": ("种水果", ("苹果", "香蕉", "橙子", "梨", "葡萄", "桃子", "樱桃", "柠檬", "芒果", "西瓜", "李子",
                                 "猕猴桃"))},
    "animals": {"en": ("animals", ("cat", "dog", "horse", "rabbit", "tiger", "lion", "panda", "monkey", "sheep",
                                   "duck", "fox", "bear")),
                "zh": ("种动物", ("猫", "狗", "马", "兔子", "老虎", "狮子", "熊猫", "猴子", "绵羊", "鸭子", "狐狸",
                                  "熊"))},
    "colours": {"en": ("colours", ("red", "blue", "green", "yellow", "purple", "black", "white", "pink", "brown",
                                   "grey", "gold", "silver")),
                "zh": ("种颜色", ("红色", "蓝色", "绿色", "黄色", "紫色", "黑色", "白色", "粉色", "棕色", "灰色",
                                  "金色", "银色"))},
    "sports": {"en": ("sports", ("football", "basketball", "tennis", "swimming", "running", "cycling", "skiing",
                                 "boxing", "golf", "volleyball", "badminton", "rowing")),
               "zh": ("项运动", ("足球", "篮球", "网球", "游泳", "跑步", "骑车", "滑雪", "拳击", "高尔夫", "排球",
                                 "羽毛球", "划船"))},
}
# Words a plain answer does not need: the avoid_word constraint of the sum / sort / multiples tasks.
HEDGES = {"en": ("maybe", "probably", "guess", "roughly", "perhaps"), "zh": ("大概", "可能", "也许", "估计", "差不多")}
# Words the gold weaves into a closing sentence when include_word asks for one.
CLOSING_WORDS = {
    "sum": {"en": ("total", "sum", "result"), "zh": ("总和", "结果", "合计")},
    "sort": {"en": ("result", "order"), "zh": ("结果", "顺序")},
    "multiples": {"en": ("multiples", "first"), "zh": ("倍数",)},
}
_NUMBER_HI = {1: 20, 2: 50, 3: 100, 4: 500, 5: 999}


def response_lang(problem: Problem) -> str:
    """The language an instruction problem's response must be in ("zh" or "en")."""
    return problem.check_data["lang"]


def _join_numbers(xs, lang: str) -> str:
    """12, 7 and 30 / 12、7和30."""
    head, last = [str(x) for x in xs[:-1]], str(xs[-1])
    return f"{', '.join(head)} and {last}" if lang == "en" else f"{'、'.join(head)}和{last}"


def _step_marker(i: int, lang: str) -> str:
    return f"Step {i}: " if lang == "en" else f"步骤{int_to_cn(i)}："


def _answer_marker(lang: str) -> str:
    return "Answer: " if lang == "en" else "答案："


def _closing(word: str, value: str, lang: str) -> str:
    return f" So the {word} is {value}." if lang == "en" else f"。所以{word}是{value}。"


# ------------------------------------------------------------------------------------------ tasks
# Each returns, for response language R: the task prompt {"en", "zh"}, its layout ("steps" or "list"), n (the
# number of steps or list items of the gold response), the gold builder (include_word or None -> text), the
# words avoid_word may pick and the words include_word may pick.


def _sum_task(rng, level, R):
    xs = [rng.randint(1, _NUMBER_HI[level]) for _ in range(level + 2)]
    prompt = {"en": f"Add the numbers {_join_numbers(xs, 'en')} one at a time, one partial sum per step.",
              "zh": f"把{_join_numbers(xs, 'zh')}依次相加，每一步写一个部分和。"}

    def gold(word):
        steps, acc = [], xs[0]
        for x in xs[1:]:
            steps.append(f"{acc}+{x}={acc + x}")
            acc += x
        if word:
            steps[-1] += _closing(word, str(acc), R)
        lines = [_step_marker(i, R) + s for i, s in enumerate(steps, 1)]
        return "\n".join(lines + [_answer_marker(R) + str(acc)])

    return prompt, "steps", len(xs) - 1, gold, HEDGES[R], CLOSING_WORDS["sum"][R]


def _sort_task(rng, level, R):
    xs = rng.sample(range(1, 20 * level + 10), level + 2)
    ordered = sorted(xs)
    prompt = {"en": f"Sort the numbers {_join_numbers(xs, 'en')} from smallest to largest, one number per step.",
              "zh": f"把{_join_numbers(xs, 'zh')}从小到大排列，每一步写一个数。"}
    value = ", ".join(str(x) for x in ordered)

    def gold(word):
        if R == "en":
            steps = [f"the smallest number is {ordered[0]}"] + [f"next comes {x}" for x in ordered[1:]]
        else:
            steps = [f"最小的数是{ordered[0]}"] + [f"接着是{x}" for x in ordered[1:]]
        if word:
            steps[-1] += _closing(word, value, R)
        lines = [_step_marker(i, R) + s for i, s in enumerate(steps, 1)]
        return "\n".join(lines + [_answer_marker(R) + value])

    return prompt, "steps", len(xs), gold, HEDGES[R], CLOSING_WORDS["sort"][R]


def _related(a: str, b: str) -> bool:
    """Whether either word would be found inside the other (熊 in 熊猫), so one cannot be avoided alone."""
    return word_occurs(a, b) or word_occurs(b, a)


def _list_task(rng, level, R):
    cat = rng.choice(sorted(CATEGORIES))
    n = level + 1
    names = {lang: CATEGORIES[cat][lang][0] for lang in LANGS}
    items = list(CATEGORIES[cat][R][1])
    rng.shuffle(items)
    chosen = items[:n]
    avoid = [w for w in items[n:] if not any(_related(w, c) for c in chosen)]
    prompt = {"en": f"List {n} {names['en']}.", "zh": f"列举{n}{names['zh']}。"}
    intro = f"Here are {n} {names['en']}:" if R == "en" else f"以下是{n}{names['zh']}："

    def gold(word):
        # The required word is one of the chosen items (include_word picks from `chosen`).
        return "\n".join([intro] + [f"- {c}" for c in chosen])

    return prompt, "list", n, gold, tuple(avoid), tuple(chosen)


def _multiples_task(rng, level, R):
    k, n = rng.randint(2, 5 + 3 * level), level + 1
    prompt = {"en": f"Write the first {n} multiples of {k}, starting with {k}.",
              "zh": f"写出{k}的前{n}个倍数（从{k}开始）。"}
    intro = f"The first {n} multiples of {k} are:" if R == "en" else f"{k}的前{n}个倍数是："

    def gold(word):
        return "\n".join([intro] + [f"- {k * i}" for i in range(1, n + 1)])

    return prompt, "list", n, gold, HEDGES[R], CLOSING_WORDS["multiples"][R]


TASKS = {"sum": _sum_task, "sort": _sort_task, "list": _list_task, "multiples": _multiples_task}


# ------------------------------------------------------------------------------------------ constraint text


def _quoted(text: str, lang: str) -> str:
    return f'"{text}"' if lang == "en" else f"“{text}”"


def describe(constraint: dict, lang: str, response: str) -> str:
    """The instruction sentence for one constraint, in the prompt language `lang`, for a response in the
    language `response` (it names the step markers to use)."""
    kind = constraint["type"]
    if kind == "language":
        target = constraint["lang"]
        if lang == "en":
            return "Answer in English." if target == "en" else "Answer in Chinese."
        return "请用英文回答。" if target == "en" else "请用中文回答。"
    if kind == "num_steps":
        n = constraint["n"]
        first, second = (_quoted(_step_marker(i, response).strip(), lang) for i in (1, 2))
        return f"Use exactly {n} steps ({first}, {second}, ...)." if lang == "en" else f"恰好写{n}步（{first}、{second}……）。"
    if kind == "answer_line":
        line = _answer_marker(constraint["lang"]) + ("<answer>" if constraint["lang"] == "en" else "<答案>")
        return f"End with the line {_quoted(line, lang)}." if lang == "en" else f"最后一行写{_quoted(line, lang)}。"
    if kind == "max_chars":
        return f"Use at most {constraint['k']} characters." if lang == "en" else f"全文不超过{constraint['k']}个字符。"
    if kind == "include_word":
        w = _quoted(constraint["word"], lang)
        return f"Use the word {w}." if lang == "en" else f"回答中要用到{w}。"
    if kind == "avoid_word":
        w = _quoted(constraint["word"], lang)
        return f"Do not use the word {w}." if lang == "en" else f"不要出现{w}。"
    if kind == "list_items":
        dash = _quoted("- ", lang)
        return (f"Write exactly {constraint['n']} list items, one per line, each starting with {dash}."
                if lang == "en" else f"恰好写{constraint['n']}个列表项，每项一行，以{dash}开头。")
    raise ValueError(f"no description for constraint type {kind!r}")


def _max_chars_for(gold: str) -> int:
    return int(math.ceil((len(gold.strip()) * 1.25 + 10) / 10.0)) * 10


def make_instructions(lang: str | None):
    """make(rng, difficulty) for a source whose response language is `lang` (None: drawn per problem)."""

    def make(rng: random.Random, difficulty: int) -> dict:
        R = lang if lang is not None else rng.choice(LANGS)
        kind = rng.choice(sorted(TASKS))
        prompt, layout, n, gold_of, avoid_choices, include_choices = TASKS[kind](rng, difficulty, R)
        extras = list(STEPS_EXTRAS if layout == "steps" else LIST_EXTRAS)
        rng.shuffle(extras)
        chosen = set(extras[:min(difficulty, len(extras))])
        word = rng.choice(include_choices) if "include_word" in chosen else None
        gold = gold_of(word)
        constraints = [{"type": "language", "lang": R}]
        for name in (STEPS_EXTRAS if layout == "steps" else LIST_EXTRAS):  # a fixed, readable order
            if name not in chosen:
                continue
            if name == "num_steps":
                constraints.append({"type": "num_steps", "n": n})
            elif name == "answer_line":
                constraints.append({"type": "answer_line", "lang": R})
            elif name == "max_chars":
                constraints.append({"type": "max_chars", "k": _max_chars_for(gold)})
            elif name == "include_word":
                constraints.append({"type": "include_word", "word": word})
            elif name == "avoid_word":
                options = [w for w in avoid_choices if not word_occurs(gold, w)]
                constraints.append({"type": "avoid_word", "word": rng.choice(options)})
            elif name == "list_items":
                constraints.append({"type": "list_items", "n": n})
        texts = {}
        for plang in LANGS:
            parts = [prompt[plang]] + [describe(c, plang, R) for c in constraints]
            texts[plang] = " ".join(parts) if plang == "en" else "".join(parts)
        check = {"task": kind, "lang": R, "prompt": texts, "constraints": constraints}
        return {"question": texts["en"], "answer": gold, "steps": None, "reward": "instructions", "check": check}

    return make


INSTRUCTIONS = GeneratedSource("instructions", make_instructions(None),
                               description="verifiable instructions (IFEval-style), response language drawn per problem")
INSTRUCTIONS_ZH = GeneratedSource("instructions_zh", make_instructions("zh"),
                                  description="verifiable instructions (IFEval-style), responses in Chinese")
INSTRUCTIONS_EN = GeneratedSource("instructions_en", make_instructions("en"),
                                  description="verifiable instructions (IFEval-style), responses in English")
SOURCES = (INSTRUCTIONS, INSTRUCTIONS_ZH, INSTRUCTIONS_EN)
