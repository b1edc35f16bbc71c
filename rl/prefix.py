"""Start a run from the end of another run's shared stages (`--init_from`): a sweep's points share a cold start.

    k = shared_stages(source_cfg, cfg)             # how many leading stages two resolved configs share
    seed_from(workdir, source_workdir, cfg)        # before train(): copy what the source ran of those stages

Two runs share their first k stages when everything but `stages[k:]`, `run.*` and `log.*` is equal and
`stages[:k]` are equal. Because all randomness derives from (seed, purpose, stage, unit), the units of those
stages come out the same in both runs; so a run may start where the source left off inside them. `seed_from`
copies into the new workdir the source's newest intact checkpoint whose stage lies inside the shared prefix
(with its metrics.jsonl / samples.jsonl lines up to that unit and its best-policy copy); the run then resumes
from it exactly as from its own checkpoint, and ends with the numbers a run through every stage would give
(tests/test_sweep.py checks this). Everything is checked before any compute; a ConfigError says what differs.
"""
from __future__ import annotations

import json
import os
import shutil

from rl import config_validation as cv
from rl.runs import find_policy
from rl import stages as stage_kinds

IGNORED = ("run", "log")  # sections that never change what a unit computes (the launcher's resume rule)
RECORD_KEY = cv.RECORD_KEYS[0]  # config.json's record of the backend kernels in use: a fact about the machine, not config
_MISSING = object()


def _norm(d):
    """A config as config.json stores it (plain JSON values)."""
    return json.loads(json.dumps(d, default=str))


def _defaults_like(cfg: dict) -> dict:
    """Every field's default in `cfg`'s layout: the sections of config_validation.default_config and, per stage,
    its kind's defaults (unknown kinds: none)."""
    out = cv.to_dict(cv.default_config())
    out["stages"] = [stage_kinds.defaults(st["kind"]) if isinstance(st, dict) and st.get("kind") in stage_kinds.CONFIGS
                     else {} for st in cfg.get("stages", [])]
    return out


def with_added_defaults(old: dict, new: dict) -> dict:
    """`old` (a stored config.json) plus every field that `new` has, `old` lacks and `new` holds at its default:
    a field added to the code after that run was launched, left at its default, changes nothing the run computed,
    so resuming it, seeding from it or reusing it stays possible. Likewise a stage key its kind no longer has and
    never read (rl.stages.legacy_keys: GRPO's gamma, ...) is dropped when `new` lacks it, a value spelled as an
    older release wrote it reads in today's spelling (rl.stages.current_values: filter_zero_variance true -> "drop"),
    and a stage written before algorithm names existed takes `new`'s names: a name only sets fields, which are
    compared themselves. Any other difference is kept. The RECORD_KEY entry (which kernels the launching process
    used) is dropped: it is not a config field."""
    def fill(o, n, d):
        if isinstance(o, dict) and isinstance(n, dict):
            out = dict(o)
            for k, v in n.items():
                dk = d.get(k, _MISSING) if isinstance(d, dict) else _MISSING
                if k not in o:
                    if dk is not _MISSING and v == dk:
                        out[k] = v
                else:
                    out[k] = fill(o[k], v, dk)
            return out
        if isinstance(o, list) and isinstance(n, list) and len(o) == len(n):
            return [fill(x, y, d[i] if isinstance(d, list) and i < len(d) else _MISSING) for i, (x, y) in
                    enumerate(zip(o, n))]
        return o

    old = {k: v for k, v in old.items() if k != RECORD_KEY} if isinstance(old, dict) else old
    if isinstance(old, dict) and isinstance(old.get("stages"), list):
        old = {**old, "stages": [stage_kinds.current_values(st.get("kind"), st) if isinstance(st, dict) else st
                                 for st in old["stages"]]}
    out = fill(_norm(old), _norm(new), _norm(_defaults_like(new)))
    if isinstance(out, dict) and isinstance(out.get("stages"), list) and isinstance(new, dict):
        news = new.get("stages") if isinstance(new.get("stages"), list) else []
        for i, st in enumerate(out["stages"]):
            if isinstance(st, dict) and i < len(news) and isinstance(news[i], dict):
                for k in set(stage_kinds.legacy_keys(st.get("kind"))) - set(news[i]):
                    st.pop(k, None)
                for k in ("algorithm", "applied_algorithm"):
                    if k not in st and k in news[i]:
                        st[k] = news[i][k]
    return out


def shared_stages(a: dict, b: dict, ignore: tuple[str, ...] = IGNORED) -> int:
    """Leading stages two resolved configs (plain dicts) share; 0 when anything outside the stages and the
    `ignore`d sections differs. `a` is the earlier run's: fields added since at their default count as equal."""
    a, b = with_added_defaults(a, b), _norm(b)
    rest = lambda d: {k: v for k, v in d.items() if k not in tuple(ignore) + ("stages",)}  # noqa: E731
    if rest(a) != rest(b):
        return 0
    k = 0
    for sa, sb in zip(a["stages"], b["stages"]):
        if sa != sb:
            break
        k += 1
    return k


def differing_fields(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Dotted paths where two plain-dict configs differ (for messages), e.g. ['stages[2].lr', 'seed']."""
    out = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            out += differing_fields(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            out += differing_fields(x, y, f"{prefix}[{i}]")
    elif a != b:
        out.append(prefix)
    return out


def _checkpoints(root: str) -> list[tuple[int, dict]]:
    """(step, meta) of the intact checkpoints under root, newest first."""
    workdir = os.path.dirname(os.path.dirname(root))
    steps = sorted((int(n) for n in os.listdir(root) if n.isdigit()), reverse=True) if os.path.isdir(root) else []
    out = []
    for s in steps:
        try:
            _, step, meta = find_policy(workdir, s)
        except Exception:  # noqa: BLE001 - a damaged or partial checkpoint is passed over
            continue
        out.append((step, meta))
    return out


def _copy_lines(src: str, dst: str, last_step: int) -> None:
    if not os.path.exists(src):
        return
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            try:
                if int(json.loads(line).get("step", -1)) <= last_step:
                    g.write(line)
            except ValueError:
                continue


def plan(source: str, cfg: dict) -> tuple[int, dict]:
    """(step, meta) of `source`'s newest intact checkpoint inside the stages it shares with `cfg`; ConfigError
    naming what differs or what is missing when there is none. Reads only."""
    src_cfg_path = os.path.join(source, "config.json")
    if not os.path.isfile(src_cfg_path):
        raise cv.ConfigError(f"--init_from {source!r}: not a run's workdir (no config.json)")
    with open(src_cfg_path, encoding="utf-8") as f:
        src_cfg = json.load(f)
    k = shared_stages(src_cfg, cfg)
    if k == 0:
        src_cfg = with_added_defaults(src_cfg, cfg)
        diff = differing_fields({x: y for x, y in src_cfg.items() if x not in IGNORED},
                                {x: y for x, y in cfg.items() if x not in IGNORED})
        raise cv.ConfigError(f"--init_from {source}: its run shares no stage with this config (differs in "
                             f"{', '.join(diff[:6]) or 'stages[0]'})")
    usable = [(s, m) for s, m in _checkpoints(os.path.join(source, "checkpoints", "last")) if m["stage"] < k]
    if not usable:
        raise cv.ConfigError(f"--init_from {source}: no intact checkpoint inside the {k} shared stage(s) "
                             f"({', '.join(st['name'] for st in cfg['stages'][:k])}); its checkpoints are later or "
                             "missing (run the shared stages with run.stop_after, or keep more checkpoints)")
    step, meta = usable[0]
    best = meta.get("best")
    if best is not None and cfg["checkpoint"]["keep_best"] and not os.path.isdir(
            os.path.join(source, "checkpoints", "best_policy", "last", str(best["global_unit"]))):
        raise cv.ConfigError(f"--init_from {source}: the best policy of unit {best['global_unit']} (within the "
                             "shared stages) is no longer kept there: a later unit replaced it")
    return step, meta


def seed_from(workdir: str, source: str, cfg: dict) -> dict:
    """Copy `source`'s newest checkpoint inside the stages it shares with `cfg` (see `plan`) into `workdir`, which
    holds no checkpoint yet; returns {"source", "step", "stage", "unit"} (also written to workdir/init_from.json)."""
    step, meta = plan(source, cfg)
    best = meta.get("best")
    best_src = os.path.join(source, "checkpoints", "best_policy", "last")
    ck = os.path.join(workdir, "checkpoints")
    os.makedirs(os.path.join(ck, "last"), exist_ok=True)
    shutil.copytree(os.path.join(source, "checkpoints", "last", str(step)), os.path.join(ck, "last", str(step)))
    if best is not None and cfg["checkpoint"]["keep_best"]:
        shutil.copytree(os.path.join(best_src, str(best["global_unit"])),
                        os.path.join(ck, "best_policy", "last", str(best["global_unit"])))
    for name in ("metrics.jsonl", "samples.jsonl"):
        _copy_lines(os.path.join(source, name), os.path.join(workdir, name), meta["global_unit"])
    stage = cfg["stages"][meta["stage"]]["name"]
    info = {"source": os.path.abspath(source), "step": step, "stage": stage, "unit": meta["unit"]}
    with open(os.path.join(workdir, "init_from.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
    return info
