"""KL coefficient controllers as pure (init, update) pairs whose state is a dict of arrays.

The controller is the one owner of the KL coefficient. The stage keeps its state (checkpointed
with everything else), updates it once per RL iteration from the measured KL, and passes
`coef_at(state, iteration)` to the train step (KL in the loss) or to the reward shaping (KL in the
reward):

    ctl = AdaptiveKL(init_coef=0.05, target=6.0, horizon=10_000, ramp_steps=0)
    kl_state = ctl.init()                                # {"coef": f32[]}
    coef = ctl.coef_at(kl_state, iteration)              # the coefficient this iteration uses
    kl_state = ctl.update(kl_state, kl=measured_kl, n_steps=batch_size)

The measured KL is the mean over sequences of each sequence's masked token-mean KL, whatever the
loss aggregation (rl.train_step reports it as `kl`; the RL stages measure it on the sampled batch).

AdaptiveKL is the proportional controller of Ziegler et al. (2019):
`err = clip(kl / target - 1, -0.2, 0.2)`, `coef <- max(coef, min_coef) * (1 + err * n_steps / horizon)`;
the floor `min_coef` (default 1e-4) lets a controller started at 0 grow. The paper's controller (and verl's
AdaptiveKLController) has no floor, `coef <- coef * (1 + err * n_steps / horizon)`: a coefficient below 1e-4 moves
differently here (it first jumps to the floor); `min_coef=0` gives the paper's update exactly, under which a
coefficient at 0 stays 0. A non-finite `kl` leaves the state unchanged
(one bad batch cannot poison the coefficient). `ramp_steps > 0` scales the coefficient linearly from
1/ramp_steps to 1 over the first `ramp_steps` iterations (both kinds).

`KLConfig` holds the stage fields of the KL to the reference (`stages[i].kl_coef`, `kl_adaptive`, ...: each one's
default, doc and check); `controller(cfg)` builds the controller they ask for (None without a reference policy).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from schema import Checked, boolean, choice, field, integer, num

__all__ = ["FixedKL", "AdaptiveKL", "KLConfig", "controller", "ramp_factor"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class KLConfig(Checked):
    """The KL to the reference policy of an RL stage (composed by the GRPO / PPO stage configs, flat keys)."""

    kl_place: str = field("loss", "where the KL goes: loss (GRPO style) | reward (PPO style, per-token penalty)",
                          choice("loss", "reward"))
    kl_coef: float = field(0.04, "initial / fixed KL coefficient (0 and not adaptive = no reference policy)",
                           num(0.0, 100.0))
    kl_adaptive: bool = field(False, "adaptive KL controller towards kl_target", boolean)
    kl_target: float = field(0.01, "adaptive KL target (per-token KL, mean over sequences)",
                             num(0.0, 100.0, lo_open=True))
    kl_horizon: int = field(10000, "adaptive KL horizon (in samples)", integer(1, 10**9))
    kl_ramp_steps: int = field(0, "ramp the KL coefficient linearly from 0 over N iterations (0 = off)",
                               integer(0, 10**6))

    @property
    def uses_reference(self) -> bool:
        """A reference policy is kept (and its logprobs computed) only when some KL coefficient can be > 0."""
        return self.kl_coef > 0 or self.kl_adaptive


def ramp_factor(iteration: int, ramp_steps: int) -> float:
    """1.0 without a ramp, else linear from 1/ramp_steps at iteration 0 to 1 at iteration ramp_steps - 1."""
    if ramp_steps <= 0:
        return 1.0
    return float(min((int(iteration) + 1) / ramp_steps, 1.0))


def _finite_or_old(new: jax.Array, old: jax.Array, kl) -> jax.Array:
    return jnp.where(jnp.isfinite(jnp.asarray(kl, jnp.float32)) & jnp.isfinite(new), new, old)


@dataclasses.dataclass(frozen=True)
class FixedKL:
    """A constant KL coefficient; `update` returns the state unchanged."""

    coef: float
    ramp_steps: int = 0

    def __post_init__(self):
        if not 0 <= self.coef < float("inf"):
            raise ValueError(f"coef must be a finite number >= 0, got {self.coef}")
        if self.ramp_steps < 0:
            raise ValueError(f"ramp_steps must be >= 0, got {self.ramp_steps}")

    def init(self) -> dict:
        return {"coef": jnp.asarray(self.coef, jnp.float32)}

    def update(self, state: dict, kl: jax.Array, n_steps: int | jax.Array) -> dict:
        del kl, n_steps
        return state

    def coef_at(self, state: dict, iteration: int) -> float:
        return float(state["coef"]) * ramp_factor(iteration, self.ramp_steps)


@dataclasses.dataclass(frozen=True)
class AdaptiveKL:
    """Ziegler et al. adaptive KL: nudges the coefficient so the measured KL tracks `target`."""

    init_coef: float
    target: float
    horizon: float
    ramp_steps: int = 0
    min_coef: float = 1e-4

    def __post_init__(self):
        if not 0 <= self.init_coef < float("inf"):
            raise ValueError(f"init_coef must be a finite number >= 0, got {self.init_coef}")
        if not 0 < self.target < float("inf"):
            raise ValueError(f"target must be a finite number > 0, got {self.target}")
        if not 0 < self.horizon < float("inf"):
            raise ValueError(f"horizon must be a finite number > 0, got {self.horizon}")
        if self.ramp_steps < 0:
            raise ValueError(f"ramp_steps must be >= 0, got {self.ramp_steps}")
        if not 0 <= self.min_coef < float("inf"):
            raise ValueError(f"min_coef must be a finite number >= 0, got {self.min_coef}")

    def init(self) -> dict:
        return {"coef": jnp.asarray(self.init_coef, jnp.float32)}

    def update(self, state: dict, kl: jax.Array, n_steps: int | jax.Array) -> dict:
        err = jnp.clip(jnp.asarray(kl, jnp.float32) / self.target - 1.0, -0.2, 0.2)
        mult = 1.0 + err * jnp.asarray(n_steps, jnp.float32) / self.horizon
        new = jnp.maximum(state["coef"], self.min_coef) * mult
        return {"coef": _finite_or_old(new, state["coef"], kl)}

    def coef_at(self, state: dict, iteration: int) -> float:
        return float(state["coef"]) * ramp_factor(iteration, self.ramp_steps)


def controller(cfg: KLConfig):
    """The controller a KLConfig asks for: AdaptiveKL, FixedKL (kl_coef > 0) or None (no KL term)."""
    if cfg.kl_adaptive:
        return AdaptiveKL(init_coef=float(cfg.kl_coef), target=float(cfg.kl_target), horizon=float(cfg.kl_horizon),
                          ramp_steps=int(cfg.kl_ramp_steps))
    if cfg.kl_coef > 0:
        return FixedKL(float(cfg.kl_coef), ramp_steps=int(cfg.kl_ramp_steps))
    return None
