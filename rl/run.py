"""The run loop: build, resume, then for each stage and unit: run -> evaluate -> log -> checkpoint.

    summary = train(config, workdir, config_path="experiments/configs/quickstart.py")

`train` validates the config, builds the run context (rl/context.py: model config, mesh, tokenizer,
problems, reward pool, checkpointer), prints a compute estimate and runs the stages in order, each
through its kind's runtime (rl/stages/). After every unit it logs metrics (workdir/metrics.jsonl and
TensorBoard) and, every `checkpoint.every` units and at stage ends, saves a checkpoint, so a run
started again on the same workdir resumes exactly where it stopped (all randomness derives from
(seed, purpose, stage, unit); a batch sampled ahead is checkpointed with the rest).

Evaluation: the initial policy (test + validation), validation every `eval.every` units of any stage,
validation + test at each stage end. The policy with the best validation pass@1 so far is saved in
workdir/checkpoints/best_policy; at the end it is evaluated on the test split and reported in
summary.json next to the last stage:
{"eval": {stage: {"pass@1", "pass@1_se", "pass@1_ci95", "pass@k", "maj@k", "format_rate", "mean_length",
                  "language_consistency", "n_problems", "solved" (the greedy answers' per-problem outcomes, "0110...":
                  the paired lift's input), and for mixed task families "pass@1/<family>", "pass@1_se/<family>",
                  "pass@1_ci95/<family>", "format_rate/<family>", "language_consistency/<family>", ...}},
 "hacking": {rl stage: rl.hacking.stage_report(...)},
 "best": {"stage", "unit", "global_unit", "val_pass@1", "test": {...}, and "note" when every validation pass@1 was 0},
 "numbering": rl.runs.UNIT_NUMBERING (units from 1 within a stage; global_unit = the checkpoint number),
 "wall_seconds", "compile": {"seconds", "compiles", "cache_hits", "cache_misses", "cache_dir"}, "config",
 "memory": {"peak_rss_gib": the run's peak resident memory over its processes, "plan_peak_gib": the memory plan's
            peak per device (rl/memory_plan.py), "peak_over_plan", "besides_arrays_gib": the most this process held
            besides its live JAX arrays at a unit's end (RSS - mem/arrays_gib), "plan_runtime_gib": the plan's
            runtime part, which counts it},
 "kernels": rl.setup.backend_kernels() - the expert / attention kernels traced and whether the native CPU kernels
 ran (their library name and SHA-256), as config.json's "kernels" planned them, and with model.upcycle / model.lora
 "model": rl.context.RunContext.adaptation_record() - the checkpoint upcycled and its section, the adapter count}.
`compile` counts every process of the run (rl/compile_cache.py; run.compile_cache turns the persistent cache off).

The run ends with the held-out table (rl.metrics.results_table): pass@1 with its 95 % interval, the lift over the
initial policy with its paired SE, pass@k at its temperature when k > 0, and words when n < 64. Progress lines show
the KL the objective used (`progress_values`).

Every evaluation also appends complete samples (prompt, response, extracted answer, gold, reward parts) to
workdir/samples.jsonl and TensorBoard text; at the end of every RL stage the reward-hacking report
(rl/hacking.py) is printed and stored; workdir/curves.png (rl/plots.py) is redrawn at every stage end. Every
phase that takes more than a moment prints a progress line (rl.metrics.Clock), progress bars or not.
"""
from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np
from tqdm import tqdm

from rl import checkpoint as ckpt_lib
from rl import compile_cache
from rl import config_validation as cv
from rl import evaluation as ev
from rl import hacking
from rl import metrics as mlib
from rl import stages as stage_lib
from models import kernels, layer_stack, transformer
from rl import plots, preflight, runs
from rl.context import build_context
from rl.setup import Prepared, backend_kernels
from rl.train_loop import NonFiniteError  # noqa: F401 - what a run raises when its steps are not finite (launch)

SUMMARY_KEYS = ("pass@1", "pass@1_se", "pass@1_ci95", "pass@k", "maj@k", "format_rate", "mean_length",
                "language_consistency")
FAMILY_TABLE_KEYS = ("pass@1", "language_consistency")  # per task family, for mixed runs (a second table)
PROGRESS_KEYS = ("loss", "reward/mean", "accuracy", "kept_share")  # shown on progress bars and lines (+ the KL)
PLAIN_LINE_SECONDS = 30.0  # a progress line at most this often when stdout is not a terminal (tee, nohup, a scheduler)


def progress_mode(log_progress: bool, stdout_tty: bool, stderr_tty: bool) -> tuple[bool, float | None]:
    """(draw tqdm bars, seconds between plain unit lines or None for none besides the first unit's).
    log.progress off: a plain line per unit. On: bars where they can be drawn (tqdm writes to stderr, a terminal),
    and where stdout is not a terminal (a log file) a plain line every PLAIN_LINE_SECONDS instead of `\r` updates."""
    if not log_progress:
        return False, 0.0
    bars = stderr_tty
    return bars, (None if bars and stdout_tty else PLAIN_LINE_SECONDS)


def progress_values(m: dict, kl_place: str | None = None) -> dict[str, float]:
    """The numbers a unit's progress line and bar show, by label: PROGRESS_KEYS, then the KL the objective used
    when the stage has a reference policy (its metrics hold the sampled batch's `kl`): with kl_place "loss" (GRPO,
    PPO's default) `loss/kl`, the KL term as the loss aggregated it over the update; with "reward" (PPO) `kl
    (reward)`, the sampled batch's KL the rewards were penalised by. (The sampled `kl` alone is 0 for the first
    iterations, drawn by the reference itself.)"""
    out = {k: float(m[k]) for k in PROGRESS_KEYS if isinstance(m.get(k), (float, np.floating))}
    if isinstance(m.get("kl"), (float, np.floating)):
        if kl_place == "reward":
            out["kl (reward)"] = float(m["kl"])
        elif isinstance(m.get("loss/kl"), (float, np.floating)):
            out["loss/kl"] = float(m["loss/kl"])
    return out


def progress_number(v: float) -> str:
    """A progress value with three decimals, or three significant digits below 0.01 (a KL of 0.00039 is not 0.000)."""
    return f"{v:.3f}" if v == 0 or abs(v) >= 0.01 else f"{v:.2e}"


def summary_entry(test_metrics: dict) -> dict:
    """The summary.json entry of one test evaluation: SUMMARY_KEYS, the Wilson interval, n, the per-problem solved
    indicators (for the paired lift, rl.metrics.paired_lift), per-family metrics."""
    out = {k: float(test_metrics[k]) for k in SUMMARY_KEYS if k in test_metrics and k != "pass@1_ci95"}
    out["pass@1_ci95"] = mlib.wilson_interval(float(test_metrics["pass@1"]), int(test_metrics["n_problems"]))
    out["n_problems"] = int(test_metrics["n_problems"])
    if "solved" in test_metrics:
        out["solved"] = test_metrics["solved"]
    for k, v in test_metrics.items():
        if "/" in k and k.split("/", 1)[0] in ev.FAMILY_KEYS:
            out[k] = float(v)
    fams = sorted({k.split("/", 1)[1] for k in out if k.startswith("n_problems/")})
    for f in fams:
        out[f"pass@1_ci95/{f}"] = mlib.wilson_interval(out[f"pass@1/{f}"], int(out[f"n_problems/{f}"]))
    return out


def family_columns(rows: dict) -> list[str]:
    """The per-family columns ("pass@1/code", ...) the evaluations in `rows` hold ([] for a one-family run)."""
    keys = {k for r in rows.values() for k in r}
    fams = sorted({k.split("/", 1)[1] for k in keys if k.startswith("n_problems/")})
    return [f"{k}/{f}" for f in fams for k in FAMILY_TABLE_KEYS if f"{k}/{f}" in keys]


class Loop:
    """The mutable bookkeeping of one run: where it is, what it measured, the best policy so far."""

    def __init__(self, ctx, stage_cfgs, config_path: str):
        self.ctx, self.stage_cfgs = ctx, stage_cfgs
        self.summary = {"eval": {}, "wall_seconds": 0.0, "config": config_path}
        self.history: list[dict] = []  # validation / test metrics per eval point (for hacking signs)
        self.best = None  # {"stage", "unit", "unit_base", "val_pass@1", "global_unit"} (rl.runs.UNIT_NUMBERING)
        self.si, self.u0, self.gunit, self.wall_before = 0, 0, 0, 0.0
        self.t_start = time.time()
        self.compile_before, self.compile_start = {}, compile_cache.stats()  # train() resets both before building
        self.cache_dir: str | None = None
        self.plan = None  # the memory plan (rl/memory_plan.py), when one was made
        self.besides_arrays_gib = 0.0  # measured: the largest RSS - live arrays at a unit's end
        self.clock = mlib.Clock()
        self.best_ck = ckpt_lib.Checkpointer(os.path.join(ctx.workdir, "checkpoints", "best_policy"), keep=1,
                                             keep_best=False, layers=layer_stack.layer_groups(ctx.model_cfg)) \
            if ctx.cfg.checkpoint.keep_best else None

    def meta(self, run, si: int, u_next: int) -> dict:
        """Checkpoint meta: the tree belongs to stage `si`, whose next unit is `u_next` (== units: stage done)."""
        return {"stage": si, "unit": u_next, "global_unit": self.gunit, "summary": self.summary,
                "history": self.history, "wall_seconds": self.wall(), "best": self.best,
                "stage_meta": stage_lib.meta(run) if run is not None else {}}

    def load_meta(self, meta: dict) -> None:
        self.si, self.u0, self.gunit = meta["stage"], meta["unit"], meta["global_unit"]
        config_path = self.summary["config"]  # this run's (a run started from another's prefix has its own)
        self.summary, self.history = meta["summary"], meta["history"]
        self.best = runs.best_record(meta.get("best"))  # a checkpoint written before one numbering: converted
        self.summary["config"] = config_path
        self.wall_before = meta["wall_seconds"]
        self.compile_before = self.summary.get("compile", {})  # the processes before this one

    def stamp(self) -> None:
        """Wall time, compile time and peak memory so far (over every process of the run) into the summary."""
        self.summary["wall_seconds"] = self.wall()
        now = compile_cache.stats()
        c = {k: self.compile_before.get(k, 0) + now[k] - self.compile_start[k] for k in now}
        self.summary["compile"] = {**c, "seconds": round(c["seconds"], 1), "cache_dir": self.cache_dir or "off"}
        before = self.summary.get("memory", {}).get("peak_rss_gib", 0.0)
        mem = {"peak_rss_gib": round(max(before, mlib.peak_rss_gib()), 2)}
        if self.plan is not None:
            peak_gib = self.plan.peak / 2**30
            mem.update(plan_peak_gib=round(peak_gib, 2), peak_over_plan=round(mem["peak_rss_gib"] / peak_gib, 2),
                       plan_runtime_gib=round(self.plan.parts["runtime"] / 2**30, 2))
        if self.besides_arrays_gib:
            mem["besides_arrays_gib"] = round(self.besides_arrays_gib, 2)
        self.summary["memory"] = mem

    def wall(self) -> float:
        return self.wall_before + (time.time() - self.t_start)

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self, params, si: int, unit: int, splits=("validation", "test"), stage: str = "") -> dict:
        """Metrics per split; the samples go to samples.jsonl at the current global unit; one progress line."""
        e, ctx = self.ctx.cfg.eval, self.ctx
        params = ctx.policy_weights(params)  # a LoRA policy ({"lora": adapters}) merged into its base
        out, t0, n_show = {}, time.time(), int(e.samples)
        for j, split in enumerate(splits):
            probs = ctx.val[: e.n_val] if split == "validation" else ctx.test[: e.n_test]
            key = jax.random.fold_in(ctx.key("eval", si + 2, unit), j)  # si: -2 best policy, -1 initial
            samples = [] if n_show else None
            out[split] = ev.evaluate(ctx, params, probs, key, e.k, e.temperature, samples_out=samples,
                                     n_show=n_show, tools=stage_lib.run_tools(self.stage_cfgs))
            ctx.writer.write_samples(self.gunit, samples or [], stage=stage, split=split)
        kernels.phase_end()
        first = next((h["validation"] for h in self.history if "validation" in h), None)
        if first is not None and "validation" in out:
            out["validation"].update({f"hacking/{k}": v for k, v in ev.hacking_signs(first, out["validation"]).items()})
        where = {-2: "best policy", -1: "initial policy"}.get(si, f"{stage} unit {unit + 1}")
        self.clock.say(f"eval ({where}): " + ", ".join(f"{sp} pass@1 {m['pass@1']:.3f} (n={m['n_problems']})"
                                                       for sp, m in out.items()) + f" [{time.time() - t0:.1f} s]")
        return out

    def stage_end(self, sc, first_step: int) -> None:
        """At the end of a stage: the reward-hacking report of an RL stage (printed, in summary.json), curves.png."""
        recs = mlib.read_jsonl(self.ctx.writer.path)
        if stage_lib.KINDS[sc.kind].is_rl:
            before = [r for r in recs if r["step"] < first_step and "validation/pass@1" in r][-1:]  # the baseline
            rep = hacking.stage_report(before + [r for r in recs if r.get("stage") == sc.stage.name])
            self.summary.setdefault("hacking", {})[sc.stage.name] = rep
            self.clock.say(hacking.format_report(sc.stage.name, rep))
        if self.wall() > 120:  # a long run gets its figure at every stage end; every run gets it at the end
            self.curves(recs)

    def curves(self, recs=None) -> None:
        recs = mlib.read_jsonl(self.ctx.writer.path) if recs is None else recs
        plots.run_curves(recs, os.path.join(self.ctx.workdir, "curves.png"), hacking=self.summary.get("hacking"),
                         title=f"{self.summary.get('config', '')}  {self.ctx.workdir}")

    def offer_best(self, params, stage_name: str, unit: int, val_pass1: float) -> None:
        if self.best_ck is None or (self.best is not None and val_pass1 <= self.best["val_pass@1"]):
            return
        self.best = {"stage": stage_name, "unit": unit + 1, "unit_base": 1, "val_pass@1": float(val_pass1),
                     "global_unit": self.gunit}
        self.best_ck.save(self.gunit, {"policy": params}, dict(self.best))

    def finish(self) -> dict:
        ctx = self.ctx
        if self.best_ck is not None and self.best is not None and "test" not in self.best:
            step = self.best_ck.latest_step()
            template = {"policy": jax.tree.map(np.asarray, self._policy_template())}
            params = jax.tree.map(jax.numpy.asarray, self.best_ck.restore(step, template)["policy"])
            self.clock.say(f"evaluating the best policy ({runs.policy_name(self.best, self.best['global_unit'])}) "
                           "on the test split")
            res = self.evaluate(params, -2, 0, splits=("test",), stage="best")
            self.best["test"] = summary_entry(res["test"])
        if self.best is not None:
            self.summary["best"] = runs.best_record(self.best)
            self.summary["numbering"] = runs.UNIT_NUMBERING
        self.stamp()
        write_summary(ctx.workdir, self.summary)
        self.curves()
        rows = dict(self.summary["eval"])
        if self.best is not None and "test" in self.best:
            b = self.summary["best"]
            what = "earliest" if "note" in b else "best"
            rows[f"{what} ({b['stage']} unit {b['unit']} = checkpoint {b['global_unit']})"] = b["test"]
        e = ctx.cfg.eval
        print("\nheld-out test set after each stage: greedy pass@1, its standard error and 95 % (Wilson) interval"
              + (";\nlift = pass@1 - the initial policy's on the same problems, with its paired standard error"
                 if "initial" in rows else "")
              + (f";\npass@{e.k} / maj@{e.k} from {e.k} samples at T {e.temperature:g}" if e.k > 0 else "") + ":")
        print(mlib.results_table(rows, e.k, e.temperature))
        if "note" in self.summary.get("best", {}):
            print(f"earliest: {self.summary['best']['note']}")
        if family_columns(rows):
            print("\nper task family (pass@1: math verified, code all tests pass, instructions all constraints met):")
            print(mlib.format_table(rows, family_columns(rows)))
        c, mem = self.summary["compile"], self.summary["memory"]
        plan = (f" against a memory plan of {mem['plan_peak_gib']:.2f} GiB ({mem['peak_over_plan']:.2f}x)"
                if "plan_peak_gib" in mem else "")
        est = self.summary.get("time_estimate")
        est = f" (estimated {est['total_warm_s']:.0f}-{est['total_s']:.0f} s)" if est else ""
        print(f"wall time {self.summary['wall_seconds']:.1f} s{est}, of which compiling {c['seconds']:.1f} s ({c['compiles']} "
              f"programs, {c['cache_hits']} read from the compilation cache {c['cache_dir']}); peak RSS "
              f"{mem['peak_rss_gib']:.2f} GiB{plan}; summary in "
              f"{os.path.join(ctx.workdir, 'summary.json')}, curves in {os.path.join(ctx.workdir, 'curves.png')}, "
              f"samples in {ctx.writer.samples_path}", flush=True)
        return self.summary

    def _policy_template(self):
        if self.ctx.model_cfg.lora is not None:  # the best policy of a LoRA run is its adapters
            return self.ctx.init_params()
        return transformer.init(self.ctx.model_cfg, jax.random.key(0))

    def close(self) -> None:
        if self.best_ck is not None:
            self.best_ck.close()


def write_summary(workdir: str, summary: dict) -> None:
    """summary.json, with "kernels": the expert / attention kernels the compiled programs contain (traced counts)
    and whether the native CPU kernels were used (rl.setup.backend_kernels)."""
    summary = {**summary, "kernels": backend_kernels()}
    with open(os.path.join(workdir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)


def train(config, workdir: str, config_path: str = "") -> dict:
    """Run (or resume) every stage of `config` in `workdir`; returns the summary dict. `config` is the launcher's
    rl.preflight.prepare(...) result (nothing is validated or loaded again) or a config (ConfigDict, plain dicts or a
    RunConfig), prepared here without the machine checks."""
    cfg = config.cfg if isinstance(config, Prepared) else config if isinstance(config, cv.RunConfig) else (
        cv.validate(config))
    if cfg.run.distributed:
        jax.distributed.initialize()  # coordinator / process ids from the cluster environment
    cache_dir = compile_cache.enable(cfg.run.compile_cache)  # before the first compile of this run
    compile_start = compile_cache.stats()
    clock = mlib.Clock()
    clock.say(f"building the run: {cfg.tasks.n_train} / {cfg.tasks.n_val} / {cfg.tasks.n_test} problems of "
              f"{cfg.tasks.mix}, {cfg.run.reward_workers} reward worker(s)")
    prep = config if isinstance(config, Prepared) else preflight.prepare(cfg, environment=False)
    ctx = build_context(prep, workdir)
    latest = ctx.ckpt.latest_step()
    meta = ctx.ckpt.restore_meta(latest) if latest is not None else None
    ctx.writer = mlib.MetricsWriter(workdir, tensorboard=cfg.log.tensorboard,
                                    truncate_after_step=(meta["global_unit"] if meta else -1))
    print(preflight.compute_estimate(cfg)[0], flush=True)
    est_text, est = preflight.time_estimate(cfg, prep.model_cfg, log=clock.say)
    print(est_text, flush=True)
    loop = Loop(ctx, list(cfg.stages), config_path)
    loop.summary["time_estimate"] = {k: round(est[k], 1) for k in ("total_s", "total_warm_s", "compile_s", "eval_s")}
    loop.clock, loop.compile_start, loop.cache_dir = clock, compile_start, cache_dir
    loop.plan = prep.plan
    try:
        return _run(loop, meta, latest)
    finally:
        loop.close()
        ctx.close()


def _run(loop: Loop, meta, latest) -> dict:
    ctx, cfg = loop.ctx, loop.ctx.cfg
    e, stop_after, ran = cfg.eval, cfg.run.stop_after, 0
    bars, line_every = progress_mode(cfg.log.progress, sys.stdout.isatty(), sys.stderr.isatty())
    run = None
    if meta is None:
        params = ctx.init_params()  # model.hf_path's weights, else a random init
        if e.initial:
            loop.clock.say(f"evaluating the initial policy: {e.n_val} validation + {e.n_test} test problems, "
                           f"greedy + {e.k} samples each (the first call compiles the sampler)")
            res = loop.evaluate(params, -1, 0, stage="initial")
            loop.summary["eval"]["initial"] = summary_entry(res["test"])
            loop.history.append({"stage": "initial", **res})
            ctx.writer.write(0, res, stage="initial", phase="eval")
    else:
        loop.load_meta(meta)
        # replaced by the checkpoint's (LoRA: fresh adapters on the base loaded again, then the checkpoint's adapters)
        params = ctx.init_params() if ctx.model_cfg.lora is not None else transformer.init(ctx.model_cfg,
                                                                                               ctx.key("init"))
        sc = loop.stage_cfgs[loop.si]
        run = stage_lib.init(ctx, loop.si, sc, params)
        run = stage_lib.load(run, ctx.ckpt.restore(latest, stage_lib.template(run, meta["stage_meta"])),
                             meta["stage_meta"])
        print(f"resuming from checkpoint {latest}: stage {loop.si + 1}/{len(loop.stage_cfgs)} {sc.stage.name}, after "
              f"unit {loop.u0} (units from 1 within a stage; the checkpoint number is the global unit)", flush=True)

    record = ctx.adaptation_record()  # model.upcycle (from which checkpoint) / model.lora (adapter parameters)
    if record:
        loop.summary["model"] = record
    while loop.si < len(loop.stage_cfgs):
        si, sc = loop.si, loop.stage_cfgs[loop.si]
        if run is None:
            run = stage_lib.init(ctx, si, sc, params)
        first_step = loop.gunit - loop.u0 + 1  # the global unit of this stage's first unit (also after a resume)
        if loop.u0 < sc.units:
            loop.clock.say(f"stage {si + 1}/{len(loop.stage_cfgs)} {sc.stage.name} ({sc.kind}): units {loop.u0 + 1}-"
                           f"{sc.units} (the first unit compiles its step functions)")
        bar = tqdm(total=sc.units, initial=loop.u0, desc=f"{sc.stage.name} ({sc.kind})", disable=not bars,
                   dynamic_ncols=True)
        t_line = time.time()
        kl_place = sc.kl.kl_place if stage_lib.KINDS[sc.kind].is_rl else None  # where an RL stage's KL goes
        for u in range(loop.u0, sc.units):
            t0 = time.time()
            run, m = stage_lib.unit(run, u)
            m["time/unit"] = time.time() - t0
            m.update(mlib.memory_metrics())
            loop.besides_arrays_gib = max(loop.besides_arrays_gib, m["mem/rss_gib"] - m["mem/arrays_gib"])
            loop.gunit += 1
            last = u == sc.units - 1
            stop = bool(stop_after) and ran + 1 >= stop_after
            if u == loop.u0 or (line_every is not None and (last or stop or time.time() - t_line >= line_every)):
                t_line = time.time()
                loop.clock.say(f"{sc.stage.name} unit {u + 1}/{sc.units} done in {m['time/unit']:.1f} s" + "".join(
                    f", {k} {progress_number(v)}" for k, v in progress_values(m, kl_place).items()))
            val = None
            if last:
                res = loop.evaluate(stage_lib.policy_params(run), si, u, stage=sc.stage.name)
                val = res["validation"]
                loop.summary["eval"][sc.stage.name] = summary_entry(res["test"])
                loop.history.append({"stage": sc.stage.name, **res})
                ctx.writer.write(loop.gunit, res, stage=sc.stage.name, phase="eval", unit=str(u))
            elif e.every and (u + 1) % e.every == 0:
                val = loop.evaluate(stage_lib.policy_params(run), si, u, splits=("validation",),
                                    stage=sc.stage.name)["validation"]
                ctx.writer.write(loop.gunit, {"validation": val}, stage=sc.stage.name, phase="eval", unit=str(u))
            if val is not None:
                loop.offer_best(stage_lib.carried_params(run), sc.stage.name, u, val["pass@1"])
            if loop.gunit % cfg.log.every == 0 or last:
                ctx.writer.write(loop.gunit, m, stage=sc.stage.name, phase="train", unit=str(u))
            bar.update(1)
            bar.set_postfix({k: progress_number(v) for k, v in progress_values(m, kl_place).items()})
            ran += 1
            if last:  # before the checkpoint that marks the stage done: a rerun fails the same way
                stage_lib.check_trained(run)
                loop.stage_end(sc, first_step)
            if last or stop or (u + 1) % cfg.checkpoint.every == 0:
                loop.stamp()
                if last:
                    write_summary(ctx.workdir, loop.summary)  # one entry per finished stage, also while the run goes on
                ctx.ckpt.save(loop.gunit, stage_lib.tree(run), loop.meta(run, si, u + 1))
            if stop and not (last and si + 1 == len(loop.stage_cfgs)):
                bar.close()
                print(f"stopping after {ran} units (run.stop_after); rerun the same command to resume", flush=True)
                loop.stamp()
                return loop.summary
        bar.close()
        if stage_lib.trained_units(run) == 0 and sc.units > 0:
            print(f"WARNING: stage {sc.stage.name!r} trained in none of its {sc.units} iterations: every group had "
                  "equal rewards (no signal), so every update was skipped; the stage changed nothing. Make the task "
                  "easier, sample more answers per problem, or start from a stronger policy.", flush=True)
        params = stage_lib.carried_params(run)  # LoRA: the adapters carry on, on the same base
        run = None
        loop.si, loop.u0 = si + 1, 0
    return loop.finish()
