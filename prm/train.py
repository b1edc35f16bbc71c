"""Training of the process reward model on the project's own train step, and the pipeline's config.

    cfg = PRMConfig(steps=300, lr=1e-3)                         # every field checked (FieldErrors names it)
    cfg = with_overrides(plain_dict, ["lr=3e-4", "sources=prior,mix"])   # a config file's fields + FIELD=VALUE
    params, log = train(enc, model_cfg, cfg, init_params, seed=0)

Training is rl.train_step in mode "prm": init_train_state (AdamW from make_optimizer, the value head added to
the given parameters), make_train_step (jitted, donated, non-finite steps skipped), the learning rate from
rl.schedules.lr_at each step, run by rl/train_loop.py's optimizer_steps (the optimizer loop every stage's train_on runs on). Rows are
drawn in reshuffled epochs, batch_size solutions per step, padded to a fixed shape with rl.rollout.pad_rows (one
compile); a row without labels is never drawn. Calibration and evaluation: prm/calibration.py.
"""
from __future__ import annotations

import ast
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from prm import metrics
from prm.model import Encoded, train_batch
from rl.rollout import pad_rows
from rl.schedules import lr_at
from rl.train_loop import optimizer_steps
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_train_step
from schema import Checked, boolean, choice, field, from_dict, integer, num, text

__all__ = ["PRMConfig", "SOURCES", "train", "step_fn", "with_overrides"]

SOURCES = ("corrupted", "mc", "mix", "exact", "prior")


def _sources_check(v) -> str | None:
    if not isinstance(v, str):
        return f"must be a comma list of {', '.join(SOURCES)}, got {v!r}"
    names = [s.strip() for s in v.split(",") if s.strip()]
    bad = [s for s in names if s not in SOURCES]
    if not names or bad:
        return f"must name label sources among {', '.join(SOURCES)}, got {v!r}"
    return None


def _ns_check(v) -> str | None:
    if (not isinstance(v, (tuple, list)) or not v
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v)):
        return f"must be a non-empty tuple of ints >= 0, got {v!r}"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PRMConfig(Checked):
    """The PRM pipeline (experiments/train_prm.py): data, labels, model, optimisation and evaluation."""

    sources: str = field("prior,corrupted,mc,mix,exact", "label sources to train and compare: corrupted (the "
                                                         "checker on corrupted gold), mc (Math-Shepherd rollouts on "
                                                         "the policy's samples), mix (both), exact (the checker on "
                                                         "the policy's samples: the exact-label reference), prior "
                                                         "(no training: the policy's step likelihood, calibrated)",
                         _sources_check)
    deploy: str = field("auto", "label source whose PRM is written to workdir/prm.npz (auto: the best step AUROC "
                                "on the calibration split)", choice("auto", *SOURCES))
    init: str = field("policy", "PRM initial weights: policy (the cold-start policy's) | scratch (fresh init)",
                      choice("policy", "scratch"))
    likelihood: bool = field(True, "the step logit adds the step's log-likelihood under the PRM's own LM head "
                                   "(prm/model.py)", boolean)
    n_problems: int = field(400, "training problems whose policy samples get MC / exact labels", integer(1, 10**6))
    samples: int = field(2, "policy samples per training problem", integer(1, 256))
    n_gold: int = field(800, "training problems rendered as (corrupted) gold solutions", integer(1, 10**6))
    corrupt_prob: float = field(0.7, "share of gold solutions with one corrupted step", num(0.0, 1.0))
    propagate_prob: float = field(0.5, "share of corruptions carried into later steps and the answer", num(0.0, 1.0))
    temperature: float = field(1.0, "sampling temperature of the policy's solutions and of the MC rollouts",
                               num(0.0, 10.0, lo_open=True))
    mc_rollouts: int = field(4, "Math-Shepherd rollouts per step (N)", integer(1, 256))
    n_calib: int = field(64, "validation problems whose samples fit the calibration and the threshold",
                         integer(1, 10**6))
    n_test: int = field(128, "test problems: held-out generated solutions", integer(1, 10**6))
    calib_samples: int = field(4, "policy samples per calibration problem", integer(1, 256))
    eval_samples: int = field(8, "of each test problem's samples, the first N give the step metrics and F1",
                              integer(1, 4096))
    best_of_n: tuple = field((4, 16, 64), "N of the best-of-N table (the test problems get max(N) samples)", _ns_check)
    agg: str = field("min", "solution score from step scores: min | mean | prod | last", choice(*metrics.AGGREGATES))
    steps: int = field(300, "optimizer steps per PRM", integer(0, 10**7))
    batch_size: int = field(32, "solutions per optimizer step", integer(1, 4096))
    lr: float = field(1e-4, "peak learning rate (the whole policy is fine-tuned: keep it low)",
                      num(0.0, 10.0, lo_open=True))
    warmup_steps: int = field(20, "linear warmup steps", integer(0, 10**7))
    end_lr_fraction: float = field(0.1, "the learning rate decays linearly to this fraction of lr", num(0.0, 1.0))
    weight_decay: float = field(0.0, "AdamW weight decay (matrices only)", num(0.0, 10.0))
    grad_clip: float = field(1.0, "global-norm gradient clip (0 = off)", num(0.0, 1e6))
    seeds: tuple = field((0,), "PRM training seeds (head init, data order); metrics are means over them",
                         _ns_check)
    select_every: int = field(20, "score the calibration split every N steps and keep the best parameters "
                                     "(0 = keep the last)", integer(0, 10**7))
    score_rows: int = field(64, "rows per scoring call (one compiled shape)", integer(1, 4096))
    log_every: int = field(0, "print the training loss every N steps (0 = never)", integer(0, 10**7))
    note: str = field("", "free text stored with the results", text)
    cache: bool = field(True, "reuse the samples and labels already in the workdir", boolean)

    def source_list(self) -> list[str]:
        return [s.strip() for s in self.sources.split(",") if s.strip()]

    def cross_checks(self):
        if self.deploy != "auto" and self.deploy not in self.source_list():
            yield "deploy", f"must be one of the trained sources ({self.sources}), got {self.deploy!r}"
        if "prior" in self.source_list() and not self.likelihood:
            yield "sources", "'prior' (the untrained policy's step likelihood) needs likelihood on"
        if any(n < 1 for n in self.best_of_n):
            yield "best_of_n", f"must hold ints >= 1, got {self.best_of_n!r}"


def _batches(enc: Encoded, cfg: PRMConfig, rng: np.random.Generator):
    """cfg.steps minibatches of cfg.batch_size rows (padded to it: one compile), drawn in reshuffled epochs over the
    rows that have a label."""
    rows = np.flatnonzero(enc.label_mask.sum(1) > 0)
    order = np.zeros((0,), np.int64)
    for _ in range(cfg.steps):
        if len(order) < cfg.batch_size:
            order = np.concatenate([order, rng.permutation(rows)])
        idx, order = order[:cfg.batch_size], order[cfg.batch_size:]
        yield pad_rows(train_batch(enc, idx, cfg.likelihood), cfg.batch_size)


def _schedule(cfg: PRMConfig):
    """Step i's learning rate: linear warmup, then linear decay to end_lr_fraction over cfg.steps."""
    return lambda i: {"lr": lr_at(i, i / max(cfg.steps - 1, 1), peak=cfg.lr, warmup_steps=cfg.warmup_steps,
                                  end_fraction=cfg.end_lr_fraction)}


def train(enc: Encoded, model_cfg, cfg: PRMConfig, params, seed: int, select=None) -> tuple[dict, dict]:
    """Trained parameters (policy tree + value_head) and a log {"loss", "accuracy", "seconds", "skipped",
    "selection"}. With `select(params) -> float` (higher is better, e.g. AUROC on a calibration split), the
    parameters are scored before training and every cfg.select_every steps, and the best ones are returned
    (early stopping: fine-tuning a policy on a few thousand labels can lose what the start knew)."""
    loss_cfg = LossConfig(mode="prm")
    optim_cfg = OptimConfig(weight_decay=float(cfg.weight_decay), grad_clip=float(cfg.grad_clip) or None)
    params = jax.tree.map(jnp.array, params)  # a copy: the step donates its state, the caller keeps its params
    state = init_train_state(model_cfg, loss_cfg, optim_cfg, jax.random.key(seed), params=params)
    t0, log = time.time(), {"loss": [], "accuracy": [], "selection": []}
    best = None

    def consider(i, state):
        nonlocal best
        p = jax.device_get(state["params"])
        v = float(select(p))
        log["selection"].append((i, v))
        if best is None or v > best[0]:
            best = (v, i, p)

    def after_step(i, state, m):
        if select is not None and (i % (cfg.select_every or cfg.steps) == 0 or i == cfg.steps):
            consider(i, state)
        if cfg.log_every and i % cfg.log_every == 0:
            print(f"  step {i}: loss {float(m['loss/prm']):.4f} accuracy {float(m['prm/accuracy']):.3f}", flush=True)

    if select is not None:
        consider(0, state)
    state, ms = optimizer_steps(step_fn(model_cfg, loss_cfg, optim_cfg), state,
                                _batches(enc, cfg, np.random.default_rng(seed)), _schedule(cfg), after_step)
    log["loss"] = [float(m["loss/prm"]) for m in ms]
    log["accuracy"] = [float(m["prm/accuracy"]) for m in ms]
    log["skipped"] = int(sum(int(m["skipped"]) for m in ms))
    log["seconds"] = time.time() - t0
    if best is not None:
        log["best_step"] = best[1]
        return best[2], log
    return jax.device_get(state["params"]), log


_STEPS: dict = {}


def step_fn(model_cfg, loss_cfg, optim_cfg):
    """The jitted train step of (model, loss, optimizer) configs, built once per process (tests share its compile)."""
    key = (model_cfg, loss_cfg, optim_cfg)
    if key not in _STEPS:
        _STEPS[key] = make_train_step(model_cfg, loss_cfg, optim_cfg)
    return _STEPS[key]


def with_overrides(d: dict, overrides=()) -> PRMConfig:
    """The PRMConfig of `d` (a config file's get_prm_config as plain containers) with FIELD=VALUE overrides, each
    value read as a Python literal, else as text; a `sources` override that drops the deploy source deploys "auto".
    FieldErrors names a bad field, ValueError a malformed override."""
    d = dict(d)
    for item in overrides:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r} must look like FIELD=VALUE")
        try:
            d[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            d[name] = value
        if name == "sources" and d.get("deploy", "auto") not in ("auto", *str(d[name]).split(",")):
            d["deploy"] = "auto"
    return from_dict(PRMConfig, d)
