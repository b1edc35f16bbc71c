"""Run a config's sweep (grid x seeds), one launcher process per run, then a table, results.csv and plots.

    python -m experiments.sweep --config experiments/configs/quickstart.py[:arg] --workdir runs/qs_sweep \
        [--axis stages[2].lr=1e-4,2e-4 ...] [--seeds 0,1,2] [--only AXIS=VALUE ...] [--parallel N] \
        [--init_from shared|none|PATH] [--metric pass@1] [--stage grpo] [--dry_run] [--config.a.b=value ...]

The config file's `get_sweep(arg=None)` returns {"axes": {"<field path>": [values...], ...}, "seeds": [0, 1, ...]};
`--axis PATH=V1,V2` (repeatable) sweeps any config without one: the --axis flags replace the file's axes, each
value parsed like the launcher's --config.PATH=V (a number, a string, dict(...) for a section; commas inside
brackets do not split), and an axis that names no field is refused before anything runs.
The grid is the product of the axes, each point run once per seed in workdir/<point name>/seed<k> by
`python -m experiments.launch` (a separate process each, so a crash costs one run), its output in that
directory's launch.log. The sweep prints a `start` line with that log's path as each run starts, a live status
line while runs go (experiments/sweep_log.py: units done per running run; redrawn in place on a terminal, a plain
line every minute in a log file) and one line per run as it ends, with a failed run's whole error. --dry_run
checks every run through the launcher and estimates the compute of what is to run (the launcher's estimate
summed) and its time (scaled from the sweep's finished runs). Extra --config.* overrides apply to every
point; --seeds replaces the file's seeds; --only keeps the points whose AXIS (its full path or last part, e.g.
`clip_high`) has VALUE (repeat it: different axes must all match, values of one axis are alternatives).

A sweep cannot report stale results: before anything runs, each run's config is resolved and compared with the
config.json in its directory (rl.workdir_state.workdir_state, the rule the launcher resumes by, with no field
allowed to differ). Equal and finished (summary.json holds every stage): skipped, its results reused. Equal and
unfinished: resumed. Different once a checkpoint or summary.json was written under it, or a directory that holds
something else: the sweep refuses, naming the fields that differ, and runs nothing (use a new --workdir or remove
that directory).

Shared stages (--init_from shared, the default): when every point of the whole grid (before --only) has the same
first k stages (the axes only touch later stages: e.g. GRPO settings after one cold start; a grid of one point
shares all its stages but the last), those stages run once per seed in workdir/_shared/seed<k>
and every point starts from their end (launch --init_from, rl/prefix.py): the same numbers as running them in every
point, in a fraction of the time. `none` runs every point from scratch; a PATH (may hold `{seed}`) is a run every
point starts from. --parallel N runs N launchers at once (default: what this machine holds: one per CPU core, as many
as its free memory fits by the run's memory plan, rl/memory_plan.py: its runtime part is the process's own).

Outputs in workdir: results.csv (one row per run: axis values, seed, each stage's summary metrics, the hacking
signs flagged per RL stage, wall time, status), results.md (the table printed at the end: per point and stage the
mean +- the sample standard deviation (ddof=1) over the n seeds, and every seed's value), <metric>.png (the metric
after each stage, one line per point, error bars +- sample std) and curves.png (rl/plots.py: the run curves, one
line per point, mean and a +-sd band over seeds).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import copy
import csv
import io
import itertools
import json
import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import psutil
from matplotlib.figure import Figure

import prm
from experiments import launch, sweep_log
from rl import config_validation as cv
from rl import calibration, memory_plan, plots, preflight, setup, workdir_lock
from rl import time_estimate as time_est
from rl.checkpoint import CheckpointError
from rl.metrics import read_jsonl
from rl.prefix import shared_stages
from rl.preflight import compute_estimate
from rl.runs import find_policy
from rl.stages import parse_stage
from rl.workdir_state import has_checkpoint, workdir_state

METRICS = ("pass@1", "pass@k", "maj@k", "format_rate", "mean_length")
SHARED = "_shared"


# ------------------------------------------------------------------------------------------- the grid
def grid(sweep: dict) -> list[dict]:
    """Points of the grid: a list of {path: value} (one empty point when there are no axes)."""
    axes = sweep.get("axes", {}) or {}
    if not isinstance(axes, dict):
        raise ValueError("get_sweep()['axes'] must map field paths to lists of values")
    keys = list(axes)
    for k in keys:
        if not isinstance(axes[k], (list, tuple)) or not axes[k]:
            raise ValueError(f"sweep axis {k!r} needs a non-empty list of values")
    return [dict(zip(keys, vals)) for vals in itertools.product(*(axes[k] for k in keys))]


def point_name(point: dict) -> str:
    if not point:
        return "base"
    parts = []
    for k, v in point.items():
        short = re.sub(r"[^A-Za-z0-9_.@-]+", "_", f"{k.split('.')[-1]}={v}")
        parts.append(short)
    return ",".join(parts)


def split_values(text: str) -> list[str]:
    """'1e-5,2e-4' -> ['1e-5', '2e-4']: split at the commas outside brackets and quotes ("dict(a=1, b=2),None" is
    two values)."""
    out, cur, depth, quote = [], "", 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return out + [cur.strip()]


def axes_from_flags(config_spec: str, flags: list[str]) -> dict[str, list]:
    """{path: values} of --axis PATH=V1,V2 flags, each value parsed as the launcher parses --config.PATH=V on this
    config (launch.set_override); ConfigError naming the flag and the part of the path that does not exist."""
    config, axes = launch.get_config(config_spec), {}
    for flag in flags:
        path, eq, text = flag.partition("=")
        values = split_values(text) if eq else []
        if not path.strip() or not values or not all(values):
            raise cv.ConfigError(f"--axis {flag!r}: expected PATH=V1,V2,... (e.g. stages[0].lr=1e-5,2e-4)")
        if path in axes:
            raise cv.ConfigError(f"--axis {path}: given twice")
        try:
            axes[path] = [cv.to_dict(launch.set_override(copy.deepcopy(config), path, v)) for v in values]
        except cv.ConfigError as e:
            raise cv.ConfigError(f"--axis {path}: {e}") from None
    return axes


def _matches(value, text: str) -> bool:
    try:
        parsed = launch.literal(text)
    except ValueError:
        parsed = text
    return value == parsed or str(value) == text


def select(points: list[dict], only: list[str]) -> list[dict]:
    """The points matching every --only AXIS=VALUE (an axis named by its full path or its last part; several
    values of one axis are alternatives). ValueError naming an unknown axis or a filter that matches nothing."""
    want: dict[str, list[str]] = {}
    axes = list(points[0]) if points else []
    for f in only:
        name, eq, text = f.partition("=")
        if not eq:
            raise ValueError(f"--only {f!r}: expected AXIS=VALUE")
        full = [a for a in axes if a == name] or [a for a in axes if a.split(".")[-1] == name.split(".")[-1]
                                                  and a.endswith(name)]
        if len(full) != 1:
            raise ValueError(f"--only {f!r}: {'no' if not full else 'more than one'} sweep axis is {name!r} "
                             f"(axes: {', '.join(axes) or 'none'})")
        want.setdefault(full[0], []).append(text)
    out = [p for p in points if all(any(_matches(p[a], t) for t in ts) for a, ts in want.items())]
    if not out:
        raise ValueError(f"--only {' '.join(only)} matches no point of the grid")
    return out


# ------------------------------------------------------------------------------------------- configs and states
def resolve(config_spec: str, overrides: list[tuple[str, str]]) -> dict:
    """The resolved config of one run as config.json records it (validated; ConfigError names the field)."""
    config = launch.get_config(config_spec)
    recipe_hf = bool(config.model.get("hf_path"))
    launch.apply_overrides(config, overrides)
    cfg, _ = launch.on_checkpoint(cv.validate(config), recipe_hf)  # the lengths the launcher will record
    return json.loads(json.dumps(cfg, default=str))


def run_overrides(point: dict, seed: int, extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [("seed", str(seed))] + [(k, str(v)) for k, v in point.items()] + list(extra)


def grid_prefix(cfgs: list[dict]) -> int:
    """The stages a sweep runs once per seed: those every point of the whole grid shares; a grid of one point
    shares all its stages but the last (its _shared run is then a start other sweeps' --init_from can use)."""
    if len(cfgs) == 1:
        return max(len(cfgs[0]["stages"]) - 1, 0)
    return shared_prefix(cfgs)


def shared_prefix(cfgs: list[dict]) -> int:
    """How many leading stages every config shares (rl.prefix.shared_stages against the first). Unlike a resume,
    run.* counts here: a sweep over run.overlap changes what its stages compute."""
    return min((shared_stages(cfgs[0], c, ignore=("log",)) for c in cfgs[1:]), default=0) if len(cfgs) > 1 else 0


def default_parallel(cfg: dict, n_runs: int) -> tuple[int, str]:
    """(launchers at once, why): one per CPU core, as many as the free memory holds, at most n_runs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cfg = cv.typed(cfg)  # the resolved config.json dict, validated where it enters the builders
    sizes = preflight.resolved_mesh(cfg, len(jax.devices()))
    plan = memory_plan.plan_for_config(cfg, setup.build_model_cfg(cfg), sizes, setup.run_rules(cfg))
    runtime = plan.parts["runtime"]  # the process's own part, held once whatever the devices
    per_run = (plan.peak - runtime) * plan.devices + runtime
    free = psutil.virtual_memory().available
    n = max(1, min(cores, free // per_run, n_runs))
    return int(n), f"{cores} cores, {free / 2**30:.1f} GiB free / {per_run / 2**30:.2f} GiB per run (its memory plan)"


# ------------------------------------------------------------------------------------------- running
def launch_cmd(config_spec: str, workdir: str, overrides: list[tuple[str, str]], init_from: str = "") -> list[str]:
    cmd = [sys.executable, "-m", "experiments.launch", "--config", config_spec, "--workdir", workdir]
    cmd += [f"--config.{k}={v}" for k, v in overrides]
    return cmd + (["--init_from", init_from] if init_from else [])


def run_one(cmd: list[str], workdir: str) -> tuple[int, float, str]:
    """(exit status, seconds, the whole error its log ends with if it failed): one launcher, its output in
    workdir/launch.log."""
    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, "launch.log")
    t0 = time.time()
    with open(log, "a", encoding="utf-8") as f:
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        # The launcher dies with this sweep, even a SIGKILLed one (launch.DIE_WITH_PARENT), so a rerun never finds
        # an orphan still writing into the run's directory.
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, launch.DIE_WITH_PARENT: "1"})
    return rc, time.time() - t0, sweep_log.error_of(log) if rc else ""


def run_all(jobs: list[dict], parallel: int) -> None:
    """Run jobs ({"label", "cmd", "workdir"}) `parallel` at a time; one line per job as it ends (job["rc"] set)."""
    if not jobs:
        return
    width = len(str(len(jobs)))
    status = sweep_log.Status(jobs)

    def one(j):
        status.say(f"start {j['label']:<40} log {os.path.join(j['workdir'], 'launch.log')}")
        status.started(j)
        return run_one(j["cmd"], j["workdir"])

    with cf.ThreadPoolExecutor(max_workers=parallel) as pool, status:
        futs = {pool.submit(one, j): j for j in jobs}
        for i, fut in enumerate(cf.as_completed(futs), 1):
            j = futs[fut]
            j["rc"], secs, j["error"] = fut.result()
            status.ended(j)
            extra = j.get("describe", lambda: "")() if j["rc"] == 0 else f"FAILED (exit {j['rc']}):"
            err = "\n    " + j["error"].replace("\n", "\n    ") if j["rc"] else ""
            status.say(f"[{i:>{width}}/{len(jobs)}] {j['label']:<40} {secs:6.0f} s  {extra}  "
                       f"({os.path.join(j['workdir'], 'launch.log')}){err}")


# ------------------------------------------------------------------------------------------- results
def collect(rows_in: list[dict]) -> tuple[list[dict], list[str]]:
    """Flatten each run's summary.json into one CSV row; returns rows and the stage names in order."""
    rows, stages = [], []
    for r in rows_in:
        path = os.path.join(r["workdir"], "summary.json")
        row = {k: v for k, v in r.items() if k != "workdir"}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                s = json.load(f)
            for st, vals in s["eval"].items():
                if st not in stages:
                    stages.append(st)
                for m in METRICS:
                    row[f"{st}/{m}"] = vals.get(m)
            for st, rep in (s.get("hacking") or {}).items():
                row[f"{st}/hacking"] = ",".join(rep.get("flagged", [])) or ("-" if rep.get("signs") else "not judged")
            row["wall_seconds"] = s.get("wall_seconds")
            row["status"] = "ok"
        else:
            row["status"] = "failed"
        rows.append(row)
    return rows, stages


def write_csv(path: str, rows: list[dict]) -> None:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def mean_sd(vals: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1; None for one value)."""
    return float(np.mean(vals)), (float(np.std(vals, ddof=1)) if len(vals) > 1 else None)


def cell(vals: list[float]) -> str:
    """'0.312 ± 0.041 (n=3: 0.281, 0.297, 0.359)': mean ± sample std over seeds, then every seed's value."""
    if not vals:
        return "-"
    mu, sd = mean_sd(vals)
    per_seed = ", ".join(f"{v:.3f}" for v in vals)
    return (f"{mu:.3f} ± {sd:.3f}" if sd is not None else f"{mu:.3f}") + f" (n={len(vals)}: {per_seed})"


def table(rows: list[dict], axes: list[str], stages: list[str], metric: str) -> str:
    """Markdown table: one line per grid point; per stage the mean ± sample std over seeds and each seed's value."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(a) for a in axes), []).append(r)
    head = [a.split(".")[-1] if sum(x.split(".")[-1] == a.split(".")[-1] for x in axes) == 1 else a for a in axes]
    head += [f"{s} {metric}" for s in stages]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        cells = [str(k) for k in key]
        for s in stages:
            cells.append(cell([r[f"{s}/{metric}"] for r in rs if r.get(f"{s}/{metric}") is not None]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(path: str, rows: list[dict], axes: list[str], stages: list[str], metric: str) -> None:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(a) for a in axes), []).append(r)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    x = np.arange(len(stages))
    for key, rs in groups.items():
        means, sds = [], []
        for s in stages:
            vals = [r.get(f"{s}/{metric}") for r in rs if r.get(f"{s}/{metric}") is not None]
            mu, sd = mean_sd(vals) if vals else (np.nan, None)
            means.append(mu)
            sds.append(sd or 0.0)
        label = ", ".join(f"{a.split('.')[-1]}={k}" for a, k in zip(axes, key)) or "base"
        ax.errorbar(x, means, yerr=sds, marker="o", capsize=3, label=f"{label} (n={len(rs)})")
    ax.set_xticks(x, stages)
    ax.set_ylabel(f"held-out {metric} (mean ± sample sd over seeds)")
    ax.set_xlabel("after stage")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def curves(path: str, runs: list[dict], axes: list[str]) -> None:
    groups: dict[str, list[list[dict]]] = {}
    for r in runs:
        m = os.path.join(r["workdir"], "metrics.jsonl")
        label = ", ".join(f"{a.split('.')[-1]}={r[a]}" for a in axes) or "base"
        groups.setdefault(label, []).append(read_jsonl(m) if os.path.exists(m) else [])
    plots.sweep_curves(groups, path)


# ------------------------------------------------------------------------------------------- main
def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m experiments.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--metric", default="pass@1", choices=METRICS)
    ap.add_argument("--stage", default="", help="show this stage only in the table and plot (default: every stage)")
    ap.add_argument("--axis", action="append", default=[], metavar="PATH=V1,V2",
                    help="a sweep axis (repeat for a grid), replacing get_sweep()'s axes, e.g. stages[0].lr=1e-5,2e-4")
    ap.add_argument("--seeds", default="", help="comma list replacing get_sweep()'s seeds, e.g. 0,1,2")
    ap.add_argument("--only", action="append", default=[], metavar="AXIS=VALUE", help="run only matching points")
    ap.add_argument("--parallel", type=int, default=0, help="launchers at once (0 = what this machine holds)")
    ap.add_argument("--init_from", default="shared", help="shared (default) | none | a run directory ({seed} ok)")
    ap.add_argument("--dry_run", action="store_true", help="validate every run and print the plan, run nothing")
    args, rest = ap.parse_known_args(argv)
    extra = []
    for a in rest:
        if not a.startswith("--config.") or "=" not in a:
            ap.error(f"unknown argument {a!r} (extra overrides look like --config.a.b=value)")
        k, _, v = a[len("--config."):].partition("=")
        extra.append((k, v))
    return ap, args, extra


def main(argv: list[str] | None = None) -> int:
    prm.install()  # the PRM wing's config section, reward term and objective (a run may ask for a PRM: prm.path)
    locks: list = []  # the sweep's workdir lock, once taken: released on every way out (the OS releases it on a kill)
    try:
        return _main(sys.argv[1:] if argv is None else argv, locks)
    finally:
        for lock in locks:
            lock.release()


def busy_runs(workdirs: list[str]) -> list[str]:
    """'<workdir> is in use by pid N (...)' for each run directory a live process holds (rl/workdir_lock.py)."""
    return [f"{wd} is in use by {who}" for wd in workdirs if (who := workdir_lock.holder(wd))]


def _main(argv: list[str], locks: list) -> int:
    ap, args, extra = parse(argv)
    try:
        module, arg = launch.load_config_file(args.config)
        if not hasattr(module, "get_sweep") and not (args.axis or args.seeds):
            ap.error(f"{args.config} has no get_sweep(): give the sweep as --axis PATH=V1,V2 and/or --seeds 0,1,2")
        sweep = module.get_sweep(arg) if hasattr(module, "get_sweep") else {}
        if args.axis:
            sweep = {**sweep, "axes": axes_from_flags(args.config, args.axis)}
        full_grid = grid(sweep)
        points = select(full_grid, args.only) if args.only else full_grid
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else list(sweep.get("seeds", [0]))
        axes = list((sweep.get("axes") or {}).keys())
        runs = [{**p, "seed": s, "point": p, "label": f"{point_name(p)} seed{s}", "overrides": run_overrides(p, s, extra),
                 "workdir": os.path.join(args.workdir, point_name(p), f"seed{s}")} for p in points for s in seeds or [0]]
        for r in runs:
            r["cfg"] = resolve(args.config, r["overrides"])
    except (cv.ConfigError, ValueError) as e:
        print(f"sweep error: {e}", file=sys.stderr)
        return 2
    stage_names = [st["name"] for st in runs[0]["cfg"]["stages"]]
    if args.stage and args.stage not in stage_names:
        ap.error(f"--stage {args.stage!r} is not a stage of this config ({', '.join(stage_names)})")

    # the shared stages: run once per seed, every point starts from their end
    k = 0
    if args.init_from == "shared":  # over the whole grid, so --only, or a grid of one point, still shares its stages
        s0 = runs[0]["seed"]
        k = grid_prefix([resolve(args.config, run_overrides(p, s0, extra)) for p in full_grid])
    shared = []
    if k:
        units = sum(parse_stage(st).units for st in runs[0]["cfg"]["stages"][:k])
        for s in sorted({r["seed"] for r in runs}):
            first = next(r for r in runs if r["seed"] == s)
            cfg = {**first["cfg"], "run": {**first["cfg"]["run"], "stop_after": units}}
            shared.append({"seed": s, "workdir": os.path.join(args.workdir, SHARED, f"seed{s}"), "cfg": cfg, "k": k,
                           "units": units, "label": f"{SHARED} seed{s}", "overrides": first["overrides"] +
                           [("run.stop_after", str(units))], "describe": lambda: f"stages {', '.join(stage_names[:k])}"})
        for r in runs:
            r["init_from"] = os.path.join(args.workdir, SHARED, f"seed{r['seed']}")
    elif args.init_from not in ("shared", "none"):
        for r in runs:
            r["init_from"] = args.init_from.replace("{seed}", str(r["seed"]))

    # nothing runs before every directory is known to hold this sweep's runs or nothing
    states = [(r, *workdir_state(r["workdir"], r["cfg"])) for r in runs]
    todo = [r for r, st, _ in states if st != "done"]
    fresh = {r["seed"] for r in todo if not has_checkpoint(r["workdir"])}  # the others resume their own
    needed = [(j, *_shared_state(j)) for j in shared if j["seed"] in fresh]  # a shared run only where it is used
    conflicts = [why for _, st, why in states + needed if st == "conflict"]
    if conflicts:
        print("sweep refused (nothing was run):\n  " + "\n  ".join(conflicts) +
              "\n  use a new --workdir, or remove those directories", file=sys.stderr)
        return 2
    shared_todo = [j for j, st, _ in needed if st != "done"]
    n_par = args.parallel
    why = "--parallel"
    if n_par <= 0:
        n_par, why = default_parallel(runs[0]["cfg"], max(len(todo), len(shared_todo), 1))
    print(f"sweep: {len(points)} point(s) x {len(seeds)} seed(s) = {len(runs)} runs; {len(runs) - len(todo)} finished "
          f"with the same config (reused), {len(todo)} to run" +
          (f"; stages {', '.join(stage_names[:k])} shared per seed in {os.path.join(args.workdir, SHARED)}" if k else "")
          + f"; {n_par} at once ({why})", flush=True)
    if args.dry_run:
        print(estimate(shared_todo, todo, k, n_par, [r for r, st, _ in states if st == "done"]), flush=True)
        return _dry_run(args.config, shared + runs)
    try:  # one sweep per workdir, and no point whose directory a launcher still holds (e.g. of a killed sweep)
        locks.append(workdir_lock.lock_workdir(args.workdir, "sweep"))
    except workdir_lock.WorkdirError as e:
        print(f"sweep refused (nothing was run): {e}", file=sys.stderr)
        return 2
    busy = busy_runs([j["workdir"] for j in shared_todo + todo])
    if busy:
        print("sweep refused (nothing was run):\n  " + "\n  ".join(busy) + "\n  wait for those runs to end (or stop "
              "them)", file=sys.stderr)
        return 2

    for j in shared_todo:  # resumed with the units still to go, so it stops exactly at the end of the shared stages
        left = j["units"] - _units_done(j["workdir"])
        j["cmd"] = launch_cmd(args.config, j["workdir"], j["overrides"][:-1] + [("run.stop_after", str(left))])
    run_all(shared_todo, n_par)
    if any(j["rc"] for j in shared_todo):
        print("sweep stopped: a shared run failed (see its launch.log)", file=sys.stderr)
        return 1
    for r in todo:
        r.update(describe=lambda r=r: _describe(r, args), units=total_units(r["cfg"]),
                 cmd=launch_cmd(args.config, r["workdir"], r["overrides"], r.get("init_from", "")))
    run_all(todo, n_par)
    failed = sum(1 for r in todo if r["rc"])

    out_rows = [{**{a: r[a] for a in axes}, "seed": r["seed"], "workdir": r["workdir"]} for r in runs]
    rows, stages = collect(out_rows)
    write_csv(os.path.join(args.workdir, "results.csv"), rows)
    shown = [args.stage] if args.stage else stages
    text = table(rows, axes, shown, args.metric)
    with open(os.path.join(args.workdir, "results.md"), "w", encoding="utf-8") as f:
        f.write(f"held-out test {args.metric} after each stage: mean ± sample std (ddof=1) over n seeds, then each "
                f"seed's value\n\n{text}\n")
    if stages:
        print(f"\nheld-out test {args.metric}: mean ± sample std over n seeds (each seed's value)\n{text}")
    else:
        print(f"\nno run finished a stage: no table (each failed run's error is above, its log in launch.log)")
    if stages:
        plot(os.path.join(args.workdir, f"{args.metric}.png"), rows, axes, shown, args.metric)
        curves(os.path.join(args.workdir, "curves.png"), out_rows, axes)
    print(f"results in {os.path.join(args.workdir, 'results.csv')}, results.md, {args.metric}.png, curves.png" +
          (f" ({failed} runs failed)" if failed else ""))
    return 1 if failed else 0


def _shared_state(j: dict) -> tuple[str, str]:
    """A shared run is done when its summary holds every shared stage; run.stop_after may differ (it is resumed
    with the units still to go), and so may the stages after the shared ones once it is done (it never ran them:
    a later sweep over other points of the grid reuses it)."""
    st, why = workdir_state(j["workdir"], j["cfg"], may_differ=("run.stop_after",))
    exact = st != "conflict"
    if not exact:  # differences only after the shared stages are fine for a finished shared run
        later = tuple(f"stages[{i}]" for i in range(j["k"], len(j["cfg"]["stages"])))
        if workdir_state(j["workdir"], j["cfg"], may_differ=("run.stop_after",) + later)[0] == "conflict":
            return st, why
    if st == "new":
        return st, why
    try:
        with open(os.path.join(j["workdir"], "summary.json"), encoding="utf-8") as f:
            names = json.load(f).get("eval", {})
    except (OSError, ValueError):
        names = {}
    if all(s["name"] in names for s in j["cfg"]["stages"][: j["k"]]):
        return "done", ""
    return ("resume", "") if exact else (st, why)  # a resume runs under the new config: it must be the same


def total_units(cfg: dict) -> int:
    return sum(parse_stage(st).units for st in cfg["stages"])


def _units_done(workdir: str) -> int:
    """Global units the newest intact checkpoint of workdir holds (0 without one)."""
    try:
        return int(find_policy(workdir, "last")[2]["global_unit"])
    except (CheckpointError, KeyError):
        return 0


def _describe(r: dict, args) -> str:
    try:
        with open(os.path.join(r["workdir"], "summary.json"), encoding="utf-8") as f:
            s = json.load(f)
    except (OSError, ValueError):
        return "no summary.json"
    st = args.stage or list(s["eval"])[-1]
    flags = [f"{k}: {','.join(v['flagged'])}" for k, v in (s.get("hacking") or {}).items() if v.get("flagged")]
    return f"{st} {args.metric} {s['eval'].get(st, {}).get(args.metric, float('nan')):.3f}" + (
        f"  hacking signs {'; '.join(flags)}" if flags else "")


def estimate(shared_todo: list[dict], todo: list[dict], k: int, n_par: int, finished: list[dict]) -> str:
    """The compute of the runs still to go (rl.preflight.compute_estimate, the launcher's, summed; a point that
    starts from the shared stages counts only its own) and their time: scaled from the finished runs of this sweep
    (seconds per generated + trained token of their compute estimate), divided over `n_par` launchers."""
    def typed(cfg, skip=0):  # a resolved config.json dict (its stages after `skip`), validated where it enters
        return cv.typed({**cfg, "stages": cfg["stages"][skip:]})

    keys = ("gen_tokens", "verifier_calls", "train_tokens")
    tot = dict.fromkeys(keys, 0)
    jobs = [typed(j["cfg"]) for j in shared_todo] + [typed(r["cfg"], k if r.get("init_from") and k else 0)
                                                      for r in todo]
    for cfg in jobs:
        for key, v in compute_estimate(cfg)[1].items():
            tot[key] += v
    lines = [f"compute estimate for the {len(jobs)} run(s) to go (upper bounds, the launcher's estimate summed; "
             f"points count only their stages after the shared ones): {tot['gen_tokens']:,} generated tokens, "
             f"{tot['verifier_calls']:,} verifier calls, {tot['train_tokens']:,} train tokens"]
    rates = []
    for r in finished:
        try:
            with open(os.path.join(r["workdir"], "summary.json"), encoding="utf-8") as f:
                wall = float(json.load(f)["wall_seconds"])
        except (OSError, ValueError, KeyError):
            continue
        w = compute_estimate(typed(r["cfg"]))[1]
        rates.append(wall / max(w["gen_tokens"] + w["train_tokens"], 1))
    if not jobs:
        lines.append("time estimate: nothing to run")
    elif rates:
        secs = float(np.median(rates)) * (tot["gen_tokens"] + tot["train_tokens"]) / max(n_par, 1)
        lines.append(f"time estimate: about {secs / 60:.0f} min with {n_par} at once (scaled from the wall time of "
                     f"{len(rates)} finished run(s) here; compiles and a busy machine shift it)")
    if jobs:
        lines.append(calibrated_estimate(jobs, n_par))
    return "\n".join(lines)


def calibrated_estimate(cfgs: list[cv.RunConfig], n_par: int) -> str:
    """rl/time_estimate.py per run to go (at this machine's calibration) and for all of them, n_par at a time."""
    cal = calibration.load(log=print)
    ests = [time_est.estimate(c, setup.build_model_cfg(c), cal) for c in cfgs]
    per = sorted({time_est.fmt_s(e["total_s"]) for e in ests})
    one = time_est.parallel_wall(ests, 1, os.cpu_count() or 1)
    par = time_est.parallel_wall(ests, n_par, os.cpu_count() or 1)
    return (f"time estimate from this machine's calibration (rl/time_estimate.py, compiles cold): per run "
            f"{' / '.join(per)}; all {len(ests)} one at a time ~{time_est.fmt_s(one)}"
            + (f", {n_par} at a time ~{time_est.fmt_s(par)} (compute shares the cores; compiles overlap)"
               if n_par > 1 else ""))


def _dry_run(config_spec: str, runs: list[dict]) -> int:
    """Every run through the launcher's checks (in this process, data and machine included), one line each."""
    bad = 0
    for i, r in enumerate(runs, 1):
        buf = io.StringIO()
        argv = ["--config", config_spec, "--dry_run"] + [f"--config.{k}={v}" for k, v in r["overrides"]]
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            rc = launch.main(argv)
        bad += rc != 0
        msg = "config OK" if rc == 0 else buf.getvalue().strip().splitlines()[-1]
        print(f"[{i}/{len(runs)}] {r['label']}: {msg}", flush=True)
    print(f"{len(runs)} runs validated" + (f", {bad} failed" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
