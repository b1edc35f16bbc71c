"""Host memory allocator setting for CPU runs: glibc malloc on transparent huge pages (optionally reusing its heap).

    env = allocator.tuned_env()          # os.environ plus GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (Linux/glibc)
    allocator.reexec_if_untuned()        # first thing in a launcher's main: restart this process with that env
    allocator.trim_after_compiles()      # then: hand the heap XLA's compiler freed back to the OS after each compile

Why. XLA's CPU runtime allocates every step's temporaries (activations, gradient buffers, a scan's stacked outputs)
with malloc, and buffers above glibc's mmap threshold come from fresh mmap'd 4 KiB pages each step: the first write
to each page faults. In W1's train step those page faults show up as zero-broadcasts and concatenations costing
several ms each (profile: experiments/bench/profile_w1.py). glibc's `hugetlb=1` tunable madvises malloc's memory
for transparent huge pages (2 MiB), so a step faults ~500x fewer pages. Measured on W1 (BENCHMARKS.md) it cut
this project's CPU seconds per step by ~10% at no extra peak memory; the same setting made TRL's PyTorch process
slower and larger, so the W1 benchmark runs the peer with its default allocator.

Reuse (opt-in: MATHRL_HEAP_REUSE=1). Huge pages make the faults fewer, not the memory reused: glibc still mmaps
every buffer above its mmap threshold (at most 32 MiB) fresh and unmaps it when freed. On SmolLM2's update (W2, 3.7
GB of fresh buffers per step) the kernel's work of backing those pages again grew from 0.2-2 s to 8-14 s of system
CPU time per update whenever sampling and the reference pass had run in between (the RL loop's order). The cause is
the VM: its balloon reports free pages to the host, which discards them, so memory that lay free for more than about
a second costs 1-4 s of system CPU per GiB to touch again instead of ~0.1 s (experiments/bench/page_reuse.py).
HEAP_REUSE_TUNABLES (`mmap_max=0`: no mmap'd chunks; `arena_max=1`: one arena, whose brk heap has no size cap; a
16 GiB `trim_threshold`: freed memory is kept) make every step's buffers come from memory the process already
touched: in the same W2 run the update took 10.96 s instead of 18.83 s, with 0.16 s of system time (BENCHMARKS.md).
It is not the default: a heap that never returns memory can fragment and hold far more than a run needs at its peak
(on a shortened upcycled SmolLM2 run, smollm2_upcycle.py with 3 iterations, over 23.9 GB in the first update against
a 14.3 GB peak without it), which a machine the size of this one's 24 GB does not have.

glibc reads tunables only when a process starts, hence the environment for child processes and the re-exec for the
launcher. Where the kernel has THP disabled ("never") the huge-page tunable is a no-op; on other C libraries or
operating systems nothing is changed. MATHRL_HUGEPAGES=0 opts out of all of them.

Compiles leave freed heap behind. Compiling W1's train step grows the process by ~600 MiB, most of it freed small
blocks that glibc keeps in its arenas; the step's large buffers are mmap'd separately and never reuse them, so the
first step's peak resident memory is the compiler's leftovers plus the step's buffers. `trim_after_compiles`
listens for JAX's backend-compile events and calls glibc's malloc_trim(0) after every compile that took at least
`min_seconds` (the large programs; the many tiny compiles leave little): in W1 it cut the update's peak by ~500
MiB (BENCHMARKS.md). MATHRL_TRIM=0 opts out.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
import time

import jax

TUNABLES = ("glibc.malloc.hugetlb=1",)  # transparent huge pages for malloc's memory
TUNABLE = ":".join(TUNABLES)
# Opt-in (MATHRL_HEAP_REUSE=1): every buffer from the one brk heap, freed memory kept there (see "Reuse" above)
HEAP_REUSE = "MATHRL_HEAP_REUSE"
HEAP_REUSE_TUNABLES = ("glibc.malloc.mmap_max=0", "glibc.malloc.arena_max=1",
                       "glibc.malloc.trim_threshold=17179869184")
OPT_OUT = "MATHRL_HUGEPAGES"
_MARK = "MATHRL_ALLOCATOR_REEXEC"  # set in the re-executed process: never restart twice
TRIM_OPT_OUT = "MATHRL_TRIM"
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_trim_state = {"registered": False, "trims": 0, "seconds": 0.0}


def supported() -> bool:
    """True on Linux with glibc (the only C library whose tunable this sets)."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def wanted(env=None) -> bool:
    env = os.environ if env is None else env
    return supported() and env.get(OPT_OUT, "1") != "0"


def tunables(env=None) -> tuple[str, ...]:
    """The tunables this environment asks for: TUNABLES, plus HEAP_REUSE_TUNABLES with MATHRL_HEAP_REUSE=1."""
    env = os.environ if env is None else env
    return TUNABLES + (HEAP_REUSE_TUNABLES if env.get(HEAP_REUSE, "0") == "1" else ())


def has_tunable(env=None) -> bool:
    """True when GLIBC_TUNABLES holds every one of tunables(env)."""
    env = os.environ if env is None else env
    present = env.get("GLIBC_TUNABLES", "").split(":")
    return all(t in present for t in tunables(env))


def tuned_env(env=None) -> dict:
    """A copy of `env` (default os.environ) with tunables(env) added to GLIBC_TUNABLES (other tunables kept, those
    already there not repeated), unless unsupported or opted out."""
    out = dict(os.environ if env is None else env)
    if wanted(out) and not has_tunable(out):
        present = [t for t in out.get("GLIBC_TUNABLES", "").split(":") if t]
        out["GLIBC_TUNABLES"] = ":".join(present + [t for t in tunables(out) if t not in present])
    return out


def reexec_if_untuned() -> None:
    """Restart the current command (same interpreter and arguments) with `tuned_env()` if this process did not
    start with it. Call before doing anything that should not happen twice; does nothing when unsupported, opted
    out, already tuned, or already restarted once."""
    if not wanted() or has_tunable() or os.environ.get(_MARK):
        return
    env = tuned_env()
    env[_MARK] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def release_free_heap() -> bool:
    """glibc's malloc_trim(0): return the free memory of every malloc arena to the OS. False where unsupported."""
    if not supported():
        return False
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return True


def trims_at_phase_ends(env=None) -> bool:
    """Whether models.kernels.phase_end() should hand the freed heap back (supported, not opted out: MATHRL_TRIM,
    and not reusing the heap: a trim there hands back the very pages the next phase would reuse, so with reuse on
    every update faulted its buffers in again, at more system CPU than without reuse: docs/training.md)."""
    env = os.environ if env is None else env
    return supported() and env.get(TRIM_OPT_OUT, "1") != "0" and env.get(HEAP_REUSE, "0") != "1"


def trim_after_compiles(min_seconds: float = 0.5) -> bool:
    """Register (once per process) a JAX event listener that calls `release_free_heap()` after each XLA compile
    taking >= min_seconds, before the compiled program first runs. True if registered now or before; False when
    unsupported or opted out (MATHRL_TRIM=0). `trim_stats()` counts the trims and the time they took."""
    if not supported() or os.environ.get(TRIM_OPT_OUT, "1") == "0":
        return False
    if _trim_state["registered"]:
        return True

    def on_event(name, duration, **_):
        if name == _COMPILE_EVENT and duration >= min_seconds:
            t0 = time.perf_counter()
            release_free_heap()
            _trim_state["trims"] += 1
            _trim_state["seconds"] += time.perf_counter() - t0

    jax.monitoring.register_event_duration_secs_listener(on_event)
    _trim_state["registered"] = True
    return True


def trim_stats() -> dict:
    """{"registered", "trims", "seconds"} of trim_after_compiles in this process."""
    return dict(_trim_state)
