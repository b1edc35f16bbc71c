"""The kernel registry: which routed-expert kernel a MoE layer runs, and the optional cached-attention kernel.

    kernels.register_moe("blocked", fn, auto=None)               # models/moe_kernels.py: the portable kernels
    kernels.register_moe("native", fn, auto=pred, rank=0)        # a backend wing (models/cpu/) adds its own
    name = kernels.resolve_moe("auto", x_ND, p, k, mesh)          # models/moe.py and models/moe_ep.py
    y_NKD = kernels.moe_kernel(name)(p, x_ND, experts_NK, valid_NK, block_size)
    out = kernels.cached_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS)  # None: no registered kernel applies
    kernels.register_phase_end(fn); kernels.phase_end()           # a wing's work between a run's phases (rl/)

Why a registry. The model core (layers, moe, moe_ep, transformer) holds only portable JAX; a backend's own kernels
and heuristics live in a wing (models/cpu/ for the CPU: compiled C++ kernels, the windowed decode dispatch) that
registers them here when imported. The core never imports a wing; the run set-up does (rl/setup.py). Without a
wing "auto" takes the portable kernel of the backend: "ragged_dot" (GPU/TPU kernels) off CPU, "blocked" on CPU.

An expert kernel has the signature fn(p, x_ND, experts_NK, valid_NK, block_size) -> y_NKD (each valid assignment's
SwiGLU expert output, zeros elsewhere) and may be differentiable. `auto` is its claim on "auto": a predicate
(x_ND, p, k, mesh) -> bool; the registered claims are tried by `rank` (lowest first) and the first that holds wins.
`in_shard_map`: whether it may run inside models/moe_ep.py's shard_map on each device's rows.

A wing may also hook the boundaries between a run's phases (sampling, the reference pass, the update, an
evaluation: each allocates its own large buffers): `phase_end()` runs what was registered, e.g. the CPU wing hands
the heap freed by the phase that ended back to the OS (models/cpu/allocator.py), so the next phase's buffers do not
sit on top of it. Without a wing it does nothing.

Every resolution and attention call made while tracing is counted (`traced()`, per process: runs in one process
share the counts, and a reused compile adds none), so a run can record which kernels its compiled programs contain
(summary.json); `describe()` adds each wing's own record (e.g. whether the native library was built, and its hash).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, NamedTuple

import jax


class MoEKernel(NamedTuple):
    fn: Callable
    auto: Callable | None  # (x_ND, p, k, mesh) -> bool: take this kernel for "auto"; None: only by name
    rank: int
    in_shard_map: bool


_MOE: dict[str, MoEKernel] = {}
_ATTENTION: list[tuple[Callable, Callable]] = []  # (applies(q, k, v, mask) -> bool, fn(q, k, v, mask) -> out)
_WINGS: dict[str, Callable[[], dict]] = {}
_PHASE_END: list[Callable[[], object]] = []
_TRACED: Counter = Counter()


def register_moe(name: str, fn: Callable, *, auto: Callable | None = None, rank: int = 0,
                 in_shard_map: bool = False) -> None:
    """Add (or replace) the expert kernel `name`."""
    _MOE[name] = MoEKernel(fn, auto, rank, in_shard_map)


def register_attention(applies: Callable, fn: Callable) -> None:
    """Add a cached-attention kernel over layers.py's cache layout (q [B, K, M, H] pre-scaled, keys [B, K, H, S],
    values [B, K, S, H], mask [B or 1, T, S]); `applies(q, k, v, mask)` decides per call."""
    _ATTENTION.append((applies, fn))


def register_phase_end(fn: Callable[[], object]) -> None:
    """Run fn() at every phase_end() (once per fn)."""
    if fn not in _PHASE_END:
        _PHASE_END.append(fn)


def phase_end() -> None:
    """A run's phase ended (rl/): the registered hooks run, in registration order."""
    for fn in _PHASE_END:
        fn()


def register_wing(name: str, describe: Callable[[], dict]) -> None:
    """A wing's record for `describe()` (what it built and whether it is in use)."""
    _WINGS[name] = describe


def moe_names() -> tuple[str, ...]:
    return ("auto", *sorted(_MOE))


def resolve_moe(impl: str, x_ND, p, k: int, mesh=None, *, in_shard_map: bool = False) -> str:
    """The expert kernel `impl` names; "auto": the best-ranked registered claim that holds, else the backend's
    portable kernel. in_shard_map: only kernels that may run inside a shard_map."""
    if impl == "auto":
        claims = sorted((e.rank, n) for n, e in _MOE.items()
                        if e.auto is not None and (e.in_shard_map or not in_shard_map))
        name = next((n for _, n in claims if _MOE[n].auto(x_ND, p, k, mesh)),
                    "ragged_dot" if jax.default_backend() != "cpu" else "blocked")
    elif impl in _MOE and (_MOE[impl].in_shard_map or not in_shard_map):
        name = impl
    else:
        allowed = [n for n in moe_names() if n == "auto" or _MOE[n].in_shard_map or not in_shard_map]
        where = " inside the expert-parallel shard_map" if in_shard_map else ""
        raise ValueError(f"impl must be one of {', '.join(map(repr, allowed))}{where}, got {impl!r}"
                         + ("" if impl not in ("native", "windowed") else
                            " (the CPU wing models/cpu registers it: import models.cpu)"))
    _TRACED[f"moe/{name}"] += 1
    return name


def moe_kernel(name: str) -> Callable:
    return _MOE[name].fn


def cached_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS):
    """The first registered cached-attention kernel that applies, called; None when none does (the caller then
    computes attention with XLA's ops)."""
    for applies, fn in _ATTENTION:
        if applies(q_BKMH, k_BKHS, v_BKSH, mask_BTS):
            _TRACED["attention/kernel"] += 1
            return fn(q_BKMH, k_BKHS, v_BKSH, mask_BTS)
    _TRACED["attention/xla"] += 1
    return None


def traced() -> dict[str, int]:
    """How many times each kernel was chosen while tracing in this process ("moe/<name>", "attention/kernel",
    "attention/xla"): one count per traced layer call, so a jitted program counts once however often it runs."""
    return dict(sorted(_TRACED.items()))


def describe() -> dict:
    """The registry's state: the backend, the registered expert kernels in "auto" order, each wing's record, and
    what was traced so far (config.json records it before the run, summary.json after)."""
    auto = [n for _, n in sorted((e.rank, n) for n, e in _MOE.items() if e.auto is not None)]
    return {"backend": jax.default_backend(), "moe_kernels": sorted(_MOE), "moe_auto_order": auto,
            "attention_kernels": len(_ATTENTION), "wings": {n: d() for n, d in sorted(_WINGS.items())},
            "traced": traced()}
