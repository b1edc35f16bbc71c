"""JAX's persistent compilation cache, and the seconds a process spends compiling.

    path = compile_cache.enable(cfg.run.compile_cache)   # "auto" | "off" | a directory; returns the dir or None
    compile_cache.stats()   # {"seconds": 12.3, "compiles": 41, "cache_hits": 38, "cache_misses": 3}

A tiny run spends most of its wall time compiling the same programs every time it starts; with the cache on, a
second run (or a resumed one, or a sweep's next point) reads them back from disk. "auto" is the user's cache
directory: $MATHRL_JAX_CACHE when set (a path, or "off"), else $XDG_CACHE_HOME/mathrl/jax, else
~/.cache/mathrl/jax. JAX caches only programs that took at least `jax_persistent_cache_min_compile_time_secs` (1 s
by default) to compile; here every program is cached (threshold 0 s, no minimum size), because a tiny run is many
small programs. The cache key covers the program, the devices, the compile options and jax / jaxlib versions, so a
stale entry is never used. tests/conftest.py turns the same cache on for the test suite.

`stats()` sums JAX's own monitoring events from the first `enable` or `stats` call on: `seconds` is the
XLA backend time (a cache hit costs the time to read the entry back), plus tracing and lowering.
"""
from __future__ import annotations

import os
import threading

import jax

COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration", "/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration")
_lock = threading.Lock()
_totals = {"seconds": 0.0, "compiles": 0, "cache_hits": 0, "cache_misses": 0}
_listening = False


def default_dir(env=None) -> str | None:
    """The cache directory "auto" means (None when $MATHRL_JAX_CACHE is "off")."""
    env = os.environ if env is None else env
    own = env.get("MATHRL_JAX_CACHE", "")
    if own:
        return None if own.lower() == "off" else own
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mathrl", "jax")


def resolve(setting: str, env=None) -> str | None:
    """run.compile_cache -> the directory to use, or None for no cache."""
    setting = (setting or "auto").strip()
    if setting.lower() == "off":
        return None
    return default_dir(env) if setting.lower() == "auto" else os.path.expanduser(setting)


def enable(setting: str = "auto") -> str | None:
    """Turn the persistent cache on for this process (every program cached) and start counting compile time;
    returns the directory, or None when `setting` (or $MATHRL_JAX_CACHE under "auto") says off."""
    _listen()
    path = resolve(setting)
    if path is None:
        return None
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def _listen() -> None:
    global _listening
    with _lock:
        if _listening:
            return
        _listening = True

    def on_duration(name, duration, **_):
        if name in COMPILE_EVENTS:
            with _lock:
                _totals["seconds"] += float(duration)
                _totals["compiles"] += name == COMPILE_EVENTS[0]

    def on_event(name, **_):
        key = {"/jax/compilation_cache/cache_hits": "cache_hits",
               "/jax/compilation_cache/cache_misses": "cache_misses"}.get(name)
        if key:
            with _lock:
                _totals[key] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)


def stats() -> dict:
    """Compile seconds and counts of this process since counting started (the first enable / stats call)."""
    _listen()
    with _lock:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in _totals.items()}
