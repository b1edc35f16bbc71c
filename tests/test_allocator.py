"""models/cpu/allocator.py: the huge-page malloc tunable is added to a child's environment without losing other
tunables, honours the opt-out, and the launcher's re-exec happens at most once."""
import sys

import pytest

from models.cpu import allocator


@pytest.fixture
def glibc(monkeypatch):
    monkeypatch.setattr(allocator, "supported", lambda: True)


def test_tuned_env_adds_the_tunable_and_keeps_others(glibc):
    env = allocator.tuned_env({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0", "PATH": "/bin"})
    assert env["GLIBC_TUNABLES"].split(":") == ["glibc.malloc.tcache_count=0", *allocator.TUNABLES]
    assert env["PATH"] == "/bin"
    assert allocator.tuned_env({})["GLIBC_TUNABLES"] == allocator.TUNABLE
    assert allocator.tuned_env({allocator.HEAP_REUSE: "1"})["GLIBC_TUNABLES"].split(":") == [
        *allocator.TUNABLES, *allocator.HEAP_REUSE_TUNABLES]
    # Already present: unchanged, not duplicated.
    assert allocator.tuned_env(env)["GLIBC_TUNABLES"] == env["GLIBC_TUNABLES"]


def test_opt_out_and_unsupported_leave_the_env_alone(glibc, monkeypatch):
    assert "GLIBC_TUNABLES" not in allocator.tuned_env({allocator.OPT_OUT: "0"})
    monkeypatch.setattr(allocator, "supported", lambda: False)
    assert "GLIBC_TUNABLES" not in allocator.tuned_env({})


def test_reexec_once_with_the_same_command(glibc, monkeypatch):
    calls = []
    monkeypatch.setattr(allocator.os, "execve", lambda exe, argv, env: calls.append((exe, argv, env)))
    for name in ("GLIBC_TUNABLES", allocator.OPT_OUT, allocator._MARK):
        monkeypatch.delenv(name, raising=False)
    allocator.reexec_if_untuned()
    (exe, argv, env), = calls
    assert exe == sys.executable and argv[1:] == sys.orig_argv[1:]
    assert allocator.has_tunable(env) and env[allocator._MARK] == "1"
    # The restarted process (tunable present, or the mark set even if the tunable was stripped) does not restart.
    monkeypatch.setenv("GLIBC_TUNABLES", allocator.TUNABLE)
    allocator.reexec_if_untuned()
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv(allocator._MARK, "1")
    allocator.reexec_if_untuned()
    monkeypatch.delenv(allocator._MARK)
    monkeypatch.setenv(allocator.OPT_OUT, "0")
    allocator.reexec_if_untuned()
    assert len(calls) == 1


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unknown"


@pytest.mark.skipif(not allocator.supported() or _thp_mode() != "madvise",
                    reason="needs glibc and the kernel's THP mode 'madvise' (with 'always' every process gets them)")
def test_the_tunable_gives_malloc_huge_pages():
    # A child mallocs and touches 64 MiB and reports its AnonHugePages: ~0 by default, ~all with the tunable.
    import subprocess

    code = ("import ctypes\nlibc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p\n"
            "p = libc.malloc(64 << 20); ctypes.memset(p, 1, 64 << 20)\n"
            "print([int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')][0])")
    run = lambda env: int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                         check=True).stdout)
    base = {k: v for k, v in allocator.os.environ.items() if k != "GLIBC_TUNABLES"}
    assert run(base) < 16 << 10
    assert run(allocator.tuned_env(base)) >= 48 << 10  # kB


@pytest.mark.skipif(not allocator.supported(), reason="needs glibc")
def test_the_heap_reuse_tunables_reuse_freed_memory_instead_of_faulting_fresh_pages():
    # A child mallocs, touches and frees 256 MiB twice and reports the minor page faults of the second round:
    # by default glibc unmaps the first buffer and maps a fresh one (tens of thousands of faults); tuned, the second
    # buffer is the first one's memory again (opt-in: MATHRL_HEAP_REUSE=1).
    import subprocess

    code = ("import ctypes, resource\nlibc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p\n"
            "libc.free.argtypes = [ctypes.c_void_p]\nn = 256 << 20\n"
            "def once():\n    p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)\n"
            "once(); f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "once(); print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)")
    run = lambda env: int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                         check=True).stdout)
    base = {k: v for k, v in allocator.os.environ.items() if k != "GLIBC_TUNABLES"}
    assert run(base) > 1000
    assert run(allocator.tuned_env({**base, allocator.HEAP_REUSE: "1"})) < 100


@pytest.mark.skipif(not allocator.supported(), reason="needs glibc")
def test_a_compile_hands_freed_heap_back():
    # A child frees 128 MiB of small malloc blocks below a live one (free() alone cannot return them), then jits a
    # function: the compile event trims the heap, and its resident memory drops by at least half of the 128 MiB.
    import subprocess

    code = """
import ctypes, jax, jax.numpy as jnp
from models.cpu import allocator
libc = ctypes.CDLL("libc.so.6"); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: int([l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS")][0]) // 1024
blocks = [libc.malloc(2048) for _ in range(65536)]
for b in blocks: ctypes.memset(b, 1, 2048)
keep = libc.malloc(2048)
for b in blocks: libc.free(b)
assert allocator.trim_after_compiles(min_seconds=0.0) and allocator.trim_after_compiles()  # registers once
before = rss()
jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(3)).block_until_ready()
print(before - rss(), allocator.trim_stats()["trims"])
"""
    env = {k: v for k, v in allocator.os.environ.items() if k != allocator.TRIM_OPT_OUT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    released_mib, trims = map(int, out.stdout.split())
    assert trims >= 1 and released_mib >= 64, out.stdout  # the compile itself reuses some of it


def test_trim_opt_out(monkeypatch):
    monkeypatch.setenv(allocator.TRIM_OPT_OUT, "0")
    assert allocator.trim_after_compiles() is False


def test_phase_end_trims_off_when_the_heap_is_reused(glibc):
    """A phase's end hands the freed heap back, except under heap reuse (the pages the next phase reuses) or the
    MATHRL_TRIM=0 opt-out."""
    assert allocator.trims_at_phase_ends({})
    assert not allocator.trims_at_phase_ends({allocator.HEAP_REUSE: "1"})
    assert not allocator.trims_at_phase_ends({allocator.TRIM_OPT_OUT: "0"})
    assert allocator.trims_at_phase_ends({allocator.HEAP_REUSE: "0"})
