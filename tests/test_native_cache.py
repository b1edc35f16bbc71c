"""The native kernel cache (models/cpu/native_kernels.py) under failure: a truncated, corrupt or unrecorded cached
library is rebuilt and never loaded, a killed build's temporaries are removed rather than reused, a hung compiler is
killed after the build's time limit (the process falls back to XLA's ops, and the next process falls back at once
instead of retrying it), and a waiter does not block forever on another process's build lock.

Rebuilds use a stand-in compiler (a script that copies the library the real compiler built once for this machine
to the `-o` path), so the cache logic is tested in milliseconds; the real compiler is tested in test_cpu_kernels.py.
"""

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import pytest

import models.cpu  # noqa: F401 - registers the CPU wing's kernels
from models import kernels
from models.cpu import native_kernels

pytestmark = pytest.mark.skipif(not native_kernels.available(), reason="no C++ compiler to build the native kernel")

REPO = native_kernels.NATIVE_DIR.parents[2]
# Loads the kernels in a fresh process and runs the expert kernel once through "auto".
PROBE = ("import warnings, jax.numpy as jnp, models.cpu; from models import moe; from models.cpu import native_kernels "
         "as nk; from models.config import ModelConfig\n"
         "cfg = ModelConfig(d_model=8, d_ff=12, n_experts=4, experts_per_token=2, moe_every=1)\n"
         "p = {'router': jnp.ones((8, 4)), 'w_gate': jnp.ones((4, 8, 12)), 'w_up': jnp.ones((4, 8, 12)), "
         "'w_down': jnp.ones((4, 12, 8))}\n"
         "with warnings.catch_warnings(record=True) as w:\n"
         "    warnings.simplefilter('always'); y, _ = moe.moe_layer(p, jnp.ones((1, 3, 8)), cfg)\n"
         "print(nk.available(), float(y.sum()), '|'.join(str(x.message).splitlines()[0] for x in w))")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def real_library() -> Path:
    """The library the real compiler built for this machine (the default cache's), and its hash."""
    path = native_kernels.library_path()
    assert native_kernels.verified(path)
    return path


def copying_compiler(tmp_path: Path, library: Path) -> Path:
    """A stand-in for g++: writes `library`'s bytes to the path after -o, and counts its calls."""
    script = tmp_path / "bin" / "fake-cxx"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f'#!/bin/sh\necho x >> "{tmp_path}/calls"\nwhile [ "$1" != "-o" ]; do shift; done\n'
                      f'cp "{library}" "$2"\n')
    script.chmod(0o755)
    return script


def probe(env: dict, timeout: float = 120) -> list[str]:
    base = {"PATH": os.environ["PATH"], "JAX_PLATFORMS": "cpu", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True,
                          cwd=str(REPO), timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.rstrip("\n").split("\n")[-1].split(" ", 2)


def damage(path: Path, library: Path, how: str) -> None:
    """Put a damaged copy of `library` at the cache path `path`."""
    data = library.read_bytes()
    path.parent.mkdir(exist_ok=True)
    if how == "truncated":  # e.g. a full disk or a copy cut short, after a complete build was recorded
        path.write_bytes(data[: len(data) // 3])
        native_kernels.digest_path(path).write_text(sha256(library) + "\n")
    elif how == "corrupt":  # same size, some bytes flipped
        path.write_bytes(data[:4096] + bytes(b ^ 0xFF for b in data[4096:8192]) + data[8192:])
        native_kernels.digest_path(path).write_text(sha256(library) + "\n")
    else:  # a library without its record: a build killed between the rename and the record, or an old cache
        path.write_bytes(data[: len(data) // 2])


def calls(tmp_path: Path) -> int:
    return (tmp_path / "calls").read_text().count("x") if (tmp_path / "calls").exists() else 0


def test_truncated_cached_library_is_rebuilt_before_a_fresh_process_loads_it(tmp_path, real_library):
    # dlopen of the truncated file would kill the process (SIGBUS): it is rebuilt first, then loaded and used.
    cache = tmp_path / "cache"
    env = {"MATHRL_NATIVE_DIR": str(cache), "CXX": str(copying_compiler(tmp_path, real_library))}
    path = cache / native_kernels.library_path().name
    damage(path, real_library, "truncated")
    ok, _, warned = probe(env)
    assert ok == "True" and warned == "" and calls(tmp_path) == 1
    assert sha256(path) == sha256(real_library) and native_kernels.verified(path)


@pytest.mark.parametrize("how", ["truncated", "corrupt", "no_record"])
def test_damaged_cached_library_is_rebuilt_once(tmp_path, real_library, monkeypatch, how):
    monkeypatch.setenv("MATHRL_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(copying_compiler(tmp_path, real_library)))
    path = native_kernels.library_path()
    damage(path, real_library, how)
    assert not native_kernels.verified(path)
    assert native_kernels.build() == path and calls(tmp_path) == 1 and native_kernels.verified(path)
    assert sha256(path) == sha256(real_library)
    assert native_kernels.build() == path and calls(tmp_path) == 1  # verified now: found, not rebuilt


def test_killed_build_leaves_no_temporary_that_is_reused(tmp_path, real_library, monkeypatch):
    # A build killed with SIGKILL while its compiler is writing: the half-written temporary stays behind (nothing
    # can remove it then); the next build removes it and writes its own, and the library is complete.
    monkeypatch.setenv("MATHRL_NATIVE_DIR", str(tmp_path / "cache"))
    path = native_kernels.library_path()
    slow = tmp_path / "slow-cxx"
    slow.write_text('#!/bin/sh\necho $$ > "$(dirname "$0")/cxx.pid"\nwhile [ "$1" != "-o" ]; do shift; done\n'
                    'head -c 1000 /dev/urandom > "$2"\nexec sleep 600\n')
    slow.chmod(0o755)
    env = {**os.environ, "MATHRL_NATIVE_DIR": str(tmp_path / "cache"), "CXX": str(slow), "JAX_PLATFORMS": "cpu"}
    builder = subprocess.Popen([sys.executable, "-c", "from models.cpu import native_kernels as n; n.build()"],
                               env=env, cwd=str(REPO))
    try:
        for _ in range(600):  # until the compiler has written part of its output
            if list(path.parent.glob("*.tmp")) and (tmp_path / "cxx.pid").exists():
                break
            time.sleep(0.1)
        builder.kill()
        builder.wait()
    finally:
        pid = int((tmp_path / "cxx.pid").read_text()) if (tmp_path / "cxx.pid").exists() else None
        if pid:
            os.killpg(pid, signal.SIGKILL)  # the compiler runs in its own process group
    stale = list(path.parent.glob("*.tmp"))
    assert stale and not path.exists()
    monkeypatch.setenv("CXX", str(copying_compiler(tmp_path, real_library)))
    assert native_kernels.build() == path and native_kernels.verified(path)
    assert sha256(path) == sha256(real_library) and not list(path.parent.glob("*.tmp"))


def hung_compiler(tmp_path: Path) -> Path:
    """A directory with a `g++` that never finishes and leaves a child holding its output pipes."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "g++").write_text("#!/bin/sh\nsleep 600 &\nwait\n")
    (fake / "g++").chmod(0o755)
    return fake


def test_hung_compiler_times_out_and_falls_back(tmp_path, monkeypatch):
    # The build is killed, as a process group, after MATHRL_NATIVE_BUILD_TIMEOUT seconds; the process warns and
    # runs the portable dispatch; the next attempt falls back at once instead of waiting for the same build.
    monkeypatch.setenv("PATH", f"{hung_compiler(tmp_path)}:/usr/bin:/bin")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("MATHRL_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MATHRL_NATIVE_BUILD_TIMEOUT", "2")
    monkeypatch.setattr(native_kernels, "_state", {})  # as in a fresh process
    with pytest.warns(UserWarning, match="took over 2 s"):
        assert native_kernels.available() is False
    assert native_kernels.status()["native"] is False and "took over" in native_kernels.status()["reason"]
    p = {n: jnp.ones(shape) for n, shape in (("w_gate", (4, 8, 12)), ("w_up", (4, 8, 12)), ("w_down", (4, 12, 8)))}
    assert kernels.resolve_moe("auto", jnp.ones((3, 8)), p, 2) == "windowed"  # the portable path, not "native"
    assert not list((tmp_path / "cache").glob("*.tmp")) and not list((tmp_path / "cache").glob("*.so"))
    with pytest.raises(RuntimeError, match="not retrying"):
        native_kernels.build()


def test_waiter_gives_up_on_a_lock_held_too_long(tmp_path, monkeypatch):
    # Another holder keeps the build lock and never finishes: a waiter stops waiting after the time limit's bound
    # (1.25 x 1 s + 5 s here) with a clear error, which available() turns into the fallback.
    monkeypatch.setenv("MATHRL_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MATHRL_NATIVE_BUILD_TIMEOUT", "1")
    path = native_kernels.library_path()
    path.parent.mkdir()
    with open(path.with_suffix(".lock"), "w") as lock:  # a second open file: flock conflicts even in one process
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match="another process has been building"):
            native_kernels.build()


@pytest.mark.parametrize("output", ["garbage", "no kernels"])
def test_a_compiler_that_exits_0_without_a_loadable_library_records_nothing(tmp_path, monkeypatch, output):
    """A compiler that wrote garbage (or a library without the kernels) and exited 0 got its output's hash recorded:
    every later process found a "verified" library that would not load and fell back to XLA silently. The build
    now loads it (in a child process) before recording it; a failure is a failed build (the .failed record, retried
    after RETRY_AFTER_S)."""
    import _ctypes

    written = tmp_path / "written.so"
    if output == "garbage":
        written.write_bytes(b"\x7fELF" + os.urandom(4000))
    else:  # a real shared library, without ExpertFfn & co.
        written.write_bytes(Path(_ctypes.__file__).read_bytes())
    monkeypatch.setenv("MATHRL_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(copying_compiler(tmp_path, written)))
    monkeypatch.setattr(native_kernels, "_state", {})  # as in a fresh process
    path = native_kernels.library_path()
    with pytest.warns(UserWarning, match="exited 0 but its library does not load or lacks the kernels"):
        assert native_kernels.available() is False
    assert calls(tmp_path) == 1 and not native_kernels.digest_path(path).exists() and not path.exists()
    assert path.with_suffix(".failed").exists() and not list(path.parent.glob("*.tmp"))
