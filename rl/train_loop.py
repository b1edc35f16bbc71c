"""The one optimizer loop: epochs of minibatches through a jitted train step, each step at its scheduled learning rate.

Every stage kind (sft, rejection, grpo, ppo; rl/stages/) trains through `train_on`; its core, `optimizer_steps`
(one step per minibatch, each at its scheduled hyper-parameters), is also the process reward model's loop
(prm/train.py, mode "prm"), which draws its own minibatches across epoch edges:

    state, step_metrics = optimizer_steps(step_fn, state, batches, schedule, after_step=None)

    cfg = LoopConfig(lr=1e-3, warmup_steps=0, end_lr_fraction=0.1)          # stages[i].lr, ... (flat keys)
    trainer = Trainer(step_fn=make_train_step(model_cfg, loss_cfg, cfg.optim()), loop=cfg, units=n_units,
                      agg=loss_cfg.agg, max_len_norm=loss_cfg.max_len_norm)
    carry = Carry(state=init_train_state(model_cfg, loss_cfg, cfg.optim(), key), opt_steps=0, consecutive_skips=0)
    carry, metrics = train_on(trainer, carry, batch, epochs=1, rng=np.random.default_rng(0), max_rows=32, unit=u)

Each epoch splits the rows into near-equal minibatches (rl.rollout.even_minibatches; length-grouped ones with
length_buckets, each step then weighted by its share of the epoch's loss tokens, `bucketed_denominator`; whole
groups in the grouped layout with `grouped`); every optimizer step gets its learning rate from rl.schedules.lr_at at
the stage's true progress (units done, steps of this unit), so the last step of a stage runs at exactly
`end_lr_fraction * lr` however many rows filtering kept. Step metrics are fetched once per call, so dispatch stays
asynchronous. Consecutive non-finite (skipped) steps are counted across calls; `max_consecutive_skips` of them raise
NonFiniteError.
"""
from __future__ import annotations

import dataclasses
import resource
import time
from typing import Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl import grouped_batch, losses, rollout, schedules
from rl.train_step import OptimConfig
from schema import Checked, field, integer, num

__all__ = ["LoopConfig", "Trainer", "Carry", "train_on", "optimizer_steps", "bucketed_denominator", "mean_metrics", "step_stats",
           "router_metrics", "NonFiniteError", "STEP_STATS", "check_trained"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopConfig(Checked):
    """The learning-rate schedule and optimizer fields of a stage (flat keys `stages[i].lr`, ...)."""

    lr: float = field(1e-3, "peak learning rate", num(0.0, 10.0, lo_open=True))
    warmup_steps: int = field(0, "linear warmup over this many optimizer steps (may exceed the stage's steps)",
                              integer(0, 10**7))
    end_lr_fraction: float = field(0.1, "the learning rate decays linearly to this fraction of lr at the stage's "
                                        "last optimizer step", num(0.0, 1.0))
    weight_decay: float = field(0.0, "AdamW weight decay (matrices only)", num(0.0, 10.0))
    grad_clip: float = field(1.0, "global-norm gradient clip (0 = off)", num(0.0, 1e6))

    def optim(self) -> OptimConfig:
        """The train step's optimizer (rl.train_step.OptimConfig: AdamW after the global-norm clip)."""
        return OptimConfig(weight_decay=float(self.weight_decay), grad_clip=float(self.grad_clip) or None)


class Trainer(NamedTuple):
    """What the loop needs that stays fixed over a stage."""

    step_fn: Callable  # rl.train_step.make_train_step's (state, batch, hparams) -> (state, metrics)
    loop: LoopConfig  # the learning-rate schedule
    units: int  # units (epochs, rounds, iterations) in the stage: the schedule's progress is over them
    agg: str = "token-mean"  # the loss's aggregation (LossConfig.agg) and max_len_norm: length buckets' denominator
    max_len_norm: int | None = None
    max_consecutive_skips: int = 0  # 0 = never stop on skipped steps (run.max_consecutive_skips)
    name: str = "stage"  # named in NonFiniteError


class Carry(NamedTuple):
    """What the loop changes: the train state and its counters (all checkpointed)."""

    state: dict  # rl.train_step.init_train_state's tree
    opt_steps: int = 0  # optimizer steps attempted in this stage (the warmup counts them)
    consecutive_skips: int = 0


class NonFiniteError(RuntimeError):
    """Raised when a stage skipped more consecutive non-finite steps than run.max_consecutive_skips allows."""


def mean_metrics(ms: list[dict]) -> dict:
    """Average a list of step-metric dicts (host values)."""
    if not ms:
        return {}
    out = {}
    for k in ms[0]:
        vals = [np.asarray(m[k], np.float64) for m in ms if k in m]
        out[k] = np.mean(np.stack(vals), axis=0)
    return out


def router_metrics(m: dict) -> dict:
    """Router balance and loss terms from averaged step metrics."""
    out = {}
    if "router/expert_load" in m:
        load = np.asarray(m["router/expert_load"])  # [n_moe_layers, n_experts]
        if load.ndim == 2 and load.size:
            # balance per layer: max load over the uniform share (1.0 = perfectly balanced)
            out["router/max_load_ratio"] = load.max(axis=1) * load.shape[1]
    if "router/dropped_fraction" in m:
        out["router/dropped_fraction"] = np.asarray(m["router/dropped_fraction"])
    if "loss/router_aux" in m:
        out["router/aux_loss"] = m["loss/router_aux"]
    if "loss/router_z" in m:
        out["router/z_loss"] = m["loss/router_z"]
    return out


STEP_STATS = ("lr", "optimizer_steps", "train/min_rows_per_step", "train/max_rows_per_step", "skipped_steps",
              "nonfinite_inputs", "time/train", "time/train_sys")


def step_stats(m: dict) -> dict:
    """The optimizer-loop statistics every training unit logs (from `train_on`'s result)."""
    return {k: m[k] for k in STEP_STATS if k in m}


def bucketed_denominator(loss_mask: np.ndarray, steps: int, agg: str = "token-mean", max_len: int | None = None):
    """The aggregation denominator of every step of a length-bucketed epoch: the whole epoch's (its loss tokens for
    token-mean) over its number of steps. A step's loss is then its numerator (summed token losses) over this, i.e.
    its token mean weighted by (its tokens) / (the epoch's mean tokens per step), and the steps' gradients add up to
    `steps` x the gradient of the epoch's token mean, whichever rows share a step. Length-sorted steps with their own
    token means would instead weight each sequence about equally (long rows share a step with many tokens)."""
    m = np.asarray(loss_mask, np.float64)
    _, den = losses.aggregate_parts(m, m, agg, max_len)
    return float(den) / max(int(steps), 1)


def _plan(n: int, epochs: int, max_rows: int, rng: np.random.Generator, lengths, grouped) -> list[list[np.ndarray]]:
    """Each epoch's minibatches (row indices): whole groups in the grouped layout, else near-equal row sets."""
    if grouped is not None:
        return [[grouped_batch.group_rows(g, grouped.k)
                 for g in rollout.epoch_minibatches(n // grouped.k, grouped.groups, rng)] for _ in range(epochs)]
    return [rollout.epoch_minibatches(n, max_rows, rng, lengths) for _ in range(epochs)]


def _count_skips(trainer: Trainer, consecutive: int, skipped: list[int]) -> int:
    """Consecutive non-finite steps across units; too many stop the run (run.max_consecutive_skips)."""
    for s in skipped:
        consecutive = consecutive + 1 if s else 0
    if trainer.max_consecutive_skips and consecutive >= trainer.max_consecutive_skips:
        raise NonFiniteError(
            f"stage {trainer.name!r}: {consecutive} consecutive optimizer steps were skipped because "
            "the loss, gradient, update or an input was not finite (see skipped_steps and nonfinite_inputs in "
            "metrics.jsonl); lower the learning rate or check the data. The last good state is in the checkpoint.")
    return consecutive


def check_trained(name: str, carry: Carry) -> None:
    """NonFiniteError when every optimizer step of a stage so far was skipped as non-finite (consecutive skips reset
    on a finite step, so they equal the stage's steps only then): the stage changed nothing. A run with
    model.lora.alpha 1e300 once skipped every step, below run.max_consecutive_skips, and exited 0 with a normal
    table. Called at a stage's last unit, before the checkpoint that marks the stage done."""
    if carry.opt_steps and carry.consecutive_skips >= carry.opt_steps:
        raise NonFiniteError(
            f"stage {name!r}: every one of its {carry.opt_steps} optimizer steps was skipped because the loss, "
            "gradient, update or an input was not finite (see skipped_steps and nonfinite_inputs in metrics.jsonl); "
            "the stage changed nothing. Lower the learning rate (or model.lora.alpha) or check the data.")


def optimizer_steps(step_fn: Callable, state, batches: Iterable[dict], schedule: Callable[[int], dict],
                    after_step: Callable | None = None) -> tuple[dict, list[dict]]:
    """One optimizer step per minibatch of `batches` (host dicts of arrays, each padded to one shape: one compile;
    drawn lazily, one per step, so the caller's data order stays its own). `schedule(i)` gives step i's
    hyper-parameters (host floats, sent as float32 scalars); `after_step(i + 1, state, metrics)` runs after each step
    with the metrics still on the device (early stopping reads the parameters there). `step_fn` is a jitted
    rl.train_step step (it donates `state`). Returns the final state and every step's metrics, fetched to the host
    once at the end (dispatch stays asynchronous), in step order."""
    ms = []
    for i, mb in enumerate(batches):
        hyper = {k: jnp.float32(v) for k, v in schedule(i).items()}
        state, m = step_fn(state, {k: jnp.asarray(v) for k, v in mb.items()}, hyper)
        ms.append(m)
        if after_step is not None:
            after_step(i + 1, state, m)
    return state, jax.device_get(ms)


def train_on(trainer: Trainer, carry: Carry, batch: dict, *, epochs: int, rng: np.random.Generator, max_rows: int,
             unit: int, kl_coef: float = 0.0, length_buckets: int = 0, grouped=None,
             resp_start=None) -> tuple[Carry, dict]:
    """`epochs` passes over `batch` in near-equal minibatches of at most `max_rows` rows (each padded to
    `max_rows`: one compiled shape); returns the new carry and the averaged step metrics plus the unit's step
    statistics (STEP_STATS). `unit` is the stage's unit this call trains in (the learning-rate schedule's progress).
    `length_buckets` > 0 groups rows of similar length into the minibatches and cuts each one's columns to the
    narrowest of that many widths holding its longest row (one compiled shape per width used); every step's loss is
    then divided by `bucketed_denominator` instead of its own token count, so the epoch optimises the token mean over
    all its rows, as unbucketed (random) minibatches do on average.
    `grouped` (an rl.grouped_batch.GroupedLayout, with each row's `resp_start`): minibatches of whole groups
    (at most grouped.groups), each in the grouped layout, every prompt computed once for its K answers."""
    cfg = trainer.loop
    n = int(batch["tokens"].shape[0])
    t0, sys0 = time.time(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
    lengths = rollout.row_lengths(batch["attn_mask"]) if length_buckets else None
    plan = _plan(n, epochs, max_rows, rng, lengths, grouped)
    steps_in_unit = sum(len(p) for p in plan)
    denom = None
    if length_buckets and grouped is None:  # each epoch has the same rows, so one denominator serves them all
        denom = jnp.float32(bucketed_denominator(batch["loss_mask"], len(plan[0]), trainer.agg, trainer.max_len_norm))
    steps = [idx for parts in plan for idx in parts]

    def minibatches():  # built on the host while the previous step runs
        for idx in steps:
            if grouped is not None:
                yield grouped_batch.to_grouped({k: np.asarray(v)[idx] for k, v in batch.items()},
                                               np.asarray(resp_start)[idx], grouped)
            else:
                yield rollout.take_minibatch(batch, idx, max_rows, length_buckets, lengths)

    def schedule(j: int) -> dict:
        lr = schedules.lr_at(carry.opt_steps + j, schedules.unit_progress(unit, j, steps_in_unit, trainer.units),
                             peak=cfg.lr, warmup_steps=cfg.warmup_steps, end_fraction=cfg.end_lr_fraction)
        return {"lr": lr, "kl_coef": kl_coef} if denom is None else {"lr": lr, "kl_coef": kl_coef, "loss_denom": denom}

    state, ms = optimizer_steps(trainer.step_fn, carry.state, minibatches(), schedule)
    ms = [jax.tree.map(np.asarray, m) for m in ms]
    sizes = [len(idx) for idx in steps]
    opt_steps = carry.opt_steps + len(ms)
    out = mean_metrics(ms)
    skipped = [int(m["skipped"]) for m in ms]
    skips = _count_skips(trainer, carry.consecutive_skips, skipped)
    out.update({"lr": float(ms[-1]["lr"]) if ms else None, "optimizer_steps": len(ms),
                "train/min_rows_per_step": min(sizes) if sizes else 0,
                "train/max_rows_per_step": max(sizes) if sizes else 0,
                "skipped_steps": float(sum(skipped)), "time/train": time.time() - t0,
                # the kernel's share (backing fresh pages of the steps' buffers: models/cpu/allocator.py)
                "time/train_sys": resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys0})
    return Carry(state=state, opt_steps=opt_steps, consecutive_skips=skips), out
