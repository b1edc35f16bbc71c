"""Held-out evaluation: pass@1 / pass@k / maj@k, format rate, length, diversity, reward-hacking signs.

`evaluate(ctx, params, problems, key, k, temperature)` samples (greedy for pass@1, k at `temperature`
for pass@k / maj@k / diversity) through the run context, scores with the reward pool and summarises.
Below it, pure metric functions on Python lists (testable against hand-computed values) and
`summarize`, which turns per-problem sample records into the eval dict the trainer logs and writes
into summary.json (and `by_family`, the same per task family for mixed problem sets):

    rec = ProblemSamples(greedy_correct=True, greedy_format=1.0, greedy_text="...",
                         correct=[...k bools], answers=[...k str|None], texts=[...k str], formats=[...k floats])
    metrics = summarize([rec, ...], k=8)
    # {"pass@1", "pass@k", "maj@k", "format_rate", "mean_length", "language_consistency", "distinct_answers",
    #  "distinct_ngrams", "repetition_share", "sample_accuracy", "n_problems", "k",
    #  "solved": the greedy answers' per-problem indicators as "0110..." (solved_bits)}

pass@k uses the unbiased estimator 1 - C(n-c, k) / C(n, k) (n samples, c correct), computed
as a product so it never overflows. maj@k votes among the first k samples by answer equivalence:
answers that rewards.verify.is_equiv judges equal (`1/2` and `0.5`) form one cluster; the largest
cluster wins (ties go to the cluster seen first) and is scored by its first member's verification.
pass@1 comes with its standard error over problems (`pass@1_se`, binomial). `hacking_signs` compares two evals (e.g. the first and the latest) and
flags length growth with flat accuracy, and a rise in repetitive samples.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import jax
import numpy as np

from rewards.parse import extract_answer
from rewards.penalties import language_consistency, repetition_share
from rewards.verify import is_equiv
from rl import reward_terms, tool_rollout


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


def answer_clusters(answers: list[str | None], equiv=None) -> list[int | None]:
    """Cluster id per answer (None for no answer): equal keys share a cluster, and distinct keys are merged when
    `equiv(a, b)` (default rewards.verify.is_equiv) says they are the same value."""
    equiv = is_equiv if equiv is None else equiv
    keys = [_norm_answer(a) for a in answers]
    reps: list[str] = []  # one representative key per cluster
    by_key: dict[str, int] = {}
    out: list[int | None] = []
    for k in keys:
        if k is None:
            out.append(None)
            continue
        if k not in by_key:
            by_key[k] = next((c for c, r in enumerate(reps) if equiv(k, r)), len(reps))
            if by_key[k] == len(reps):
                reps.append(k)
        out.append(by_key[k])
    return out


def majority_answer(answers: list[str | None], equiv=None) -> int | None:
    """Index of the first sample of the largest equivalence cluster; None if no sample has an answer."""
    clusters = answer_clusters(answers, equiv)
    counts = Counter(c for c in clusters if c is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(i for i, c in enumerate(clusters) if c is not None and counts[c] == best)


def maj_at_k(answers: list[str | None], correct: list[bool], k: int, equiv=None) -> float:
    """1.0 if the majority (by equivalence) answer among the first k samples is a correct one, else 0.0."""
    idx = majority_answer(list(answers[:k]), equiv)
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


@dataclass
class ProblemSamples:
    """Everything evaluation needs about one problem."""

    greedy_correct: bool
    greedy_format: float
    greedy_text: str
    family: str = "math"  # the problem's task family (rl.tasks Problem.family: the reward, or gym/<generator>)
    language: float = 1.0  # language consistency of the greedy answer (rewards.penalties.language_consistency)
    correct: list[bool] = field(default_factory=list)  # k sampled answers verified
    answers: list[str | None] = field(default_factory=list)  # extracted final answers of the samples
    texts: list[str] = field(default_factory=list)  # sample texts (for diversity / repetition)
    formats: list[float] = field(default_factory=list)


def solved_bits(flags) -> str:
    """Per-problem indicators as a string, "1" solved and "0" not, in problem order ("0110"): what a paired
    comparison of two evaluations on the same problems needs (rl.metrics.paired_lift), compact in JSON."""
    return "".join("1" if f else "0" for f in flags)


def summarize(records: list[ProblemSamples], k: int, ngram: int = 2, repetition_threshold: float = 0.3) -> dict:
    """Aggregate per-problem records into the eval metrics (means over problems)."""
    if not records:
        raise ValueError("summarize needs at least one problem")
    p1 = float(np.mean([r.greedy_correct for r in records]))
    out = {
        "pass@1": p1,
        "pass@1_se": float(np.sqrt(p1 * (1 - p1) / max(len(records) - 1, 1))),
        "format_rate": float(np.mean([r.greedy_format for r in records])),
        "mean_length": float(np.mean([len(r.greedy_text) for r in records])),
        "language_consistency": float(np.mean([r.language for r in records])),
        "n_problems": len(records),
        "k": int(k),
        "solved": solved_bits([r.greedy_correct for r in records]),
    }
    if k > 0 and all(len(r.correct) >= k for r in records):
        out["pass@k"] = float(np.mean([pass_at_k(len(r.correct), int(sum(r.correct)), k) for r in records]))
        out["maj@k"] = float(np.mean([maj_at_k(r.answers, r.correct, k) for r in records]))
        out["sample_accuracy"] = float(np.mean([np.mean(r.correct) for r in records]))
        out["sample_format_rate"] = float(np.mean([np.mean(r.formats) for r in records])) if records[0].formats else 0.0
        out["distinct_answers"] = float(
            np.mean([len({c for c in answer_clusters(r.answers[:k]) if c is not None}) / k for r in records]))
        out["distinct_ngrams"] = float(np.mean([distinct_ngram_ratio(r.texts[:k], ngram) for r in records]))
        reps = [repetition_share(t) for r in records for t in r.texts[:k]]
        out["repetition_share"] = float(np.mean([x > repetition_threshold for x in reps])) if reps else 0.0
    else:  # no samples drawn: pass@k / maj@k fall back to the greedy answer
        out["pass@k"] = out["pass@1"]
        out["maj@k"] = out["pass@1"]
        out["repetition_share"] = float(np.mean([repetition_share(r.greedy_text) > repetition_threshold for r in records]))
    return out


def by_family(records: list[ProblemSamples], k: int) -> dict:
    """Per-family metrics when the records hold more than one task family: "<metric>/<family>" for pass@1 (math,
    code: solved; instructions: every constraint met), its standard error, format_rate (instructions: the share of
    constraints met), language_consistency and n_problems."""
    fams = sorted({r.family for r in records})
    if len(fams) < 2:
        return {}
    out = {}
    for f in fams:
        m = summarize([r for r in records if r.family == f], k)
        for key in FAMILY_KEYS:
            out[f"{key}/{f}"] = m[key]
    return out


FAMILY_KEYS = ("pass@1", "pass@1_se", "format_rate", "language_consistency", "n_problems")


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


SAMPLE_REWARD_KEYS = ("total", "solved", "outcome", "process", "format", "overlong", "repetition", "language",
                      "error", "error_kind")


def sample_records(problems, prompts: list[str], greedy_texts: list[str], greedy_scores: list[dict],
                   sample_texts: list[str], sample_scores: list[dict], k: int, n_show: int) -> list[dict]:
    """Complete samples for samples.jsonl: per problem, the greedy answer and the first `n_show` of its k samples,
    each as {"problem_id", "kind" ("greedy" | "sample i"), "prompt", "response", "answer" (extracted), "gold",
    "reward": the reward parts}; [] when n_show == 0."""
    if n_show <= 0:
        return []

    def rec(p, prompt, kind, text, sc):
        return {"problem_id": p.id, "kind": kind, "prompt": prompt, "response": text, "answer": extract_answer(text),
                "gold": p.answer, "reward": {key: sc.get(key) for key in SAMPLE_REWARD_KEYS if key in sc}}

    out = []
    for i, p in enumerate(problems):
        out.append(rec(p, prompts[i], "greedy", greedy_texts[i], greedy_scores[i]))
        for j in range(min(n_show, k) if sample_texts else 0):
            out.append(rec(p, prompts[i], f"sample {j}", sample_texts[i * k + j], sample_scores[i * k + j]))
    return out


def evaluate(ctx, params, problems, key, k: int, temperature: float, samples_out: list | None = None,
             n_show: int = 2, tools=None) -> dict:
    """Greedy pass@1 / format / length / language consistency plus k-sample pass@k, maj@k, diversity on
    `problems` (a RunContext from rl.context supplies the sampler, tokenizer and reward pool); per-family
    metrics (`by_family`) when the problems mix task families. With a `samples_out` list, `sample_records`
    (the greedy answer and `n_show` samples per problem) are appended to it. With `tools` (an
    rl.tool_rollout.ToolsConfig that is on) every answer above, greedy and sampled, is drawn with tool calls
    (rl/tool_rollout.py) and scored on the policy's own text, and `tool_metrics` adds the tool-free greedy pass@1
    and the tool metrics of the greedy answers."""
    prompts = [ctx.prompt(p) for p in problems]
    n = len(problems)
    with_tools = tools is not None and tools.on

    def draw(counts, sub, temp):
        if with_tools:
            return tool_rollout.sample(ctx, params, prompts, counts, sub, temperature=temp, model_cfg=ctx.model_cfg,
                                       cfg=tools)
        return ctx.sample(params, prompts, counts, sub, temperature=temp)

    samples, s_scores = None, None
    if k > 0 and not with_tools:  # one sampler call: each prompt's greedy answer and its k samples share a prefill
        both = draw([1 + k] * n, jax.random.fold_in(key, 0), np.tile([0.0] + [temperature] * k, n))
        greedy, samples = both.split(1)
    else:
        greedy = draw([1] * n, jax.random.fold_in(key, 0), 0.0)
    fut_g = ctx.scorer.submit(greedy.texts, problems, greedy.lengths)
    if k > 0:
        if samples is None:
            samples = draw([k] * n, jax.random.fold_in(key, 1), temperature)
        s_scores = ctx.scorer.result(ctx.scorer.submit(samples.texts, [p for p in problems for _ in range(k)],
                                                       samples.lengths))
    g_scores = ctx.scorer.result(fut_g)
    recs = []
    for i in range(n):
        p = problems[i]
        lang = p.check_data["lang"] if p.reward == "instructions" else ctx.lang
        r = ProblemSamples(greedy_correct=bool(g_scores[i]["solved"] > 0.5), greedy_format=float(g_scores[i]["format"]),
                           greedy_text=greedy.texts[i], family=p.family,
                           language=language_consistency(greedy.texts[i], lang))
        if samples is not None:
            sl = slice(i * k, (i + 1) * k)
            r.texts = samples.texts[sl]
            r.correct = [bool(sc["solved"] > 0.5) for sc in s_scores[sl]]
            r.formats = [float(sc["format"]) for sc in s_scores[sl]]
            r.answers = [extract_answer(t) for t in r.texts]
        recs.append(r)
    shown = []  # this eval's records in samples_out (the same dicts)
    if samples_out is not None:
        shown = sample_records(problems, prompts, greedy.texts, g_scores, samples.texts if samples else [],
                               s_scores or [], k, n_show)
        samples_out.extend(shown)
    prm = reward_terms.eval_metrics(ctx, prompts, samples, s_scores, k)  # prm.path: prm@k and its cost, else {}
    out = {**summarize(recs, k), **by_family(recs, k), **prm}
    if with_tools:
        _add_turns(ctx, shown, greedy, samples, k, n_show)
        out.update(tool_metrics(ctx, params, problems, prompts, jax.random.fold_in(key, 2), greedy, out,
                                samples_out if n_show > 0 else None))
    return out


def _add_turns(ctx, records: list[dict], greedy, samples, k: int, n_show: int) -> None:
    """Tool answers' records (sample_records' order: per problem the greedy answer, then min(n_show, k) samples)
    get `turns`, the policy and tool segments; the greedy ones are kind "greedy+tools"."""
    shown = min(n_show, k) if samples is not None else 0
    for rec_i, rec in enumerate(records):
        i, j = divmod(rec_i, 1 + shown)
        g, row = (greedy, i) if j == 0 else (samples, i * k + j - 1)
        if j == 0:
            rec["kind"] = "greedy+tools"
        rec["turns"] = tool_rollout.turn_records(ctx.tok, g.tokens[row], g.policy_mask[row], int(g.lengths[row]))


def tool_metrics(ctx, params, problems, prompts, key, greedy, out: dict, samples_out: list | None = None) -> dict:
    """What a tool run's evaluation adds to `out` (evaluate's metrics of answers drawn with tools): pass@1 with tools
    under its own name (`pass@1_tools`, `_se`), the tool-free greedy pass@1 (`pass@1_no_tools`, one more greedy pass
    without tool calls; its answers go to `samples_out` as kind "greedy") and the tool metrics of the greedy tool
    answers (tool_rollout.metrics: calls per answer, errors, tool tokens, copied answers)."""
    n = len(problems)
    plain = ctx.sample(params, prompts, [1] * n, key, temperature=0.0)
    sc = ctx.scorer.result(ctx.scorer.submit(plain.texts, problems, plain.lengths))
    if samples_out is not None:
        samples_out.extend(sample_records(problems, prompts, plain.texts, sc, [], [], 0, 1))
    # A run with a tool stage is judged with tools: pass@1 (the summary table, the best-policy choice, the hacking
    # signs), pass@k and every other field are the tool answers'; the tool-free greedy pass@1 stays beside them.
    facts = tool_rollout.metrics({**tool_rollout.tool_arrays(greedy, ctx.tok), "lengths": greedy.lengths})
    return {"pass@1_tools": out["pass@1"], "pass@1_tools_se": out["pass@1_se"],
            "pass@1_no_tools": float(np.mean([s["solved"] > 0.5 for s in sc])), **facts}
