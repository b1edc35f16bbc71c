"""The windowed MoE dispatch for few tokens per expert (a decode step on CPU), registered as the kernel "windowed".

At a decode step each expert gets a handful of rows and the layer is bound by streaming the experts' weights from
memory (W1: 50 MB for 4 layers per step, more than the L3). The blocked kernel's scan multiplies one block at a time,
copying its expert's weights out of the stacked arrays. Here every expert takes a window of its first w rows of
the expert-sorted assignments and all windows go through one batched einsum per weight: the stacked weights are
read in place, once, by one threaded kernel. Dropless: rows past an expert's first w (an expert holds at most
min(A, N) rows) go through further w-row windows, each under a cond that skips it when that expert has no rows
there; window rows past an expert's own belong to the next expert and are masked out.

"auto" takes it on CPU (when the native kernel does not apply) while the mean load is at most WINDOWED_MAX_LOAD
assignments per expert (W1's decode step: 0.8 vs 1.9 ms per layer for blocked; at 512 tokens they tie, at 1024
blocked wins). Its gradient is the blocked kernel's (a custom VJP that re-runs blocked's forward for its
residuals): differentiating the windows' conds made a 64-token prompt pass's fwd+bwd ~1.5x slower than blocked, so
the one "auto" serves forward passes and gradients alike.

Suffixes: N tokens, A = N*k assignments, E experts, D d_model, F expert width, w rows per window.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from models import moe_kernels

# "auto" on CPU uses the windowed dispatch up to this mean number of assignments per expert (64 tokens x top-2 of 8
# is 16; W1's prefill of 8 x 32 tokens is 64), the blocked one above it.
WINDOWED_MAX_LOAD = 64


def claims(x_ND, p, k: int, mesh) -> bool:
    """Whether "auto" should take the windowed kernel: CPU and at most WINDOWED_MAX_LOAD assignments per expert."""
    return jax.default_backend() == "cpu" and x_ND.shape[0] * k <= WINDOWED_MAX_LOAD * p["w_gate"].shape[0]


def default_window(n_assignments: int, n_experts: int) -> int:
    # 1.5x the mean load per expert, in multiples of 8: most routings need no overflow window.
    mean = -(-n_assignments // n_experts)
    return max(8, -(-3 * mean // 16) * 8)


def _forward(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down, window: int | None):
    N, D = x_ND.shape
    E, k = w_gate.shape[0], experts_NK.shape[1]
    A = N * k
    w = window or default_window(A, E)
    dtype = x_ND.dtype
    _, order_A, sizes_E = moe_kernels.sort_by_expert(experts_NK, valid_NK, E)
    starts_E = jnp.cumsum(sizes_E) - sizes_E
    x_AD = jnp.concatenate([x_ND[order_A // k], jnp.zeros((w, D), dtype)])  # w spare rows: every window in bounds

    # models.layers.swiglu under jax.vmap over the experts took 2.3 instead of 0.8 ms per decode layer (XLA relaid
    # out the stacked weights every call), hence the einsums written here with the expert axis leading.
    def swiglu_rows(x, w_g, w_u, w_d, spec):
        g = jnp.einsum(f"{spec}D,{spec[:-1]}DF->{spec}F", x, w_g)
        u = jnp.einsum(f"{spec}D,{spec[:-1]}DF->{spec}F", x, w_u)
        return jnp.einsum(f"{spec}F,{spec[:-1]}FD->{spec}D", jax.nn.silu(g) * u, w_d)

    rows_Ew = starts_E[:, None] + jnp.arange(w)
    y_EwD = swiglu_rows(x_AD[rows_Ew], w_gate, w_up, w_down, "Ew")
    mine_Ew = jnp.arange(w)[None, :] < sizes_E[:, None]
    y_AD = jnp.zeros_like(x_AD).at[rows_Ew].add(jnp.where(mine_Ew[..., None], y_EwD, 0))
    n_windows = -(-min(A, N) // w)
    for e in range(E):
        for j in range(1, n_windows):
            def overflow(y_AD, e=e, j=j):
                start = starts_E[e] + j * w
                y_wD = swiglu_rows(jax.lax.dynamic_slice_in_dim(x_AD, start, w), w_gate[e], w_up[e], w_down[e], "w")
                mine_w = j * w + jnp.arange(w) < sizes_E[e]
                y_wD = jnp.where(mine_w[:, None], y_wD, 0) + jax.lax.dynamic_slice_in_dim(y_AD, start, w)
                return jax.lax.dynamic_update_slice_in_dim(y_AD, y_wD, start, 0)
            y_AD = jax.lax.cond(sizes_E[e] > j * w, overflow, lambda y: y, y_AD)
    return jnp.zeros((A, D), dtype).at[order_A].set(y_AD[:A]).reshape(N, k, D)


@partial(jax.custom_vjp, nondiff_argnums=(6,))
def _windowed(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down, window):
    return _forward(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down, window)


def _fwd(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down, window):
    return (_forward(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down, window),
            (x_ND, experts_NK, valid_NK, w_gate, w_up, w_down))


def _bwd(window, res, dy_NKD):
    x_ND, experts_NK, valid_NK, w_gate, w_up, w_down = res
    blocked = lambda x, wg, wu, wd: moe_kernels.experts_blocked(  # noqa: E731
        {"w_gate": wg, "w_up": wu, "w_down": wd}, x, experts_NK, valid_NK, window)
    dx, dwg, dwu, dwd = jax.vjp(blocked, x_ND, w_gate, w_up, w_down)[1](dy_NKD)
    return dx, None, None, dwg, dwu, dwd


_windowed.defvjp(_fwd, _bwd)


def experts_windowed(p, x_ND, experts_NK, valid_NK, window: int | None):
    """y [N, k, D]: each valid assignment's expert output (zeros elsewhere); window None: default_window."""
    dtype = x_ND.dtype
    w_gate, w_up, w_down = (p[n].astype(dtype) for n in ("w_gate", "w_up", "w_down"))
    return _windowed(x_ND, experts_NK, valid_NK, w_gate, w_up, w_down, window)
