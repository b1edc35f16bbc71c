"""The typed `model.lora` and `model.upcycle` sections (LoraConfig, UpcycleConfig) and LoRA's target table.

They sit apart from models/lora.py and models/upcycle.py, which need JAX, because models/config.py holds them as
fields of ModelConfig and the launcher and the reward workers import the config without importing JAX.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from schema import field

# Block-relative path -> (lead dims, contracted "in" dims) of that weight (models/transformer.py _block_shapes).
TARGETS = {
    "attn/wq": (0, 1), "attn/wk": (0, 1), "attn/wv": (0, 1), "attn/wo": (0, 2),
    "mlp/w_gate": (0, 1), "mlp/w_up": (0, 1), "mlp/w_down": (0, 1),
    "moe/w_gate": (1, 1), "moe/w_up": (1, 1), "moe/w_down": (1, 1),
    "moe/shared/w_gate": (0, 1), "moe/shared/w_up": (0, 1), "moe/shared/w_down": (0, 1),
}
# Every attention and dense-MLP projection: the "all linear layers" setting (QLoRA, Dettmers et al. 2023).
DEFAULT_TARGETS = ("attn/wq", "attn/wk", "attn/wv", "attn/wo", "mlp/w_gate", "mlp/w_up", "mlp/w_down")
MAX_ALPHA = 65536  # the largest rank: alpha = rank (scale 1) at any rank; recipes use 2 x rank or less

@dataclass(frozen=True, kw_only=True)
class LoraConfig:
    """The `model.lora` section: rank r >= 1, 0 < alpha <= MAX_ALPHA (the update is scaled by alpha / r), known
    targets."""

    rank: int = field(8, "r: inner width of each adapter, 1..65536")
    alpha: float = field(16.0, "the update is (alpha / rank) * A @ B; 0 < alpha <= 65536")
    targets: tuple[str, ...] = field(DEFAULT_TARGETS, "block-relative weights adapted (models/adaptation.py "
                                                      "TARGETS): attn/*, mlp/* (dense blocks), moe/* (routed experts), "
                                                      "moe/shared/*; the router is never adapted")

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets) if isinstance(self.targets, (list, tuple))
                           else self.targets)
        errors = []
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 1 <= self.rank <= 2**16:
            errors.append(f"lora.rank must be an int in [1, 65536], got {self.rank!r}")
        # alpha / rank scales every update: 1e300 passed this check once and every step was skipped as non-finite.
        if (isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not math.isfinite(self.alpha)
                or not 0 < self.alpha <= MAX_ALPHA):
            errors.append(f"lora.alpha must be a finite number in (0, {MAX_ALPHA}], got {self.alpha!r}")
        if not isinstance(self.targets, tuple) or not self.targets:
            errors.append(f"lora.targets must be a non-empty tuple of {sorted(TARGETS)}, got {self.targets!r}")
        else:
            unknown = [t for t in self.targets if t not in TARGETS]
            if unknown:
                errors.append(f"lora.targets {unknown} are not known; known: {sorted(TARGETS)}")
            elif len(set(self.targets)) != len(self.targets):
                errors.append(f"lora.targets lists a target twice: {self.targets!r}")
        if errors:
            raise ValueError("; ".join(errors))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_value(cls, value: Any) -> "LoraConfig":
        """A LoraConfig from itself, a mapping or an ml_collections ConfigDict (unknown keys are an error)."""
        return _section(cls, value, "lora", "dict(rank=..., alpha=..., targets=...)")


@dataclass(frozen=True, kw_only=True)
class UpcycleConfig:
    """The `model.upcycle` section (see the module docstring for the choices)."""

    n_experts: int = field(4, "experts per MoE block, each a copy of the dense MLP, 2..4096")
    top_k: int = field(2, "experts per token; gates renormalised to sum to one")
    moe_every: int = field(2, "block i becomes MoE iff (i + 1) % moe_every == 0 (2: every other block, as the paper)")
    router_init_std: float = field(0.02, "std of the fresh router's normal init")
    capacity_factor: float | None = field(None, "None = dropless; else >= n_experts / top_k (nothing dropped at init)")

    def __post_init__(self):
        errors = []
        for name, lo, hi in (("n_experts", 2, 4096), ("top_k", 1, 4096), ("moe_every", 1, 10**4)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                errors.append(f"upcycle.{name} must be an int in [{lo}, {hi}], got {v!r}")
        std = self.router_init_std
        if isinstance(std, bool) or not isinstance(std, (int, float)) or not math.isfinite(std) or not 0 < std <= 10:
            errors.append(f"upcycle.router_init_std must be a finite number in (0, 10], got {std!r}")
        if errors:
            raise ValueError("; ".join(errors))
        if self.top_k > self.n_experts:
            raise ValueError(f"upcycle.top_k ({self.top_k}) must be <= upcycle.n_experts ({self.n_experts})")
        cf = self.capacity_factor
        if cf is not None:
            least = self.n_experts / self.top_k
            if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not math.isfinite(cf) or cf < least:
                raise ValueError(f"upcycle.capacity_factor must be None (dropless) or a number >= n_experts / top_k "
                                 f"= {least:g} (so no token is dropped at init), got {cf!r}")

    @classmethod
    def from_value(cls, value: Any) -> "UpcycleConfig":
        """An UpcycleConfig from itself, a mapping or an ml_collections ConfigDict (unknown keys are an error)."""
        return _section(cls, value, "upcycle", "dict(n_experts=..., top_k=..., ...)")


def _section(cls, value: Any, name: str, example: str):
    """`cls` (a section dataclass) from itself, a mapping or a ConfigDict; unknown keys are an error naming `name`."""
    if isinstance(value, cls):
        return value
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be None or a {example}, got {value!r}")
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{name} has unknown field(s) {unknown}; known: {known}")
    return cls(**value)
