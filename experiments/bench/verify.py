"""Answer verification benchmark: rewards.verify.is_equiv against math-verify, in one run.

    python -m experiments.bench.verify             # 800 pairs, single process and a pool of 2
    python -m experiments.bench.verify --quick     # 200 pairs, a smoke run
    python -m experiments.bench.verify --pairs 2000 --workers 4 --json out.json
    python -m experiments.bench.verify --against 100407f   # also: this tree's is_equiv vs rewards/ at a revision

Reports, for both verifiers on the SAME synthetic mix of answer pairs (integers with separators,
decimals, fractions, percentages, LaTeX, mathematics_dataset polynomials, equations, intervals,
sets, tuples, matrices, long solutions ending in \\boxed{}, true and false):
  - pairs/s in this process and in process pools: concurrent.futures (large chunks: the
    verifier's own scaling) and the project's rewards.pool.RewardPool with a score_fn that only
    verifies (per-item deadlines and crash isolation included), when it exists; rewards.verify
    gives each worker process its own sympy worker,
  - the ratio is_equiv / math-verify,
  - agreement with the mix's own labels,
  - agreement on the peer test tables ../shared/peers/mathverify_cases.jsonl and
    other_equiv_cases.jsonl when they exist (they are read, never copied into the project),
  - agreement on the project's own table of realistic Chinese / GSM8K / R1-style responses
    (tests/data/answers_zh_en.jsonl: written by us, so flattering to is_equiv; math-verify is
    given the same whole responses).
math-verify is called the two ways a user would: verify(parse(gold), parse(pred)) with its
defaults on the strings as they are ("as-is"), and with bare answers wrapped in $...$ as its
documentation shows ("$-wrapped": slower, finds more LaTeX answers).  The ratio is taken against
the faster of the two.  On the peer tables math-verify is also run with the extraction settings
each of its own tests used ("per-case config"), for reference.

With --against REV, `rewards/` at git revision REV is extracted to a temporary directory and
both verifiers run on the same mix in alternating subprocesses (3 rounds each); the figure is
pairs per CPU-second of the process (median of 5 passes), which a machine shared with other
jobs disturbs far less than wall-clock rates, and the ratio is this tree over REV.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rewards.verify import is_equiv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER_DIR = os.path.join(os.path.dirname(ROOT), "shared", "peers")
PEER_FILES = ("mathverify_cases.jsonl", "other_equiv_cases.jsonl")
ZH_EN_TABLE = os.path.join(ROOT, "tests", "data", "answers_zh_en.jsonl")


# ---------------------------------------------------------------------------------------------
# the synthetic mix

def _poly_pair(rng: random.Random):
    var = rng.choice("abcdfghjklmnopqrstuvwxyz")
    k, r1, r2 = rng.randint(1, 9), rng.randint(-300, 300), rng.randint(-300, 300)
    gold = f"{k}*({var} - {r1})*({var} - {r2})".replace("- -", "+ ")
    b, c = -k * (r1 + r2), k * r1 * r2

    def poly(lin: int) -> str:  # mathematics_dataset spelling: 5*o**2 - 1475*o + 16980
        return f"{k}*{var}**2 {'-' if lin < 0 else '+'} {abs(lin)}*{var} {'-' if c < 0 else '+'} {abs(c)}"

    good, bad = poly(b), poly(b + rng.choice([-1, 1]))
    return gold, good, bad


def make_mix(n: int, seed: int = 0) -> list[tuple[str, str, bool]]:
    """n (pred, gold, expected) pairs, about half of them equivalent, mostly numeric answers
    (as in RL on arithmetic) with a tail of symbolic and structured ones."""
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        kind = rng.choices(range(12), weights=[20, 8, 10, 5, 6, 10, 6, 5, 6, 3, 14, 4])[0]
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        x = rng.randint(1000, 9_999_999)
        if kind == 0:
            gold = str(x)
            pairs += [(f"{x:,}", gold, True), (str(x + rng.randint(1, 9)), gold, False),
                      (f"\\boxed{{{x}}}", gold, True)]
        elif kind == 1:
            dec = f"{a}.{b:02d}"
            pairs += [(dec + "0", dec, True), (f"{a}.{(b + 1) % 100:02d}", dec, False)]
        elif kind == 2:
            gold = f"{a}/{b}"
            pairs += [(f"\\frac{{{2 * a}}}{{{2 * b}}}", gold, True),
                      (f"\\dfrac{{{a + 1}}}{{{b}}}", gold, False),
                      (f"{a / b:.6f}", gold, True)]  # rounded to 6 decimals
        elif kind == 3:
            pairs += [(f"{a}\\%", str(a), True), (f"{a + 1}%", f"{a}\\%", False)]
        elif kind == 4:
            pairs += [(f"{a}*sqrt({b})/3", f"\\frac{{{a}\\sqrt{{{b}}}}}{{3}}", True),
                      (f"\\frac{{{a}\\sqrt{{{b + 1}}}}}{{3}}", f"{a}*sqrt({b})/3",
                       _sqrt_equal(a, b + 1, a, b))]
        elif kind == 5:
            gold, good, bad = _poly_pair(rng)
            pairs += [(good, gold, True), (bad, gold, False)]
        elif kind == 6:
            pairs += [(f"x = {a}", str(a), True), (f"x={a + 1}", f"x = {a}", False),
                      (f"y = {a}x + {b}", f"{a}x - y + {b} = 0", True)]
        elif kind == 7:
            pairs += [(f"[{a}, {a + b})", f"[{a},{a + b})", True), (f"({a}, {a + b})", f"[{a},{a + b})", False),
                      (f"{a} \\le x < {a + b}", f"x \\in [{a}, {a + b})", True)]
        elif kind == 8:
            pairs += [(f"\\{{{a}, {b}, 1\\}}", f"1, {b}, {a}", True), (f"({a}, {b + 100})", f"({b + 100}, {a})", False)]
        elif kind == 9:
            m = f"\\begin{{pmatrix}} {a} & {b} \\\\ 1 & 0 \\end{{pmatrix}}"
            pairs += [(m, m.replace("pmatrix", "bmatrix"), True), (m.replace(f"{a} &", f"{a + 1} &"), m, False)]
        elif kind == 10:
            body = (f"Step 1: We add {a} and {b} to get ${a + b}$. Step 2: Multiply by {b} to get "
                    f"${(a + b) * b}$. ")
            pairs += [(body + f"So the final answer is $\\boxed{{{(a + b) * b}}}$.", str((a + b) * b), True),
                      (body + f"Therefore the answer is $\\boxed{{{(a + b) * b + 1}}}$.", str((a + b) * b), False)]
        else:
            pairs += [("\\sin^2 x + \\cos^2 x", "1", True), (f"\\tan^2({a}y)+1", f"\\sec^2({a}y)", True),
                      (f"2\\sin(x)\\cos(x)", "\\sin(2x)", True), ("\\sin(x)^2", "\\cos(x)^2", False)]
    return pairs[:n]


def _sqrt_equal(a1, b1, a2, b2) -> bool:
    return a1 * a1 * b1 == a2 * a2 * b2


# ---------------------------------------------------------------------------------------------
# the two verifiers (top-level functions so a process pool can run them)

def run_is_equiv(pairs) -> list[bool]:
    return [is_equiv(p, g, timeout=1.0) for p, g in pairs]


def _delimited(s: str) -> str:
    """math-verify extracts LaTeX only inside $...$, \\(...\\), \\[...\\] or \\boxed{}: wrap a bare
    answer the way its documentation shows (a bare answer is otherwise often not found)."""
    if any(mark in s for mark in ("$", "\\boxed", "\\(", "\\[")):
        return s
    return f"${s}$"


def run_math_verify(pairs) -> list[bool]:
    out = []
    for p, g in pairs:
        try:
            out.append(bool(verify(parse(_delimited(g)), parse(_delimited(p)))))
        except Exception:  # noqa: BLE001 - count a crash as "not equivalent"
            out.append(False)
    return out


def run_math_verify_raw(pairs) -> list[bool]:
    out = []
    for p, g in pairs:
        try:
            out.append(bool(verify(parse(g), parse(p))))
        except Exception:  # noqa: BLE001
            out.append(False)
    return out


def _warm(name: str) -> int:
    RUNNERS[name]([("x^2 + 2x + 1", "(x+1)^2"), ("1/2", "0.5")])
    return os.getpid()


RUNNERS = {"is_equiv": run_is_equiv, "math_verify": run_math_verify, "math_verify_raw": run_math_verify_raw}


def timed(fn, pairs, reps: int) -> tuple[float, list[bool]]:
    """(median pairs/s over reps passes, results of the last pass)."""
    rates = []
    for _ in range(reps):
        start = time.perf_counter()
        out = fn(pairs)
        rates.append(len(pairs) / (time.perf_counter() - start))
    return statistics.median(rates), out


def pool_score_is_equiv(text, gold, cfg=None, *, n_tokens=None) -> dict:
    """A rewards.pool score_fn that only verifies (module level, so pool workers import it)."""
    return {"total": float(run_is_equiv([(text, gold)])[0]), "error": 0}


def pool_score_math_verify(text, gold, cfg=None, *, n_tokens=None) -> dict:
    return {"total": float(run_math_verify([(text, gold)])[0]), "error": 0}


def pool_score_math_verify_raw(text, gold, cfg=None, *, n_tokens=None) -> dict:
    return {"total": float(run_math_verify_raw([(text, gold)])[0]), "error": 0}


POOL_SCORE_FNS = {"is_equiv": pool_score_is_equiv, "math_verify": pool_score_math_verify,
                  "math_verify_raw": pool_score_math_verify_raw}


def timed_futures_pool(name: str, pairs, workers: int) -> float:
    """pairs/s over one pass through a concurrent.futures process pool (large chunks), warm."""
    chunk = max(8, -(-len(pairs) // (workers * 2)))  # few large tasks: pickling is not free
    chunks = [pairs[i:i + chunk] for i in range(0, len(pairs), chunk)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_warm, [name] * workers * 2))  # imports and sympy workers, untimed
        start = time.perf_counter()
        list(pool.map(RUNNERS[name], chunks))
        return len(pairs) / (time.perf_counter() - start)


def timed_reward_pool(name: str, pairs, workers: int) -> float | None:
    """pairs/s through the project's rewards.pool.RewardPool (per-item deadlines, crash
    isolation), with a score_fn that only verifies; None when rewards.pool is absent."""
    try:  # here, not at the top: --against's children import this module with an older rewards/ first on the path
        from rewards.pool import RewardPool
    except ImportError:
        return None
    texts, golds = [p for p, _ in pairs], [g for _, g in pairs]
    with RewardPool(n_workers=workers, timeout=30.0, score_fn=POOL_SCORE_FNS[name]) as pool:
        pool.score_batch(texts[:4 * workers], golds[:4 * workers])  # untimed warm-up
        start = time.perf_counter()
        pool.score_batch(texts, golds)
        return len(pairs) / (time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# agreement on the peer tables

def _mv_configured(row) -> bool:
    cfg = row.get("config") or {}
    if cfg.get("api") != "compare_strings":
        return bool(verify(parse(str(row["gold"])), parse(str(row["pred"]))))
    extraction = [LatexExtractionConfig(boxed_match_priority=0) if m == "latex" else ExprExtractionConfig()
                  for m in cfg.get("match_types", ["latex", "expr"])]
    return bool(verify(parse(str(row["gold"]), extraction), parse(str(row["pred"]), extraction),
                       float_rounding=cfg.get("precision", 6), strict=cfg.get("strict", True),
                       allow_set_relation_comp=cfg.get("allow_set_relation_comp", False)))


def peer_agreement() -> list[dict]:
    results = []
    for fname in PEER_FILES:
        path = os.path.join(PEER_DIR, fname)
        if not os.path.exists(path):
            print(f"[verify bench] {path} not found: peer agreement skipped "
                  "(it lives in ../shared/peers next to the repository)")
            continue
        with open(path, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        ours = [is_equiv(r["pred"], r["gold"], timeout=2.0) == r["expected"] for r in rows]
        mv_default = run_math_verify_raw([(str(r["pred"]), str(r["gold"])) for r in rows])
        mv_default = [m == r["expected"] for m, r in zip(mv_default, rows)]
        entry = {"table": fname, "n": len(rows), "is_equiv": sum(ours) / len(rows),
                 "math_verify_default": sum(mv_default) / len(rows),
                 "is_equiv_misses": [i for i, ok in enumerate(ours) if not ok]}
        if fname == "mathverify_cases.jsonl":
            configured = []
            for r in rows:
                try:
                    configured.append(_mv_configured(r) == r["expected"])
                except Exception:  # noqa: BLE001
                    configured.append(False)
            entry["math_verify_configured"] = sum(configured) / len(rows)
        results.append(entry)
    return results


def zh_en_agreement() -> dict | None:
    """Agreement with the expected verdicts of tests/data/answers_zh_en.jsonl (whole responses)."""
    if not os.path.exists(ZH_EN_TABLE):
        return None
    with open(ZH_EN_TABLE, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    ours = [is_equiv(r["text"], r["gold"], timeout=2.0) == r["expected"] for r in rows]
    mv = run_math_verify_raw([(r["text"], r["gold"]) for r in rows])
    return {"table": "answers_zh_en.jsonl", "n": len(rows), "is_equiv": sum(ours) / len(rows),
            "math_verify_default": sum(m == r["expected"] for m, r in zip(mv, rows)) / len(rows)}


# ---------------------------------------------------------------------------------------------
# this tree against an earlier revision of rewards/

_CPU_RATE = """
import statistics, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]   # the rewards/ to time first, then this tree (for the mix)
from experiments.bench.verify import make_mix
from rewards.verify import is_equiv
pairs = [(p, g) for p, g, _ in make_mix(int(sys.argv[3]))]
[is_equiv(p, g) for p, g in pairs[:50]]
rates = []
for _ in range(5):
    start = time.process_time()
    [is_equiv(p, g, timeout=1.0) for p, g in pairs]
    rates.append(len(pairs) / (time.process_time() - start))
print(statistics.median(rates))
"""


def cpu_rate_against(rev: str, n_pairs: int, rounds: int = 3) -> dict:
    """Pairs per CPU-second of this tree's is_equiv and of rewards/ at `rev`, alternating subprocesses."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "rewards"], capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as old:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
        rates = {"current": [], rev: []}
        for _ in range(rounds):
            for name, path in (("current", ROOT), (rev, old)):
                out = subprocess.run([sys.executable, "-c", _CPU_RATE, path, ROOT, str(n_pairs)],
                                     capture_output=True, text=True, check=True, cwd=ROOT)
                rates[name].append(float(out.stdout.split()[-1]))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"rev": rev, "rates": rates, "current": med["current"], "baseline": med[rev],
            "ratio": med["current"] / med[rev]}


# ---------------------------------------------------------------------------------------------

def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=800)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="200 pairs, 1 repetition")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--against", default=None, metavar="REV",
                    help="also time rewards/ at this git revision against this tree (pairs per CPU-second)")
    args = ap.parse_args(argv)
    if args.quick:
        args.pairs, args.reps = 200, 1
    sys.path.insert(0, ROOT)

    mix = make_mix(args.pairs)
    pairs = [(p, g) for p, g, _ in mix]
    labels = [e for _, _, e in mix]
    for fn in RUNNERS.values():  # warm-up: imports, caches and the sympy worker, untimed
        fn(pairs[:50])

    report = {"pairs": len(pairs), "equivalent": sum(labels), "workers": args.workers,
              "single": {}, "pool": {}, "mix_agreement": {}}
    for name, fn in RUNNERS.items():
        rate, out = timed(fn, pairs, args.reps)
        report["single"][name] = rate
        report["mix_agreement"][name] = sum(o == e for o, e in zip(out, labels)) / len(labels)
    report["reward_pool"] = {}
    for name in RUNNERS:
        report["pool"][name] = timed_futures_pool(name, pairs, args.workers)
        rate = timed_reward_pool(name, pairs, args.workers)
        if rate is not None:
            report["reward_pool"][name] = rate
    report["peers"] = peer_agreement()
    zh_en = zh_en_agreement()
    if zh_en is not None:
        report["peers"].append(zh_en)
    # the ratio is taken against the faster of the two ways of calling math-verify
    if not report["reward_pool"]:
        del report["reward_pool"]
    for mode in ("single", "pool", "reward_pool"):
        if mode not in report:
            continue
        best = max(report[mode]["math_verify"], report[mode]["math_verify_raw"])
        report[f"ratio_{mode}"] = report[mode]["is_equiv"] / best
    if args.against:
        report["against"] = cpu_rate_against(args.against, args.pairs)
    print_report(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
    return report


def print_report(report: dict) -> None:
    cols = [("is_equiv", "is_equiv"), ("math_verify", "mv $-wrapped"), ("math_verify_raw", "mv as-is")]
    print(f"\nmix: {report['pairs']} pairs ({report['equivalent']} equivalent), "
          f"pools of {report['workers']} processes\n")
    print(f"{'':30}" + "".join(f"{title:>14}" for _, title in cols) + f"{'ratio':>9}")
    for mode, title in (("single", "pairs/s, 1 process"), ("pool", "pairs/s, futures pool"),
                        ("reward_pool", "pairs/s, rewards.pool")):
        if mode not in report:
            continue
        print(f"{title:30}" + "".join(f"{report[mode][key]:>14.0f}" for key, _ in cols)
              + f"{report['ratio_' + mode]:>8.1f}x")
    print(f"{'agreement, mix labels':30}" + "".join(f"{report['mix_agreement'][key]:>14.1%}" for key, _ in cols))
    for entry in report["peers"]:
        name = "agreement, " + entry["table"].split(".")[0]
        print(f"{name:30}{entry['is_equiv']:>14.1%}{'':>14}{entry['math_verify_default']:>14.1%}   (n={entry['n']})")
        if "math_verify_configured" in entry:
            print(f"{'  math-verify, per-case config':30}{'':>14}{'':>14}{entry['math_verify_configured']:>14.1%}")
    print("ratio: is_equiv pairs/s over the faster math-verify column")
    if "against" in report:
        a = report["against"]
        print(f"\nis_equiv pairs per CPU-second, this tree {a['current']:.0f} vs rewards/ at {a['rev']} "
              f"{a['baseline']:.0f}: {a['ratio']:.3f}x (medians of {len(a['rates']['current'])} alternating runs)")


if __name__ == "__main__":
    main()
