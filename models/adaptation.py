"""The typed `model.lora` and `model.upcycle` sections (LoraConfig, UpcycleConfig) and LoRA's target table.

They sit apart from models/lora.py and models/upcycle.py, which need JAX, because models/config.py holds them as
fields of ModelConfig and the launcher and the reward workers import the config without importing JAX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schema import Checked, field, integer, num, optional

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


def _alpha(v) -> str | None:
    # alpha / rank scales every update: 1e300 passed an older check and every step was skipped as non-finite.
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= MAX_ALPHA:
        return f"must be a finite number in (0, {MAX_ALPHA}], got {v!r}"
    return None


def _targets(v) -> str | None:
    if not isinstance(v, tuple) or not v:
        return f"must be a non-empty tuple of {sorted(TARGETS)}, got {v!r}"
    unknown = [t for t in v if t not in TARGETS]
    if unknown:
        return f"{unknown} are not known; known: {sorted(TARGETS)}"
    if len(set(v)) != len(v):
        return f"lists a target twice: {v!r}"
    return None


@dataclass(frozen=True, kw_only=True)
class LoraConfig(Checked):
    """The `model.lora` section: rank r >= 1, 0 < alpha <= MAX_ALPHA (the update is scaled by alpha / r), known
    targets."""

    rank: int = field(8, "r: inner width of each adapter, 1..65536", integer(1, 2**16))
    alpha: float = field(16.0, "the update is (alpha / rank) * A @ B; 0 < alpha <= 65536", _alpha)
    targets: tuple[str, ...] = field(DEFAULT_TARGETS, "block-relative weights adapted (models/adaptation.py "
                                                      "TARGETS): attn/*, mlp/* (dense blocks), moe/* (routed experts), "
                                                      "moe/shared/*; the router is never adapted", _targets)

    def __post_init__(self):
        if isinstance(self.targets, list):  # a list from JSON or Python; the config is hashed as a static argument
            object.__setattr__(self, "targets", tuple(self.targets))
        super().__post_init__()

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclass(frozen=True, kw_only=True)
class UpcycleConfig(Checked):
    """The `model.upcycle` section (models/upcycle.py): each dense MLP becomes n_experts copies behind a fresh
    router."""

    n_experts: int = field(4, "experts per MoE block, each a copy of the dense MLP, 2..4096", integer(2, 4096))
    top_k: int = field(2, "experts per token; gates renormalised to sum to one", integer(1, 4096))
    moe_every: int = field(2, "block i becomes MoE iff (i + 1) % moe_every == 0 (2: every other block, as the paper)",
                           integer(1, 10**4))
    router_init_std: float = field(0.02, "std of the fresh router's normal init", num(0.0, 10.0, lo_open=True))
    capacity_factor: float | None = field(None, "None = dropless; else >= n_experts / top_k (nothing dropped at init)",
                                          optional(num(0.0, lo_open=True), "dropless"))

    def cross_checks(self):
        if self.top_k > self.n_experts:
            yield "top_k", f"({self.top_k}) must be <= n_experts ({self.n_experts})"
        elif self.capacity_factor is not None and self.capacity_factor < self.n_experts / self.top_k:
            yield "capacity_factor", (f"must be None (dropless) or a number >= n_experts / top_k = "
                                      f"{self.n_experts / self.top_k:g} (so no token is dropped at init), got "
                                      f"{self.capacity_factor!r}")
