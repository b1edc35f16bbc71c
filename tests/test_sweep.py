"""Sweeps that cannot lie: a run is reused only when its finished config.json equals the point's resolved config,
anything else in a run directory is refused before anything runs; --only / --seeds / --stage; the table's ± is the
sample std (ddof=1) with n and every seed's value; the shared stages of a grid are found from the resolved configs.
The end-to-end sweep (processes, shared cold start, a rerun that reuses) is marked slow; the equivalence of a run
started from a shared prefix with a full run is tested in tests/test_run.py (cached compiles)."""
import json
import os

import numpy as np
import pytest

from experiments import sweep
from rl import config_validation as cv
from rl.workdir_state import check_resume, workdir_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QS = os.path.join(ROOT, "experiments/configs/quickstart.py") + ":variant=tiny"


def _cfg(**over):
    return sweep.resolve(QS, [(k, str(v)) for k, v in over.items()])


def _finish(wd, cfg, summary=None):
    os.makedirs(wd, exist_ok=True)
    with open(os.path.join(wd, "config.json"), "w") as f:
        json.dump(cfg, f)
    s = summary or {"eval": {st["name"]: {"pass@1": 0.5} for st in cfg["stages"]}, "best": {}}
    with open(os.path.join(wd, "summary.json"), "w") as f:
        json.dump(s, f)


def test_workdir_state_reuses_only_the_same_finished_config(tmp_path):
    cfg = _cfg(seed=0)
    wd = str(tmp_path / "p" / "seed0")
    assert workdir_state(wd, cfg)[0] == "new"
    _finish(wd, cfg)
    assert workdir_state(wd, cfg) == ("done", "finished with this exact config")
    # the bug of the issue: a rerun with changed overrides was reported from the old summary.json
    changed = _cfg(seed=0, **{"stages[2].lr": 5e-4})
    st, why = workdir_state(wd, changed)
    assert st == "conflict" and "stages[2].lr" in why
    # same config, unfinished (a stage missing from summary.json): resumed, not reused
    _finish(wd, cfg, {"eval": {"initial": {}, "cold_start": {}}})
    assert workdir_state(wd, cfg)[0] == "resume"
    # a directory with something else in it
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    st, why = workdir_state(str(other), cfg)
    assert st == "conflict" and "notes.txt" in why
    (tmp_path / "file").write_text("")
    assert workdir_state(str(tmp_path / "file"), cfg)[0] == "conflict"
    # run.stop_after may differ for the shared run only when asked
    stopped = _cfg(seed=0, **{"run.stop_after": 11})
    assert workdir_state(wd, stopped)[0] == "conflict"
    assert workdir_state(wd, stopped, may_differ=("run.stop_after",))[0] != "conflict"


def test_the_launcher_and_the_sweep_read_a_run_directory_by_one_rule(tmp_path, monkeypatch):
    """rl.workdir_state for both: a config.json pins nothing before a checkpoint or summary.json is written under
    it; an old config.json reads with today's field names; a directory holding something else is no run's (the
    launcher refuses it too); only the launcher's resume lets run.* / log.* differ."""
    cfg, logged, other_seed = _cfg(seed=0), _cfg(seed=0, **{"log.every": 2}), _cfg(seed=2)
    wd = tmp_path / "run"
    wd.mkdir()
    (wd / "config.json").write_text(json.dumps(_cfg(seed=1)))  # a run that stopped before its first checkpoint
    assert workdir_state(str(wd), cfg)[0] == "new"
    check_resume(str(wd), cfg)
    old = json.loads(json.dumps(cfg))
    old["tasks"]["n_problems"] = old["tasks"].pop("n_train")  # a field renamed since that run
    monkeypatch.setattr(cv, "ALIASES", {"tasks.n_problems": "tasks.n_train"})
    _finish(str(wd), old)
    assert workdir_state(str(wd), cfg) == ("done", "finished with this exact config")
    assert workdir_state(str(wd), logged)[0] == "conflict"  # a reused result comes from exactly this config
    check_resume(str(wd), logged)  # a resume may change how the run logs
    with pytest.raises(cv.ConfigError, match=r"holds a run with a different config \(seed differ"):
        check_resume(str(wd), other_seed)
    (tmp_path / "stray" / "checkpoints").mkdir(parents=True)
    with pytest.raises(cv.ConfigError, match="holds checkpoints but no config.json"):
        check_resume(str(tmp_path / "stray"), cfg)


def test_sweep_refuses_before_running_anything(tmp_path, capsys):
    # one point's directory holds a run of another config: nothing runs, the message names the field
    wd = tmp_path / "sw"
    _finish(str(wd / "clip_high_0.2,lr_0.0001" / "seed0"), _cfg(seed=0, **{"stages[2].clip_high": 0.2,
                                                                          "stages[2].lr": 1e-4, "stages[2].epochs": 2}))
    rc = sweep.main(["--config", QS, "--workdir", str(wd), "--seeds", "0", "--only", "lr=0.0001", "--parallel", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "refused" in err and "stages[2].epochs" in err
    assert not (wd / sweep.SHARED).exists() and not (wd / "clip_high_0.28,lr_0.0001").exists()


def test_select_only_and_grid():
    pts = sweep.grid({"axes": {"stages[2].clip_high": [0.2, 0.28], "stages[2].lr": [1e-4, 2e-4]}})
    assert len(pts) == 4
    assert sweep.select(pts, ["clip_high=0.28"]) == [p for p in pts if p["stages[2].clip_high"] == 0.28]
    assert sweep.select(pts, ["stages[2].lr=0.0002", "clip_high=0.2"]) == [{"stages[2].clip_high": 0.2,
                                                                            "stages[2].lr": 2e-4}]
    assert len(sweep.select(pts, ["lr=1e-4", "lr=2e-4"])) == 4  # values of one axis are alternatives
    with pytest.raises(ValueError, match="no sweep axis"):
        sweep.select(pts, ["temperature=1"])
    with pytest.raises(ValueError, match="matches no point"):
        sweep.select(pts, ["lr=3e-4"])


def test_table_is_mean_and_sample_std_with_every_seed():
    rows = [{"a": 1, "seed": s, "grpo/pass@1": v} for s, v in enumerate([0.25, 0.5, 0.75])]
    rows.append({"a": 2, "seed": 0, "grpo/pass@1": 0.125})
    text = sweep.table(rows, ["a"], ["grpo"], "pass@1")
    sd = np.std([0.25, 0.5, 0.75], ddof=1)  # 0.25; the population std would be 0.204
    assert f"0.500 ± {sd:.3f} (n=3: 0.250, 0.500, 0.750)" in text
    assert "| 2 | 0.125 (n=1: 0.125) |" in text  # one seed: no spread to show
    assert sweep.mean_sd([1.0, 3.0]) == (2.0, pytest.approx(np.sqrt(2.0)))


def test_shared_stages_from_resolved_configs():
    a, b = _cfg(seed=0), _cfg(seed=0, **{"stages[2].clip_high": 0.2})
    assert sweep.shared_prefix([a, b]) == 2  # GRPO settings only: cold start and rejection are shared
    assert sweep.shared_prefix([a, _cfg(seed=0, **{"stages[1].lr": 5e-4})]) == 1
    assert sweep.shared_prefix([a, _cfg(seed=0, **{"reward.w_format": 0.2})]) == 0  # touches every stage
    assert sweep.shared_prefix([a, _cfg(seed=0, **{"log.every": 2})]) == 3
    assert sweep.shared_prefix([a, _cfg(seed=0, **{"run.overlap": False})]) == 0  # changes what RL stages compute
    n, why = sweep.default_parallel(a, n_runs=64)
    assert 1 <= n <= (os.cpu_count() or 1) and "GiB" in why


def test_fields_added_since_a_run_at_their_default_are_no_difference(tmp_path):
    from rl.prefix import shared_stages, with_added_defaults

    new = _cfg(seed=0)
    old = json.loads(json.dumps(new))
    del old["stages"][0]["length_buckets"], old["sampling"]["top_p"]  # fields the code gained after `old` ran
    assert with_added_defaults(old, new) == json.loads(json.dumps(new))
    assert shared_stages(old, new) == 3
    _finish(str(tmp_path / "a"), old)
    assert workdir_state(str(tmp_path / "a"), new)[0] == "done"  # reused, not a conflict
    off_default = _cfg(seed=0, **{"stages[0].length_buckets": 3})  # an added field NOT at its default differs
    assert shared_stages(old, off_default) == 0
    assert workdir_state(str(tmp_path / "a"), off_default)[0] == "conflict"
    changed = json.loads(json.dumps(old))
    changed["stages"][0]["lr"] = 1.0  # and a changed field stays a difference
    assert shared_stages(changed, new) == 0


def test_a_finished_shared_run_serves_points_whose_later_stages_differ(tmp_path):
    cfg = _cfg(seed=0)
    other = _cfg(seed=0, **{"stages[2].clip_high": 0.2})  # another point of the grid: same first 2 stages
    wd = str(tmp_path / "shared")
    _finish(wd, other, summary={"eval": {"cold_start": {"pass@1": 0.1}, "rejection": {"pass@1": 0.2}}})
    assert sweep._shared_state({"workdir": wd, "cfg": cfg, "k": 2})[0] == "done"
    assert sweep._shared_state({"workdir": wd, "cfg": cfg, "k": 3})[0] == "conflict"  # stage 2 is shared now
    unfinished = str(tmp_path / "unfinished")
    _finish(unfinished, other, summary={"eval": {"cold_start": {"pass@1": 0.1}}})
    # resuming would run the rest of the shared stages under the new config: refused, with the reason
    state, why = sweep._shared_state({"workdir": unfinished, "cfg": cfg, "k": 2})
    assert state == "conflict" and "stages[2].clip_high" in why
    changed_cold = _cfg(seed=0, **{"stages[0].lr": 5e-4})
    assert sweep._shared_state({"workdir": wd, "cfg": changed_cold, "k": 2})[0] == "conflict"


def test_dry_run_validates_every_run_and_the_shared_one(tmp_path, capsys):
    rc = sweep.main(["--config", QS, "--workdir", str(tmp_path / "sw"), "--seeds", "0,1", "--only", "lr=0.0001",
                     "--only", "clip_high=0.28", "--dry_run", "--config.eval.k=2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "1 point(s) x 2 seed(s) = 2 runs" in out
    # one point of a grid whose axes touch only GRPO: its cold start and rejection still run in _shared, once per
    # seed, so another point run later (or another sweep's --init_from) starts from them
    assert "stages cold_start, rejection shared per seed" in out and "_shared seed1: config OK" in out
    assert "4 runs validated" in out
    # the compute of what is to run (the launcher's estimate summed) and a time estimate
    assert "compute estimate for the 4 run(s) to go" in out
    # ... from this machine's calibration (rl/time_estimate.py): per run, all 4 one at a time and with --parallel
    assert "time estimate from this machine's calibration" in out and "all 4 one at a time ~" in out
    with pytest.raises(SystemExit):  # --stage must name a stage of the config
        sweep.main(["--config", QS, "--workdir", str(tmp_path / "sw"), "--seeds", "0", "--stage", "nope", "--dry_run"])


@pytest.mark.slow
def test_sweep_end_to_end_shares_the_cold_start_and_reuses(tmp_path, capsys):
    wd = tmp_path / "sw"
    argv = ["--config", QS, "--workdir", str(wd), "--seeds", "0", "--only", "lr=0.0001", "--parallel", "2"]
    assert sweep.main(argv) == 0
    out = capsys.readouterr().out
    assert "stages cold_start, rejection shared per seed" in out
    assert (wd / "results.csv").exists() and (wd / "curves.png").exists() and (wd / "pass@1.png").exists()
    for name in ("clip_high_0.2,lr_0.0001", "clip_high_0.28,lr_0.0001"):
        run = wd / name / "seed0"
        assert json.loads((run / "init_from.json").read_text())["stage"] == "rejection"
        assert (run / "launch.log").exists() and (run / "curves.png").exists()
    a = json.loads((wd / "clip_high_0.2,lr_0.0001/seed0/summary.json").read_text())
    b = json.loads((wd / "clip_high_0.28,lr_0.0001/seed0/summary.json").read_text())
    assert a["eval"]["rejection"] == b["eval"]["rejection"]  # one cold start and rejection, shared
    assert "resolved config" not in out and len(out.splitlines()) < 20  # progress lines, not configs
    assert sweep.main(argv) == 0  # a rerun reuses every finished run
    assert "2 finished with the same config (reused), 0 to run" in capsys.readouterr().out


def test_a_grid_of_one_point_shares_all_its_stages_but_the_last(tmp_path, capsys):
    qs_seeds = os.path.join(ROOT, "experiments/configs/quickstart.py") + ":variant=tiny,sweep=seeds"
    assert sweep.main(["--config", qs_seeds, "--workdir", str(tmp_path / "sw"), "--seeds", "0", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "stages cold_start, rejection shared per seed" in out and "2 runs validated" in out


def test_the_time_estimate_scales_from_finished_runs(tmp_path):
    cfg = _cfg(seed=0)
    wd = str(tmp_path / "p" / "seed0")
    _finish(wd, cfg, {"eval": {}, "wall_seconds": 120.0})
    text = sweep.estimate([], [{"cfg": cfg}, {"cfg": cfg}], 0, 2, [{"cfg": cfg, "workdir": wd}])
    assert "about 2 min with 2 at once" in text  # two runs like the finished one (2 min each), two at once


def test_run_all_prints_each_log_a_live_status_and_the_whole_error(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setattr(sweep.sweep_log, "STATUS_SECONDS", 0.05)
    ok = ("import json, os, sys, time; p = os.path.join(sys.argv[1], 'metrics.jsonl')\n"
          "for s in (1, 2, 3):\n    open(p, 'a').write(json.dumps({'step': s}) + '\\n'); time.sleep(0.3)")
    bad = ("import sys; print('building the run'); print('config error: 2 problems:\\n  tasks.n_test: asked for 9, "
           "the mix supplies 4' + 'x' * 200 + '\\n  eval.n_val: 64 > tasks.n_val = 8', file=sys.stderr); sys.exit(2)")
    jobs = [{"label": "good seed0", "workdir": str(tmp_path / "good"), "units": 5},
            {"label": "bad seed0", "workdir": str(tmp_path / "bad"), "units": 5}]
    jobs[0]["cmd"] = [sys.executable, "-c", ok, jobs[0]["workdir"]]
    jobs[1]["cmd"] = [sys.executable, "-c", bad]
    sweep.run_all(jobs, 2)
    out = capsys.readouterr().out
    for j in jobs:  # each run's log path as it starts
        assert f"start {j['label']}" in out and os.path.join(j["workdir"], "launch.log") in out
    assert "running: " in out and "good seed0 unit " in out and "/5" in out  # the live status, plain lines here
    assert "\r" not in out  # not a terminal: no carriage returns
    assert jobs[1]["rc"] == 2 and "FAILED (exit 2)" in out
    assert "x" * 200 in out and "eval.n_val: 64 > tasks.n_val = 8" in out  # the whole error, every line
    assert jobs[0]["rc"] == 0


def test_a_sweep_whose_runs_all_fail_prints_their_errors_not_an_empty_table(tmp_path, monkeypatch, capsys):
    def fail(cmd, workdir):
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "launch.log"), "w") as f:
            f.write("+ launch\nTraceback (most recent call last):\n  File x\nRuntimeError: out of memory in step\n")
        return 1, 0.1, sweep.sweep_log.error_of(os.path.join(workdir, "launch.log"))

    monkeypatch.setattr(sweep, "run_one", fail)
    rc = sweep.main(["--config", QS, "--workdir", str(tmp_path / "sw"), "--seeds", "0", "--only", "lr=0.0001",
                     "--only", "clip_high=0.2", "--init_from", "none"])
    out = capsys.readouterr().out
    assert rc == 1 and "RuntimeError: out of memory in step" in out
    assert "no run finished a stage: no table" in out and "| clip_high" not in out


# -- --axis: a sweep of any recipe without a new file (issue 53, item 5) -------------------------------------------
GRPO_TINY = os.path.join(ROOT, "experiments/configs/grpo_arith.py") + ":variant=tiny"  # stage 1 is GRPO


def test_axis_values_split_outside_brackets_and_parse_like_overrides():
    assert sweep.split_values("1e-5,2e-4") == ["1e-5", "2e-4"]
    assert sweep.split_values("dict(kind='python', max_turns=2), {'kind': ''},'a,b'") == [
        "dict(kind='python', max_turns=2)", "{'kind': ''}", "'a,b'"]
    axes = sweep.axes_from_flags(GRPO_TINY, ["stages[1].lr=1e-5,2e-4", "stages[1].agg=token-mean,seq-mean-token-mean",
                                             "stages[1].tools=dict(kind='python'),{'kind': ''}",
                                             "run.overlap=true,false", "model.lora.rank=4,8"])
    assert axes["stages[1].lr"] == [1e-5, 2e-4] and axes["stages[1].agg"] == ["token-mean", "seq-mean-token-mean"]
    assert axes["stages[1].tools"] == [{"kind": "python"}, {"kind": ""}] and axes["run.overlap"] == [True, False]
    assert axes["model.lora.rank"] == [4, 8]  # an off section's field, as on the launcher's command line
    # every point resolves to the config the launcher would run for the same --config.* flags
    cfg = sweep.resolve(GRPO_TINY, sweep.run_overrides({"stages[1].tools": axes["stages[1].tools"][0],
                                                         "model.lora.rank": 4}, 0, []))
    assert cfg["stages"][1]["tools"]["kind"] == "python" and cfg["model"]["lora"]["rank"] == 4


@pytest.mark.parametrize("flag,message", [
    ("stages[1].lrr=1e-5", "--axis stages[1].lrr: no field 'lrr' there; did you mean 'lr'?"),
    ("stages[5].lr=1e-5", "--axis stages[5].lr: stages[5] does not exist"),
    ("stages[1].lr", "--axis 'stages[1].lr': expected PATH=V1,V2"),
    ("stages[1].lr=1e-5,", "expected PATH=V1,V2"),
])
def test_a_bad_axis_is_refused_naming_it(flag, message):
    from rl import config_validation as cv

    with pytest.raises(cv.ConfigError) as e:
        sweep.axes_from_flags(GRPO_TINY, [flag])
    assert message in str(e.value)


def test_axis_sweep_of_a_recipe_without_get_sweep_dry_run(tmp_path, capsys):
    tool = os.path.join(ROOT, "experiments/configs/tool_arith.py") + ":variant=tiny"  # no get_sweep
    wd = str(tmp_path / "sw")
    rc = sweep.main(["--config", tool, "--workdir", wd, "--axis", "stages[1].lr=1e-5,2e-4", "--seeds", "0,1",
                     "--dry_run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2 point(s) x 2 seed(s) = 4 runs" in out and "lr_1e-05 seed1: config OK" in out
    assert "6 runs validated" in out  # + the cold start shared per seed
    assert sweep.main(["--config", tool, "--workdir", wd, "--axis", "stages[1].lr=abc", "--seeds", "0",
                       "--dry_run"]) == 2  # a value the field refuses: before anything runs, naming it
    assert "stages[1].lr must be a number, got 'abc'" in capsys.readouterr().err
    assert sweep.main(["--config", tool, "--workdir", wd, "--axis", "stages[1].lrr=1e-5", "--dry_run"]) == 2
    assert "--axis stages[1].lrr: no field 'lrr' there" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # neither get_sweep nor --axis / --seeds: nothing to sweep
        sweep.main(["--config", tool, "--workdir", wd, "--dry_run"])
    assert "has no get_sweep(): give the sweep as --axis" in capsys.readouterr().err


@pytest.mark.parametrize("name,runs", [("smollm2_grpo", 3), ("smollm2_tools", 3), ("smollm2_upcycle", 6)])
def test_smollm2_recipes_sweep_their_documented_variants(tmp_path, capsys, name, runs):
    spec = os.path.join(ROOT, f"experiments/configs/{name}.py") + ":variant=tiny"
    assert sweep.main(["--config", spec, "--workdir", str(tmp_path / "sw"), "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert f"= {runs} runs" in out and f"{runs} runs validated" in out, out
