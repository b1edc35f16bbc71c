"""The dry run's time estimate (rl/time_estimate.py) and the machine calibration it stands on (rl/calibration.py):
the cache is keyed by machine and code, the matmul rate interpolates the measured points, and each phase grows with
the work it names. tests/test_run.py holds the estimate against a real tiny run (within 2x)."""
import json

import numpy as np
import pytest

from experiments.configs import quickstart
from rl import calibration, preflight, time_estimate
from rl import config_validation as cv
from rl.setup import build_model_cfg

CAL = {"matmul_gflops": {"8": 10.0, "64": 40.0, "512": 100.0, "4096": 200.0}, "bandwidth_gbs": 20.0,
       "loop_op_s": 1e-6, "dispatch_s": 1e-5, "compile_s": 0.5}


def _cfg(**over):
    cfg = quickstart.get_config("variant=tiny")
    for path, value in over.items():
        node = cfg
        *parents, last = path.split(".")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[last] = value
    cfg = cv.validate(cfg)
    return cfg, build_model_cfg(cfg)


def test_cache_is_reused_for_the_same_machine_and_remeasured_for_another(tmp_path, monkeypatch):
    path = str(tmp_path / "cal.json")
    calls = []
    monkeypatch.setattr(calibration, "measure", lambda: calls.append(1) or dict(CAL))
    assert calibration.load(path) == CAL and len(calls) == 1
    assert calibration.load(path) == CAL and len(calls) == 1  # read back, not measured
    data = json.loads(open(path).read())
    data["key"]["cpu"] = {"model_name": "another CPU"}
    open(path, "w").write(json.dumps(data))
    calibration.load(path)
    assert len(calls) == 2  # another machine's figures are not used
    calibration.load(path, refresh=True)
    assert len(calls) == 3
    open(path, "w").write("{not json")
    calibration.load(path)
    assert len(calls) == 4  # a damaged file is measured again, not an error


def test_an_unwritable_cache_only_loses_the_caching(tmp_path, monkeypatch):
    monkeypatch.setattr(calibration, "measure", lambda: dict(CAL))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert calibration.load(str(blocker / "sub" / "cal.json")) == CAL


def test_matmul_rate_interpolates_log_log_and_is_flat_beyond_the_points():
    assert calibration.matmul_rate(CAL, 64) == pytest.approx(40e9)
    assert calibration.matmul_rate(CAL, 1) == pytest.approx(10e9)
    assert calibration.matmul_rate(CAL, 10**6) == pytest.approx(200e9)
    mid = calibration.matmul_rate(CAL, 8 * 8**0.5)  # halfway between 8 and 64 in log space
    assert mid == pytest.approx(np.sqrt(10.0 * 40.0) * 1e9)


def test_measure_returns_positive_figures():
    figs = calibration.measure(reps=1)
    assert set(figs["matmul_gflops"]) == {str(r) for r in calibration.MATMUL_ROWS}
    assert all(v > 0 for v in figs["matmul_gflops"].values())
    for k in ("bandwidth_gbs", "loop_op_s", "dispatch_s", "compile_s"):
        assert figs[k] > 0, k


def test_each_phase_grows_with_its_work():
    base_cfg, m = _cfg()
    base = time_estimate.estimate(base_cfg, m, CAL)
    grpo = [s for s in base["stages"] if s["kind"] == "grpo"][0]
    i = [s["kind"] for s in base["stages"]].index("grpo")
    more_units = time_estimate.estimate(_cfg(**{f"stages.{i}.iterations": 2 * grpo["units"]})[0], m, CAL)
    g2 = more_units["stages"][i]
    assert g2["stage_s"] == pytest.approx(2 * grpo["stage_s"])
    longer = time_estimate.estimate(_cfg(**{"sampling.max_new_tokens": 48, "tasks.max_prompt_len": 48,
                                            "model.max_seq_len": 96})[0], m, CAL)
    assert longer["stages"][i]["parts"]["sampling"] > grpo["parts"]["sampling"]
    assert longer["eval_s"] > base["eval_s"]
    more_eval = time_estimate.estimate(_cfg(**{"eval.k": base_cfg.eval.k + 4})[0], m, CAL)
    assert more_eval["eval_s"] > base["eval_s"]
    assert base["total_s"] > base["total_warm_s"] > 0
    work = sum(s["stage_s"] for s in base["stages"]) + base["evals_s"]
    assert base["total_s"] == pytest.approx(work + base["compile_s"])
    # mid-stage evaluations are validation-only and the best policy's test-only: never more than full ones
    assert 0 < base["evals_s"] <= base["n_evals"] * base["eval_s"]
    assert more_eval["evals_s"] > base["evals_s"]


def test_faster_machine_shorter_estimate():
    cfg, m = _cfg()
    fast = {**CAL, "matmul_gflops": {k: 4 * v for k, v in CAL["matmul_gflops"].items()}, "bandwidth_gbs": 80.0,
            "loop_op_s": CAL["loop_op_s"] / 4, "compile_s": CAL["compile_s"] / 4}
    a, b = time_estimate.estimate(cfg, m, CAL), time_estimate.estimate(cfg, m, fast)
    assert b["total_s"] < a["total_s"]
    assert b["compile_s"] == pytest.approx(a["compile_s"] / 4)


def test_evaluations_counted_as_the_run_does():
    cfg, m = _cfg()
    est = time_estimate.estimate(cfg, m, CAL)
    e = cfg.eval
    mids = sum((s.units - 1) // e.every if e.every else 0 for s in cfg.stages)
    assert est["n_evals"] == int(e.initial) + len(cfg.stages) + mids + int(cfg.checkpoint.keep_best)
    per = 1 + e.k  # initial and stage ends: validation + test; mid-stage: validation; best policy: test
    want = per * ((e.n_val + e.n_test) * (int(e.initial) + len(cfg.stages)) + e.n_val * mids
                  + e.n_test * int(cfg.checkpoint.keep_best))
    assert sum(a for a, _ in time_estimate.evaluations(cfg)) == want
    assert preflight.compute_estimate(cfg)[1]["verifier_calls"] >= want  # the launcher's counts the same answers


def test_dry_run_text_names_every_phase(monkeypatch, tmp_path):
    monkeypatch.setenv("MATHRL_CALIBRATION", str(tmp_path / "cal.json"))
    monkeypatch.setattr(calibration, "measure", lambda: dict(CAL))
    cfg, m = _cfg()
    text, est = preflight.time_estimate(cfg, m)
    for s in cfg.stages:
        assert s.stage.name in text
    assert "evaluations" in text and "compiling" in text and "total" in text
    assert est["total_s"] > 0


def test_parallel_runs_share_the_cores_for_compute_and_overlap_compiles():
    cfg, m = _cfg()
    est = time_estimate.estimate(cfg, m, CAL)
    serial = est["compile_s"] + sum(st["parts"]["host"] * st["units"] for st in est["stages"])
    compute = est["total_s"] - serial
    one = time_estimate.parallel_wall([est] * 4, 1, cores=2)
    assert one == pytest.approx(4 * est["total_s"])
    four = time_estimate.parallel_wall([est] * 4, 4, cores=2)
    assert four == pytest.approx(max(est["total_s"], 4 * compute + 4 * serial / 2))
    assert time_estimate.parallel_wall([est], 8, cores=2) == pytest.approx(est["total_s"])  # never below one run
    assert time_estimate.parallel_wall([], 2, cores=2) == 0.0
