"""A run's policies, read from outside the run (sampling, evaluation, notebooks; read-only, safe on a run that is
still going): which checkpoint is the best / the last / global unit N, its name, and its policy loaded.

    cfg, model_cfg, params, tok = load_policy("runs/quickstart", "best")   # or "last", or a global unit N
    path, step, meta = find_policy("runs/quickstart", "best")              # which checkpoint that is
    print(policy_name(meta, step))   # "grpo unit 40 = checkpoint 82 (validation pass@1 0.512)"

One numbering of units everywhere (console, summary.json, sample / eval): a unit is numbered from 1 within its
stage ("grpo unit 40"), and the checkpoint number is the global unit, numbered from 1 over the whole run (what
`--ckpt N` takes). summary.json says so in its "numbering" field (UNIT_NUMBERING; rl/run.py writes it and reads a
checkpoint's best-policy record through best_record).

load_policy validates the run's config.json once (rl.config_validation.typed, as an old run's file reads today)
and builds the model config and tokenizer from it (rl/setup.py) and, for a LoRA run, the base the adapters merge
into (rl.context.start_weights); the checkpoints themselves are rl/checkpoint.py's (verified by their checksums).
"""
from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp

from models import layer_stack, lora, transformer
from rl import config_validation as cv
from rl.checkpoint import CheckpointError, step_dirs, verify_checkpoint
from rl.context import start_weights
from rl.setup import build_model_cfg, build_tokenizer

UNIT_NUMBERING = ("unit: the unit's number within its stage, from 1 (as the console prints it); global_unit: its "
                  "number over the whole run, from 1 = the checkpoint number (--ckpt N of experiments.sample / eval)")
ALL_ZERO_NOTE = ("every validation pass@1 was 0: this is the earliest evaluated checkpoint, not a better one")


def best_record(best: dict | None) -> dict | None:
    """A best-policy record ({"stage", "unit", "global_unit", "val_pass@1", ...}) in UNIT_NUMBERING; records
    written before it (no "unit_base") counted `unit` from 0. With validation pass@1 0 it carries ALL_ZERO_NOTE
    (a later unit replaces the best only when strictly better, so 0 means every evaluation was 0)."""
    if best is None:
        return None
    out = dict(best)
    # compat: best_record_from_zero
    if "unit_base" not in out:
        out["unit"], out["unit_base"] = int(out["unit"]) + 1, 1
    if float(out.get("val_pass@1", 1.0)) == 0.0:
        out["note"] = ALL_ZERO_NOTE
    return out


def policy_name(meta: dict, step: int) -> str:
    """"grpo unit 40 = checkpoint 82 (validation pass@1 0.512)" for a best-policy meta; "stage 3 unit 40 =
    checkpoint 82" for a last-checkpoint meta (its stage is an index from 0, its unit the count of the stage's
    units done: the number of the last one)."""
    if isinstance(meta.get("stage"), str):
        b = best_record(meta)
        return (f"{b['stage']} unit {b['unit']} = checkpoint {step} (validation pass@1 {b['val_pass@1']:.3f}"
                + (f"; {b['note']}" if "note" in b else "") + ")")
    if "stage" in meta and "unit" in meta:
        return f"stage {int(meta['stage']) + 1} unit {int(meta['unit'])} = checkpoint {step}"
    return f"checkpoint {step}"


def find_policy(workdir: str, which: str | int = "best") -> tuple[str, int, dict]:
    """(checkpoint directory, global unit, meta) of a run's policy: "best" = the best-by-validation policy
    (checkpoints/best_policy), "last" = the newest intact checkpoint, N = the checkpoint of global unit N.
    Read-only (nothing is created or cleaned up, so a running run is never disturbed); a step still being
    written (no checksums yet) is passed over."""
    which = str(which)
    root = os.path.join(workdir, "checkpoints", "best_policy" if which == "best" else "", "last")
    if not os.path.isfile(os.path.join(workdir, "config.json")):
        raise CheckpointError(f"{workdir} holds no run (no config.json)")
    steps = step_dirs(root)
    if which not in ("best", "last"):
        if not which.isdigit():
            raise CheckpointError(f"checkpoint must be best, last or a global unit number, got {which!r}")
        if int(which) not in steps:
            raise CheckpointError(f"{workdir} has no checkpoint of unit {which}; kept: {steps or 'none'}")
        steps = [int(which)]
    for step in reversed(steps):
        path = os.path.join(root, str(step))
        if not verify_checkpoint(path):
            meta = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
                os.path.abspath(path), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            return path, step, meta
    what = ("no best policy yet (checkpoint.keep_best off, or no validation eval has run): use 'last'"
            if which == "best" else "no intact checkpoint yet")
    raise CheckpointError(f"{workdir}: {what}")


def load_policy(workdir: str, which: str | int = "best"):
    """(cfg, model_cfg, params, tokenizer) of a finished or running run: cfg is workdir/config.json validated (a
    RunConfig: the file as today's code reads it), params the policy's parameters (JAX arrays on the default
    device; a PPO value head is dropped), checked against the model config's shapes. See find_policy for `which`."""
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        cfg = cv.typed(json.load(f))  # where the run's config enters: validated once, as an old run's file reads
    model_cfg = build_model_cfg(cfg)
    path, _, _ = find_policy(workdir, which)
    try:  # no template: the arrays come back as saved (host NumPy); the shapes are checked below
        state = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
            os.path.abspath(path), args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    except Exception as e:  # noqa: BLE001 - orbax raises many types; the caller gets one with the path
        raise CheckpointError(f"checkpoint {path} could not be restored: {type(e).__name__}: {e}") from None
    params = state["policy"] if "policy" in state else state["train_state"]["params"]
    params = {k: v for k, v in params.items() if k != "value_head"}
    # compat: per_layer_checkpoint
    if layer_stack.is_per_layer(params):  # written before the stacked layout
        params = layer_stack.to_stacked(params, layer_stack.layer_groups(model_cfg))
    if model_cfg.lora is not None:  # a LoRA run's checkpoint holds adapters: merged into the base rebuilt here
        if "lora" not in params:
            raise CheckpointError(f"checkpoint {path} holds no LoRA adapters, but {workdir}/config.json sets model.lora")
        try:
            params = lora.merge(start_weights(cfg, model_cfg), jax.tree.map(jax.numpy.asarray, params["lora"]),
                                model_cfg)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {path}: its adapters do not fit the model of {workdir}/config.json: "
                                  f"{e}") from None
    want = jax.eval_shape(lambda: transformer.init(model_cfg, jax.random.key(0)))
    try:
        ok = all(jax.tree.leaves(jax.tree.map(lambda w, x: w.shape == x.shape and w.dtype == x.dtype, want, params)))
    except ValueError:  # another tree structure
        ok = False
    if not ok:
        raise CheckpointError(f"checkpoint {path} does not hold a policy of the model in {workdir}/config.json")
    return cfg, model_cfg, jax.tree.map(jax.numpy.asarray, params), build_tokenizer(cfg)
