"""RL algorithms by name: `stages[i].algorithm` sets the group of stage fields its paper uses.

    stage("grpo", "grpo", algorithm="dr_grpo")                 # Dr. GRPO's advantage, normaliser, clip, no KL
    stage("grpo", "grpo", algorithm="dapo", kl_coef=0.04)      # DAPO, keeping a KL (an explicit field wins)
    --config.stages[0].algorithm=gspo                          # switch a recipe's stage from the command line

A name is defaults applied before the config's own values. `stage(kind, name, algorithm=X, **fields)` writes X's
fields, then `fields` on top, and records X as `applied_algorithm` (the name whose values the entry holds). When a
later layer changes `algorithm` (the command line, a sweep axis, an assignment in get_config), `resolve` moves every
field still at the applied name's value (or at the kind's default, for fields that name does not set) to the new
name's value, and leaves the others: those were set by the config, and override the name. So a recipe's untouched
fields follow the new name, an explicit `clip_high=0.3` or a recipe's own `kl_coef=0.01` stays, and a sweep over a
name's field keeps every value it lists. The one value that cannot override a name being switched is the value the
old name (or the kind's default) itself holds: a field set to it reads as untouched. A hand-written entry without
`applied_algorithm` is read as applied_algorithm '' (the kind's defaults). The resolved config holds both names, so
its config.json validates to the same config.

No estimator lives here: each name maps onto fields that already exist (rl/advantages.py, rl/losses.py,
rl/kl_control.py, the GRPO / PPO stage configs). What a paper does that no stage field expresses is in `missing`.
rl.stages.with_algorithm applies `resolve` (parse_stage and config_validation.stage call it); `describe` is what the
dry run prints (rl/preflight.py).
"""
from __future__ import annotations

import dataclasses

from rl.stages.common import flat_value


@dataclasses.dataclass(frozen=True)
class Algorithm:
    kind: str  # the stage kind the name runs in
    title: str
    paper: str
    fields: dict  # flat stage key -> the paper's value
    missing: str = ""  # what the paper does that no stage field expresses (the name leaves those fields alone)


ALGORITHMS: dict[str, Algorithm] = {
    "grpo": Algorithm(
        "grpo", "GRPO", "Shao et al. 2024, DeepSeekMath, arXiv:2402.03300",
        dict(advantage="grpo", scale_by_std=True, policy_loss="ppo", agg="seq-mean-token-mean", clip_low=0.2,
             clip_high=0.2, kl_place="loss", kl_coef=0.04, kl_kind="k3", filter_zero_variance="off")),
    "dr_grpo": Algorithm(
        "grpo", "Dr. GRPO", "Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783",
        dict(advantage="grpo", scale_by_std=False, policy_loss="ppo", agg="seq-mean-token-sum-norm", clip_low=0.2,
             clip_high=0.2, kl_coef=0.0, filter_zero_variance="off")),
    "dapo": Algorithm(
        "grpo", "DAPO", "Yu et al. 2025, DAPO, arXiv:2503.14476",
        dict(advantage="grpo", scale_by_std=True, policy_loss="ppo", agg="token-mean", clip_low=0.2, clip_high=0.28,
             kl_coef=0.0, filter_zero_variance="refill"),
        missing="dynamic sampling's cap is max_refill_rounds (default 3 rounds of n_prompts; the paper's recipe "
                "allows 10 generation batches of 3x the training prompts), which the name leaves alone; overlong "
                "reward shaping is reward.overlong_max_len / overlong_buffer, a run-wide section the name does not "
                "set"),
    "gspo": Algorithm(
        "grpo", "GSPO", "Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071",
        dict(advantage="grpo", scale_by_std=True, policy_loss="gspo", agg="seq-mean-token-mean", clip_low=3e-4,
             clip_high=4e-4, kl_coef=0.0)),
    "cispo": Algorithm(
        "grpo", "CISPO", "MiniMax 2025, MiniMax-M1, arXiv:2506.13585",
        dict(advantage="grpo", scale_by_std=True, policy_loss="cispo", cispo_floor=False, agg="token-mean",
             kl_coef=0.0),
        missing="the paper tunes the weight's upper bound eps_high without giving a value: clip_high stays the "
                "config's (default 0.2, a weight cap of 1.2)"),
    "rloo": Algorithm(
        "grpo", "RLOO", "Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",
        dict(advantage="rloo", scale_by_std=False, policy_loss="reinforce", agg="seq-mean-token-sum",
             filter_zero_variance="off"),
        missing="the KL penalty in the sequence reward: a grpo stage's KL is a loss term (kl_place reward needs "
                "PPO's token rewards), so kl_* stay the config's"),
    "reinforce_pp": Algorithm(
        "grpo", "REINFORCE++", "Hu 2025, REINFORCE++, arXiv:2501.03262",
        dict(advantage="reinforce_pp", scale_by_std=False, policy_loss="ppo", agg="token-mean", clip_low=0.2,
             clip_high=0.2, filter_zero_variance="off"),
        missing="the per-token KL penalty in the reward: a grpo stage's KL is a loss term (kl_place reward needs "
                "PPO's token rewards), so kl_* stay the config's"),
    "ppo": Algorithm(
        "ppo", "PPO", "Schulman et al. 2017, arXiv:1707.06347; for language models Ouyang et al. 2022, "
                      "arXiv:2203.02155",
        dict(policy_loss="ppo", agg="token-mean", clip_low=0.2, clip_high=0.2, kl_place="reward", kl_kind="k1",
             gamma=1.0, lam=0.95, value_clip=0.2)),
}
NAMES = tuple(ALGORITHMS)


def _same(a, b) -> bool:
    """Equal values of the same sort (True is not 1: a bool field holding 1 is the config's own error)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def resolve(kind: str, entry: dict, kind_defaults: dict) -> dict:
    """The stage entry (flat dict) with its name's fields in place. Nothing to do when `algorithm` is the name the
    entry's fields already hold (`applied_algorithm`); otherwise every field of either name's group that the entry
    leaves out or holds at the applied name's value (the kind's default when '' or outside its group) takes the new
    name's value (the kind's default when the new name is '' or does not set it), and `applied_algorithm` becomes the
    new name. Unknown names or a name of another kind come back unchanged (the stage's checks report them)."""
    if not isinstance(entry, dict):
        return entry
    new, old = entry.get("algorithm", ""), entry.get("applied_algorithm", "")
    if new == old or any(n and (n not in ALGORITHMS or ALGORITHMS[n].kind != kind) for n in (new, old)):
        return entry
    before = {**kind_defaults, **(ALGORITHMS[old].fields if old else {})}
    after = {**kind_defaults, **(ALGORITHMS[new].fields if new else {})}
    group = [*(ALGORITHMS[old].fields if old else ()), *(ALGORITHMS[new].fields if new else ())]
    out = dict(entry, applied_algorithm=new)
    for k in dict.fromkeys(group):
        if k not in entry or _same(entry[k], before.get(k)):
            out[k] = after.get(k)
    return out


def settings(name: str) -> str:
    """'scale_by_std=False, agg=seq-mean-token-sum-norm, ...': the fields a name sets, as a config writes them."""
    return ", ".join(f"{k}={v!r}" for k, v in ALGORITHMS[name].fields.items())


def overrides(cfg) -> dict:
    """{field: (the config's value, the name's value)} of a typed stage config whose fields differ from its name's
    (the config's own choices); {} without a name."""
    algo = ALGORITHMS.get(flat_value(cfg, "algorithm", ""))
    if algo is None:
        return {}
    return {k: (flat_value(cfg, k), v) for k, v in algo.fields.items() if not _same(flat_value(cfg, k), v)}


def describe(cfg) -> list[str]:
    """What a stage's name set and what the config overrode (the dry run's lines); [] without a name."""
    name = flat_value(cfg, "algorithm", "")
    if name not in ALGORITHMS:
        return []
    algo, over = ALGORITHMS[name], overrides(cfg)
    kept = ", ".join(f"{k}={v!r}" for k, v in algo.fields.items() if k not in over)
    lines = [f"algorithm {name} ({algo.title}: {algo.paper}) sets {kept or 'nothing the config left'}"]
    if over:
        lines.append("the config overrides " + ", ".join(f"{k}={mine!r} (the name's {theirs!r})"
                                                         for k, (mine, theirs) in over.items()))
    if algo.missing:
        lines.append(f"not expressed by any field: {algo.missing}")
    return lines


def kind_error(name: str, kind: str) -> str | None:
    """Why a name cannot run in a stage of `kind` (None when it can)."""
    algo = ALGORITHMS.get(name)
    if algo is None or algo.kind == kind:
        return None
    return (f"{name!r} ({algo.title}) runs in a {algo.kind} stage, this one is {kind}: set kind={algo.kind!r} (or a "
            f"name of {kind}: {', '.join(n for n, a in ALGORITHMS.items() if a.kind == kind)})")
