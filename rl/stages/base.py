"""What every stage kind shares: the common config fields and the runtime that owns one stage's train state.

    cfg = SFTConfig(name="cold_start", epochs=3, lr=3e-3)      # validated on construction
    run = SFTRun(ctx, index, cfg, params)                      # a StageRun subclass (rl/stages/sft.py)
    metrics = run.run_unit(u)                                  # one epoch / round / iteration
    tree, meta = run.tree(), run.meta()                        # what a checkpoint holds; run.load(tree, meta)

`StageConfig.components(max_new_tokens)` is the one mapping from a stage config to the train step's
LossConfig / OptimConfig and the KL controller; validation and the run both call it.

`StageRun.train_on(batch, ...)` is the one optimizer loop: each epoch splits the rows into
near-equal minibatches (rl.rollout.even_minibatches; length-grouped ones with length_buckets, each step then
weighted by its share of the epoch's loss tokens, `bucketed_denominator`), every optimizer step gets its learning rate
from rl.schedules.lr_at at the stage's true progress (units done, steps of this unit), so the last
step of a stage runs at exactly `end_lr_fraction * lr` however many rows filtering kept.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rl import grouped_batch, rollout, schedules
from rl.config_fields import Checked, choice, field, integer, name, num

KINDS = ("sft", "rejection", "grpo", "ppo")
FAMILIES = ("math", "code", "instructions", "gym")  # rewards; gym problems report as gym/<generator>


def parse_families(v: str) -> tuple[str, ...]:
    """'' -> () (all families); "math, code" -> ("math", "code")."""
    return tuple(f.strip() for f in str(v).split(",") if f.strip())


def families_check(v) -> str | None:
    if not isinstance(v, str):
        return f"must be a string like 'math,code', got {v!r}"
    bad = [f for f in parse_families(v) if f not in FAMILIES]
    if bad:
        return f"unknown task family {bad[0]!r}; choose from {', '.join(FAMILIES)}"
    return None


def stage_problems(problems, families: str):
    """The problems of the given families ('' = all), in their original order."""
    fams = parse_families(families)
    return list(problems) if not fams else [p for p in problems if p.reward in fams]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageConfig(Checked):
    """Fields every stage kind has."""

    name: str = field("stage", "stage name (summary.json key; must be unique)", name)
    kind: str = field("sft", "sft | rejection | grpo | ppo", choice(*KINDS))
    lr: float = field(1e-3, "peak learning rate", num(0.0, 10.0, lo_open=True))
    warmup_steps: int = field(0, "linear warmup over this many optimizer steps (may exceed the stage's steps)",
                              integer(0, 10**7))
    end_lr_fraction: float = field(0.1, "the learning rate decays linearly to this fraction of lr at the stage's "
                                        "last optimizer step", num(0.0, 1.0))
    weight_decay: float = field(0.0, "AdamW weight decay (matrices only)", num(0.0, 10.0))
    grad_clip: float = field(1.0, "global-norm gradient clip (0 = off)", num(0.0, 1e6))
    families: str = field("", "task families this stage draws from: '' = every problem of tasks.mix, else a comma "
                              "list of math, code, instructions, gym", families_check)

    KIND = "sft"  # class attributes: the kind this config class describes and the field counting its units
    UNIT_FIELD = "epochs"

    def cross_checks(self):
        if self.kind != self.KIND:
            yield "kind", f"must be {self.KIND!r} for {type(self).__name__}, got {self.kind!r}"

    @property
    def units(self) -> int:
        """Units in the stage (SFT epochs, rejection rounds, RL iterations)."""
        return int(getattr(self, self.UNIT_FIELD))

    def components(self, max_new_tokens: int):
        """(LossConfig, OptimConfig, KL controller or None) of the train step this stage runs."""
        from rl.train_step import LossConfig

        return LossConfig(mode="sft"), self.optim_config(), None

    def optim_config(self):
        from rl.train_step import OptimConfig

        return OptimConfig(weight_decay=float(self.weight_decay), grad_clip=float(self.grad_clip) or None)


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
              "nonfinite_inputs", "time/train")


def step_stats(m: dict) -> dict:
    """The optimizer-loop statistics every training unit logs (from `StageRun.train_on`'s result)."""
    return {k: m[k] for k in STEP_STATS if k in m}


def bucketed_denominator(loss_mask: np.ndarray, steps: int, agg: str = "token-mean", max_len: int | None = None):
    """The aggregation denominator of every step of a length-bucketed epoch: the whole epoch's (its loss tokens for
    token-mean) over its number of steps. A step's loss is then its numerator (summed token losses) over this, i.e.
    its token mean weighted by (its tokens) / (the epoch's mean tokens per step), and the steps' gradients add up to
    `steps` x the gradient of the epoch's token mean, whichever rows share a step. Length-sorted steps with their own
    token means would instead weight each sequence about equally (long rows share a step with many tokens)."""
    from rl import losses

    m = np.asarray(loss_mask, np.float64)
    _, den = losses.aggregate_parts(m, m, agg, max_len)
    return float(den) / max(int(steps), 1)


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


class StageRun:
    """One stage's train state, step function and optimizer-step counter; each kind's subclass adds `run_unit(u)`."""

    def __init__(self, ctx, index: int, cfg: StageConfig, params):
        from rl.train_step import init_train_state, make_train_step

        self.ctx, self.index, self.cfg = ctx, index, cfg
        self.units = cfg.units
        self.problems = stage_problems(ctx.train, cfg.families)  # what this stage samples or fine-tunes on
        if not self.problems:
            raise ValueError(f"stage {cfg.name!r}: no training problem of families {cfg.families!r} in tasks.mix")
        self.loss_cfg, self.optim_cfg, self.kl_ctl = cfg.components(ctx.cfg["sampling"]["max_new_tokens"])
        self.state = init_train_state(ctx.model_cfg, self.loss_cfg, self.optim_cfg, ctx.key("state", index),
                                      mesh=ctx.mesh, rules=ctx.rules, params=params)
        self.step_fn = ctx.cached(("step", ctx.model_cfg, self.loss_cfg, self.optim_cfg, ctx.mesh, ctx.rules),
                                  lambda: make_train_step(ctx.model_cfg, self.loss_cfg, self.optim_cfg, mesh=ctx.mesh,
                                                          rules=ctx.rules))
        self.opt_steps = 0  # optimizer steps attempted in this stage (the warmup counts them)
        self.consecutive_skips = 0

    # -- checkpoint ---------------------------------------------------------------------------
    def tree(self) -> dict:
        return {"train_state": self.state}

    def meta(self) -> dict:
        return {"opt_steps": self.opt_steps, "consecutive_skips": self.consecutive_skips}

    def template(self, meta: dict) -> dict:
        """The tree structure `load` expects for a checkpoint written with `meta` (defaults to `tree()`)."""
        del meta
        return self.tree()

    def load(self, tree: dict, meta: dict) -> None:
        def restore(t, x):
            return jax.random.wrap_key_data(jnp.asarray(x)) if _is_key(t) else jnp.asarray(x, dtype=t.dtype)

        self.state = jax.tree.map(restore, self.state, tree["train_state"])
        if self.ctx.mesh is not None:
            from rl.train_step import state_shardings

            self.state = jax.device_put(self.state, state_shardings(self.ctx.model_cfg, self.loss_cfg, self.optim_cfg,
                                                                    self.ctx.mesh, self.ctx.rules))
        self.opt_steps = int(meta.get("opt_steps", 0))
        self.consecutive_skips = int(meta.get("consecutive_skips", 0))

    def policy_params(self):
        return {k: v for k, v in self.state["params"].items() if k != "value_head"}

    # -- the optimizer loop -------------------------------------------------------------------
    def train_on(self, batch: dict, *, epochs: int, rng: np.random.Generator, max_rows: int, unit: int,
                 kl_coef: float = 0.0, length_buckets: int = 0, grouped=None, resp_start=None) -> dict:
        """`epochs` passes over `batch` in near-equal minibatches of at most `max_rows` rows (each padded to
        `max_rows`: one compiled shape); returns the averaged step metrics plus the unit's step statistics.
        `length_buckets` > 0 groups rows of similar length into the minibatches and cuts each one's columns to
        the narrowest of that many widths holding its longest row (one compiled shape per width used); every step's
        loss is then divided by `bucketed_denominator` instead of its own token count, so the epoch optimises the
        token mean over all its rows, as unbucketed (random) minibatches do on average.
        `grouped` (an rl.grouped_batch.GroupedLayout, with each row's `resp_start`): minibatches of whole groups
        (at most grouped.groups), each in the grouped layout, every prompt computed once for its K answers."""
        cfg = self.cfg
        n = int(batch["tokens"].shape[0])
        t0 = time.time()
        ms, sizes = [], []
        lengths = rollout.row_lengths(batch["attn_mask"]) if length_buckets else None
        if grouped is not None:  # minibatches of whole groups
            plan = [[grouped_batch.group_rows(g, grouped.k)
                     for g in rollout.epoch_minibatches(n // grouped.k, grouped.groups, rng)] for _ in range(epochs)]
        else:
            plan = [rollout.epoch_minibatches(n, max_rows, rng, lengths) for _ in range(epochs)]
        steps_in_unit = sum(len(p) for p in plan)
        denom = None
        if length_buckets and grouped is None:  # each epoch has the same rows, so one denominator serves them all
            denom = jnp.float32(bucketed_denominator(batch["loss_mask"], len(plan[0]), self.loss_cfg.agg,
                                                     self.loss_cfg.max_len_norm))
        j = 0
        for parts in plan:
            for idx in parts:
                if grouped is not None:
                    mb = grouped_batch.to_grouped({k: np.asarray(v)[idx] for k, v in batch.items()},
                                                  np.asarray(resp_start)[idx], grouped)
                else:
                    mb = rollout.take_minibatch(batch, idx, max_rows, length_buckets, lengths)
                lr = schedules.lr_at(self.opt_steps, schedules.unit_progress(unit, j, steps_in_unit, self.units),
                                     peak=cfg.lr, warmup_steps=cfg.warmup_steps, end_fraction=cfg.end_lr_fraction)
                hp = {"lr": jnp.float32(lr), "kl_coef": jnp.float32(kl_coef)}
                if denom is not None:
                    hp["loss_denom"] = denom
                self.state, m = self.step_fn(self.state, {k: jnp.asarray(v) for k, v in mb.items()}, hp)
                ms.append(m)
                sizes.append(len(idx))
                self.opt_steps += 1
                j += 1
        ms = [jax.tree.map(np.asarray, jax.device_get(m)) for m in ms]  # fetched once: dispatch stays asynchronous
        out = mean_metrics(ms)
        skipped = [int(m["skipped"]) for m in ms]
        self._count_skips(skipped)
        out.update({"lr": float(ms[-1]["lr"]) if ms else None, "optimizer_steps": len(ms),
                    "train/min_rows_per_step": min(sizes) if sizes else 0,
                    "train/max_rows_per_step": max(sizes) if sizes else 0,
                    "skipped_steps": float(sum(skipped)), "time/train": time.time() - t0})
        return out

    def _count_skips(self, skipped: list[int]) -> None:
        """Consecutive non-finite steps across units; too many stop the run (run.max_consecutive_skips)."""
        for s in skipped:
            self.consecutive_skips = self.consecutive_skips + 1 if s else 0
        limit = self.ctx.cfg["run"]["max_consecutive_skips"]
        if limit and self.consecutive_skips >= limit:
            raise NonFiniteError(
                f"stage {self.cfg.name!r}: {self.consecutive_skips} consecutive optimizer steps were skipped because "
                "the loss, gradient, update or an input was not finite (see skipped_steps and nonfinite_inputs in "
                "metrics.jsonl); lower the learning rate or check the data. The last good state is in the checkpoint.")


class NonFiniteError(RuntimeError):
    """Raised when a stage skipped more consecutive non-finite steps than run.max_consecutive_skips allows."""
