"""The native CPU kernels (models/native/): build them with the host compiler, register them with XLA, call them.

`expert_ffn(p, x_ND, experts_NK, valid_NK)` computes what the other dropless dispatches in models/moe.py compute (each
valid assignment's SwiGLU expert output, zeros elsewhere) through one XLA FFI custom call that streams each expert's
weights once and multiplies every row routed to it, spread over XLA's intra-op threads. models/moe.py's "auto" uses it
on CPU for float32 without a mesh: the sampler's decode and prefill, the reference pass and, through
"auto_grad", the train step. `expert_ffn` has a custom VJP whose backward is a second kernel (the forward
the SwiGLU's five gradient products from the gate / up pre-activations the differentiated forward saved).

`decode_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS)` is models/layers.py's grouped-query attention over the KV
cache (models/native/decode_attention.cc), which the sampler's cached steps take on CPU in float32 without a mesh.

`available()` builds the library on first use: `g++ -O3 -march=native` into a cache directory keyed by the sources,
the flags, jaxlib's version and the CPU's feature flags (default ~/.cache/mathrl/native, or $MATHRL_NATIVE_DIR),
under a file lock so parallel test workers build it once. No compiler, a failed build or MATHRL_NATIVE=0 makes it
return False (with one warning for a failure) and models/moe.py and models/layers.py keep XLA's own ops: the kernels
are a speed-up, never a requirement.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

NATIVE_DIR = Path(__file__).parent / "native"
SOURCES = (NATIVE_DIR / "expert_ffn.cc", NATIVE_DIR / "decode_attention.cc")
HEADERS = (NATIVE_DIR / "parallel.h", NATIVE_DIR / "simd.h")
TARGET = "mathrl_expert_ffn"
TARGET_RES = "mathrl_expert_ffn_res"
TARGET_BWD = "mathrl_expert_ffn_bwd"
TARGET_ATTENTION = "mathrl_decode_attention"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
BUILD_TIMEOUT_S = 300

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
    import jaxlib
    texts = [f.read_text() for f in SOURCES + HEADERS]
    key = hashlib.sha256("\n".join([*texts, " ".join(FLAGS), jaxlib.__version__,
                                    _cpu_flags()]).encode()).hexdigest()[:16]
    return _cache_dir() / f"cpu_kernels-{key}.so"


def build(path: Path | None = None) -> Path:
    """Compile the kernels to `path` (default library_path()) unless it is there; raises RuntimeError on failure."""
    path = path or library_path()
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ / c++ / $CXX) on PATH")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel processes: one builds, the others wait and reuse
        if path.exists():
            return path
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        cmd = [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", str(tmp)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"building the CPU kernels took over {BUILD_TIMEOUT_S} s") from e
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"building the CPU kernels failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
        os.replace(tmp, path)  # atomic: a reader never sees half a library
    return path


def available() -> bool:
    """Whether the kernels are built and registered in this process (builds and registers them on the first call)."""
    if "ok" not in _state:
        _state["ok"] = False
        if os.environ.get("MATHRL_NATIVE", "1") == "0":
            return False
        try:
            lib = ctypes.cdll.LoadLibrary(str(build()))
            jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.ExpertFfn), platform="cpu")
            jax.ffi.register_ffi_target(TARGET_RES, jax.ffi.pycapsule(lib.ExpertFfnRes), platform="cpu")
            jax.ffi.register_ffi_target(TARGET_BWD, jax.ffi.pycapsule(lib.ExpertFfnBwd), platform="cpu")
            jax.ffi.register_ffi_target(TARGET_ATTENTION, jax.ffi.pycapsule(lib.DecodeAttention), platform="cpu")
            _state["ok"] = True
        except (RuntimeError, OSError, AttributeError) as e:
            warnings.warn(f"the native CPU kernels are unavailable, using XLA's own ops instead: {e}", stacklevel=2)
    return _state["ok"]


def applies(x_ND, p, mesh) -> bool:
    """Whether models/moe.py's "auto" should take the kernel: CPU, float32 activations and weights, no mesh."""
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
    """Whether models/layers.py's cached attention should take the kernel: CPU, float32, built."""
    return (jax.default_backend() == "cpu" and all(a.dtype == jnp.float32 for a in arrays) and available())


def decode_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS):
    """out [B, K, M, H]: softmax(q k) v per kv head over the cache's S slots, row m masked by mask_BTS[:, m % T]
    (mask_BTS may be [1, T, S], shared by the batch).

    q is already scaled by head_dim ** -0.5; keys slots-last [B, K, H, S], values [B, K, S, H]. Forward only (the
    sampler's cached steps are never differentiated). Call only when `available()`."""
    out = jax.ShapeDtypeStruct(q_BKMH.shape, jnp.float32)
    return jax.ffi.ffi_call(TARGET_ATTENTION, out, vmap_method="sequential")(
        q_BKMH, k_BKHS, v_BKSH, mask_BTS.astype(jnp.uint8))
