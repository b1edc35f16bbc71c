"""Stage kinds by name: each is a module with a keyword-only config dataclass and functions over a state.

    from rl import stages
    cfg = stages.parse_stage({"kind": "grpo", "name": "grpo", "iterations": 10, ...})   # FieldErrors names fields
    st = stages.init(ctx, index, cfg, params)        # the kind's state (a frozen dataclass)
    st, metrics = stages.unit(st, u)                  # one epoch / round / iteration
    tree, meta = stages.tree(st), stages.meta(st)     # what a checkpoint holds; st = stages.load(st, tree, meta)
    stage("grpo", "grpo", iterations=10)   # a config-file entry with every field at its default (ConfigDict)

Kinds: sft (rl/stages/sft.py), rejection (rejection.py), grpo (grpo.py), ppo (ppo.py); grpo and ppo are one
iteration (rl/stages/iteration.py) with their own advantage functions. Every kind trains through the one optimizer
loop, rl.train_loop.train_on. A new kind is a new module registered in KINDS.

A Kind also answers what the run's planners and checks ask of a stage (whether it is RL, the training problems it
asks for, its rows per optimizer step and their layout, the answers it samples and the rows it trains on per unit,
its seconds per unit, whether it holds a KL reference, how many units trained, its warnings and its rules against
the model and PRM sections): no module outside rl/stages/ branches on a kind's name (tests/test_stage_kinds.py).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

from rl.stages import algorithms, common, grpo, iteration, ppo, rejection, sft
from rl.stages.common import flat_fields, flat_value, from_flat
from rl.train_loop import check_trained as check_trained_carry
from schema import FieldErrors


class Kind(NamedTuple):
    """A stage kind: its config class, its functions, and what the run's planners and checks ask of it (rl/run.py,
    rl/preflight.py, rl/memory_plan.py, rl/time_estimate.py, rl/config_validation.py, rl/config_warnings.py read
    these, never the kind's name). Checkpoint functions: every kind's, or the RL ones."""

    config: type
    init: Callable  # (ctx, index, cfg, params) -> state
    unit: Callable  # (state, u) -> (state, metrics)
    components: Callable  # (cfg, max_new_tokens) -> (LossConfig, OptimConfig, KL controller or None) of its step
    problems: Callable  # cfg -> (the flat key counting the training problems it asks for, that count)
    step_rows: Callable  # (cfg, seq_len, row_multiple) -> rows per optimizer step (the memory plan's and its own)
    answers: Callable  # cfg -> answers one unit samples and scores (0: none)
    trained_rows: Callable  # (cfg, tasks.n_train) -> rows one unit trains on at most, epochs counted
    seconds: Callable  # (cfg, run, rl.time_estimate.Price) -> {part: seconds of one unit}
    is_rl: bool = False  # trains on its own answers against the sampler's logprobs: truncated sampling is refused,
    # its end has a reward-hacking report, its run compiles a logprob pass
    draws: bool = True  # each unit draws `problems` distinct problems of its families (False: takes up to that many)
    demonstrations: bool = False  # fine-tunes on the tasks' worked solutions (what teaches a format the prompt lacks)
    step_layout: Callable = common.flat_steps  # (cfg, rows, row_multiple, prompt_len, new_tokens) -> grouped or None
    uses_reference: Callable = common.no_reference  # cfg -> whether it holds a KL reference policy
    tools: Callable = common.no_tools  # cfg -> its tools section when the tool is on, else None
    trained_units: Callable = common.untracked  # state -> units that updated the policy (None: not counted)
    warnings: Callable = common.no_warnings  # cfg -> warnings on its values (rl/config_warnings.py)
    model_checks: Callable = common.no_checks  # (cfg, model section) -> (field, reason) pairs
    prm_checks: Callable = common.no_checks  # (cfg, the PRM wing's section: its dict, {} without) -> pairs
    tree: Callable = common.tree  # state -> the checkpoint's array tree
    meta: Callable = common.meta  # state -> the checkpoint's JSON meta
    template: Callable = common.template  # (state, meta) -> the tree structure to restore into
    load: Callable = common.load  # (state, tree, meta) -> state


_FINE_TUNE = dict(components=sft.components, step_rows=sft.step_rows)  # SFT's train step (SFT, rejection)
_RL = dict(components=iteration.components, problems=iteration.problems, step_rows=iteration.step_rows,
           answers=iteration.answers, trained_rows=iteration.trained_rows, is_rl=True,
           step_layout=iteration.step_layout, uses_reference=iteration.uses_reference, tools=iteration.tools,
           trained_units=iteration.trained_units, model_checks=iteration.model_checks,
           prm_checks=iteration.prm_checks, tree=iteration.tree, meta=iteration.meta,
           template=iteration.template, load=iteration.load)
KINDS: dict[str, Kind] = {
    "sft": Kind(sft.SFTConfig, sft.init, sft.unit, problems=sft.problems, answers=sft.answers,
                trained_rows=sft.trained_rows, seconds=sft.seconds, draws=False, demonstrations=True, **_FINE_TUNE),
    "rejection": Kind(rejection.RejectionConfig, rejection.init, rejection.unit, problems=rejection.problems,
                      answers=rejection.answers, trained_rows=rejection.trained_rows, seconds=rejection.seconds,
                      **_FINE_TUNE),
    "grpo": Kind(grpo.GRPOConfig, grpo.init, grpo.unit, seconds=grpo.seconds, warnings=grpo.warnings, **_RL),
    "ppo": Kind(ppo.PPOConfig, ppo.init, ppo.unit, seconds=ppo.seconds, warnings=iteration.warnings, **_RL),
}
CONFIGS: dict[str, type] = {k: v.config for k, v in KINDS.items()}

__all__ = ["Kind", "KINDS", "CONFIGS", "parse_stage", "defaults", "with_algorithm", "current_values", "flat_fields",
           "flat_value", "legacy_keys", "sft_problem_count", "FieldErrors", "init", "unit", "tree", "meta",
           "template", "load", "components", "tools", "run_tools", "trained_units", "policy_params", "carried_params",
           "check_trained"]


def _kind_error(kind) -> FieldErrors:
    return FieldErrors([("kind", f"must be one of {'|'.join(CONFIGS)}, got {kind!r}")])


def parse_stage(d: dict):
    """The typed config of one `stages` entry (plain dict); FieldErrors names each bad field. A named algorithm
    (`algorithm`) first puts its fields in place (with_algorithm, rl/stages/algorithms.py)."""
    kind = d.get("kind") if isinstance(d, dict) else None
    if kind not in CONFIGS:
        raise _kind_error(kind)
    return from_flat(CONFIGS[kind], with_algorithm(kind, d))


def defaults(kind: str) -> dict:
    """Every field of a stage kind at its default, as plain containers (the flat keys a config file writes)."""
    if kind not in CONFIGS:
        raise _kind_error(kind)
    return CONFIGS[kind]().to_dict()


@functools.cache
def _kind_defaults(kind: str) -> dict:
    """defaults(kind), built once (read only)."""
    return defaults(kind)


def with_algorithm(kind: str, entry: dict) -> dict:
    """A flat stage entry with its algorithm name's fields in place (rl/stages/algorithms.py, resolve), its values in
    today's spelling first (current_values: an older spelling of a name's value reads as that value)."""
    return algorithms.resolve(kind, current_values(kind, entry), _kind_defaults(kind))


def current_values(kind: str, entry: dict) -> dict:
    """A flat stage entry with the values an older release spelled otherwise in today's spelling (the kind's
    SPELLINGS, rl/stages/common.py: GRPO's filter_zero_variance True / False -> "drop" / "off"), so that an old config
    file or config.json means, resolves and compares as it did. Other kinds and entries come back unchanged."""
    spellings = CONFIGS[kind].SPELLINGS if kind in CONFIGS else {}
    if not isinstance(entry, dict) or not any(k in entry for k in spellings):
        return entry
    return {**entry, **{k: spell(entry[k]) for k, spell in spellings.items() if k in entry}}


def legacy_keys(kind: str) -> dict:
    """Keys old config.json entries of this kind may hold that it no longer has (rl/stages/common.py, LEGACY)."""
    return dict(CONFIGS[kind].LEGACY) if kind in CONFIGS else {}


def components(cfg, max_new_tokens: int):
    """(LossConfig, OptimConfig, KL controller or None) of the train step a stage config runs (Kind.components)."""
    return KINDS[cfg.kind].components(cfg, max_new_tokens)


def tools(cfg):
    """A stage config's tools section when its tool is on, else None (Kind.tools)."""
    return KINDS[cfg.kind].tools(cfg)


def run_tools(stage_cfgs):
    """The run's tool setting for evaluation: the first stage's tools section that is on, else None (every eval of
    such a run, the initial and the cold start's too, then reports pass@1 with and without tools)."""
    return next((t for t in map(tools, stage_cfgs) if t is not None), None)


def sft_problem_count(cfg) -> int:
    """How many training problems the stages that fine-tune on demonstrations (Kind.demonstrations) render as worked
    solutions, for a validated RunConfig: their `problems` count, 0 meaning all of tasks.n_train."""
    counts = [KINDS[s.kind].problems(s)[1] or cfg.tasks.n_train for s in cfg.stages if KINDS[s.kind].demonstrations]
    return max(counts, default=0)


# -- a stage's state, whatever its kind ---------------------------------------------------------------------------
def init(ctx, index: int, cfg, params):
    """The state of stage `index` (config `cfg`) starting from `params`."""
    return KINDS[cfg.kind].init(ctx, index, cfg, params)


def unit(st, u: int):
    return KINDS[st.base.cfg.kind].unit(st, u)


def trained_units(st) -> int | None:
    """Units of the stage that updated the policy so far; None where its kind does not count them."""
    return KINDS[st.base.cfg.kind].trained_units(st)


def tree(st) -> dict:
    return KINDS[st.base.cfg.kind].tree(st)


def meta(st) -> dict:
    return KINDS[st.base.cfg.kind].meta(st)


def template(st, meta: dict) -> dict:
    return KINDS[st.base.cfg.kind].template(st, meta)


def load(st, tree: dict, meta: dict):
    return KINDS[st.base.cfg.kind].load(st, tree, meta)


policy_params = common.policy_params
carried_params = common.carried_params


def check_trained(st) -> None:
    """rl.train_loop.check_trained on the stage's carry: NonFiniteError when every optimizer step was skipped."""
    check_trained_carry(st.base.cfg.stage.name, st.base.carry)
