"""Parameters of repeated blocks stored stacked (MaxText's scan layout): the layer plan and the per-layer view.

Every weight of a run of identical blocks is one array with a leading layer axis, so the forward pass is a lax.scan
over that axis: XLA compiles one block, not n_layers, and the optimizer, the LoRA merge, checkpoints and the
non-finite check see a dozen arrays instead of hundreds.

    groups = layer_groups(cfg)        # (Group(start=0, kinds=(False,), repeats=30, names=("stack_0",)),)
    params["stack_0"]["attn"]["wq"]   # [30, D, N, H]: layers 0..29
    blocks = per_layer(params, cfg)   # {"embed", ..., "block_0": {...}, ..., "block_29": {...}} (slices)
    params = stacked(blocks, cfg)     # the inverse

A Group is a repeated *period* of blocks: `kinds` (is each block of one period an MoE block) repeated `repeats`
times from layer `start`. Position j of the period is the stack `names[j]`, holding layers start + r * period + j for
r = 0 .. repeats - 1 on its leading axis. A homogeneous model is one group of period 1; an upcycled model with an MoE
block every other layer is one group of period 2 (a dense stack and an MoE stack, scanned together); dense_layers
before an all-MoE tail give two groups. `plan(kinds)` cuts the layer sequence greedily into the groups that cover the
most layers, so the plan depends on the block kinds only (and a checkpoint's per-layer blocks convert without the
config that made them).

The per-layer view ("block_i" keys) is what Hugging Face / GGUF files, sparse upcycling and checkpoints written
before this layout use; `to_stacked` / `to_per_layer` convert any tree that holds such dicts (optimizer moments,
LoRA adapters, templates of jax.ShapeDtypeStruct) in either direction. Nothing here needs the arrays' values: NumPy,
JAX arrays and ShapeDtypeStructs are all stacked and sliced by their leading axis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

MAX_PERIOD = 8  # longest repeating pattern of block kinds looked for
BLOCK_KEY = re.compile(r"block_(\d+)")
STACK_KEY = re.compile(r"stack_(\d+)")


@dataclass(frozen=True)
class Group:
    """`kinds` (MoE or dense, per block of one period) repeated `repeats` times from layer `start`."""

    start: int
    kinds: tuple[bool, ...]
    repeats: int
    names: tuple[str, ...]  # the stacks of the period's positions

    @property
    def period(self) -> int:
        return len(self.kinds)

    def layers(self, position: int) -> tuple[int, ...]:
        """The layers stack `names[position]` holds, in the order of its leading axis."""
        return tuple(self.start + r * self.period + position for r in range(self.repeats))

    @property
    def n_layers(self) -> int:
        return self.period * self.repeats


def plan(kinds: Sequence[bool]) -> tuple[Group, ...]:
    """The groups of a block-kind sequence: from each start, the period (1..MAX_PERIOD) whose pattern repeats over
    the most layers (at least twice; ties to the shorter period), else a single block."""
    kinds = tuple(bool(k) for k in kinds)
    groups, i, n_stacks = [], 0, 0
    while i < len(kinds):
        best_p, best_r = 1, 1
        for p in range(1, min(MAX_PERIOD, len(kinds) - i) + 1):
            pattern, r = kinds[i:i + p], 1
            while kinds[i + r * p:i + (r + 1) * p] == pattern:
                r += 1
            if r >= 2 and r * p > best_p * best_r:
                best_p, best_r = p, r
        names = tuple(f"stack_{n_stacks + j}" for j in range(best_p))
        groups.append(Group(start=i, kinds=kinds[i:i + best_p], repeats=best_r, names=names))
        n_stacks += best_p
        i += best_p * best_r
    return tuple(groups)


@lru_cache(maxsize=256)
def _groups_of(kinds: tuple[bool, ...]) -> tuple[Group, ...]:
    return plan(kinds)


def layer_groups(cfg) -> tuple[Group, ...]:
    """The groups of a ModelConfig (block i is MoE iff cfg.is_moe_layer(i))."""
    return _groups_of(tuple(cfg.is_moe_layer(i) for i in range(cfg.n_layers)))


def stacks(groups: Sequence[Group]) -> list[tuple[str, tuple[int, ...], bool]]:
    """[(stack name, its layers, is MoE)] in name order."""
    return [(g.names[j], g.layers(j), g.kinds[j]) for g in groups for j in range(g.period)]


def where(groups: Sequence[Group]) -> dict[int, tuple[str, int]]:
    """layer -> (its stack, its index on the stack's leading axis)."""
    return {layer: (name, r) for name, layers, _ in stacks(groups) for r, layer in enumerate(layers)}


# ---- leaves: NumPy, JAX or ShapeDtypeStruct --------------------------------------------------------------------------
def _stack_leaves(*xs):
    x0 = xs[0]
    if isinstance(x0, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(xs), *x0.shape), x0.dtype)
    if isinstance(x0, np.ndarray) or np.isscalar(x0):
        return np.stack(xs)
    return jnp.stack(xs)


def _index_leaf(x, r: int):
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape[1:], x.dtype)
    return x[r]


def stack_blocks(blocks: Sequence, groups: Sequence[Group]) -> dict:
    """{stack name: the stacked tree} from the per-layer blocks (a sequence indexed by layer)."""
    return {name: jax.tree.map(lambda *xs: _stack_leaves(*xs), *[blocks[i] for i in layers])
            for name, layers, _ in stacks(groups)}


def unstack_blocks(stacked_: Mapping, groups: Sequence[Group]) -> list:
    """The per-layer blocks (a list indexed by layer) of {stack name: stacked tree}."""
    blocks = [None] * sum(g.n_layers for g in groups)
    for name, layers, _ in stacks(groups):
        for r, layer in enumerate(layers):
            blocks[layer] = jax.tree.map(lambda x, r=r: _index_leaf(x, r), stacked_[name])
    return blocks


def stacked(params: Mapping, cfg_or_groups) -> dict:
    """Per-layer params ("block_i" keys) -> stacked ("stack_k" keys); other keys are kept."""
    groups = _as_groups(cfg_or_groups)
    n = sum(g.n_layers for g in groups)
    missing = [i for i in range(n) if f"block_{i}" not in params]
    if missing:
        raise ValueError(f"per-layer params lack block(s) {missing[:5]} of the {n}-layer model")
    out = {k: v for k, v in params.items() if not BLOCK_KEY.fullmatch(k)}
    out.update(stack_blocks([params[f"block_{i}"] for i in range(n)], groups))
    return out


def per_layer(params: Mapping, cfg_or_groups) -> dict:
    """Stacked params -> the per-layer view ("block_i" keys, each a slice); other keys are kept."""
    groups = _as_groups(cfg_or_groups)
    out = {k: v for k, v in params.items() if not STACK_KEY.fullmatch(k)}
    out.update({f"block_{i}": b for i, b in enumerate(unstack_blocks(params, groups))})
    return out


def _as_groups(cfg_or_groups) -> tuple[Group, ...]:
    return tuple(cfg_or_groups) if isinstance(cfg_or_groups, (tuple, list)) else layer_groups(cfg_or_groups)


def _convert(tree, fn, key_re):
    """tree with every dict that has a key_re key replaced by fn(dict); other containers rebuilt as they were."""
    if isinstance(tree, Mapping):
        if any(key_re.fullmatch(str(k)) for k in tree):
            return fn(dict(tree))
        return {k: _convert(v, fn, key_re) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple (optax states)
        return type(tree)(*[_convert(v, fn, key_re) for v in tree])
    if isinstance(tree, (list, tuple)):
        return type(tree)(_convert(v, fn, key_re) for v in tree)
    return tree


def _holds(tree, key_re) -> bool:
    found = []
    _convert(tree, lambda d: found.append(1) or d, key_re)
    return bool(found)


def is_per_layer(tree) -> bool:
    """True when a dict anywhere in tree has "block_i" keys (a tree of the per-layer layout)."""
    return _holds(tree, BLOCK_KEY)


def to_stacked(tree, cfg_or_groups):
    """Every dict of `tree` with "block_i" keys turned into its stacked form (a checkpoint of the per-layer layout
    read into today's: params, optimizer moments, adapters, reference params alike)."""
    groups = _as_groups(cfg_or_groups)
    return _convert(tree, lambda d: stacked(d, groups), BLOCK_KEY)


def to_per_layer(tree, cfg_or_groups):
    """The inverse of to_stacked: every dict with "stack_k" keys in the per-layer view (e.g. the template a
    per-layer checkpoint is restored into before to_stacked)."""
    groups = _as_groups(cfg_or_groups)
    return _convert(tree, lambda d: per_layer(d, groups), STACK_KEY)


def stack_items(params: Mapping) -> list[tuple[str, dict]]:
    """[(name, stacked tree)] of params' stacks in name order."""
    return sorted(((k, v) for k, v in params.items() if STACK_KEY.fullmatch(k)), key=lambda kv: int(kv[0][6:]))
