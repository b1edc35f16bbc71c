"""Shared benchmark utilities: this machine's matmul peak, timing, peak memory, load, tables.

Every benchmark in experiments/bench/ reports ratios measured in ONE run, so a noisy
shared machine moves numerator and denominator together:

    peak = matmul_peak_gflops()              # float32 jnp matmul, best over a few sizes
    sec = time_call(step_fn, args, reps=3)   # median seconds, after a warm-up/compile call
    print_table(["metric", "value"], rows)

`peak_rss_mib()` reads this process's high-water resident memory (ru_maxrss), which is why
model_step.py runs each measured phase in its own subprocess.
"""
from __future__ import annotations

import os
import resource
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


def block(tree):
    """Wait for every array in `tree` (timings must include the device work, not just dispatch)."""
    return jax.tree.map(lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree)


def time_call(fn, *args, reps: int = 3, warmup: int = 1) -> tuple[float, list[float]]:
    """(median seconds, all timings) of fn(*args) over `reps` calls after `warmup` untimed calls."""
    for _ in range(warmup):
        block(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        block(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def matmul_peak_gflops(sizes=(1024, 2048), reps: int = 5, seed: int = 0) -> dict:
    """Best float32 GFLOP/s of a jitted square `a @ b` over `sizes` (2 n^3 flops per matmul).

    This is the ceiling model FLOPs utilisation is quoted against. The best of several
    repetitions, not the median, so background load lowers MFU rather than inflating it.
    Also returns the best GFLOP per CPU-second (process CPU time over all threads), the
    ceiling for a load-independent "MFU per CPU-second" on a shared machine.
    """
    matmul = jax.jit(lambda a, b: a @ b)
    per_size, per_cpu = {}, {}
    for n in sizes:
        ka, kb = jax.random.split(jax.random.PRNGKey(seed + n))
        a = jax.random.normal(ka, (n, n), jnp.float32)
        b = jax.random.normal(kb, (n, n), jnp.float32)
        block(matmul(a, b))
        walls, cpus = [], []
        for _ in range(reps):
            w0, c0 = time.perf_counter(), time.process_time()
            block(matmul(a, b))
            walls.append(time.perf_counter() - w0)
            cpus.append(max(time.process_time() - c0, 1e-9))
        per_size[n] = 2.0 * n**3 / min(walls) / 1e9
        per_cpu[n] = 2.0 * n**3 / min(cpus) / 1e9
    return {"peak_gflops": max(per_size.values()), "per_size": per_size,
            "peak_gflops_per_cpu_s": max(per_cpu.values())}


def peak_rss_mib() -> float:
    """High-water resident set size of this process in MiB (Linux reports ru_maxrss in KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024.0 if sys.platform != "darwin" else kib / 2**20


def current_rss_mib() -> float:
    """Current resident set size in MiB (psutil)."""
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss / 2**20


def machine_info() -> dict:
    """CPU count, load averages and the JAX backend, to print next to the figures."""
    return {
        "nproc": os.cpu_count(),
        "loadavg": tuple(round(x, 2) for x in os.getloadavg()),
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "jax": jax.__version__,
        "numpy": np.__version__,
    }


def fmt(x, digits: int = 3) -> str:
    """Compact number formatting for tables."""
    if isinstance(x, str):
        return x
    if x is None:
        return "-"
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def format_table(headers, rows) -> str:
    """A Markdown table; cells are formatted with fmt()."""
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(str(v).ljust(w) for v, w in zip(vals, widths)) + " |"
    return "\n".join([line(headers), "| " + " | ".join("-" * w for w in widths) + " |"] + [line(r) for r in cells])


def print_table(headers, rows) -> str:
    """Print (and return) format_table(headers, rows)."""
    text = format_table(headers, rows)
    print(text, flush=True)
    return text
