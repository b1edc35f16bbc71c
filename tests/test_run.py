"""End-to-end runs of the tiny quickstart through the launcher: files written (summary with the hacking report,
samples.jsonl, curves.png, TensorBoard tags named as in metrics.jsonl), progress lines for every phase, every stage
trains, the estimator fixes hold in the logged metrics (sampler / trainer match, even steps, exact lr schedule),
best-by-validation, exact resume after a stop, a run started from another run's shared stages (--init_from) equal
to a full run, a warning for a stage that never trained, the sample / eval commands on the finished run, and
determinism on one machine (identical summary.json).

The runs go through the launcher in-process (config.json / validation are covered too); jitted functions are
cached per config in rl.context, so later runs in this file reuse the first run's compiles.
"""
import contextlib
import io
import json
import os
import struct

import numpy as np
import pytest

from experiments import launch
from rl import preflight
from rl import config_validation as cv
from rl.config_validation import to_dict
from rl.metrics import depends_on_the_machine, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments/configs/quickstart.py")
# sampling at 0.6 with zero-variance filtering on: the setting the checks name
TINY = ["--config.stages[2].temperature_start=0.6", "--config.stages[2].temperature_end=0.6"]


def _run(workdir, *extra):
    argv = ["--config", QUICKSTART + ":variant=tiny", "--workdir", str(workdir), *TINY, *extra]
    assert launch.main(argv) == 0


def _run_captured(workdir, *extra) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _run(workdir, *extra)
    return buf.getvalue()


def _without_wall(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("wall_seconds", "compile", "memory", "time_estimate")}


def tb_events(tb_dir):
    """(tag, step, value or text) of every summary value in the event files (TFRecord framing read by hand)."""
    from tensorboardX.proto.event_pb2 import Event

    out = []
    for name in sorted(os.listdir(tb_dir)):
        data = open(os.path.join(tb_dir, name), "rb").read()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in ev.summary.value:
                out.append((v.tag, ev.step, v.simple_value if v.HasField("simple_value") else
                            b"".join(v.tensor.string_val).decode()))
    return out


def _train_records(workdir):
    """Train-phase metrics without wall-clock fields (those differ between any two runs)."""
    out = []
    for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
        if r.get("phase") != "train":
            continue
        out.append({k: v for k, v in r.items() if not depends_on_the_machine(k)})
    return out


def _assert_same_records(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], float):
                np.testing.assert_allclose(ra[k], rb[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} at step {ra['step']}")
            else:
                assert ra[k] == rb[k], k


@pytest.fixture(scope="module")
def full_output(tmp_path_factory):
    wd = tmp_path_factory.mktemp("full")
    return wd, _run_captured(wd)


@pytest.fixture(scope="module")
def full_run(full_output):
    return full_output[0]


def test_tiny_run_writes_everything(full_run, capsys):
    summary = json.loads((full_run / "summary.json").read_text())
    assert set(summary) == {"eval", "best", "numbering", "wall_seconds", "compile", "memory", "config", "hacking",
                            "kernels", "time_estimate"}
    # rl/compile_cache.py; >= 0: programs this pytest worker already traced for another test are not compiled again
    # (a fresh process's counts are tested in tests/test_compile_cache.py)
    assert summary["compile"]["seconds"] >= 0 and summary["compile"]["compiles"] >= 0
    assert set(summary["compile"]) >= {"seconds", "compiles", "cache_hits", "cache_misses", "cache_dir"}
    assert summary["hacking"]["grpo"]["iterations"] == 3  # the report of the RL stage (3 iterations: not judged)
    assert list(summary["eval"]) == ["initial", "cold_start", "rejection", "grpo"]
    for entry in summary["eval"].values():
        assert {"pass@1", "pass@1_se", "pass@1_ci95", "pass@k", "maj@k", "format_rate"} <= set(entry)
        lo, hi = entry["pass@1_ci95"]
        assert 0 <= lo <= entry["pass@1"] <= hi <= 1
    assert summary["eval"]["cold_start"]["format_rate"] > summary["eval"]["initial"]["format_rate"]
    best = summary["best"]  # the best unit by validation pass@1, evaluated on the test split
    assert best["stage"] in summary["eval"] and "pass@1" in best["test"]
    assert os.listdir(full_run / "checkpoints" / "best_policy")
    cfg_json = json.loads((full_run / "config.json").read_text())
    assert cfg_json["stages"][2]["kind"] == "grpo"
    recs = read_jsonl(full_run / "metrics.jsonl")
    rej = [r for r in recs if r.get("stage") == "rejection" and r["phase"] == "train"]
    assert "kept_share" in rej[0]
    # the process's own bytes besides its arrays, measured at each unit's end (the memory plan's runtime part)
    assert 0 < rej[0]["mem/arrays_gib"] < rej[0]["mem/rss_gib"]
    assert 0 < summary["memory"]["besides_arrays_gib"] <= summary["memory"]["peak_rss_gib"]
    evals = [r for r in recs if r["phase"] == "eval" and r.get("stage") == "cold_start"]
    assert len(evals) >= 3  # validation every 2 SFT epochs, plus the stage end: a curve for the cold start
    assert (full_run / "curves.png").stat().st_size > 10_000


def test_time_estimate_holds_the_tiny_run_to_2x(full_run):
    """rl/time_estimate.py against the run it estimated: the work besides compiling (which this pytest worker may
    have done already for another test) within 2x of the estimate, on this machine's calibration."""
    summary = json.loads((full_run / "summary.json").read_text())
    est = summary["time_estimate"]
    work = summary["wall_seconds"] - summary["compile"]["seconds"]
    est_work = est["total_s"] - est["compile_s"]
    assert est_work / 2 <= work <= 2 * est_work, (work, est)


def test_config_and_summary_record_the_kernels(full_run):
    # Which MoE expert kernels the run's programs contain and whether the native CPU kernels ran (with their
    # library's name and SHA-256), before the run (config.json) and after it (summary.json).
    import jax

    planned = json.loads((full_run / "config.json").read_text())["kernels"]
    done = json.loads((full_run / "summary.json").read_text())["kernels"]
    for rec in (planned, done):
        assert rec["backend"] == jax.default_backend() and {"blocked", "ragged_dot"} <= set(rec["moe_kernels"])
    ran = {k for k in done["traced"] if k.startswith("moe/")}
    assert ran, "no MoE kernel recorded"
    if jax.default_backend() == "cpu":
        from models.cpu import native_kernels

        cpu = done["wings"]["cpu"]
        assert cpu["native"] == native_kernels.available() == planned["wings"]["cpu"]["native"]
        if cpu["native"]:
            assert len(cpu["sha256"]) == 64 and cpu["library"].endswith(".so") and "moe/native" in ran
        else:
            assert cpu["reason"]


def test_every_eval_writes_complete_samples(full_run):
    cfg = json.loads((full_run / "config.json").read_text())
    samples = read_jsonl(full_run / "samples.jsonl")
    recs = read_jsonl(full_run / "metrics.jsonl")
    eval_points = {(r["step"], split) for r in recs if r["phase"] == "eval" for split in ("validation", "test")
                   if f"{split}/pass@1" in r}
    assert eval_points <= {(s["step"], s["split"]) for s in samples}  # every evaluation, every split
    first = [s for s in samples if s["step"] == 0 and s["split"] == "validation"]
    per_problem = cfg["eval"]["samples"] + 1  # the greedy answer and eval.samples of the k samples
    assert len(first) == cfg["eval"]["n_val"] * per_problem
    for s in first:
        assert s["prompt"].startswith("Question: ") and isinstance(s["response"], str) and s["gold"]
        assert {"total", "solved", "outcome", "format"} <= set(s["reward"]) and "answer" in s
    assert [s["kind"] for s in first[:per_problem]] == ["greedy"] + [f"sample {j}" for j in range(per_problem - 1)]
    assert {s["stage"] for s in samples} >= {"initial", "cold_start", "rejection", "grpo", "best"}


def test_tensorboard_one_tag_per_metric_named_as_in_metrics_jsonl(full_run):
    events = tb_events(full_run / "tb")
    tags = {t for t, _, _ in events}
    assert "validation/pass@1" in tags and "test/pass@1" in tags and "pass_1" not in " ".join(tags)
    assert not any(t.startswith(("cold_start/", "grpo/", "initial/")) for t in tags)  # no stage prefix
    recs = read_jsonl(full_run / "metrics.jsonl")
    want = [(r["step"], r["validation/pass@1"]) for r in recs if "validation/pass@1" in r]
    got = [(step, v) for t, step, v in events if t == "validation/pass@1"]
    assert got == [(s, pytest.approx(v)) for s, v in want]  # one curve across every stage
    loss_steps = {step for t, step, _ in events if t == "loss"}
    assert loss_steps == {r["step"] for r in recs if r["phase"] == "train" and r.get("loss") is not None}
    stage_of = {step: v for t, step, v in events if t == "stage"}
    assert stage_of[0] == 0 and stage_of[max(stage_of)] == 3  # initial = 0 ... grpo = 3
    text = [v for t, _, v in events if t.startswith("samples/validation")]
    assert text and "gold" in text[0]


def test_no_phase_is_silent(full_output):
    out = full_output[1]
    lines = out.splitlines()
    first = next(i for i, ln in enumerate(lines) if "evaluating the initial policy" in ln)
    assert "building the run" in "\n".join(lines[:first])
    for name, units in (("cold_start", 10), ("rejection", 1), ("grpo", 3)):
        assert f"{name} (" in out and "the first unit compiles" in out
        for u in range(1, units + 1):  # progress bars are off in tiny runs: a line per unit instead
            assert f"{name} unit {u}/{units} done in" in out, (name, u)
    assert "eval (initial policy)" in out and "eval (grpo unit 3)" in out and "eval (best policy)" in out
    assert "reward-hacking check, stage 'grpo'" in out


def test_progress_in_a_log_file_is_plain_lines(tmp_path):
    """log.progress on with stdout and stderr not terminals (a log file): no tqdm bar, no carriage returns; plain
    unit lines (the first unit, then at most every PLAIN_LINE_SECONDS, and the last one before stopping)."""
    from rl.run import PLAIN_LINE_SECONDS, progress_mode

    assert progress_mode(True, True, True) == (True, None)  # a terminal: bars only
    assert progress_mode(True, False, True) == (True, PLAIN_LINE_SECONDS)  # `| tee`: the bar on screen, lines in the log
    assert progress_mode(True, False, False) == (False, PLAIN_LINE_SECONDS)  # nohup, `> log 2>&1`
    assert progress_mode(False, True, True) == (False, 0.0)  # log.progress off: a line per unit
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        _run(tmp_path / "wd", "--config.log.progress=True", "--config.run.stop_after=4")
    text = out.getvalue() + err.getvalue()
    assert "\r" not in text and "it/s" not in text
    assert "cold_start unit 1/10 done in" in text and "cold_start unit 4/10 done in" in text


def test_rl_iterations_train_and_match_the_sampler(full_run):
    """The tiny run really updates in RL; the sampler's logprobs are the trainer's for the same params and
    temperature; optimizer steps are even; the lr of each stage's last step is its end fraction."""
    cfg = json.loads((full_run / "config.json").read_text())
    recs = [r for r in read_jsonl(full_run / "metrics.jsonl") if r["phase"] == "train"]
    grpo = [r for r in recs if r["stage"] == "grpo"]
    assert len(grpo) == 3 and all(r["temperature"] == pytest.approx(0.6) for r in grpo)
    trained = [r for r in grpo if r.get("optimizer_steps")]
    assert trained, "every GRPO iteration was skipped"
    assert all(abs(r["loss"]) > 0 and r["grad_norm"] > 0 for r in trained)
    assert all(r["mismatch/logp_max_abs"] <= 1e-4 for r in grpo)
    for r in recs:
        if r.get("optimizer_steps"):
            assert r["train/max_rows_per_step"] - r["train/min_rows_per_step"] <= 1, r
    for i, st in enumerate(cfg["stages"]):
        last = [r for r in recs if r["stage"] == st["name"]][-1]
        if last.get("optimizer_steps"):
            assert last["lr"] == pytest.approx(st["end_lr_fraction"] * st["lr"], rel=0.02), st["name"]


def test_resume_after_stop_is_exact(full_run, tmp_path, capsys):
    part = tmp_path / "part"
    # stop after 12 units (10 SFT epochs, the rejection round, GRPO iteration 0: a sampled-ahead batch is pending)
    _run(part, "--config.run.stop_after=12")
    partial = json.loads((part / "summary.json").read_text())  # written after every finished stage
    assert list(partial["eval"]) == ["initial", "cold_start", "rejection"]
    assert "rerun the same command to resume" in capsys.readouterr().out
    _run(part)  # resume: same command (run.* may differ)
    assert "resuming from checkpoint" in capsys.readouterr().out
    resumed = json.loads((part / "summary.json").read_text())
    full = json.loads((full_run / "summary.json").read_text())
    assert resumed["eval"] == full["eval"] and resumed["best"] == full["best"]
    for k in ("seconds", "compiles"):  # compile time counts the stopped process too, as wall_seconds does
        # >= 0: programs this pytest process already compiled (another test's run) are not traced or compiled again
        assert resumed["compile"][k] >= partial["compile"][k] >= 0, k
    _assert_same_records(_train_records(full_run), _train_records(part))


def test_same_command_same_numbers(full_run, tmp_path):
    """Two runs of one command on one machine give the identical summary.json, wall time aside."""
    again = tmp_path / "again"
    _run(again)
    a = json.loads((full_run / "summary.json").read_text())
    b = json.loads((again / "summary.json").read_text())
    assert _without_wall(a) == _without_wall(b)


def test_init_from_shared_stages_equals_a_full_run(full_run, tmp_path):
    """A run started from another run's end of the shared stages (what a sweep does per seed) ends with the numbers
    of a run through every stage; the copied prefix shows in metrics.jsonl, samples.jsonl and TensorBoard."""
    shared, point = tmp_path / "shared", tmp_path / "point"
    _run(shared, "--config.run.stop_after=11")  # cold start (10 epochs) and the rejection round
    out = _run_captured(point, "--init_from", str(shared))
    assert "init_from: starting from" in out and "resuming from checkpoint 11" in out
    assert "evaluating the initial policy" not in out  # that part came from the shared run
    assert json.loads((point / "init_from.json").read_text())["stage"] == "rejection"
    full = json.loads((full_run / "summary.json").read_text())
    assert _without_wall(json.loads((point / "summary.json").read_text())) == _without_wall(full)
    _assert_same_records(_train_records(full_run), _train_records(point))
    assert {t for t, step, _ in tb_events(point / "tb") if step <= 11} >= {"validation/pass@1", "loss"}
    # a config that shares no stage is refused before any compute, naming the field
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        rc = launch.main(["--config", QUICKSTART + ":variant=tiny", "--workdir", str(tmp_path / "x"), *TINY,
                          "--config.stages[0].lr=0.02", "--init_from", str(shared)])
    assert rc == 2 and "shares no stage" in buf.getvalue() and "stages[0]" in buf.getvalue()


def test_a_stage_that_never_trains_warns(tmp_path):
    """No reward at all: every GRPO group has equal rewards, every update is skipped, and the run says so."""
    out = _run_captured(tmp_path / "flat", "--config.reward.w_format=0", "--config.reward.w_outcome=0",
                        "--config.stages[0].epochs=1", "--config.stages[2].iterations=2", "--config.eval.initial=false")
    assert "WARNING: stage 'grpo' trained in none of its 2 iterations" in out


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_r1_zero_tiny_takes_real_rl_steps(tmp_path):
    """Every config's tiny variant exercises the RL update (the other configs: here and tests/test_stages.py)."""
    wd = tmp_path / "r1z"
    argv = ["--config", os.path.join(ROOT, "experiments/configs/r1_zero.py") + ":variant=tiny", "--workdir", str(wd),
            "--config.eval.initial=false"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert launch.main(argv) == 0
    assert "trained in none" not in buf.getvalue()
    recs = [r for r in read_jsonl(wd / "metrics.jsonl") if r["phase"] == "train"]
    assert recs and all(r.get("optimizer_steps") and r["grad_norm"] > 0 and abs(r["loss"]) > 0 for r in recs)


def test_sample_and_eval_commands_on_a_finished_run(full_run, capsys):
    from experiments import eval as eval_cmd
    from experiments import sample as sample_cmd

    assert sample_cmd.main(["--workdir", str(full_run), "--ckpt", "last", "--prompt", "2+3", "--k", "1"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint " in out and "Question: 2+3" in out and "--- greedy" in out and "-> answer" in out
    assert sample_cmd.main(["--workdir", str(full_run), "--split", "test", "--n", "2", "--k", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("=== ") == 2 and "gold" in out and "solved" in out
    assert eval_cmd.main(["--workdir", str(full_run), "--ckpt", "best", "--split", "test", "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert "pass@1" in out and "95% CI" in out
    res = json.loads((full_run / "evals" / "best-test.json").read_text())
    summary = json.loads((full_run / "summary.json").read_text())
    assert res["summary"]["pass@1"] == summary["best"]["test"]["pass@1"]  # the trainer's own evaluation, rerun
    assert eval_cmd.main(["--workdir", str(full_run), "--ckpt", "best", "--mix", "add:1.0", "--n", "4", "--k", "0"]) == 0
    assert "n_problems" in json.loads((full_run / "evals" / "best-test-add_1.0.json").read_text())["metrics"]
    assert eval_cmd.main(["--workdir", str(full_run), "--ckpt", "99"]) == 2


def test_sample_and_eval_read_the_runs_compiled_programs(full_run, monkeypatch, capsys):
    """experiments.sample / eval turn on the compilation cache the run used (run.compile_cache), so a second call
    reads its programs back instead of compiling them again."""
    from experiments import sample as sample_cmd
    from rl import compile_cache

    seen = []
    monkeypatch.setattr(compile_cache, "enable", lambda setting="auto": seen.append(setting))
    assert sample_cmd.main(["--workdir", str(full_run), "--ckpt", "last", "--prompt", "2+3", "--k", "0"]) == 0
    run_setting = json.loads((full_run / "config.json").read_text())["run"]["compile_cache"]
    assert seen == [run_setting]


def test_eval_without_ckpt_takes_the_best_policy_else_the_last(full_run, tmp_path, capsys):
    """experiments.eval --workdir with no --ckpt: the best policy when the run kept one, the last checkpoint
    otherwise (checkpoint.keep_best off: here the same run without its best_policy folder), saying which; with
    --k 0 no pass@k / maj@k column."""
    import shutil

    from experiments import eval as eval_cmd

    assert eval_cmd.resolve_ckpt(str(full_run))[0] == "best" and eval_cmd.resolve_ckpt(str(full_run), "3") == ("3", "")
    wd = tmp_path / "no_best"
    shutil.copytree(full_run, wd, ignore=shutil.ignore_patterns("evals"))
    shutil.rmtree(wd / "checkpoints" / "best_policy")
    assert eval_cmd.main(["--workdir", str(wd), "--n", "2", "--k", "0"]) == 0
    out = capsys.readouterr().out
    assert "checkpoints/last/14" in out
    assert "no --ckpt given: the last checkpoint, since the run kept no best policy" in out
    assert "pass@1" in out and "pass@" not in out.replace("pass@1", "") and "maj@" not in out
    assert "n = 2 test problems (< 64): too few to tell policies apart" in out
    assert (wd / "evals" / "last-test.json").exists()


def test_the_final_table_and_progress_lines_can_be_judged(full_output):
    """The run's last table: 95 % interval, lift over the initial policy with its paired SE (from the per-problem
    outcomes in summary.json), pass@k with its temperature, the words for n < 64; GRPO lines show the loss's KL."""
    from rl.metrics import paired_lift

    wd, out = full_output
    summary = json.loads((wd / "summary.json").read_text())
    table = out[out.index("held-out test set after each stage"):]
    assert "lift = pass@1 - the initial policy's on the same problems, with its paired standard error" in table
    head = next(ln for ln in table.splitlines() if ln.startswith("stage "))
    assert head.split()[:8] == ["stage", "pass@1", "pass@1_se", "95%", "CI", "lift", "lift_se", "(paired)"]
    assert "pass@2 (T 0.6)" in head and "maj@2 (T 0.6)" in head
    ev = summary["eval"]
    lift, se = paired_lift(ev["initial"]["solved"], ev["grpo"]["solved"])
    row = next(ln for ln in table.splitlines() if ln.startswith("grpo "))
    assert f"{lift:+.3f}  " in row and "[{:.3f}, {:.3f}]".format(*ev["grpo"]["pass@1_ci95"]) in row
    assert "n = 8 test problems (< 64): too few to tell policies apart" in table
    grpo_lines = [ln for ln in out.splitlines() if "grpo unit" in ln and "done in" in ln and ", loss " in ln]
    assert grpo_lines and all("loss/kl " in ln and ", kl " not in ln for ln in grpo_lines)


def test_one_numbering_of_units_everywhere(full_output, capsys):
    """The best policy has one name on the console, in summary.json and in experiments.sample / eval: its unit
    within its stage from 1, and its checkpoint number (the global unit, what --ckpt takes)."""
    from experiments import sample as sample_cmd
    from rl.runs import UNIT_NUMBERING, find_policy

    wd, out = full_output
    summary = json.loads((wd / "summary.json").read_text())
    b = summary["best"]
    assert summary["numbering"] == UNIT_NUMBERING
    name = f"{b['stage']} unit {b['unit']} = checkpoint {b['global_unit']}"
    assert f"({name})" in out  # the row of the final table
    if b["val_pass@1"] == 0:  # no checkpoint was better than another: the row says which one it is
        assert f"earliest ({name})" in out and "earliest: every validation pass@1 was 0" in out and "note" in b
    else:
        assert f"best ({name})" in out and "note" not in b
    assert find_policy(str(wd), "best")[1] == b["global_unit"]  # the best copy's directory is named by it
    recs = read_jsonl(wd / "metrics.jsonl")  # the unit's validation eval was logged at that global unit
    assert any(r["step"] == b["global_unit"] and r.get("validation/pass@1") == b["val_pass@1"] for r in recs)
    assert sample_cmd.main(["--workdir", str(wd), "--prompt", "2+3", "--k", "0"]) == 0
    assert name in capsys.readouterr().out


def test_best_record_numbering_and_the_all_zero_note():
    from rl.runs import ALL_ZERO_NOTE, best_record, policy_name

    old = {"stage": "grpo", "unit": 39, "val_pass@1": 0.5, "global_unit": 82}  # written before one numbering
    new = best_record(old)
    assert new["unit"] == 40 and new["unit_base"] == 1 and "note" not in new and best_record(new) == new
    assert policy_name(old, 82) == "grpo unit 40 = checkpoint 82 (validation pass@1 0.500)"
    zero = best_record({"stage": "cold_start", "unit": 2, "unit_base": 1, "val_pass@1": 0.0, "global_unit": 2})
    assert zero["note"] == ALL_ZERO_NOTE and zero["unit"] == 2
    assert "not a better one" in policy_name(zero, 2)
    assert policy_name({"stage": 2, "unit": 3, "global_unit": 15}, 15) == "stage 3 unit 3 = checkpoint 15"


def test_resume_refuses_a_different_config(tmp_path, capsys):
    from rl.checkpoint import Checkpointer

    wd = tmp_path / "wd"
    # a written checkpoint (with its checksums) pins the config; an unfinished one does not (tests/test_workdir.py)
    Checkpointer(str(wd / "checkpoints")).save(1, {"x": np.zeros(2, np.float32)}, {"unit": 1})
    (wd / "config.json").write_text(json.dumps({"seed": 123}))
    rc = launch.main(["--config", QUICKSTART + ":variant=tiny", "--workdir", str(wd)])
    assert rc == 2
    assert "different config" in capsys.readouterr().err


def test_compute_estimate_counts():
    cfg = to_dict(launch.get_config(QUICKSTART + ":variant=tiny"))
    text, tot = preflight.compute_estimate(cv.validate(cfg))
    g, rej, e = cfg["stages"][2], cfg["stages"][1], cfg["eval"]
    N = cfg["sampling"]["max_new_tokens"]
    want_gen = (rej["rounds"] * rej["n_problems"] * rej["samples"] + g["iterations"] * g["n_prompts"] * g["samples"]) * N
    assert tot["gen_tokens"] > want_gen and "verifier calls" in text


@pytest.mark.slow
def test_sharded_mesh_run_resumes_exactly(tmp_path):
    """data x expert x tensor = 2 x 2 x 2 over the 8 forced CPU devices (tests/conftest.py)."""
    import jax

    if jax.device_count() < 8:
        raise AssertionError("tests/conftest.py should force 8 CPU devices")
    mesh = ["--config.mesh.data=2", "--config.mesh.expert=2", "--config.mesh.tensor=2", "--config.stages[2].iterations=2"]
    full, part = tmp_path / "full", tmp_path / "part"
    _run(full, *mesh)
    _run(part, *mesh, "--config.run.stop_after=12")
    _run(part, *mesh)
    assert json.loads((part / "summary.json").read_text())["eval"] == json.loads((full / "summary.json").read_text())["eval"]
    _assert_same_records(_train_records(full), _train_records(part))


def test_metrics_writer_flattens_truncates_and_tables(tmp_path):
    from rl.metrics import MetricsWriter, format_table

    w = MetricsWriter(str(tmp_path), tensorboard=True)
    for step in range(1, 5):
        w.write(step, {"loss": np.float32(step), "router": {"load": np.array([0.5, 0.25])}, "bad": float("nan")},
                stage="grpo", phase="train")
    w.close()
    recs = read_jsonl(tmp_path / "metrics.jsonl")
    assert recs[0]["loss"] == 1.0 and recs[0]["router/load/1"] == 0.25 and recs[0]["bad"] is None
    assert os.listdir(tmp_path / "tb")
    MetricsWriter(str(tmp_path), tensorboard=False, truncate_after_step=2).close()  # a resume from step 2
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
    table = format_table({"initial": {"pass@1": 0.0}, "grpo": {"pass@1": 0.5}}, ["pass@1", "pass@k"])
    assert table.splitlines()[3].split() == ["grpo", "0.500", "-"]
