"""Checkpoints with orbax: the last N units and the best by validation pass@1, and exact resume.

A checkpoint holds two items:
  state  a pytree of arrays: the train state (params, optimizer, KL controller, step, rng),
         the frozen reference params of an RL stage, the curriculum arrays
  meta   JSON: stage index, unit index inside the stage, global unit counter, eval history,
         the summary so far, anything else the trainer needs to carry on exactly

    ck = Checkpointer(workdir + "/checkpoints", keep=2, keep_best=True)
    ck.save(step, tree, meta, val_pass1=0.4)         # also offered to the best manager
    step = ck.latest_step()                           # None on a fresh workdir
    meta = ck.restore_meta(step)                      # read first: it says which stage's tree to build
    tree = ck.restore(step, template_tree)            # arrays restored into the template's structure

Saving is synchronous (the trainer saves between units, and a kill right after `save` returns
must leave a complete checkpoint behind).
"""
from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp


def _to_numpy(tree):
    """Device arrays -> host NumPy (PRNG key arrays as their raw uint32 data)."""

    def conv(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)

    return jax.tree.map(conv, tree)


class Checkpointer:
    """Two orbax managers: `last` (keep N most recent) and `best` (keep 1, max validation pass@1)."""

    def __init__(self, directory: str, keep: int = 2, keep_best: bool = True):
        self.directory = os.path.abspath(directory)
        opts = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=False)
        self.last = ocp.CheckpointManager(os.path.join(self.directory, "last"), options=opts, item_names=("state", "meta"))
        self.best = None
        if keep_best:
            bopts = ocp.CheckpointManagerOptions(
                max_to_keep=1,
                create=True,
                best_fn=lambda m: m["val_pass@1"],
                best_mode="max",
                keep_checkpoints_without_metrics=False,
                enable_async_checkpointing=False,
            )
            self.best = ocp.CheckpointManager(os.path.join(self.directory, "best"), options=bopts, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.last.latest_step()

    def save(self, step: int, tree, meta: dict, val_pass1: float | None = None) -> None:
        """Save `tree` + `meta` as `step`; with a validation pass@1, also offer it to the best manager."""
        tree = _to_numpy(tree)
        args = ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta))
        self.last.save(step, args=args, force=True)
        self.last.wait_until_finished()
        if self.best is not None and val_pass1 is not None:
            self.best.save(step, args=args, metrics={"val_pass@1": float(val_pass1)}, force=True)
            self.best.wait_until_finished()

    def restore_meta(self, step: int) -> dict:
        return self.last.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

    def restore(self, step: int, template) -> object:
        """Arrays of checkpoint `step` in the structure (and dtypes) of `template`, as host NumPy."""
        template = _to_numpy(template)
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), template)
        out = self.last.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        return jax.tree.map(np.asarray, out)

    def best_step(self) -> int | None:
        return None if self.best is None else self.best.best_step()

    def close(self) -> None:
        self.last.close()
        if self.best is not None:
            self.best.close()
