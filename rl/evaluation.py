"""Held-out evaluation: pass@1 / pass@k / maj@k, format rate, length, diversity, reward-hacking signs.

Pure metric functions on Python lists (testable against hand-computed values) plus
`summarize`, which turns per-problem sample records into the eval dict the trainer logs
and writes into summary.json:

    rec = ProblemSamples(greedy_correct=True, greedy_format=1.0, greedy_text="...",
                         correct=[...k bools], answers=[...k str|None], texts=[...k str], formats=[...k floats])
    metrics = summarize([rec, ...], k=8)
    # {"pass@1", "pass@k", "maj@k", "format_rate", "mean_length", "distinct_answers",
    #  "distinct_ngrams", "repetition_share", "sample_accuracy", "n_problems", "k"}

pass@k uses the unbiased estimator 1 - C(n-c, k) / C(n, k) (n samples, c correct), computed
as a product so it never overflows. maj@k takes the most frequent extracted answer among the
first k samples (ties go to the answer that appeared first) and scores it as that answer's
verification result. `hacking_signs` compares two evals (e.g. the first and the latest) and
flags length growth with flat accuracy, and a rise in repetitive samples.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021's estimator)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def _norm_answer(a: str | None) -> str | None:
    """Answer key for voting: stripped, inner whitespace removed; empty -> None."""
    if a is None:
        return None
    key = "".join(str(a).split())
    return key or None


def majority_answer(answers: list[str | None]) -> int | None:
    """Index of the first sample carrying the most frequent (normalised) answer; None if no answers."""
    keys = [_norm_answer(a) for a in answers]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return None
    best = max(counts.values())
    for i, k in enumerate(keys):  # first occurrence among the tied winners
        if k is not None and counts[k] == best:
            return i
    return None


def maj_at_k(answers: list[str | None], correct: list[bool], k: int) -> float:
    """1.0 if the majority answer among the first k samples is a correct one, else 0.0."""
    idx = majority_answer(list(answers[:k]))
    return float(bool(correct[idx])) if idx is not None else 0.0


def ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    """Word n-grams of `text` (whitespace split; for text without spaces, character n-grams)."""
    toks = text.split()
    if len(toks) <= 1:
        toks = list(text)
    return [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]


def distinct_ngram_ratio(texts: list[str], n: int = 2) -> float:
    """Distinct n-grams over all n-grams across a problem's samples (1.0 = no overlap at all)."""
    grams = [g for t in texts for g in ngrams(t, n)]
    return float(len(set(grams)) / len(grams)) if grams else 0.0


def repetition_fraction(text: str, n: int = 4) -> float:
    """Share of n-grams in one text that repeat an earlier n-gram of the same text."""
    grams = ngrams(text, n)
    if not grams:
        return 0.0
    return float(1.0 - len(set(grams)) / len(grams))


@dataclass
class ProblemSamples:
    """Everything evaluation needs about one problem."""

    greedy_correct: bool
    greedy_format: float
    greedy_text: str
    correct: list[bool] = field(default_factory=list)  # k sampled answers verified
    answers: list[str | None] = field(default_factory=list)  # extracted final answers of the samples
    texts: list[str] = field(default_factory=list)  # sample texts (for diversity / repetition)
    formats: list[float] = field(default_factory=list)


def summarize(records: list[ProblemSamples], k: int, ngram: int = 2, repetition_threshold: float = 0.3) -> dict:
    """Aggregate per-problem records into the eval metrics (means over problems)."""
    if not records:
        raise ValueError("summarize needs at least one problem")
    out = {
        "pass@1": float(np.mean([r.greedy_correct for r in records])),
        "format_rate": float(np.mean([r.greedy_format for r in records])),
        "mean_length": float(np.mean([len(r.greedy_text) for r in records])),
        "n_problems": len(records),
        "k": int(k),
    }
    if k > 0 and all(len(r.correct) >= k for r in records):
        out["pass@k"] = float(np.mean([pass_at_k(len(r.correct), int(sum(r.correct)), k) for r in records]))
        out["maj@k"] = float(np.mean([maj_at_k(r.answers, r.correct, k) for r in records]))
        out["sample_accuracy"] = float(np.mean([np.mean(r.correct) for r in records]))
        out["sample_format_rate"] = float(np.mean([np.mean(r.formats) for r in records])) if records[0].formats else 0.0
        out["distinct_answers"] = float(
            np.mean([len({_norm_answer(a) for a in r.answers[:k] if _norm_answer(a) is not None}) / k for r in records])
        )
        out["distinct_ngrams"] = float(np.mean([distinct_ngram_ratio(r.texts[:k], ngram) for r in records]))
        reps = [repetition_fraction(t) for r in records for t in r.texts[:k]]
        out["repetition_share"] = float(np.mean([x > repetition_threshold for x in reps])) if reps else 0.0
    else:  # no samples drawn: pass@k / maj@k fall back to the greedy answer
        out["pass@k"] = out["pass@1"]
        out["maj@k"] = out["pass@1"]
        out["repetition_share"] = float(np.mean([repetition_fraction(r.greedy_text) > repetition_threshold for r in records]))
    return out


def hacking_signs(first: dict, latest: dict, length_growth: float = 0.5, flat_accuracy: float = 0.02) -> dict:
    """Reward-hacking flags between two evals.

    length_hack: mean length grew by more than `length_growth` (relative) while pass@1 moved
    by less than `flat_accuracy`; repetition_rise: the repetitive-sample share went up by more
    than 0.1. Both as floats (0/1) so they can be logged alongside other metrics.
    """
    l0, l1 = float(first.get("mean_length", 0.0)), float(latest.get("mean_length", 0.0))
    growth = (l1 - l0) / max(l0, 1.0)
    acc_delta = float(latest.get("pass@1", 0.0)) - float(first.get("pass@1", 0.0))
    rep_delta = float(latest.get("repetition_share", 0.0)) - float(first.get("repetition_share", 0.0))
    return {
        "length_growth": float(growth),
        "accuracy_delta": float(acc_delta),
        "length_hack": float(growth > length_growth and abs(acc_delta) < flat_accuracy),
        "repetition_rise": float(rep_delta > 0.1),
    }
