"""Metric logging: one JSONL line per step, generated samples, TensorBoard event files, progress lines, the table.

    w = MetricsWriter(workdir, tensorboard=True)
    w.write(step, {"reward/mean": 0.4, "kl": 0.01}, stage="grpo", phase="train")
    w.write_samples(step, sample_recs, stage="grpo", split="validation")   # samples.jsonl + TensorBoard text
    w.close()
    print(format_table(summary["eval"], ["pass@1", "pass@k", "format_rate"]))
    print(results_table(summary["eval"], k=4, temperature=0.6))   # the held-out table a run ends with
    clock = Clock(); clock.say("evaluating the initial policy")          # "[   3.1 s] evaluating ..."
    memory_metrics()   # {"mem/rss_gib", "mem/peak_rss_gib", "mem/arrays_gib"}: every unit's record carries them (summary: "memory")

The held-out table (`results_table`) gives each row's greedy pass@1 with its standard error and 95 % Wilson
interval (`wilson_interval`), its lift over the initial policy with the paired standard error (`paired_lift`: the
same test problems, per-problem solved indicators), pass@k / maj@k with their sampling temperature (only when k > 0),
and says in words when the test set is too small (n < SMALL_N) for its rows to be told apart.

`metrics.jsonl` lines are {"step": int, "stage": str, "phase": str, "time": float, ...metrics};
non-finite floats are written as null so every line is valid JSON. `flatten` turns nested
metric dicts into "a/b" keys. `samples.jsonl` lines are {"step", "stage", "split", ...one sample record of
rl.evaluation.sample_records}. On resume the writer appends to both, after dropping lines for steps the
resumed run will redo (so the files stay free of duplicates).

TensorBoard: one tag per metric, named exactly as in metrics.jsonl (`validation/pass@1`, `loss`, `reward/mean`),
so a metric is one curve across all stages over the global unit; the scalar `stage` holds the stage's index
(0 = initial, in order of appearance) to tell the stages apart. Tags are written with tensorboardX's FileWriter
and a hand-built Summary, because SummaryWriter.add_scalar rewrites `@` to `_` (`pass@1` -> `pass_1`). When
TensorBoard is on and workdir/tb does not exist yet while metrics.jsonl does (a run started from another run's
prefix, or one that turned TensorBoard on at resume), the existing records are written to it first.
"""
from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from typing import Any

import jax
import numpy as np
import psutil
from tensorboardX import FileWriter
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.summary import text as tb_text
from tqdm import tqdm

from rl.workdir_lock import WorkdirError


def to_float(v: Any) -> float | None:
    """Scalar (Python, NumPy or JAX) -> float, non-finite -> None."""
    try:
        f = float(np.asarray(v))
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a/b": 1}; array leaves with more than one element become a/b/0, a/b/1, ..."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (str, bool)) or v is None:
            out[key] = v
        else:
            arr = np.asarray(v)
            if arr.ndim == 0:
                out[key] = to_float(arr)
            else:
                for i, x in enumerate(arr.reshape(-1)):
                    out[f"{key}/{i}"] = to_float(x)
    return out


class MetricsWriter:
    """Appends metrics to workdir/metrics.jsonl, samples to workdir/samples.jsonl and (optionally) both to
    TensorBoard event files in workdir/tb."""

    def __init__(self, workdir: str, tensorboard: bool = True, truncate_after_step: int | None = None):
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.samples_path = os.path.join(workdir, "samples.jsonl")
        for path in (self.path, self.samples_path):
            if truncate_after_step is not None and os.path.exists(path):
                _truncate(path, truncate_after_step)
        old = read_jsonl(self.path) if os.path.exists(self.path) else []
        self.stages = list(dict.fromkeys(r["stage"] for r in old if r.get("stage")))  # index = TB `stage` scalar
        self._f = open(self.path, "a", encoding="utf-8")
        self._s = open(self.samples_path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            tb_dir = os.path.join(workdir, "tb")
            backfill = old and not os.path.isdir(tb_dir)
            self._tb = FileWriter(tb_dir, flush_secs=10)
            for r in old if backfill else ():
                self._tb_scalars(r["step"], {k: v for k, v in r.items() if k not in ("step", "time")}, r.get("stage"))

    def _tb_scalars(self, step: int, flat: dict, stage: str | None) -> None:
        vals = [Summary.Value(tag=k, simple_value=v) for k, v in flat.items() if isinstance(v, float)]
        if stage:
            if stage not in self.stages:
                self.stages.append(stage)
            vals.append(Summary.Value(tag="stage", simple_value=float(self.stages.index(stage))))
        self._tb.add_summary(Summary(value=vals), int(step))

    def write(self, step: int, metrics: dict, **tags: str) -> dict:
        """Log one step; returns the flattened record that was written."""
        flat = flatten(metrics)
        rec = {"step": int(step), **tags, "time": time.time(), **flat}
        self._f.write(json.dumps(rec, allow_nan=False) + "\n")
        self._f.flush()
        if tags.get("stage") and tags["stage"] not in self.stages:
            self.stages.append(tags["stage"])
        if self._tb is not None:
            self._tb_scalars(step, flat, tags.get("stage"))
        return rec

    def write_samples(self, step: int, samples: list[dict], **tags: str) -> None:
        """Append sample records (rl.evaluation.sample_records) to samples.jsonl; TensorBoard text
        `samples/<split>` shows them as one markdown page per evaluation."""
        if not samples:
            return
        for s in samples:
            self._s.write(json.dumps({"step": int(step), **tags, **s}, ensure_ascii=False, default=str) + "\n")
        self._s.flush()
        if self._tb is not None:
            self._tb.add_summary(tb_text(f"samples/{tags.get('split', 'eval')}", samples_markdown(samples)), int(step))

    def close(self) -> None:
        self._f.close()
        self._s.close()
        if self._tb is not None:
            self._tb.close()


def _truncate(path: str, last_step: int) -> None:
    """Keep only lines with step <= last_step (steps after the checkpoint are redone)."""
    keep = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut off by a kill: redone
            if not isinstance(rec, dict):
                raise WorkdirError(f"{path} line {i} is a JSON {type(rec).__name__}, not a metrics record (the file "
                                   "was edited or damaged): remove that line, or use a new --workdir")
            try:
                if int(rec.get("step", -1)) <= last_step:
                    keep.append(line)
            except (TypeError, ValueError, OverflowError):
                continue
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(keep)


def samples_markdown(samples: list[dict], max_chars: int = 600) -> str:
    """Sample records as markdown (TensorBoard's text plugin): problem, gold, answer, verdict, the response."""
    out = []
    for s in samples:
        resp = str(s.get("response", ""))
        resp = resp if len(resp) <= max_chars else resp[:max_chars] + " ..."
        reward = s.get("reward") or {}
        out.append(f"**{s.get('problem_id', '')}** ({s.get('kind', '')}) gold `{s.get('gold')}` answer "
                   f"`{s.get('answer')}` solved {reward.get('solved')} total {reward.get('total')}\n\n"
                   f"    {s.get('prompt', '')!r}\n\n    {resp!r}")
    return "\n\n---\n\n".join(out)


class Clock:
    """Progress lines with the time since the run started: `[  12.3 s] message` (through tqdm.write, so a
    progress bar on screen is not broken). Printed whatever log.progress says: no phase is silent."""

    def __init__(self, offset: float = 0.0):
        self.t0 = time.time() - offset

    def say(self, msg: str) -> None:
        tqdm.write(f"[{time.time() - self.t0:7.1f} s] {msg}", file=sys.stdout)
        sys.stdout.flush()


def depends_on_the_machine(key: str) -> bool:
    """Whether a metric measures the machine (wall times, rates, memory) rather than the run: two runs of one
    command on one machine agree on every other metric (tests compare records without these)."""
    return "time" in key or "per_s" in key or key.startswith("mem/")


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (getrusage: what the kernel counted, the compiler's and the
    allocator's included)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 2**20


def live_array_gib() -> float:
    """GiB of this process's live JAX arrays (their bytes on every device they span). Call it from the thread that
    runs the computation: the arrays it lists are held until it returns."""
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted()) / 2**30


def memory_metrics() -> dict:
    """{"mem/rss_gib": now, "mem/peak_rss_gib": the peak so far, "mem/arrays_gib": live JAX arrays now} of this
    process, for every unit's record: rss - arrays is what the process holds besides its arrays (the memory plan's
    runtime part)."""
    return {"mem/rss_gib": psutil.Process().memory_info().rss / 2**30, "mem/peak_rss_gib": peak_rss_gib(),
            "mem/arrays_gib": live_array_gib()}


def read_jsonl(path: str) -> list[dict]:
    """All records of a metrics.jsonl file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def format_table(rows: dict[str, dict], columns: list[str], row_header: str = "stage") -> str:
    """Fixed-width text table: one row per key of `rows`, one column per metric."""
    head = [row_header] + columns
    body = []
    for name, vals in rows.items():
        cells = [name]
        for c in columns:
            v = vals.get(c)
            cells.append("-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)))
        body.append(cells)
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in body])


SMALL_N = 64  # test problems below which a table's rows cannot be told apart (95 % intervals wider than ~0.25)


def wilson_interval(p: float, n: int, z: float = 1.96) -> list[float]:
    """95 % Wilson score interval of a proportion p over n trials (better than p +- 1.96 se near 0 and 1)."""
    if n <= 0:
        return [0.0, 1.0]
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [max(0.0, mid - half), min(1.0, mid + half)]


def paired_lift(base: str | None, other: str | None) -> tuple[float, float] | None:
    """(mean of other_i - base_i, its standard error) over the same problems, from two evaluations' per-problem
    solved indicators ("0110...", rl.evaluation.solved_bits): SE = sd(d, ddof=1) / sqrt(n), the paired standard
    error (problems both solve or both miss add no noise, so it is below sqrt(se_a^2 + se_b^2) when the two agree
    more than chance). None when either is missing or they differ in length; the SE is nan for one problem."""
    if not base or not other or len(base) != len(other):
        return None
    d = np.array([int(b) - int(a) for a, b in zip(base, other)], np.float64)
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.nan
    return float(d.mean()), se


def small_n_note(n: int) -> str:
    """The table's words for a test set below SMALL_N problems ("" from SMALL_N on)."""
    if n <= 0 or n >= SMALL_N:
        return ""
    lo, hi = wilson_interval(0.5, n)
    return (f"n = {n} test problems (< {SMALL_N}): too few to tell policies apart (a 95 % interval at pass@1 0.5 "
            f"spans {lo:.2f}-{hi:.2f}; a lift counts only beyond about 2 x its paired SE);\nevaluate on {SMALL_N} or "
            "more problems to judge a run (a run: eval.n_test and tasks.n_test; experiments.eval: --n).")


def results_table(rows: dict[str, dict], k: int, temperature: float, baseline: str = "initial",
                  row_header: str = "stage") -> str:
    """The held-out table of summary entries (rl.run.summary_entry), one row per key of `rows`: greedy pass@1, its
    standard error and 95 % Wilson interval, the lift over the `baseline` row with its paired SE (when `rows` holds
    the baseline), pass@k and maj@k headed with k and their sampling temperature (only when k > 0), format rate,
    mean length and n; below it the small_n_note when n < SMALL_N."""
    base = rows.get(baseline, {}).get("solved")
    sampled = [f"pass@{k} (T {temperature:g})", f"maj@{k} (T {temperature:g})"] if k > 0 else []
    cols = ["pass@1", "pass@1_se", "95% CI"] + (["lift", "lift_se (paired)"] if base else []) + sampled + [
        "format_rate", "mean_length", "n"]
    table = {}
    for name, e in rows.items():
        n = e.get("n_problems")
        ci = e.get("pass@1_ci95") or (wilson_interval(e["pass@1"], int(n)) if n else None)
        row = {"pass@1": e.get("pass@1"), "pass@1_se": e.get("pass@1_se"), "format_rate": e.get("format_rate"),
               "mean_length": e.get("mean_length"), "n": None if n is None else int(n),
               "95% CI": None if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"}
        if sampled:
            row[sampled[0]], row[sampled[1]] = e.get("pass@k"), e.get("maj@k")
        lift = None if name == baseline else paired_lift(base, e.get("solved"))
        if lift is not None:
            row["lift"], row["lift_se (paired)"] = f"{lift[0]:+.3f}", lift[1]
        table[name] = row
    ns = [int(e["n_problems"]) for e in rows.values() if e.get("n_problems")]
    note = small_n_note(min(ns)) if ns else ""
    return format_table(table, cols, row_header) + (f"\n{note}" if note else "")
