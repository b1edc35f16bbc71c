"""Logical axis names -> device mesh: the rules table, make_mesh, logical specs, batch shardings, constraints.

Every parameter dimension carries a logical name (models.transformer.param_axes); activations use batch and length
(their embed dimension stays replicated). A rules table (DEFAULT_RULES, or the experiment config's own) maps each
logical name to a mesh axis, a tuple of mesh axes, or None (replicated). The mesh always has the four axes
("data", "fsdp", "expert", "tensor").

    mesh = make_mesh({"data": 2, "expert": 2, "tensor": -1})            # -1 = the remaining devices
    params = transformer.init_sharded(cfg, key, mesh, DEFAULT_RULES)     # created in place, already sharded
    tokens = jax.device_put(tokens, batch_sharding(mesh, DEFAULT_RULES))
    logits, aux = forward(params, tokens, cfg, mesh=mesh, rules=DEFAULT_RULES)

Resolution of a spec: a mesh axis already used by an earlier dimension of the same array is skipped (so e.g. embed ->
fsdp does not clash with batch -> (data, fsdp)), and when the array's shape is known a dimension keeps only the leading
mesh axes whose product divides it (e.g. an odd vocabulary of 259 stays replicated rather than failing).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "expert", "tensor")

DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert", "expert"),
)


def _rules_dict(rules) -> dict:
    """Accepts a sequence of (logical, mesh axes) pairs or a mapping; mesh axes may be a str, tuple/list or None."""
    items = rules.items() if isinstance(rules, Mapping) else rules
    table = {}
    for entry in items:
        if len(entry) != 2:
            raise ValueError(f"sharding rule {entry!r} must be a (logical_name, mesh_axes) pair")
        logical, target = entry
        if target is None:
            target = ()
        elif isinstance(target, str):
            target = (target,)
        else:
            target = tuple(target)
        for axis in target:
            if axis not in MESH_AXES:
                raise ValueError(f"sharding rule for {logical!r} names unknown mesh axis {axis!r}; "
                                 f"mesh axes are {MESH_AXES}")
        table[logical] = target
    return table


def logical_to_spec(axes: Sequence[str | None], rules=DEFAULT_RULES, *, shape=None, mesh: Mesh | None = None):
    """PartitionSpec for an array whose dimensions have these logical names (None = replicated dimension)."""
    table = _rules_dict(rules)
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(axes):
        if name is None:
            spec.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis {name!r} has no sharding rule; rules cover {sorted(table)}")
        chosen, size = [], 1
        for axis in table[name]:
            if axis in used or (mesh is not None and axis not in mesh.shape):
                continue
            axis_size = mesh.shape[axis] if mesh is not None else 1
            if shape is not None and mesh is not None and shape[dim] % (size * axis_size):
                break  # keep only the leading axes that divide this dimension evenly
            chosen.append(axis)
            size *= axis_size
        used.update(chosen)
        spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
    return PartitionSpec(*spec)


def make_mesh(axis_sizes: Mapping[str, int], devices=None) -> Mesh:
    """Mesh with axes (data, fsdp, expert, tensor); missing axes have size 1, one size may be -1 (= the rest)."""
    unknown = sorted(set(axis_sizes) - set(MESH_AXES))
    if unknown:
        raise ValueError(f"unknown mesh axes {unknown} in {dict(axis_sizes)}; mesh axes are {MESH_AXES}")
    devices = list(jax.devices() if devices is None else devices)
    sizes = {axis: int(axis_sizes.get(axis, 1)) for axis in MESH_AXES}
    for axis, size in sizes.items():
        if size == 0 or size < -1:
            raise ValueError(f"mesh axis {axis!r} has size {size}; sizes must be >= 1 or -1 (= the rest)")
    free = [axis for axis, size in sizes.items() if size == -1]
    if len(free) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {free} in {dict(axis_sizes)}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if free:
        if len(devices) % fixed:
            raise ValueError(f"mesh axis sizes {dict(axis_sizes)}: the fixed sizes multiply to {fixed}, which does "
                             f"not divide the {len(devices)} devices")
        sizes[free[0]] = len(devices) // fixed
    total = math.prod(sizes.values())
    if total != len(devices):
        raise ValueError(f"mesh axis sizes {dict(axis_sizes)} multiply to {total} but there are {len(devices)} "
                         f"devices; make the product equal the device count (or set one axis to -1)")
    return jax.make_mesh(tuple(sizes.values()), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def batch_sharding(mesh: Mesh, rules=DEFAULT_RULES, ndim: int = 2, *, shape=None) -> NamedSharding:
    """Sharding for [batch, length, ...] arrays: batch over the rule's mesh axes, the rest replicated."""
    axes = ("batch", "length", *([None] * (ndim - 2)))[:ndim]
    return NamedSharding(mesh, logical_to_spec(axes, rules, shape=shape, mesh=mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def constrain(x, axes, mesh: Mesh, rules=DEFAULT_RULES):
    """with_sharding_constraint by logical axis names (used on activations inside forward)."""
    spec = logical_to_spec(axes, rules, shape=x.shape, mesh=mesh)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
