"""Shared benchmark utilities: this machine's matmul peak, timing, peak memory, load, tables.

Every benchmark in experiments/bench/ reports ratios measured in ONE run, so a noisy
shared machine moves numerator and denominator together:

    peak = matmul_peak_gflops()              # float32 jnp matmul, best over a few sizes
    sec = time_call(step_fn, args, reps=3)   # median seconds, after a warm-up/compile call
    print_table(["metric", "value"], rows)

`peak_rss_mib()` reads this process's high-water resident memory (ru_maxrss), which is why
model_step.py, lora_memory.py and w1.py run each measured phase in its own subprocess (`run_phase`). Every script takes `--json PATH` and writes its
figures there with `write_json` (add_json_arg / write_json). On a shared machine, `wait_quiet(max_s)` waits (a
bounded time) for the 1-minute load average to drop before a measurement and returns the load it saw.

Importing this module registers the backend's kernel wing (rl.setup.backend_kernels: models/cpu on a CPU), so
a benchmark measures the kernels a run uses; `machine_info()` records which ("kernels").
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import psutil

from rl.calibration import cpu_info  # noqa: F401 - the benches' CPU record (one owner: the calibration key)
from rl.setup import backend_kernels

backend_kernels()  # the kernels a run uses (the native CPU kernels on a CPU host), as rl/setup.py registers them


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
    return psutil.Process(os.getpid()).memory_info().rss / 2**20


def run_phase(cmd: list[str], what: str, env: dict | None = None) -> dict:
    """Run `cmd` (one measured phase in its own process, so its peak RSS is its own) and return the last line of
    its stdout parsed as JSON; on a non-zero exit code, its stderr and SystemExit("{what} failed with exit code N").
    `env` defaults to a copy of this process's environment."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy() if env is None else env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"{what} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine_info() -> dict:
    """CPU (cpu_info), CPU count, load averages and the JAX backend, to print next to the figures."""
    return {
        "cpu": cpu_info(),
        "nproc": os.cpu_count(),
        "loadavg": tuple(round(x, 2) for x in os.getloadavg()),
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "jax": jax.__version__,
        "numpy": np.__version__,
        "kernels": backend_kernels()["wings"],
    }


def add_json_arg(ap) -> None:
    """The `--json PATH` option every bench script takes."""
    ap.add_argument("--json", default=None, help="also write the figures as JSON to this path")


def write_json(path, obj) -> None:
    """Write `obj` (plain dicts / lists / numbers / strings; numpy scalars, arrays and tuples converted) to path,
    creating its folder. No-op when path is None."""
    if not path:
        return

    def plain(x):
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if isinstance(x, (np.generic, np.ndarray)):
            return x.tolist()
        return x

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(plain(obj), f, indent=1)
        f.write("\n")


def load1() -> float:
    """The machine's 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def wait_quiet(max_s: float, threshold: float = 1.5, poll_s: float = 15.0, log=print) -> dict:
    """Wait until the 1-minute load average is below `threshold` (a quiet machine), at most `max_s` seconds.

    Returns {"waited_s", "load", "quiet"}: the load when it stopped waiting and whether it was below the threshold
    (False = gave up: the measurement that follows ran on a busy machine, and says so)."""
    start = time.monotonic()
    load = load1()
    while load >= threshold and time.monotonic() - start < max_s:
        log(f"[wait-quiet] load average {load} >= {threshold}; waiting "
            f"({time.monotonic() - start:.0f} of {max_s:.0f} s)")
        time.sleep(min(poll_s, max(0.0, max_s - (time.monotonic() - start))) or poll_s)
        load = load1()
    return {"waited_s": round(time.monotonic() - start, 1), "load": load, "quiet": load < threshold}


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


def trace_ops(fn, *args, top: int = 40, reps: int = 3, path: str = "/tmp/jax_trace_ops"):
    """Where a call of the jitted `fn(*args)` spends its time: [(op name, ms per call, robust ms per call,
    executions per call, JAX op path)], the `top` XLA operations by robust time in a jax.profiler trace of `reps`
    calls. On CPU the trace has one event per executed thunk (loop bodies count every iteration; loops and
    conditionals also appear as a whole). "ms per call" sums the measured durations; "robust" is the op's 20th
    percentile duration times its executions, which discounts the times a thread waited for a core on a loaded
    machine. Compare shares, not milliseconds."""
    block(fn(*args))  # compile outside the trace
    shutil.rmtree(path, ignore_errors=True)
    with jax.profiler.trace(path):
        for _ in range(reps):
            block(fn(*args))
    durations = collections.defaultdict(list)
    for name in glob.glob(f"{path}/**/*.trace.json.gz", recursive=True):
        for e in json.load(gzip.open(name))["traceEvents"]:
            if e.get("ph") == "X" and not e["name"].startswith(("$", "ThunkExecutor", "PjitFunction")):
                durations[e["name"]].append(e["dur"] / 1e3)
    text = fn.lower(*args).compile().as_text() if hasattr(fn, "lower") else ""
    origin = dict(re.findall(r"%([\w.\-]+) = [^\n]*?op_name=\"([^\"]+)\"", text))
    rows = [(n, sum(d) / reps, float(np.percentile(d, 20)) * len(d) / reps, len(d) / reps, origin.get(n, ""))
            for n, d in durations.items()]
    return sorted(rows, key=lambda r: -r[2])[:top]
