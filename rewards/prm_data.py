"""Training data for the process reward model (rewards/prm.py): gold solutions with corrupted steps, labelled
by the exact step checker, and the byte-token windows the PRM reads.

    examples = build_examples("add,sub,mul,word,word_zh", n=1000, seed=0, split="train")
    examples[0].text, examples[0].labels      # labels == rewards.steps.check_steps(text)

Corruptions (one step of a solution, chosen among steps with an `a op b = c` claim):
    digit    one digit of a result (a number right after "=") is changed
    operand  one digit of an operand (a number left of "=") is changed
    carry    a result is off by 10**k (k = 0 is off-by-one, k > 0 a dropped / extra carry)
With probability `propagate_prob` the wrong result is carried into later steps and the answer (every whole-number
occurrence of the old value is replaced), so later steps may become wrong too, or stay consistent with the error.
Whatever the corruption does, the labels are what `check_steps` says about the final text, so they are exact.

Windows. A text is byte-tokenised (BOS + UTF-8 bytes, as models.tokenizer.ByteTokenizer) and each step is
read at the token of its last byte (rewards.parse.step_spans gives the character span). A causal model therefore
sees the prefix up to and including the step. Texts longer than `max_len` tokens are cut into windows of
max_len tokens starting at multiples of max_len // 2; a step is read in the first window that contains its end,
so every step has at least max_len // 2 tokens of context (or the whole prefix).
"""
from __future__ import annotations

import random
import re
from typing import NamedTuple

import numpy as np

from rewards.parse import as_text, step_spans
from rewards.steps import check_steps
from rl.tasks import load_mix, render_prompt
from rl.tasks.render import render_steps

__all__ = ["Example", "CORRUPTIONS", "corrupt_steps", "make_example", "build_examples", "token_ids",
           "step_end_tokens", "windows", "Windows", "encode_windows"]

CORRUPTIONS = ("digit", "operand", "carry")
BOS, OFFSET = 1, 3  # models.tokenizer.ByteTokenizer ids: byte b -> b + 3
_RESULT = re.compile(r"=\s*(\d+)")  # a number right after "=": a claimed result
_OPERAND = re.compile(r"(\d+)(?=\s*[-+*/×÷])")  # a number followed by an operator: an operand


class Example(NamedTuple):
    """One (possibly corrupted) rendered solution and its step labels."""

    text: str  # prompt + solution, or the solution alone
    labels: tuple  # check_steps(text): 1.0 / 0.0 / None per step
    kind: str  # "clean" or one of CORRUPTIONS
    corrupted_step: int  # index of the corrupted step, -1 when clean
    propagated: bool  # the wrong value was carried into later steps
    problem_id: str
    split: str


def _change_digit(num: str, rng: random.Random) -> str:
    """The same number with one digit changed (never a new leading zero)."""
    i = rng.randrange(len(num))
    choices = [d for d in "0123456789" if d != num[i] and not (i == 0 and d == "0" and len(num) > 1)]
    return num[:i] + rng.choice(choices) + num[i + 1:]


def _off_by_carry(num: str, rng: random.Random) -> str:
    value, k = int(num), rng.randrange(len(num))
    delta = 10 ** k
    if value - delta < 0 or rng.random() < 0.5:
        return str(value + delta)
    return str(value - delta)


def _replace_number(text: str, old: str, new: str) -> str:
    """Every whole-number occurrence of old (not part of a longer number or decimal) replaced by new."""
    return re.sub(rf"(?<![\d.]){re.escape(old)}(?![\d]|\.\d)", new, text)


def corrupt_steps(steps: tuple, answer: str, kind: str, propagate: bool, rng: random.Random):
    """(new steps, new answer, index of the corrupted step), or None when no step has a number to corrupt."""
    rx = _OPERAND if kind == "operand" else _RESULT
    candidates = [(i, m) for i, s in enumerate(steps) if "=" in s for m in rx.finditer(s)]
    if not candidates:
        return None
    i, m = rng.choice(candidates)
    old = m.group(1)
    new = _off_by_carry(old, rng) if kind == "carry" else _change_digit(old, rng)
    steps = list(steps)
    steps[i] = steps[i][:m.start(1)] + new + steps[i][m.end(1):]
    if propagate and kind != "operand":
        steps[i + 1:] = [_replace_number(s, old, new) for s in steps[i + 1:]]
        answer = _replace_number(answer, old, new)
    return tuple(steps), answer, i


def make_example(problem, lang: str, with_prompt: bool, kind: str, propagate: bool, rng: random.Random) -> Example:
    """Render one problem (corrupted when kind != "clean") and label it with check_steps."""
    steps, answer, idx = problem.steps, problem.answer, -1
    if kind != "clean":
        out = corrupt_steps(steps, answer, kind, propagate, rng)
        if out is None:
            kind, propagate = "clean", False
        else:
            steps, answer, idx = out
    text = render_steps(steps, answer, lang)
    if with_prompt:
        text = render_prompt(problem, lang) + text
    return Example(text, tuple(check_steps(text)), kind, idx, bool(propagate and kind != "clean"),
                   problem.id, "")


def _lang_for(problem, rng: random.Random, zh_fraction: float) -> str:
    # Word problems are written in one language; render their markers in the same one.
    if problem.source.startswith("word"):
        return "zh" if problem.source.endswith("_zh") else "en"
    return "zh" if rng.random() < zh_fraction else "en"


def build_examples(mix: str, n: int, seed: int, split: str, *, corrupt_prob: float = 0.6,
                   propagate_prob: float = 0.5, zh_fraction: float = 0.5, prompt_fraction: float = 0.3) -> list[Example]:
    """n labelled examples from problems of one rl.tasks split (problems without gold steps are skipped, so
    the mix should name step-annotated sources). Deterministic in all arguments."""
    problems = [p for p in load_mix(mix, n, seed, split) if p.steps]
    rng = random.Random(f"prm|{mix}|{seed}|{split}")
    out = []
    for p in problems:
        lang = _lang_for(p, rng, zh_fraction)
        with_prompt = rng.random() < prompt_fraction
        kind = rng.choice(CORRUPTIONS) if rng.random() < corrupt_prob else "clean"
        propagate = rng.random() < propagate_prob
        out.append(make_example(p, lang, with_prompt, kind, propagate, rng)._replace(split=split))
    return out


# ---- tokens and windows -------------------------------------------------------------------------------------------
def _utf8_lengths(text: str) -> np.ndarray:
    """Bytes per character under encode("utf-8", errors="replace") (a lone surrogate becomes one "?")."""
    cps = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
    lengths = 1 + (cps >= 0x80) + (cps >= 0x800) + (cps >= 0x10000)
    surrogate = (cps >= 0xD800) & (cps <= 0xDFFF)
    return np.where(surrogate, 1, lengths).astype(np.int64)


def token_ids(text: str) -> np.ndarray:
    """BOS + byte ids, as ByteTokenizer.encode(add_bos=True), but lone surrogates become "?" instead of raising."""
    raw = np.frombuffer(text.encode("utf-8", errors="replace"), dtype=np.uint8).astype(np.int32)
    return np.concatenate([np.array([BOS], np.int32), raw + OFFSET])


def step_end_tokens(text: str, spans) -> np.ndarray:
    """Token index (in token_ids(text)) of the last byte of each span's last character."""
    if not spans:
        return np.zeros((0,), np.int64)
    cum = np.concatenate([[0], np.cumsum(_utf8_lengths(text))])
    ends = np.array([e for _, e in spans], np.int64)
    return cum[ends]  # BOS is token 0, so the byte at offset j is token j + 1; the last byte is cum[end] - 1 + 1


class Windows(NamedTuple):
    """Token windows of a batch of texts and where each step is read.

    tokens/mask [N, L]; for step j of text t: window[t][j] and pos[t][j] (index into tokens[window, pos])."""

    tokens: np.ndarray
    mask: np.ndarray
    window: list
    pos: list


def windows(n_tokens: int, ends: np.ndarray, max_len: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Window starts needed for one text and, per step end, (window number, position in window)."""
    half = max(max_len // 2, 1)
    starts = np.where(ends < max_len, 0, -(-(ends - max_len + 1) // half) * half)
    uniq = sorted(set(int(s) for s in starts))
    which = np.searchsorted(np.array(uniq, np.int64), starts) if uniq else np.zeros((0,), np.int64)
    return uniq, which, ends - starts


def encode_windows(texts, max_len: int) -> Windows:
    """Windows of all texts (see the module docstring); step spans come from rewards.parse.step_spans."""
    rows, window, pos = [], [], []
    for text in texts:
        text = as_text(text)
        ids = token_ids(text)
        ends = step_end_tokens(text, step_spans(text))
        starts, which, where = windows(len(ids), ends, max_len)
        base = len(rows)
        rows += [ids[s:s + max_len] for s in starts]
        window.append([base + int(w) for w in which])
        pos.append([int(p) for p in where])
    tokens = np.zeros((len(rows), max_len), np.int32)
    mask = np.zeros((len(rows), max_len), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return Windows(tokens, mask, window, pos)
