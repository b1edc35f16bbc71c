"""What a run directory holds for a config: the one rule the launcher (resume) and the sweep (reuse) share.

    state, why = workdir_state(workdir, cfg)                       # "new" | "resume" | "done" | "conflict"
    state, why = workdir_state(workdir, cfg, may_differ=RESUMABLE)  # the launcher's: run.*, log.* may change
    check_resume(workdir, cfg)       # the launcher (rl.preflight.prepare, experiments.launch): ConfigError on conflict
    has_checkpoint(workdir)          # a written checkpoint (one with checksums) is there

The rule, in order:
  - no such path: "new"; a path that is not a directory: "conflict".
  - a directory without config.json: "new" when it holds nothing but the sweep's launch.log and the workdir lock,
    else "conflict" (it is not a run's directory; a stray checkpoints/ would otherwise be resumed under any config).
  - a config.json that cannot be read, or is not a JSON object: "conflict" (it records the run's config).
  - a config.json pins nothing until something was computed under it: a written checkpoint (rl.checkpoint
    written_steps: a step a kill left without checksums is not yet written) or a summary.json. Before that the run
    stopped before its first checkpoint: "new", and the config may differ (config.json is rewritten).
  - otherwise the recorded config is read as validate() reads an old config (renamed fields under their new names,
    rl.config_validation.upgrade; fields added to the code since at their defaults, rl.prefix.with_added_defaults;
    the launcher's "kernels" record dropped, also from `cfg`) and compared field by field
    (rl.prefix.differing_fields): any difference outside `may_differ` is a "conflict" naming the fields; else "done"
    when summary.json holds every stage (and the best policy's test result when the run keeps one), "resume" when
    not.

`may_differ` is what the caller's use allows to change: a resume continues units already computed under the
recorded config, so how the process runs and logs may change (RESUMABLE: run.*, log.*, and model.scan_layers, how
the same model is computed); a sweep reuses finished results as this config's, so nothing may (run.overlap changes
what an RL unit computes), except what it names itself (its shared run's run.stop_after).
"""
from __future__ import annotations

import json
import os

from rl import config_validation as cv
from rl.checkpoint import written_steps
from rl.prefix import differing_fields, with_added_defaults
from rl.workdir_lock import LOCK_NAME

# May change on resume: how this process runs the config and what it logs, and how the same model is computed
# (model.scan_layers changed its default when the blocks came to be stored stacked; an older run directory records
# False).
RESUMABLE = ("run", "log", "model.scan_layers")
NOT_A_RUN = ("launch.log", LOCK_NAME)  # what a directory holds before its run writes config.json (the sweep's log)


def has_checkpoint(workdir: str | None) -> bool:
    """Whether the workdir holds a written checkpoint (one with checksums: a step directory a kill left without
    them is not yet written and pins nothing)."""
    last = os.path.join(workdir or "", "checkpoints", "last")
    if not workdir or not os.path.isdir(last):
        return False
    return bool(written_steps(last))


def finished(workdir: str, cfg: dict) -> bool:
    """summary.json holds every stage of cfg (and the best policy's test result when the run keeps one)."""
    try:
        with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
            s = json.load(f)
    except (OSError, ValueError):
        return False
    done = all(st["name"] in s.get("eval", {}) for st in cfg["stages"])
    return done and ("best" in s or not cfg["checkpoint"]["keep_best"])


def _shown(paths) -> str:
    return ", ".join(p if ("." in p or "[" in p) else f"{p}.*" for p in paths)


def workdir_state(workdir: str, cfg, *, may_differ: tuple[str, ...] = ()) -> tuple[str, str]:
    """("new" | "resume" | "done" | "conflict", why): what `workdir` holds for `cfg` (a RunConfig, or the plain dict
    config.json stores); `may_differ`: top-level sections or `section.field` / `stages[i]` paths that may differ
    (the module docstring gives the rule)."""
    if not os.path.exists(workdir):
        return "new", ""
    if not os.path.isdir(workdir):
        return "conflict", f"{workdir} exists and is not a directory"
    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        other = sorted(n for n in os.listdir(workdir) if n not in NOT_A_RUN)
        return ("conflict", f"{workdir} holds {', '.join(other[:4])} but no config.json") if other else ("new", "")
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError) as e:
        return "conflict", f"{path} is unreadable ({e}; it records the config of the run in that workdir: restore it)"
    if not isinstance(old, dict):
        return "conflict", (f"{path} holds a JSON {type(old).__name__}, not a config object (it records the config "
                            "of the run in that workdir: restore it)")
    if not has_checkpoint(workdir) and not os.path.isfile(os.path.join(workdir, "summary.json")):
        return "new", "its run stopped before its first checkpoint: nothing to resume, the config may differ"
    new = json.loads(json.dumps(cfg.to_dict() if isinstance(cfg, cv.RunConfig) else cfg, default=str))
    new = {k: v for k, v in new.items() if k not in cv.RECORD_KEYS}  # the kernels record of a config.json given as cfg
    diff = differing_fields(with_added_defaults(cv.upgrade(old, quiet=True), new), new)
    allowed = [d for d in diff if any(d == p or d.startswith(p + ".") for p in may_differ)]
    wrong = [d for d in diff if d not in allowed]
    if wrong:
        return "conflict", (f"{workdir} holds a run with a different config ({', '.join(wrong[:5])}"
                            f"{' ...' if len(wrong) > 5 else ''} differ"
                            + (f"; only {_shown(may_differ)} may" if may_differ else "") + ")")
    same = "this exact config" if not allowed else f"this config ({', '.join(allowed[:5])} differ, which may)"
    return ("done", f"finished with {same}") if finished(workdir, new) else ("resume", f"unfinished, {same}")


def check_resume(workdir: str, cfg) -> None:
    """The launcher's use of workdir_state (a run there resumes with this config; RESUMABLE fields may change):
    ConfigError saying why when the directory holds a conflicting run or something else."""
    state, why = workdir_state(workdir, cfg, may_differ=RESUMABLE)
    if state == "conflict":
        raise cv.ConfigError(f"{why} - use a new --workdir")
