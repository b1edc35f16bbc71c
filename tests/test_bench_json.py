"""Every bench script writes its figures with --json PATH (the same numbers it prints); smoke-sized runs of the
cheap ones (the reward pool in the default run; the model benchmarks compile a W1-sized model: slow). gpu.py,
w1.py, moe_ep.py, verify.py, grad_variance.py and sft_buckets.py have their own tests."""
import json

import pytest


def test_reward_pool_json(tmp_path):
    from experiments.bench import reward_pool

    res = reward_pool.main(["--n", "40", "--workers", "1", "--rounds", "1", "--json", str(tmp_path / "r.json")])
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["single"] == pytest.approx(res["single"]) and saved["pairs"] == 40
    assert list(saved["pools"]) == ["1"] and saved["errors"] == {"1": 0}


@pytest.mark.slow
def test_profile_w1_json(tmp_path):
    from experiments.bench import profile_w1

    profile_w1.main(["--rows", "2", "--reps", "1", "--parts", "moe", "--json", str(tmp_path / "p.json")])
    saved = json.loads((tmp_path / "p.json").read_text())
    assert list(saved["parts"]) == ["1 MoE layer fwd+bwd"] and saved["parts"]["1 MoE layer fwd+bwd"]["wall_s"] > 0
    assert saved["matmul_peak"]["peak_gflops"] > 0


@pytest.mark.slow
def test_grpo_step_json(tmp_path):
    from experiments.bench import grpo_step

    res = grpo_step.main(["--quick", "--shapes", "w1", "--json", str(tmp_path / "g.json")])
    saved = json.loads((tmp_path / "g.json").read_text())
    assert saved["shapes"][0]["shape"] == "w1" and saved["shapes"][0]["step_s"] == pytest.approx(res[0]["step_s"])
