"""Metric logging: one JSONL line per step, TensorBoard event files, and the end-of-run table.

    w = MetricsWriter(workdir, tensorboard=True)
    w.write(step, {"reward/mean": 0.4, "kl": 0.01}, stage="grpo", phase="train")
    w.close()
    print(format_table(summary["eval"], ["pass@1", "pass@k", "format_rate"]))

`metrics.jsonl` lines are {"step": int, "stage": str, "phase": str, "time": float, ...metrics};
non-finite floats are written as null so every line is valid JSON. `flatten` turns nested
metric dicts into "a/b" keys. On resume the writer appends, after dropping lines for steps the
resumed run will redo (so the file stays free of duplicates).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import numpy as np


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
    """Appends metrics to workdir/metrics.jsonl and (optionally) TensorBoard event files in workdir/tb."""

    def __init__(self, workdir: str, tensorboard: bool = True, truncate_after_step: int | None = None):
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(workdir, "metrics.jsonl")
        if truncate_after_step is not None and os.path.exists(self.path):
            self._truncate(truncate_after_step)
        self._f = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tb"))

    def _truncate(self, last_step: int) -> None:
        """Keep only lines with step <= last_step (steps after the checkpoint are redone)."""
        keep = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    if int(json.loads(line).get("step", -1)) <= last_step:
                        keep.append(line)
                except (ValueError, json.JSONDecodeError):
                    continue
        with open(self.path, "w", encoding="utf-8") as f:
            f.writelines(keep)

    def write(self, step: int, metrics: dict, **tags: str) -> dict:
        """Log one step; returns the flattened record that was written."""
        flat = flatten(metrics)
        rec = {"step": int(step), **tags, "time": time.time(), **flat}
        self._f.write(json.dumps(rec, allow_nan=False) + "\n")
        self._f.flush()
        if self._tb is not None:
            # stage/phase/metric: one curve per metric and stage, the step on the x axis
            prefix = "/".join(str(tags[k]) for k in ("stage", "phase") if k in tags)
            for k, v in flat.items():
                if isinstance(v, float):
                    self._tb.add_scalar(f"{prefix}/{k}" if prefix else k, v, int(step))
        return rec

    def close(self) -> None:
        self._f.close()
        if self._tb is not None:
            self._tb.close()


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
