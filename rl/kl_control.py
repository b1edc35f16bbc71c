"""KL coefficient controllers as pure (init, update) pairs whose state is a dict of arrays.

The state lives in the train state (`state["kl_state"]`), so it is checkpointed and restored with
everything else, and `update` can run inside or outside `jax.jit`:

    ctl = AdaptiveKL(init_coef=0.05, target=6.0, horizon=10_000)
    kl_state = ctl.init()                                # {"coef": f32[]}
    kl_state = ctl.update(kl_state, kl=measured_kl, n_steps=batch_size)
    coef = kl_state["coef"]

AdaptiveKL is the proportional controller of Ziegler et al. (2019):
`err = clip(kl / target - 1, -0.2, 0.2)`, `coef <- coef * (1 + err * n_steps / horizon)`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

__all__ = ["FixedKL", "AdaptiveKL", "make_kl_controller"]


@dataclasses.dataclass(frozen=True)
class FixedKL:
    """A constant KL coefficient; `update` returns the state unchanged."""

    coef: float

    def __post_init__(self):
        if not self.coef >= 0:
            raise ValueError(f"coef must be >= 0, got {self.coef}")

    def init(self) -> dict:
        return {"coef": jnp.asarray(self.coef, jnp.float32)}

    def update(self, state: dict, kl: jax.Array, n_steps: int | jax.Array) -> dict:
        del kl, n_steps
        return state


@dataclasses.dataclass(frozen=True)
class AdaptiveKL:
    """Ziegler et al. adaptive KL: nudges the coefficient so the measured KL tracks `target`."""

    init_coef: float
    target: float
    horizon: float

    def __post_init__(self):
        if not self.init_coef >= 0:
            raise ValueError(f"init_coef must be >= 0, got {self.init_coef}")
        if not self.target > 0:
            raise ValueError(f"target must be > 0, got {self.target}")
        if not self.horizon > 0:
            raise ValueError(f"horizon must be > 0, got {self.horizon}")

    def init(self) -> dict:
        return {"coef": jnp.asarray(self.init_coef, jnp.float32)}

    def update(self, state: dict, kl: jax.Array, n_steps: int | jax.Array) -> dict:
        err = jnp.clip(jnp.asarray(kl, jnp.float32) / self.target - 1.0, -0.2, 0.2)
        mult = 1.0 + err * jnp.asarray(n_steps, jnp.float32) / self.horizon
        return {"coef": state["coef"] * mult}


def make_kl_controller(kind: str, coef: float, target: float | None = None, horizon: float | None = None):
    """Build a controller from config fields: kind "fixed" or "adaptive" (which needs target and horizon)."""
    if kind == "fixed":
        return FixedKL(coef)
    if kind == "adaptive":
        if target is None or horizon is None:
            raise ValueError("kl controller 'adaptive' needs target and horizon")
        return AdaptiveKL(init_coef=coef, target=target, horizon=horizon)
    raise ValueError(f"kl controller kind {kind!r} unknown; choose 'fixed' or 'adaptive'")
