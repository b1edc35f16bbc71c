"""End-to-end trainer runs on tiny configs: files written, learning, and exact resume after a stop.

The runs go through the launcher in-process (so config.json / validation are covered too); jitted step
functions are cached per config in rl.trainer, so the later runs in this file reuse the first run's compiles.
"""
import json
import os

import numpy as np
import pytest

from experiments import launch
from rl import trainer
from rl.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments/configs/quickstart.py")

# tiny quickstart, tuned so the tiny model learns the single-digit format within the cold start
TINY = [
    "--config.stages[0].epochs=2", "--config.stages[0].n_problems=64", "--config.stages[0].lr=0.01",
    "--config.stages[1].rounds=1", "--config.stages[2].iterations=3", "--config.eval.every=2",
]


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


def test_tiny_run_writes_everything_and_resumes_exactly(tmp_path, capsys):
    full, part = tmp_path / "full", tmp_path / "part"
    _run(full)
    out = capsys.readouterr().out
    assert "compute estimate" in out and "held-out test set after each stage" in out

    summary = json.loads((full / "summary.json").read_text())
    assert set(summary) == {"eval", "wall_seconds", "config"}
    assert list(summary["eval"]) == ["initial", "cold_start", "rejection", "grpo"]
    for entry in summary["eval"].values():
        assert set(entry) == {"pass@1", "pass@k", "maj@k", "format_rate", "mean_length"}
    assert summary["eval"]["cold_start"]["format_rate"] > summary["eval"]["initial"]["format_rate"]
    cfg_json = json.loads((full / "config.json").read_text())
    assert cfg_json["stages"][2]["kind"] == "grpo"
    recs = read_jsonl(full / "metrics.jsonl")
    grpo = [r for r in recs if r.get("stage") == "grpo" and r["phase"] == "train"]
    assert len(grpo) == 3 and all("reward/mean" in r and "kl_coef" in r and "temperature" in r for r in grpo)
    rej = [r for r in recs if r.get("stage") == "rejection" and r["phase"] == "train"]
    assert "kept_share" in rej[0]
    assert os.listdir(full / "checkpoints" / "last")

    # stop after 4 units (2 SFT epochs, the rejection round, GRPO iteration 0: a sampled-ahead batch is pending)
    _run(part, "--config.run.stop_after=4")
    partial = json.loads((part / "summary.json").read_text())  # written after every finished stage
    assert list(partial["eval"]) == ["initial", "cold_start", "rejection"]
    assert "rerun the same command to resume" in capsys.readouterr().out
    _run(part)  # resume: same command (run.* may differ)
    assert "resuming from checkpoint" in capsys.readouterr().out
    resumed = json.loads((part / "summary.json").read_text())
    assert resumed["eval"] == summary["eval"]
    _assert_same_records(_train_records(full), _train_records(part))


def test_resume_refuses_a_different_config(tmp_path, capsys):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "config.json").write_text(json.dumps({"seed": 123}))
    rc = launch.main(["--config", QUICKSTART + ":variant=tiny", "--workdir", str(wd)])
    assert rc == 2
    assert "different config" in capsys.readouterr().err


def test_compute_estimate_counts():
    cfg = launch.get_config(QUICKSTART + ":variant=tiny")
    from rl.config_validation import to_dict

    text, tot = trainer.compute_estimate(to_dict(cfg))
    c = to_dict(cfg)
    g = c["stages"][2]
    N = c["sampling"]["max_new_tokens"]
    rej = c["stages"][1]
    per_eval = (c["eval"]["n_val"] + c["eval"]["n_test"]) * (1 + c["eval"]["k"])
    n_evals = 1 + 3 + g["iterations"] // c["eval"]["every"]  # initial, three stage ends, mid-GRPO
    want_gen = (rej["rounds"] * rej["n_problems"] * rej["samples"] + g["iterations"] * g["n_prompts"] * g["samples"]) * N
    assert tot["gen_tokens"] == want_gen + per_eval * N * n_evals
    assert "verifier calls" in text


@pytest.mark.slow
def test_grpo_raises_mean_reward_on_single_digit_addition(tmp_path):
    """A 20-step cold start leaves the format half-learned; GRPO on outcome + format reward must raise the reward."""
    wd = tmp_path / "learn"
    argv = ["--config", QUICKSTART + ":variant=tiny", "--workdir", str(wd),
            "--config.stages[0].epochs=5", "--config.stages[0].n_problems=64", "--config.stages[0].lr=0.01",
            "--config.stages[1].rounds=1", "--config.stages[2].iterations=16", "--config.stages[2].n_prompts=8",
            "--config.stages[2].samples=8", "--config.stages[2].lr=0.001", "--config.stages[2].kl_coef=0.0",
            "--config.reward.w_format=1.0", "--config.eval.every=0"]
    assert launch.main(argv) == 0
    grpo = [r for r in read_jsonl(wd / "metrics.jsonl") if r.get("stage") == "grpo" and r["phase"] == "train"]
    rewards = [r["reward/mean"] for r in grpo]
    assert np.mean(rewards[-4:]) > np.mean(rewards[:4]) + 0.05, rewards


@pytest.mark.slow
def test_sharded_mesh_run_resumes_exactly(tmp_path):
    """data x expert x tensor = 2 x 2 x 2 over the 8 forced CPU devices (tests/conftest.py)."""
    import jax

    if jax.device_count() < 8:
        raise AssertionError("tests/conftest.py should force 8 CPU devices")
    mesh = ["--config.mesh.data=2", "--config.mesh.expert=2", "--config.mesh.tensor=2", "--config.stages[2].iterations=2"]
    full, part = tmp_path / "full", tmp_path / "part"
    _run(full, *mesh)
    _run(part, *mesh, "--config.run.stop_after=4")
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


def test_grpo_advantages_per_group_with_mixed_group_sizes():
    """Curriculum batches mix K per problem; each contiguous group is normalised on its own (float64 reference)."""
    runner = trainer.StageRunner.__new__(trainer.StageRunner)  # only the advantage method, no model
    runner.stage = {"advantage": "grpo", "scale_by_std": True, "process_grpo": False, "step_rewards": False}
    a = {"ks": np.array([2, 2, 4]), "tokens": np.zeros((8, 5), np.int32)}
    rewards = np.array([1, 0, 1, 1, 0, 1, 1, 0], np.float64)
    got = runner._advantages(a, [""] * 8, rewards)
    want = np.zeros(8)
    for s, k in ((0, 2), (2, 2), (4, 4)):
        g = rewards[s : s + k]
        want[s : s + k] = (g - g.mean()) / (g.std(ddof=1) + 1e-6)
    assert got.shape == (8, 5)
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:, 4], want, rtol=1e-5, atol=1e-6)  # sequence advantage on every token
