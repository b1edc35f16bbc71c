"""The native CPU kernels (models/cpu/native/): build them with the host compiler, register them with XLA, call them.

`expert_ffn(p, x_ND, experts_NK, valid_NK)` computes what the portable dropless kernels compute (each valid
assignment's SwiGLU expert output, zeros elsewhere) through one XLA FFI custom call that streams each expert's
weights once and multiplies every row routed to it, spread over XLA's intra-op threads. models/cpu/__init__.py
registers it as the MoE kernel "native", which "auto" takes on CPU for float32 without a mesh (the sampler, the
reference pass, the train step). It has a custom VJP whose backward is a second kernel (the forward also returns
the gate / up pre-activations the backward's five gradient products read).

`decode_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS)` is models/layers.py's grouped-query attention over the KV
cache (models/cpu/native/decode_attention.cc), registered as the cached-attention kernel for decode steps.

`available()` builds the library on first use: `g++ -O3 -march=native` into a cache directory keyed by the sources,
the flags, jaxlib's version and the CPU's feature flags (default ~/.cache/mathrl/native, or $MATHRL_NATIVE_DIR).
The cache is not trusted blindly: next to each library lies the SHA-256 of its bytes, written after the build, and
a library whose bytes do not match (truncated, corrupt, half-written, or with no record) is rebuilt, never loaded
(dlopen of a truncated library dies of SIGBUS). A fresh build is recorded only once it loads and holds the kernels'
symbols (check_loads, in a child process): a compiler that exits 0 after writing garbage is a failed build, not a
cached one. A build writes to a temporary name and renames it into place, and
removes the temporaries a killed build left; the compiler runs in its own process group under a time limit
(BUILD_TIMEOUT_S, $MATHRL_NATIVE_BUILD_TIMEOUT) and the whole group is killed past it. Parallel processes build
once under a file lock; a waiter gives up a little after the build's time limit instead of blocking forever, and
after a failed build the others fall back at once for RETRY_AFTER_S (a `.failed` record) instead of retrying it.
No compiler, a failed or timed-out build, or MATHRL_NATIVE=0 makes it return False (with one warning for a failure)
and the MoE layers and attention keep XLA's own ops: the kernels are a speed-up, never a requirement.
`status()` says which happened (config.json / summary.json record it).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

NATIVE_DIR = Path(__file__).parent / "native"
SOURCES = (NATIVE_DIR / "expert_ffn.cc", NATIVE_DIR / "decode_attention.cc")
HEADERS = (NATIVE_DIR / "parallel.h", NATIVE_DIR / "simd.h")
TARGET = "mathrl_expert_ffn"
TARGET_RES = "mathrl_expert_ffn_res"
TARGET_BWD = "mathrl_expert_ffn_bwd"
TARGET_ATTENTION = "mathrl_decode_attention"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
BUILD_TIMEOUT_S = 120  # a cold build takes ~10-40 s on 2 busy cores
RETRY_AFTER_S = 600  # after a failed or timed-out build, other processes fall back at once for this long

_state: dict = {}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _cache_dir() -> Path:
    return Path(os.environ.get("MATHRL_NATIVE_DIR") or Path.home() / ".cache" / "mathrl" / "native")


def library_path() -> Path:
    """Where these sources, built for this CPU and jaxlib, live (built or not)."""
    texts = [f.read_text() for f in SOURCES + HEADERS]
    key = hashlib.sha256("\n".join([*texts, " ".join(FLAGS), jaxlib.__version__,
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    return _cache_dir() / f"cpu_kernels-{key}.so"


def build_timeout() -> float:
    """Seconds one compile may take ($MATHRL_NATIVE_BUILD_TIMEOUT, default BUILD_TIMEOUT_S)."""
    try:
        return float(os.environ.get("MATHRL_NATIVE_BUILD_TIMEOUT", BUILD_TIMEOUT_S))
    except ValueError:
        return float(BUILD_TIMEOUT_S)


def digest_path(path: Path) -> Path:
    """Where the SHA-256 of the library at `path` is recorded (written after a complete build)."""
    return path.with_suffix(".sha256")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verified(path: Path) -> bool:
    """Whether the library at `path` is exactly what a completed build wrote (its bytes match the recorded hash)."""
    try:
        return digest_path(path).read_text().strip() == _sha256(path)
    except OSError:
        return False


def _lock(lock_file, seconds: float) -> None:
    """Take the build lock, waiting at most `seconds` (a hung builder elsewhere must not block this process)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"another process has been building the CPU kernels for over {seconds:.0f} s "
                                   f"(lock {lock_file.name})") from None
            time.sleep(0.2)


def _compile(cmd: list[str], timeout: float) -> None:
    """Run the compiler in its own process group; past `timeout` kill the whole group (g++ and its cc1plus / as)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"building the CPU kernels took over {timeout:.0f} s (killed; "
                           "$MATHRL_NATIVE_BUILD_TIMEOUT sets the limit)") from None
    if proc.returncode != 0:
        raise RuntimeError(f"building the CPU kernels failed ({' '.join(cmd)}):\n{err[-2000:]}")


SYMBOLS = ("ExpertFfn", "ExpertFfnRes", "ExpertFfnBwd", "DecodeAttention")  # what available() registers
# Loads a library and looks up each symbol, in a child process: a malformed file may kill the loader (SIGBUS).
_LOAD_CHECK = "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); [getattr(lib, s) for s in sys.argv[2:]]"


def check_loads(path: Path, timeout: float = 60) -> None:
    """RuntimeError unless the library at `path` loads (dlopen) and holds SYMBOLS, checked in a child process.

    A build is recorded only after this: a compiler that exits 0 having written garbage once got its output's hash
    recorded, so every later process found a "verified" library that failed to load and fell back to XLA silently,
    for as long as the cache lived."""
    try:
        done = subprocess.run([sys.executable, "-c", _LOAD_CHECK, str(path), *SYMBOLS], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the built CPU kernels {path.name} did not load within {timeout:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RuntimeError(f"the compiler exited 0 but its library does not load or lacks the kernels: {last[:300]}")


def build(path: Path | None = None) -> Path:
    """Compile the kernels to `path` (default library_path()) unless a verified build is there; raises
    RuntimeError on failure."""
    path = path or library_path()
    if verified(path):
        return path
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ / c++ / $CXX) on PATH")
    path.parent.mkdir(parents=True, exist_ok=True)
    timeout = build_timeout()
    with open(path.with_suffix(".lock"), "w") as lock:
        # Parallel processes: one builds, the others wait and reuse. A builder stops its compiler after `timeout`, so
        # a waiter gives up a little later than that instead of blocking forever behind a hung build; and after a
        # failure the others fall back at once (the .failed record) rather than each retrying the same build.
        _lock(lock, 1.25 * timeout + 5)
        if verified(path):
            return path
        failed = path.with_suffix(".failed")
        try:
            age = time.time() - failed.stat().st_mtime
            if age < RETRY_AFTER_S:
                raise RuntimeError(f"a build of the CPU kernels failed {age:.0f} s ago ({failed.read_text().strip()}); "
                                   f"not retrying for {RETRY_AFTER_S} s (delete {failed} to retry now)")
        except FileNotFoundError:
            pass
        for stale in path.parent.glob(f"{path.stem}.*.tmp"):  # left by a killed build (we hold the lock)
            stale.unlink(missing_ok=True)
        digest_path(path).unlink(missing_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            _compile([compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", str(tmp)], timeout)
            check_loads(tmp)  # before its hash is recorded: a recorded library is one that loads
            digest = _sha256(tmp)
            os.replace(tmp, path)  # atomic: a reader never sees half a library
        except RuntimeError as e:
            failed.write_text(str(e).splitlines()[0] + "\n")
            raise
        finally:
            tmp.unlink(missing_ok=True)
        failed.unlink(missing_ok=True)
        record = path.with_suffix(f".{os.getpid()}.sha256.tmp")
        record.write_text(digest + "\n")
        os.replace(record, digest_path(path))  # last: the library counts as built only from here on
    return path


def available() -> bool:
    """Whether the kernels are built and registered in this process (builds and registers them on the first call)."""
    if "ok" not in _state:
        _state["ok"] = False
        if os.environ.get("MATHRL_NATIVE", "1") == "0":
            _state["reason"] = "MATHRL_NATIVE=0"
            return False
        try:
            path = build()
            lib = ctypes.cdll.LoadLibrary(str(path))
            jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.ExpertFfn), platform="cpu")
            jax.ffi.register_ffi_target(TARGET_RES, jax.ffi.pycapsule(lib.ExpertFfnRes), platform="cpu")
            jax.ffi.register_ffi_target(TARGET_BWD, jax.ffi.pycapsule(lib.ExpertFfnBwd), platform="cpu")
            jax.ffi.register_ffi_target(TARGET_ATTENTION, jax.ffi.pycapsule(lib.DecodeAttention), platform="cpu")
            _state.update(ok=True, library=path.name, sha256=digest_path(path).read_text().strip())
        except (RuntimeError, OSError, AttributeError) as e:
            _state["reason"] = str(e).splitlines()[0]
            warnings.warn(f"the native CPU kernels are unavailable, using XLA's own ops instead: {e}", stacklevel=2)
    return _state["ok"]


def status() -> dict:
    """{"native": bool, and "library" (its name, which holds the build key of sources, flags, jaxlib and CPU) with
    "sha256" (of its bytes) when built, or "reason" when not}; builds on first call like available()."""
    available()
    return {"native": _state["ok"], **{k: _state[k] for k in ("library", "sha256", "reason") if k in _state}}


def applies(x_ND, p, mesh) -> bool:
    """Whether "auto" should take the kernel: CPU, float32 activations and weights, no mesh."""
    return (mesh is None and jax.default_backend() == "cpu" and x_ND.dtype == jnp.float32
            and all(p[n].dtype == jnp.float32 for n in ("w_gate", "w_up", "w_down")) and available())


def _ids(experts_NK, valid_NK):
    return jnp.where(valid_NK, experts_NK, -1).astype(jnp.int32)  # outside [0, E): no row, zero output


def _call(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down):
    N, D = x_ND.shape
    out = jax.ShapeDtypeStruct((N, experts_NK.shape[1], D), jnp.float32)
    return jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")(x_ND, _ids(experts_NK, valid_NK), w_gate, w_up,
                                                                    w_down)


def _call_res(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down):
    """(y [N, k, D], gate [N, k, F], up [N, k, F]): the forward and its pre-activations, the backward's residuals."""
    N, D = x_ND.shape
    K, F = experts_NK.shape[1], w_gate.shape[2]
    outs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((N, K, D), (N, K, F), (N, K, F))]
    return jax.ffi.ffi_call(TARGET_RES, outs, vmap_method="sequential")(x_ND, _ids(experts_NK, valid_NK), w_gate, w_up,
                                                                        w_down)


def _call_bwd(x_ND, ids_NK, gate_NKF, up_NKF, w_gate, w_up, w_down, dy_NKD):
    """(dx, dw_gate, dw_up, dw_down) of sum(y * dy) from the forward's residuals (gate / up pre-activations)."""
    outs = [jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in (x_ND, w_gate, w_up, w_down)]
    # The transposed weights come from XLA (one pass over them per call) so the kernel's products are all plain.
    w_down_t = jnp.swapaxes(w_down, 1, 2)
    w_gate_up_t = jnp.concatenate([jnp.swapaxes(w_gate, 1, 2), jnp.swapaxes(w_up, 1, 2)], axis=1)
    return jax.ffi.ffi_call(TARGET_BWD, outs, vmap_method="sequential")(
        x_ND, ids_NK, gate_NKF, up_NKF, w_down_t, w_gate_up_t, dy_NKD.astype(jnp.float32))


def expert_ffn(p, x_ND, experts_NK, valid_NK):
    """y [N, k, D]: each valid assignment's expert output (zeros for the others), through the native kernel.

    Call only when `available()`. Differentiable in x and the expert weights: under differentiation the forward is
    a second kernel that also returns each assignment's gate / up pre-activations, and the backward (a third) reads
    them instead of repeating the forward's two input products."""
    f32 = lambda a: a.astype(jnp.float32)
    return _with_grad(f32(x_ND), experts_NK, valid_NK, f32(p["w_gate"]), f32(p["w_up"]), f32(p["w_down"]))


@jax.custom_vjp
def _with_grad(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down):
    return _call(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down)


def _fwd(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down):
    y, gate, up = _call_res(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down)
    return y, (x_ND, _ids(experts_NK, valid_NK), gate, up, w_gate, w_up, w_down)


def _bwd(res, dy_NKD):
    dx, dwg, dwu, dwd = _call_bwd(*res, dy_NKD)
    return dx, None, None, dwg, dwu, dwd


_with_grad.defvjp(_fwd, _bwd)


def attention_applies(*arrays) -> bool:
    """Whether the cached attention should take the kernel: CPU, float32, built."""
    return (jax.default_backend() == "cpu" and all(a.dtype == jnp.float32 for a in arrays) and available())


def decode_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS):
    """out [B, K, M, H]: softmax(q k) v per kv head over the cache's S slots, row m masked by mask_BTS[:, m % T]
    (mask_BTS may be [1, T, S], shared by the batch).

    q is already scaled by head_dim ** -0.5; keys slots-last [B, K, H, S], values [B, K, S, H]. Forward only (the
    sampler's cached steps are never differentiated). Call only when `available()`."""
    out = jax.ShapeDtypeStruct(q_BKMH.shape, jnp.float32)
    return jax.ffi.ffi_call(TARGET_ATTENTION, out, vmap_method="sequential")(
        q_BKMH, k_BKHS, v_BKSH, mask_BTS.astype(jnp.uint8))
