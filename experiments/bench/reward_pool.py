"""Reward throughput: pairs/s of rewards.combine.score in one process vs rewards.pool.RewardPool, in one run.

    python -m experiments.bench.reward_pool                       # 2,000 pairs, pools of 1 and 2 workers
    python -m experiments.bench.reward_pool --n 500 --rounds 1    # quick
    python -m experiments.bench.reward_pool --workers 1,2,4 --md /tmp/bench/reward_pool.md

The mix (deterministic, seed 0) imitates what a policy writes: correct Chinese and English step solutions,
wrong final answers, wrong arithmetic steps, \\boxed LaTeX answers, symbolic answers that need sympy
(about 5%), answers missing, and long repetitive texts. Rounds alternate single-process and pool runs so a
noisy shared machine moves both; the table reports the median over rounds and the ratio pool / single.
Pool start-up (worker processes, sympy warm-up) is excluded: a warm-up batch runs first, as in training.
Every configuration scores with the same RewardConfig (process 0.2, format 0.1, repetition and language on).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

from rewards.combine import RewardConfig, score
from rewards.pool import RewardPool

CN = "零一二三四五六七八九"


def _cn(n: int) -> str:
    tens, ones = divmod(n, 10)
    return ("" if tens == 0 else ("十" if tens == 1 else CN[tens] + "十")) + (CN[ones] if ones else "")


def make_mix(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """n (text, gold) pairs of varied kinds."""
    rng = random.Random(seed)
    texts, golds = [], []
    for i in range(n):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
        s1, s2 = a + b, (a + b) * c
        kind = rng.random()
        if kind < 0.30:  # correct zh
            steps = [f"步骤{_cn(1)}：{a}+{b}={s1}", f"步骤{_cn(2)}：{s1}×{c}={s2}"]
            text, gold = "\n".join(steps) + f"\n答案：{s2}", str(s2)
        elif kind < 0.50:  # correct en
            text, gold = f"Step 1: {a} + {b} = {s1}\nStep 2: {s1} * {c} = {s2}\nAnswer: {s2}", str(s2)
        elif kind < 0.62:  # wrong final answer
            text, gold = f"步骤一：{a}+{b}={s1}\n步骤二：{s1}×{c}={s2}\n答案：{s2 + 1}", str(s2)
        elif kind < 0.72:  # wrong step
            text, gold = f"步骤一：{a}+{b}={s1 + 1}\n步骤二：{s1 + 1}×{c}={(s1 + 1) * c}\n答案：{(s1 + 1) * c}", str(s2)
        elif kind < 0.80:  # LaTeX fraction answer
            text, gold = f"Step 1: divide {a} by {b}\nAnswer: $\\boxed{{\\frac{{{a}}}{{{b}}}}}$", f"{a}/{b}"
        elif kind < 0.85:  # symbolic answer: sympy confirms in verify's worker
            text, gold = f"步骤一：展开\n答案：x^2 + {2 * c}x + {c * c}", f"(x+{c})^2"
        elif kind < 0.93:  # no answer / garbage
            text, gold = rng.choice(["", "我不知道", "Step 1: hmm", "\\boxed{", "答案："]), str(s2)
        else:  # long repetitive text (degenerate loop)
            text, gold = "步骤一：" + f"{a}+{b}={s1}，" * 80 + f"\n答案：{s1}", str(s1)
        texts.append(text)
        golds.append(gold)
    return texts, golds


def bench_single(texts, golds, cfg) -> float:
    t0 = time.perf_counter()
    for t, g in zip(texts, golds):
        score(t, g, cfg)
    return len(texts) / (time.perf_counter() - t0)


def bench_pool(pool, texts, golds) -> float:
    t0 = time.perf_counter()
    pool.score_batch(texts, golds)
    return len(texts) / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="pairs per measurement")
    ap.add_argument("--workers", default="1,2", help="comma-separated pool sizes")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (median reported)")
    ap.add_argument("--md", default=None, help="also write the table (with the command) to this Markdown file")
    ap.add_argument("--json", default=None, help="also write the figures as JSON to this path")
    args = ap.parse_args(argv)
    cfg = RewardConfig(w_process=0.2, w_format=0.1, w_repetition=0.1, w_language=0.1)
    texts, golds = make_mix(args.n)
    sizes = [int(w) for w in args.workers.split(",") if w.strip()]
    pools = {w: RewardPool(n_workers=w, timeout=10.0, cfg=cfg) for w in sizes}
    try:
        for p in pools.values():  # warm-up: workers started, sympy children up, first compile paths hot
            p.score_batch(texts[:200], golds[:200])
        score(texts[0], golds[0], cfg)
        single, per_pool = [], {w: [] for w in sizes}
        for _ in range(args.rounds):
            single.append(bench_single(texts, golds, cfg))
            for w, p in pools.items():
                per_pool[w].append(bench_pool(p, texts, golds))
        errors = {w: p.stats()["errors"] for w, p in pools.items()}
    finally:
        for p in pools.values():
            p.close()
    base = statistics.median(single)
    rows = [("single process (score loop)", base, 1.0, 0)]
    for w in sizes:
        med = statistics.median(per_pool[w])
        rows.append((f"RewardPool n_workers={w}", med, med / base, errors[w]))
    cmd = "python -m experiments.bench.reward_pool " + " ".join(argv if argv is not None else sys.argv[1:])
    load = tuple(round(x, 2) for x in os.getloadavg())
    lines = [f"| configuration | pairs/s (median of {args.rounds}) | ratio vs single | item errors |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {rate:,.0f} | {ratio:.2f}x | {err} |" for name, rate, ratio, err in rows]
    table = "\n".join(lines)
    header = (f"Command: `{cmd.strip()}`  \nMix: {args.n} pairs (see the script docstring), nproc={os.cpu_count()}, "
              f"load average at the end {load}")
    print(header)
    print(table)
    if args.md:
        os.makedirs(os.path.dirname(os.path.abspath(args.md)), exist_ok=True)
        with open(args.md, "w") as f:
            f.write("# Reward pool throughput\n\n" + header + "\n\n" + table + "\n")
    out = {"single": single, "pools": per_pool, "errors": errors}
    from experiments.bench.common import write_json  # here, after the pools closed: common starts JAX on import

    write_json(args.json, {**out, "pairs": args.n, "nproc": os.cpu_count(), "loadavg": load})
    return out


if __name__ == "__main__":
    main()
