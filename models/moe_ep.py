"""Expert parallelism: a shard_map MoE dispatch that sends each routed token to the device holding its expert with
`jax.lax.all_to_all`, runs the experts there, and sends the results back the same way.

models/moe.py's `moe_layer` calls `expert_parallel(...)` instead of its single-device dispatch whenever it is given a
mesh whose "expert" axis is larger than 1 (`uses_expert_parallelism(mesh)`); the router, its statistics and the
shared experts stay outside, under XLA's automatic partitioning, so every routing option of moe.py applies unchanged.

Layout inside the shard_map (ep = size of the "expert" axis, E_loc = n_experts / ep experts per device):
  * expert weights [E, D, F] enter as P("expert", None, None): each device holds E_loc whole experts (a rules table
    that also splits them over fsdp / tensor is gathered over those axes at the boundary);
  * tokens enter with the activations' batch layout from the rules table; every mesh axis they are replicated over
    (e.g. "expert" itself) splits them further, so each device routes its own c tokens; the outputs are all-gathered
    back over those axes at the end.
  * per device, the c * k assignments are placed in a send buffer [ep, S, D] (S slots per destination device), one
    all_to_all delivers them, the local experts run on the received rows (a kernel of models/kernels.py's registry
    with k = 1), and a second all_to_all returns the rows to their senders, where they are weighted and summed per
    token.

Buffers and the dropless guarantee. S = min(worst, ceil(buffer_factor * c * k / ep)), where worst = c * min(k, E_loc)
is the most assignments one device can ever send to another (a token's k experts are distinct). When some device has
more than S assignments for one destination, nothing is dropped: the exchange runs in rounds, round r carrying the
assignments ranked [r*S, (r+1)*S) within their destination, and the number of rounds is the largest overflow over
all devices (a pmax, so every device takes the same number of collective steps). Rounds that no device needs are
skipped at run time (lax.cond inside a lax.scan over the at most ceil(worst / S) possible rounds), so a balanced
router pays one round and a skewed one pays more exchanges, never lost tokens. With cfg.capacity_factor set, the
capacity rule of models/moe_kernels.py (per-expert capacity over the whole batch, first choices before second choices,
then token order) is decided before the exchange on the global routing, so the expert-parallel result equals the
single-device capacity result, and the dropped fraction is the same.

Suffixes: B batch, T length, N tokens, K experts per token, E experts, D d_model, c tokens of this device,
A = c*K assignments, R ep, S slots per destination.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from models import kernels, moe_kernels, sharding

DEFAULT_BUFFER_FACTOR = 2.0  # send-buffer slots per destination, as a multiple of an even share c * k / ep
EXPERT_AXIS = "expert"


def uses_expert_parallelism(mesh) -> bool:
    """True when the MoE should exchange tokens with all-to-all: a mesh whose "expert" axis is larger than 1."""
    return mesh is not None and dict(mesh.shape).get(EXPERT_AXIS, 1) > 1


def buffer_slots(n_local_tokens: int, k: int, n_experts: int, ep: int, buffer_factor: float) -> tuple[int, int]:
    """(slots per destination S, most rounds any routing can need) for a device with n_local_tokens tokens."""
    if not buffer_factor > 0:
        raise ValueError(f"buffer_factor must be > 0, got {buffer_factor!r}")
    worst = n_local_tokens * min(k, n_experts // ep)
    slots = max(1, min(worst, math.ceil(buffer_factor * n_local_tokens * k / ep)))
    return slots, max(1, math.ceil(worst / slots))


def capacity_keep(experts_NK, valid_NK, n_experts: int, capacity_factor: float):
    """moe_kernels.py's capacity rule on the whole batch: (kept assignments [N, K] bool, dropped fraction f32).

    Each expert accepts capacity(N, K, E, cf) assignments, first choices of all tokens before any second choice,
    then token order: the same slots as moe_kernels.experts_capacity, so the kept set is identical."""
    N, K = experts_NK.shape
    C = moe_kernels.capacity(N, K, n_experts, capacity_factor)
    experts_A, valid_A = experts_NK.T.reshape(N * K), valid_NK.T.reshape(N * K)  # slot-major priority
    pos_A, _ = moe_kernels.rank_within_expert(experts_A, valid_A, n_experts)
    keep_A = valid_A & (pos_A < C)
    dropped = jnp.sum(valid_A & ~keep_A) / jnp.maximum(jnp.sum(valid_A), 1)
    return keep_A.reshape(K, N).T, dropped.astype(jnp.float32)


def _spec_axes(spec) -> set[str]:
    axes = set()
    for entry in spec:
        if entry is None:
            continue
        axes.update((entry,) if isinstance(entry, str) else entry)
    return axes


def _local_experts(p_loc, x_RD, expert_R, valid_R, impl: str, block_size):
    """The local experts on the received rows (k = 1): a kernel of models/kernels.py's registry that may run inside
    the shard_map ("auto": the backend's portable one), padding rows skipped."""
    name = kernels.resolve_moe(impl, x_RD, p_loc, 1, None, in_shard_map=True)
    return kernels.moe_kernel(name)(p_loc, x_RD, expert_R[:, None], valid_R[:, None], block_size)[:, 0]


class _Plan(NamedTuple):
    """Where each of a device's assignments goes: destination device, slot in that device's buffer, round."""
    dest_A: jax.Array  # device along the expert axis holding the assignment's expert
    code_A: jax.Array  # local expert id on that device + 1 (0 marks an empty slot)
    slot_A: jax.Array
    round_A: jax.Array
    valid_A: jax.Array
    needed: jax.Array  # rounds this exchange takes: the most any device needs (identical on every device)


def _plan(experts_A, valid_A, e_loc: int, ep: int, slots: int, all_axes) -> _Plan:
    dest_A = experts_A // e_loc
    onehot_AR = jax.nn.one_hot(dest_A, ep, dtype=jnp.int32) * valid_A[:, None].astype(jnp.int32)
    rank_A = jnp.sum((jnp.cumsum(onehot_AR, axis=0) - 1) * onehot_AR, axis=1)  # order among same-destination sends
    most = jnp.max(jnp.sum(onehot_AR, axis=0))
    needed = jax.lax.pmax((most + slots - 1) // slots, all_axes)
    return _Plan(dest_A, experts_A % e_loc + 1, rank_A % slots, rank_A // slots, valid_A, needed)


def _rows(plan: _Plan, r, ep: int, slots: int):
    """Row of each assignment in round r's flat send buffer [ep * slots]; ep * slots (out of range) if not sent."""
    sent_A = plan.valid_A & (plan.round_A == r)
    return jnp.where(sent_A, plan.dest_A * slots + plan.slot_A, ep * slots)


def _send(values_A, rows_A, ep: int, slots: int):
    """Scatter per-assignment values into a [ep, slots, ...] buffer and exchange it: row j of the result came from
    device j // slots along the expert axis."""
    buf = jnp.zeros((ep * slots, *values_A.shape[1:]), values_A.dtype).at[rows_A].set(values_A, mode="drop")
    out = jax.lax.all_to_all(buf.reshape(ep, slots, *values_A.shape[1:]), EXPERT_AXIS, 0, 0, tiled=True)
    return out.reshape(ep * slots, *values_A.shape[1:])


def _return(rows_RD, rows_A, ep: int, slots: int):
    """Inverse of _send for per-row results: each assignment gets its row back (zeros if it was not in the round)."""
    D = rows_RD.shape[1]
    back = jax.lax.all_to_all(rows_RD.reshape(ep, slots, D), EXPERT_AXIS, 0, 0, tiled=True).reshape(ep * slots, D)
    return jnp.concatenate([back, jnp.zeros((1, D), back.dtype)])[rows_A]


def _round(p_loc, x_AD, plan: _Plan, r, *, ep, slots, impl, block_size):
    rows_A = _rows(plan, r, ep, slots)
    code_R = _send(plan.code_A, rows_A, ep, slots)
    y_RD = _local_experts(p_loc, _send(x_AD, rows_A, ep, slots), jnp.maximum(code_R - 1, 0), code_R > 0, impl,
                          block_size)
    return _return(y_RD, rows_A, ep, slots)


def _overflow_rounds(p_loc, x_AD, plan: _Plan, *, ep, slots, impl, block_size):
    """Rounds 1 .. needed-1 in a while loop (run-time trip count), with a hand-written backward that repeats the
    exchange round by round and recomputes the received rows' expert forward: nothing per round is stored, so memory
    does not grow with the number of rounds a routing could need."""
    kw = dict(ep=ep, slots=slots, impl=impl, block_size=block_size)

    def forward(p_loc, x_AD, plan):
        def body(state):
            r, y_AD = state
            return r + 1, y_AD + _round(p_loc, x_AD, plan, r, **kw)

        return jax.lax.while_loop(lambda s: s[0] < plan.needed, body, (jnp.int32(1), jnp.zeros_like(x_AD)))[1]

    @jax.custom_vjp
    def rounds(p_loc, x_AD, plan):
        return forward(p_loc, x_AD, plan)

    def fwd(p_loc, x_AD, plan):
        return forward(p_loc, x_AD, plan), (p_loc, x_AD, plan)

    def bwd(res, dy_AD):
        p_loc, x_AD, plan = res

        def body(state):
            r, dp, dx_AD = state
            rows_A = _rows(plan, r, ep, slots)
            code_R = _send(plan.code_A, rows_A, ep, slots)
            expert_R, used_R = jnp.maximum(code_R - 1, 0), code_R > 0
            _, vjp = jax.vjp(lambda p, x: _local_experts(p, x, expert_R, used_R, impl, block_size), p_loc,
                             _send(x_AD, rows_A, ep, slots))
            dp_r, dx_RD = vjp(_send(dy_AD, rows_A, ep, slots))
            dp = jax.tree.map(lambda acc, g: acc + g.astype(jnp.float32), dp, dp_r)
            return r + 1, dp, dx_AD + _return(dx_RD, rows_A, ep, slots)

        dp0 = jax.tree.map(lambda w: jnp.zeros(w.shape, jnp.float32), p_loc)
        _, dp, dx_AD = jax.lax.while_loop(lambda s: s[0] < plan.needed, body,
                                          (jnp.int32(1), dp0, jnp.zeros_like(x_AD)))
        dp = jax.tree.map(lambda g, w: g.astype(w.dtype), dp, p_loc)
        return dp, dx_AD, jax.tree.map(lambda _: None, plan)

    rounds.defvjp(fwd, bwd)
    return rounds(p_loc, x_AD, plan)


def _exchange(p_loc, x_cD, experts_A, valid_A, *, ep: int, slots: int, max_rounds: int, all_axes, impl, block_size):
    """Per device: y_AD, each assignment's expert output, computed on the device holding that expert.

    Round 0 is plain JAX (its backward keeps the usual residuals); rounds past it exist only when a destination can
    overflow its S slots, and run as _overflow_rounds."""
    K = experts_A.shape[0] // x_cD.shape[0]
    plan = _plan(experts_A, valid_A, p_loc["w_gate"].shape[0], ep, slots, all_axes)
    x_AD = jnp.repeat(x_cD, K, axis=0)  # assignment a belongs to token a // K
    kw = dict(ep=ep, slots=slots, impl=impl, block_size=block_size)
    y_AD = _round(p_loc, x_AD, plan, 0, **kw)
    if max_rounds > 1:
        y_AD = y_AD + _overflow_rounds(p_loc, x_AD, plan, **kw)
    return y_AD, plan.needed


def expert_parallel(p, x_BTD, weights_BTK, experts_BTK, valid_BTK, *, mesh, rules=None, impl: str = "auto",
                    block_size: int | None = None, buffer_factor: float = DEFAULT_BUFFER_FACTOR,
                    return_rounds: bool = False):
    """sum_k weights[..., k] * expert_{experts[..., k]}(x) for valid assignments, experts exchanged by all-to-all.

    p holds the routed expert weights w_gate/w_up [E, D, F], w_down [E, F, D]; routing comes from moe.route (and
    capacity_keep folded into valid_BTK when a capacity factor is set). Returns y_BTD in x's dtype, and with
    return_rounds also the number of exchange rounds taken (int32; > 1 means some device overflowed its buffer).
    """
    rules = sharding.DEFAULT_RULES if rules is None else rules
    E = p["w_gate"].shape[0]
    ep = dict(mesh.shape)[EXPERT_AXIS]
    if E % ep:
        raise ValueError(f"n_experts ({E}) must be divisible by the mesh's expert axis ({ep}) for expert parallelism")
    D, K = x_BTD.shape[2], experts_BTK.shape[2]
    tok_spec = sharding.logical_to_spec(("batch", "length", None), rules, shape=x_BTD.shape, mesh=mesh)
    taken = _spec_axes(tok_spec)
    # Mesh axes the tokens are replicated over split them further (in mesh order), so no device repeats another's work.
    split_axes = tuple(a for a in mesh.axis_names if a not in taken and mesh.shape[a] > 1)
    n_split = math.prod(mesh.shape[a] for a in split_axes)
    w_spec = P(EXPERT_AXIS, None, None)

    def local(w_gate, w_up, w_down, x_btD, w_btK, e_btK, v_btK):
        b, t = x_btD.shape[:2]
        n = b * t
        c = -(-n // n_split)  # tokens per device after the split (static: shapes are known inside shard_map)
        pad = n_split * c - n
        slots, max_rounds = buffer_slots(c, K, E, ep, buffer_factor)

        def chunk(a):  # this device's c tokens of the local n (padding tokens are invalid)
            a = a.reshape(n, *a.shape[2:])
            a = jnp.concatenate([a, jnp.zeros((pad, *a.shape[1:]), a.dtype)]) if pad else a
            if n_split == 1:
                return a
            idx = 0
            for axis in split_axes:
                idx = idx * mesh.shape[axis] + jax.lax.axis_index(axis)
            return jax.lax.dynamic_slice_in_dim(a, idx * c, c)

        x_cD, w_cK, e_cK, v_cK = chunk(x_btD), chunk(w_btK), chunk(e_btK), chunk(v_btK)
        p_loc = {"w_gate": w_gate.astype(x_cD.dtype), "w_up": w_up.astype(x_cD.dtype),
                 "w_down": w_down.astype(x_cD.dtype)}
        y_AD, rounds = _exchange(p_loc, x_cD, e_cK.reshape(c * K), v_cK.reshape(c * K), ep=ep, slots=slots,
                                 max_rounds=max_rounds, all_axes=tuple(mesh.axis_names), impl=impl,
                                 block_size=block_size)
        y_cD = jnp.einsum("cKD,cK->cD", y_AD.reshape(c, K, D), w_cK.astype(x_cD.dtype))
        if n_split > 1:
            y_cD = jax.lax.all_gather(y_cD, split_axes, axis=0, tiled=True)
        return y_cD[:n].reshape(b, t, D), rounds

    # check_vma=False: moe.py's kernels build constants inside lax.cond branches, which the varying-axes checker
    # rejects. The transposes are then JAX's conservative ones (weight gradients summed over the axes the experts are
    # replicated on); tests/test_moe_ep.py checks every gradient against the single-device model.
    fn = jax.shard_map(local, mesh=mesh, in_specs=(w_spec, w_spec, w_spec, tok_spec, tok_spec, tok_spec, tok_spec),
                       out_specs=(tok_spec, P()), check_vma=False)
    y_BTD, rounds = fn(p["w_gate"], p["w_up"], p["w_down"], x_BTD, weights_BTK, experts_BTK, valid_BTK)
    return (y_BTD, rounds) if return_rounds else y_BTD


def dispatch(p, x_BTD, weights_NK, experts_NK, valid_NK, cfg, *, mesh, rules=None, impl: str = "auto",
             block_size: int | None = None, buffer_factor: float = DEFAULT_BUFFER_FACTOR):
    """moe_layer's expert-parallel branch: (y_ND combined over the k experts, dropped fraction f32).

    Dropless (cfg.capacity_factor None): every valid assignment is computed. With a capacity factor, the
    capacity rule picks the kept assignments on the whole batch first; only those travel."""
    B, T, D = x_BTD.shape
    K = experts_NK.shape[1]
    if cfg.capacity_factor is not None:
        valid_NK, dropped = capacity_keep(experts_NK, valid_NK, p["w_gate"].shape[0], cfg.capacity_factor)
    else:
        dropped = jnp.zeros((), jnp.float32)
    y_BTD = expert_parallel(p, x_BTD, weights_NK.reshape(B, T, K), experts_NK.reshape(B, T, K),
                            valid_NK.reshape(B, T, K), mesh=mesh, rules=rules, impl=impl, block_size=block_size,
                            buffer_factor=buffer_factor)
    return y_BTD.reshape(B * T, D), dropped
