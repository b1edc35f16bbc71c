"""Stage kinds by name: each has a keyword-only config dataclass and a runtime with `run_unit(u)`.

    from rl import stages
    cfg = stages.parse_stage({"kind": "grpo", "name": "grpo", "iterations": 10, ...})   # FieldErrors names fields
    run = stages.RUNS[cfg.kind](ctx, index, cfg, params)
    stage("grpo", "grpo", iterations=10)   # a config-file entry with every field at its default (ConfigDict)

Kinds: sft (rl/stages/sft.py), rejection (rejection.py), grpo (grpo.py), ppo (ppo.py); grpo and ppo share
rl/stages/policy_gradient.py. A new kind is a new module registered here.
"""
from __future__ import annotations

from rl import curriculum as cur
from rl.config_fields import FieldErrors, from_dict
from rl.stages.base import StageConfig, StageRun
from rl.stages.grpo import GRPOConfig, GRPORun
from rl.stages.ppo import PPOConfig, PPORun
from rl.stages.rejection import RejectionConfig, RejectionRun
from rl.stages.sft import SFTConfig, SFTRun

CONFIGS: dict[str, type[StageConfig]] = {"sft": SFTConfig, "rejection": RejectionConfig, "grpo": GRPOConfig,
                                         "ppo": PPOConfig}
RUNS: dict[str, type[StageRun]] = {"sft": SFTRun, "rejection": RejectionRun, "grpo": GRPORun, "ppo": PPORun}

__all__ = ["CONFIGS", "RUNS", "parse_stage", "defaults", "sft_problem_count", "FieldErrors"]


def parse_stage(d: dict) -> StageConfig:
    """The typed config of one `stages` entry (plain dict); FieldErrors names each bad field."""
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind not in CONFIGS:
        raise FieldErrors([("kind", f"must be one of {'|'.join(CONFIGS)}, got {kind!r}")])
    nested = {"curriculum": cur.CurriculumConfig} if kind in ("grpo", "ppo") else None
    return from_dict(CONFIGS[kind], d, nested)


def defaults(kind: str) -> dict:
    """Every field of a stage kind at its default, as plain containers."""
    if kind not in CONFIGS:
        raise FieldErrors([("kind", f"must be one of {'|'.join(CONFIGS)}, got {kind!r}")])
    return CONFIGS[kind]().to_dict()


def sft_problem_count(cfg: dict) -> int:
    """How many training problems the config's SFT stages render as worked solutions."""
    return max([s.get("n_problems") or cfg["tasks"]["n_train"] for s in cfg["stages"] if s.get("kind") == "sft"],
               default=0)
