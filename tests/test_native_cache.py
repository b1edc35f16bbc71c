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

import pytest

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


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "no_record"])
def test_damaged_cached_library_is_rebuilt_not_loaded(tmp_path, real_library, monkeypatch, damage):
    monkeypatch.setenv("MATHRL_NATIVE_DIR", str(tmp_path / "cache"))
    path = native_kernels.library_path()
    path.parent.mkdir()
    data = real_library.read_bytes()
    good = sha256(real_library)
    if damage == "truncated":  # e.g. a full disk or a copy cut short, after a complete build was recorded
        path.write_bytes(data[: len(data) // 3])
        native_kernels.digest_path(path).write_text(good + "\n")
    elif damage == "corrupt":  # same size, some bytes flipped
        path.write_bytes(data[:4096] + bytes(b ^ 0xFF for b in data[4096:8192]) + data[8192:])
        native_kernels.digest_path(path).write_text(good + "\n")
    else:  # a library without its record: a build killed between the rename and the record, or an old cache
        path.write_bytes(data[: len(data) // 2])
    assert not native_kernels.verified(path)
    cxx = copying_compiler(tmp_path, real_library)
    # A fresh process loads it (dlopen of the truncated file would die of SIGBUS): rebuilt first, then used.
    ok, total, warned = probe({"MATHRL_NATIVE_DIR": str(tmp_path / "cache"), "CXX": str(cxx)})
    assert ok == "True" and warned == "" and (tmp_path / "calls").read_text().count("x") == 1
    assert sha256(path) == good and native_kernels.verified(path)
    # The next process finds a verified library: no second build.
    assert probe({"MATHRL_NATIVE_DIR": str(tmp_path / "cache"), "CXX": str(cxx)})[0] == "True"
    assert (tmp_path / "calls").read_text().count("x") == 1


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


def test_hung_compiler_times_out_and_falls_back(tmp_path):
    # A `g++` on PATH that never finishes (and leaves a child holding its output pipes): the build is killed, as a
    # process group, after MATHRL_NATIVE_BUILD_TIMEOUT seconds; the process warns and runs XLA's dispatch.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "g++").write_text("#!/bin/sh\nsleep 600 &\nwait\n")
    (fake / "g++").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "MATHRL_NATIVE_DIR": str(tmp_path / "cache"),
           "MATHRL_NATIVE_BUILD_TIMEOUT": "2"}
    ok, total, warned = probe(env, timeout=90)
    assert ok == "False" and "took over 2 s" in warned
    assert float(total) == float(probe({"MATHRL_NATIVE": "0"})[1])  # the same result as with the kernels off
    assert not list((tmp_path / "cache").glob("*.tmp")) and not list((tmp_path / "cache").glob("*.so"))
    # The next process does not wait for the same hung build again: it falls back at once, saying why.
    ok, _, warned = probe(env, timeout=90)
    assert ok == "False" and "failed" in warned and "not retrying" in warned


def test_waiter_gives_up_on_a_lock_held_too_long(tmp_path, monkeypatch):
    # Another process holds the build lock and never finishes: a waiter stops waiting after the time limit's bound
    # and falls back (it neither blocks forever nor loads anything).
    monkeypatch.setenv("MATHRL_NATIVE_DIR", str(tmp_path / "cache"))
    path = native_kernels.library_path()
    path.parent.mkdir()
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok, _, warned = probe({"MATHRL_NATIVE_DIR": str(tmp_path / "cache"), "MATHRL_NATIVE_BUILD_TIMEOUT": "1"},
                              timeout=90)
    assert ok == "False" and "another process has been building" in warned
