"""PRM checkpoints: an orbax directory written like the policy's (rl/checkpoint.py), and the old .npz files, read
until their date in rl/compat.py (prm_npz).

    save(prm, "runs/prm/prm")                 # a directory (rl.checkpoint.Checkpointer's layout, one step: 0)
    prm = load("runs/prm/prm")                # checksums verified first; a .npz file is read as the old format
    convert("runs/prm/prm.npz", "runs/prm/prm")   # an old file rewritten as a checkpoint directory

Layout. The directory holds `last/0/`, written by rl.checkpoint.Checkpointer (keep=1, no best copy), so a PRM gets
the policy checkpoint's atomic write, its checksums and its damage checks: the item `state` is the parameter tree
(the policy tree + "value_head") and `meta` is JSON with everything else: format (FORMAT), model_cfg, calib,
calibs, threshold, agg, meta, likelihood, and `arrays` (each leaf's path, shape and dtype: the template the
restore reads into, so a checkpoint comes back with exactly the dtypes it was written with).

The old format (NPZ_FORMAT, "mathrl-prm-v2": one .npz, arrays under "params/...", the rest as JSON under
"__meta__", read with allow_pickle=False) is read by load_npz until its date in rl/compat.py; load() takes either and
warns (FutureWarning) on the old one. Files written before PRM.calibs existed load with {"none", their own map}.
Every failure to read is a ValueError (or OSError for a missing path) that names the path.
"""
from __future__ import annotations

import json
import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from models import layer_stack
from models.config import ModelConfig
from prm.model import PRM
from rl import compat
from rl.checkpoint import Checkpointer, CheckpointError

__all__ = ["FORMAT", "NPZ_FORMAT", "save", "load", "load_npz", "convert", "is_checkpoint"]

FORMAT = "mathrl-prm-v3"  # an orbax directory (this module)
NPZ_FORMAT = "mathrl-prm-v2"  # the old single .npz file: read until its date in rl/compat.py
_STEP = 0  # a PRM checkpoint holds one step


def _flatten(tree, prefix=""):
    """{"a/b/c": host array} of a nested dict of arrays."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def _unflatten(flat: dict, leaf=jnp.asarray) -> dict:
    tree: dict = {}
    for key, value in flat.items():
        node = tree
        *parents, name = key.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = leaf(value)
    return tree


def _meta(prm: PRM) -> dict:
    return {"format": FORMAT, "model_cfg": prm.model_cfg.to_dict(), "calib": prm.calib, "calibs": prm.calibs,
            "threshold": prm.threshold, "agg": prm.agg, "meta": prm.meta, "likelihood": prm.likelihood}


def _prm(meta: dict, params: dict) -> PRM:
    model_cfg = ModelConfig.from_dict(meta["model_cfg"])
    # compat: per_layer_checkpoint
    if layer_stack.is_per_layer(params):  # written before the blocks were stored stacked
        params = layer_stack.to_stacked(params, layer_stack.layer_groups(model_cfg))
    return PRM(model_cfg, params, meta["calib"], float(meta["threshold"]), meta["agg"], meta["meta"],
               bool(meta.get("likelihood", False)), meta.get("calibs", {}))


def is_checkpoint(path) -> bool:
    """Whether `path` is a PRM checkpoint directory (by its layout; load() checks the rest)."""
    return os.path.isdir(os.path.join(path, "last"))


def save(prm: PRM, path) -> None:
    """Write `prm` as the checkpoint directory `path` (replacing the one there)."""
    flat = _flatten(jax.device_get(prm.params))
    meta = {**_meta(prm), "arrays": {k: [list(v.shape), str(v.dtype)] for k, v in flat.items()}}
    ck = Checkpointer(os.fspath(path), keep=1, keep_best=False)
    try:
        ck.save(_STEP, _unflatten(flat, leaf=lambda x: x), meta)
    finally:
        ck.close()


def load(path) -> PRM:
    """The PRM of a checkpoint directory written by save, or (until its date in rl/compat.py, with a FutureWarning) of an old .npz
    file; ValueError naming the path for anything else, OSError when nothing is there."""
    path = os.fspath(path)
    if os.path.isfile(path):
        warnings.warn(f"{path}: a PRM .npz file ({NPZ_FORMAT}) is read until {compat.SHIMS['prm_npz'].remove_after}; "
                      f"convert it once with prm.checkpoint.convert(old, new_directory)", FutureWarning, stacklevel=2)
        return load_npz(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no PRM checkpoint there")
    if not is_checkpoint(path):
        raise ValueError(f"{path}: not a PRM checkpoint (no last/ directory)")
    ck = Checkpointer(path, keep=1, keep_best=False)
    try:
        step = ck.latest_step()
        if step is None:
            raise ValueError(f"{path}: not a PRM checkpoint (nothing written under last/)")
        meta = ck.restore_meta(step)
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: not a PRM checkpoint (format {meta.get('format')!r}, expected {FORMAT!r})")
        template = _unflatten({k: np.empty(shape, jnp.dtype(dtype)) for k, (shape, dtype) in meta["arrays"].items()},
                              leaf=lambda x: x)
        params = jax.tree.map(jnp.asarray, ck.restore(step, template))
    except CheckpointError as e:
        raise ValueError(f"{path}: {e}") from None
    finally:
        ck.close()
    return _prm(meta, params)


# compat: prm_npz
def load_npz(path) -> PRM:
    """Read an old PRM file (NPZ_FORMAT, allow_pickle=False); ValueError for any other file. Kept until its date in rl/compat.py (prm_npz)."""
    with np.load(path, allow_pickle=False) as z:
        if "__meta__" not in z.files:
            raise ValueError(f"{path}: not a PRM file (no metadata)")
        meta = json.loads(str(z["__meta__"]))
        if meta.get("format") != NPZ_FORMAT:
            raise ValueError(f"{path}: not a PRM file (format {meta.get('format')!r}, expected {NPZ_FORMAT!r})")
        flat = {k[len("params/"):]: z[k] for k in z.files if k.startswith("params/")}
    return _prm(meta, _unflatten(flat))


def convert(npz_path, path) -> PRM:
    """Rewrite the old file `npz_path` as the checkpoint directory `path`; returns the PRM."""
    prm = load_npz(npz_path)
    save(prm, path)
    return prm
