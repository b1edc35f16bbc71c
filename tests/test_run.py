"""End-to-end runs of the tiny quickstart through the launcher: files written, every stage trains, the estimator
fixes hold in the logged metrics (sampler / trainer match, even steps, exact lr schedule), best-by-validation,
exact resume after a stop, and determinism on one machine.

The runs go through the launcher in-process (config.json / validation are covered too); jitted functions are
cached per config in rl.context, so later runs in this file reuse the first run's compiles.
"""
import json
import os

import numpy as np
import pytest

from experiments import launch
from rl import preflight
from rl.config_validation import to_dict
from rl.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments/configs/quickstart.py")
# sampling at 0.6 with zero-variance filtering on: the setting the checks name
TINY = ["--config.stages[2].temperature_start=0.6", "--config.stages[2].temperature_end=0.6"]


def _run(workdir, *extra):
    argv = ["--config", QUICKSTART + ":variant=tiny", "--workdir", str(workdir), *TINY, *extra]
    assert launch.main(argv) == 0


def _train_records(workdir):
    """Train-phase metrics without wall-clock fields (those differ between any two runs)."""
    out = []
    for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
        if r.get("phase") != "train":
            continue
        out.append({k: v for k, v in r.items() if k != "time" and "time" not in k and "per_s" not in k})
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
def full_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("full")
    _run(wd)
    return wd


def test_tiny_run_writes_everything(full_run, capsys):
    summary = json.loads((full_run / "summary.json").read_text())
    assert set(summary) == {"eval", "best", "wall_seconds", "config"}
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
    evals = [r for r in recs if r["phase"] == "eval" and r.get("stage") == "cold_start"]
    assert len(evals) >= 3  # validation every 2 SFT epochs, plus the stage end: a curve for the cold start


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
    _assert_same_records(_train_records(full_run), _train_records(part))


def test_same_command_same_numbers(full_run, tmp_path):
    """Two runs of one command on one machine give the identical summary (wall time aside)."""
    again = tmp_path / "again"
    _run(again)
    a = json.loads((full_run / "summary.json").read_text())
    b = json.loads((again / "summary.json").read_text())
    assert a["eval"] == b["eval"] and a["best"] == b["best"]


def test_resume_refuses_a_different_config(tmp_path, capsys):
    wd = tmp_path / "wd"
    (wd / "checkpoints").mkdir(parents=True)
    (wd / "config.json").write_text(json.dumps({"seed": 123}))
    rc = launch.main(["--config", QUICKSTART + ":variant=tiny", "--workdir", str(wd)])
    assert rc == 2
    assert "different config" in capsys.readouterr().err


def test_compute_estimate_counts():
    cfg = to_dict(launch.get_config(QUICKSTART + ":variant=tiny"))
    text, tot = preflight.compute_estimate(cfg)
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
