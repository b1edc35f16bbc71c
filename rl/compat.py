"""The compatibility readers: every place that reads what an older release wrote, with the date after which it goes.

    from rl import compat
    compat.SHIMS["grpo_ppo_keys"].remove_after   # "2027-06-01"

A reader of old data (a config.json key a stage no longer has or one that moved to another section, an older
spelling of a value, a checkpoint in the per-layer layout, a best-policy record numbered from 0, a PRM .npz file) is
marked in its code with a comment `# compat: NAME` naming its entry here. tests/test_compat.py checks that each
entry is marked where it says and each mark names an entry, and fails once an entry is past its date: then the
reader goes (with the old data it reads: convert it with the release before) or its date moves with a reason
written here.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Shim:
    """One compatibility reader: what old data it reads, the module that holds it, when that data stopped being
    written, and the date after which the reader is removed."""

    reads: str
    where: tuple[str, ...]  # the files that hold the reader, each marked `# compat: NAME`
    since: str  # the date of the release that stopped writing the old data
    remove_after: str


SHIMS: dict[str, Shim] = {
    "grpo_ppo_keys": Shim(
        "PPO's value-head / GAE keys in a GRPO entry of an old config.json (at their old defaults; dropped)",
        ("rl/stages/grpo.py",), "2026-12-05", "2027-06-01"),
    "ppo_grpo_keys": Shim(
        "GRPO's advantage keys in a PPO entry of an old config.json (at the one value PPO accepted; dropped)",
        ("rl/stages/ppo.py",), "2026-12-05", "2027-06-01"),
    "zero_variance_bool": Shim(
        "filter_zero_variance True / False of older configs, read as \"drop\" / \"off\"",
        ("rl/stages/grpo.py",), "2026-12-06", "2027-06-01"),
    "per_layer_checkpoint": Shim(
        "a checkpoint (run, policy or PRM) in the per-layer layout, before the stacked one: read per layer, then stacked",
        ("rl/checkpoint.py", "rl/runs.py", "prm/checkpoint.py"), "2026-12-06", "2027-06-01"),
    "best_record_from_zero": Shim(
        "a best-policy record without unit_base (its unit counted from 0)",
        ("rl/runs.py",), "2026-12-04", "2027-06-01"),
    "prm_reward_fields": Shim(
        "reward.prm_path / w_prm / prm_agg / prm_steps of an old config or config.json, read as prm.path / weight / "
        "agg / steps (the PRM wing's section, prm/config.py)",
        ("rl/config_validation.py",), "2026-12-06", "2027-06-01"),
    "prm_npz": Shim(
        "a PRM saved as one .npz file (format mathrl-prm-v2) before the orbax directory",
        ("prm/checkpoint.py", "prm/pipeline.py"), "2026-12-05", "2027-06-01"),
}
