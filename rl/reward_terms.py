"""The plug-in point for reward terms scored by a model on the trainer side: the process reward model (PRM).

rl/ sits below the PRM: the PRM's training runs rl's train step, its labels render rl.tasks' problems and its step
rewards take the stages' layout, so the PRM wing (prm/) imports rl/ and rl/ may import nothing of it (an import
back would make a circle: tests/test_layering.py). The policy-gradient stages and the evaluation still score with a
PRM when the config names one (prm.path, the wing's own section: prm/config.py). They reach it through this
registry: the wing registers its term when it is installed (prm.install() calls prm/reward.py's register(), which
calls register("prm", ...)), and every entry point that starts runs installs it first thing (experiments/launch.py,
sweep.py, eval.py, sample.py, train_prm.py; tests/conftest.py for the tests). rl/ knows only the slot: which config
field asks for it and the calls a stage makes (ProcessScorer). The wing's train-step objective goes the same way
(rl/objectives.py), and its config section too (rl/config_validation.py register_section).

    scorer = reward_terms.scorer(ctx, stage_cfg, "stages[1]")    # None when prm.path is ""
    out = scorer.score_rows(tokens, attn_mask, texts, resp_start)
    rewards, m = scorer.add_reward(rewards, out, families); scorer.step_scores(out, final, lengths, resp_start)
    reward_terms.eval_metrics(ctx, prompts, samples, scores, k)  # {"prm@k", ...}; {} without a PRM or samples

Why a registry: the alternatives were an import of prm/ inside rl/ (an upward edge, and the old
prm_reward <-> policy_gradient circle back), or a scorer built by every caller and passed in through the run
context (every builder of a context, from the launcher to the notebooks, would have to know the PRM). A config that
asks for a PRM when no term is registered fails with an error naming the field and prm.install(); it never runs
without its PRM.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

__all__ = ["ProcessScorer", "SWITCHES", "register", "registered", "scorer", "eval_metrics"]

SWITCHES = {"prm": ("prm", "path")}  # slot -> the (section, field) of the run config that asks for it ("" = off)


class ProcessScorer(Protocol):
    """What a stage calls on the scorer of the "prm" slot (prm/reward.py, PRMScorer)."""

    steps: bool  # prm.steps: step rewards take their step scores from the model

    def score_rows(self, tokens, attn_mask, texts, resp_start) -> dict: ...

    def add_reward(self, rewards, out: dict, families) -> tuple: ...

    def step_scores(self, out: dict, final=None, lengths=None, resp_start=None) -> tuple: ...


@dataclasses.dataclass(frozen=True)
class _Term:
    scorer: Callable  # (ctx, stage_cfg, where) -> ProcessScorer | None
    eval_rerank: Callable  # (ctx, prompts, samples, scores, k) -> dict of evaluation metrics


_TERMS: dict[str, _Term] = {}


def register(name: str, *, scorer: Callable, eval_rerank: Callable) -> None:
    """Fill slot `name` (one of SWITCHES) with a wing's scorer factory and evaluation hook; a later call replaces it."""
    if name not in SWITCHES:
        raise ValueError(f"reward term {name!r} has no slot (slots: {', '.join(SWITCHES)})")
    _TERMS[name] = _Term(scorer, eval_rerank)


def registered() -> list[str]:
    return sorted(_TERMS)


def _term(ctx, name: str) -> _Term | None:
    """The term of slot `name` when the run's config asks for it, else None; ValueError when it asks and no wing
    registered one. A wing's section is None until the wing registered it (rl.config_validation.register_section)."""
    section, switch = SWITCHES[name]
    if not getattr(getattr(ctx.cfg, section, None), switch, None):
        return None
    if name not in _TERMS:
        raise ValueError(f"{section}.{switch} is set, but no {name!r} reward term is registered: call prm.install() "
                         "first (the launcher, sweep, eval and sample do)")
    return _TERMS[name]


def scorer(ctx, stage=None, where: str = "stages[i]") -> ProcessScorer | None:
    """The run's PRM scorer for an RL stage config (its prm_weight / prm_calibration), None when prm.path is "";
    `where` names the stage in errors."""
    term = _term(ctx, "prm")
    return None if term is None else term.scorer(ctx, stage, where)


def eval_metrics(ctx, prompts, samples, scores, k: int) -> dict:
    """The PRM's evaluation metrics (prm@k and its cost) of k samples per prompt, {} without a PRM. Without samples
    (k < 1) nothing is asked of the wing: the PRM file is not even read (a cold start may run before it exists)."""
    if k < 1 or samples is None:
        return {}
    term = _term(ctx, "prm")
    return {} if term is None else term.eval_rerank(ctx, prompts, samples, scores, k)
