"""This machine's speed, measured in a few seconds and cached: what rl/time_estimate.py turns FLOPs and bytes into.

    cal = calibration.load()          # the cached figures for this machine and code, measured when missing or stale
    cal["matmul_gflops"]              # {"8": 31.0, "64": 140.2, "512": 201.7, "4096": 214.9}: float32 x @ W at d 1024
    cal["bandwidth_gbs"], cal["loop_op_s"], cal["dispatch_s"], cal["compile_s"]

What is measured (each the best of a few repetitions, so background load slows the figures rather than noising them):
- matmul_gflops: a jitted [rows, 1024] @ [1024, 1024] float32 at rows 8 / 64 / 512 / 4096: a decode step multiplies
  a few rows by every weight (the small-rows rate, memory-bound), a training step thousands (the peak).
- bandwidth_gbs: a jitted sum over 256 MB of float32, bytes per second (a decode step reads every weight and the
  KV cache once).
- loop_op_s: one small op inside a jitted lax.while_loop (the fixed cost a decode step pays per kernel).
- dispatch_s: one call of a tiny jitted program from Python (the fixed cost of every program call).
- compile_s: seconds XLA takes to compile a reference program (the gradient of a 2-layer scanned MLP with a
  cross-entropy; the persistent compilation cache is bypassed for it), the unit compile time is counted in.

The figures are cached as JSON in the user's cache directory (calibration_path: $MATHRL_CALIBRATION when set, else
next to the compilation cache, ~/.cache/mathrl/calibration.json) under a key of the CPU (cpu_info), the JAX
backend and device count, the jax version and this module's source: a different machine, JAX or measurement is
measured again. `load(refresh=True)` measures anew (the launcher's --recalibrate).
"""
from __future__ import annotations

import hashlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

MATMUL_ROWS = (8, 64, 512, 4096)
MATMUL_DIM = 1024
BANDWIDTH_BYTES = 256 * 2**20


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
    """The CPU a figure was measured on: model name, vendor family / model, and the SIMD / matrix extensions that
    decide XLA's CPU kernels (AVX-512, its bf16 / VNNI parts, AMX). Machines of one kind differ by 2x and in kind, so
    every benchmark records this next to its numbers, and the calibration is keyed by it."""
    fields = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if ":" not in line:
                    if fields:
                        break  # the first processor's block is enough
                    continue
                k, v = (x.strip() for x in line.split(":", 1))
                fields.setdefault(k, v)
    except OSError:
        return {"model_name": "unknown"}
    flags = set(fields.get("flags", "").split())
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
    return {"model_name": fields.get("model name", "unknown"), "vendor": fields.get("vendor_id", ""),
            "family": fields.get("cpu family", ""), "model": fields.get("model", ""),
            "flags": [f for f in wanted if f in flags]}


def machine_key() -> dict:
    """What the figures depend on: the CPU, the backend and its devices, jax, the cores and this module's code."""
    with open(__file__, "rb") as f:
        code = hashlib.sha256(f.read()).hexdigest()[:16]
    dev = jax.devices()[0]
    return {"cpu": cpu_info(), "backend": jax.default_backend(), "device_kind": dev.device_kind,
            "devices": len(jax.devices()), "cores": os.cpu_count(), "jax": jax.__version__, "code": code}


def calibration_path(env=None) -> str:
    env = os.environ if env is None else env
    own = env.get("MATHRL_CALIBRATION", "")
    if own:
        return own
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mathrl", "calibration.json")


def _best(fn, reps: int) -> float:
    jax.block_until_ready(fn())  # compile and warm up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def _matmul_gflops(reps: int) -> dict:
    mm = jax.jit(lambda a, b: a @ b)
    b = jax.random.normal(jax.random.PRNGKey(1), (MATMUL_DIM, MATMUL_DIM), jnp.float32)
    out = {}
    for rows in MATMUL_ROWS:
        a = jax.random.normal(jax.random.PRNGKey(rows), (rows, MATMUL_DIM), jnp.float32)
        out[str(rows)] = 2.0 * rows * MATMUL_DIM**2 / _best(lambda: mm(a, b), reps) / 1e9
    return out


def _bandwidth_gbs(reps: int) -> float:
    x = jnp.ones((BANDWIDTH_BYTES // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    return BANDWIDTH_BYTES / _best(lambda: total(x), reps) / 1e9


def _loop_op_s(steps: int = 500) -> float:
    """Seconds per small op inside a jitted while_loop (a tiny matmul, then a tanh, per iteration): the fixed cost
    a decode step pays for each of its kernels, whatever their size."""
    w = jnp.eye(32, dtype=jnp.float32) * 0.5

    @jax.jit
    def loop(x):
        return jax.lax.while_loop(lambda c: c[0] < steps, lambda c: (c[0] + 1, jnp.tanh(c[1] @ w) + c[1]), (0, x))[1]

    x = jnp.ones((8, 32), jnp.float32)
    return _best(lambda: loop(x), 3) / steps / 3


def _dispatch_s(calls: int = 50) -> float:
    f = jax.jit(lambda x: x + 1.0)
    x = jnp.ones((16,), jnp.float32)
    jax.block_until_ready(f(x))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _reference_program(w, x, y):
    """The gradient of a 2-layer scanned MLP with a softmax cross-entropy: the unit of compile work."""

    def loss(w):
        def layer(h, wl):
            return jax.nn.gelu(h @ wl["a"]) @ wl["b"] + h, None

        h, _ = jax.lax.scan(layer, x, w)
        logits = h @ w["a"][0]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    return jax.value_and_grad(loss)(w)


def _compile_s() -> float:
    d = 128
    w = {"a": jnp.zeros((2, d, d)), "b": jnp.zeros((2, d, d))}
    x, y = jnp.zeros((32, d)), jnp.zeros((32,), jnp.int32)
    was = jax.config.jax_enable_compilation_cache
    best = float("inf")
    try:
        jax.config.update("jax_enable_compilation_cache", False)  # the compiler's time, not a cache read
        for i in range(3):
            lowered = jax.jit(lambda w, x, y, i=i: _reference_program(w, x * (1.0 + i), y)).lower(w, x, y)
            t0 = time.perf_counter()
            lowered.compile()
            best = min(best, time.perf_counter() - t0)
    finally:
        jax.config.update("jax_enable_compilation_cache", was)
    return best


def measure(reps: int = 5) -> dict:
    """Every figure (see the module docstring), measured now: ~3-6 s on a 2-core CPU."""
    t0 = time.perf_counter()
    out = {"matmul_gflops": _matmul_gflops(reps), "bandwidth_gbs": _bandwidth_gbs(reps),
           "loop_op_s": _loop_op_s(), "dispatch_s": _dispatch_s(), "compile_s": _compile_s()}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def load(path: str | None = None, refresh: bool = False, log=None) -> dict:
    """The figures for this machine and code: from the cache file when its key matches, else measured and written
    there (an unwritable cache directory only loses the caching). `log` (e.g. print) hears when it measures."""
    path = calibration_path() if path is None else path
    key = machine_key()
    if not refresh:
        try:
            with open(path, encoding="utf-8") as f:
                cached = json.load(f)
            if cached.get("key") == key:
                return cached["figures"]
        except (OSError, ValueError, KeyError, AttributeError):
            pass  # missing, unreadable or another format: measure
    if log:
        log("calibrating this machine's speed for the time estimate (a few seconds, cached)")
    figures = measure()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"key": key, "figures": figures, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}, f, indent=1)
        os.replace(path + ".tmp", path)
    except OSError:
        pass
    return figures


def matmul_rate(cal: dict, rows: float) -> float:
    """FLOP/s of a matmul with `rows` rows, interpolated (log-log) between the measured row counts, flat beyond."""
    pts = sorted((int(r), float(g)) for r, g in cal["matmul_gflops"].items())
    r = float(np.clip(rows, pts[0][0], pts[-1][0]))
    xs, ys = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.exp(np.interp(np.log(r), xs, ys))) * 1e9
