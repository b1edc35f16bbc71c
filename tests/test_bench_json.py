"""Every bench script writes its figures with --json PATH (the same numbers it prints); smoke-sized runs of the
cheap ones (the reward pool, page_reuse.py at 10 MiB and profile_w1's decode-MoE parts in the default run; the model
benchmarks compile a W1-sized model, moe_ep.py three 8-device programs, verify.py starts a sympy pool: slow). gpu.py,
w1.py and sft_buckets.py have their own tests; stage_layout.py runs the launcher twice (slow). grad_variance.py needs
a trained run's checkpoint and has no smoke mode."""
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


def test_profile_w1_weight_reads(tmp_path):
    """The decode-MoE part times our layer and the NumPy peer on the same routed rows (the script checks that both
    compute the same outputs) and relates both to the read-bandwidth floor."""
    from experiments.bench import profile_w1

    profile_w1.main(["--reps", "1", "--parts", "decode_moe", "--json", str(tmp_path / "p.json")])
    w = json.loads((tmp_path / "p.json").read_text())["weight_reads"]
    assert w["read_gb_s"]["jax"] > 0 and w["read_gb_s"]["numpy"] > 0
    assert w["experts_used"] == 8 and w["expert_mib"] == pytest.approx(12.0)  # 3 x 8 x 256 x 512 float32
    assert w["ours_s"] > 0 and w["numpy_s"] > 0 and w["floor_s"] > 0
    assert w["ours_over_numpy"] == pytest.approx(w["ours_s"] / w["numpy_s"])


@pytest.mark.slow
def test_stage_layout_json(tmp_path):
    """The launcher's GRPO stage flat then grouped: both really trained, the grouped run in the grouped layout."""
    from experiments.bench import stage_layout

    res = stage_layout.main(["--quick", "--reps", "1", "--iterations", "2", "--json", str(tmp_path / "s.json")])
    saved = json.loads((tmp_path / "s.json").read_text())
    assert [r["grouped"] for r in saved["runs"]] == [0.0, 1.0]
    assert all(r["optimizer_steps"] >= 1 and r["train_s"] > 0 for r in saved["runs"])
    assert saved["train_s_ratio"] == pytest.approx(res["train_s_ratio"])


def test_profile_w1_decode_loop(tmp_path):
    """The decode-loop part runs every MoE layer per step with its own weights, with layer 0's everywhere, and the
    NumPy peer (its own routing) over the same weights, and reports ms per layer and step for each."""
    from experiments.bench import profile_w1

    profile_w1.main(["--reps", "1", "--parts", "decode_loop", "--decode_steps", "2", "--json", str(tmp_path / "p.json")])
    d = json.loads((tmp_path / "p.json").read_text())["decode_loop"]
    assert d["steps"] == 2 and d["moe_layers"] == 4 and d["layer_weight_mib"] == pytest.approx(12.0)
    assert d["cycled_ms"] > 0 and d["cached_ms"] > 0 and d["numpy_cycled_ms"] > 0
    assert d["cycled_over_cached"] == pytest.approx(d["cycled_ms"] / d["cached_ms"])


def test_native_moe_bench_quick(tmp_path):
    """The kernels' A/B runs every arm of its four tables; the native results agree with XLA's."""
    from experiments.bench import native_moe as bench
    from models.cpu import native_kernels

    if not native_kernels.available():
        pytest.skip("no C++ compiler to build the native kernel")
    bench.main(["--quick", "--json", str(tmp_path / "n.json")])
    d = json.loads((tmp_path / "n.json").read_text())
    assert [r["arm"] for r in d["decode_loop"]] == ["native", "windowed"]
    assert [r["arm"] for r in d["forward"]] == ["native", "windowed", "blocked"]
    assert [r["arm"] for r in d["attention"]] == ["native", "xla"]
    assert all(r["ms_per_layer_step"] > 0 and r["max_abs_diff_vs_xla"] < 1e-4 for r in d["attention"])
    assert all(r["ms"] > 0 and r["gflops"] > 0 for r in d["forward"] + d["fwd_bwd"])
    assert all(r["max_rel_diff_vs_blocked"] < 1e-4 for r in d["fwd_bwd"])


@pytest.mark.slow
def test_moe_ep_json(tmp_path):
    """The expert-parallel bench on the 8 forced CPU devices (conftest): three variants, the all-to-all in ours."""
    from experiments.bench import moe_ep

    moe_ep.main(["--quick", "--json", str(tmp_path / "m.json")])
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["config"]["mesh"] == {"data": 2, "expert": 4}
    assert saved["machine"]["devices"] == 8
    assert saved["ep"]["collectives"]["all-to-all"] > 0 and saved["single"]["collectives"]["all-to-all"] == 0
    assert saved["ep"]["max_rel_diff_vs_single"] < 1e-4 and saved["ratio_ep_over_single"] > 0


@pytest.mark.slow
def test_verify_bench_json(tmp_path):
    from experiments.bench import verify

    report = verify.main(["--quick", "--workers", "1", "--json", str(tmp_path / "v.json")])
    saved = json.loads((tmp_path / "v.json").read_text())
    assert saved.keys() == report.keys() and saved


def test_page_reuse_json(tmp_path):
    """The page-reuse bench times one allocate-and-touch per delay and records the VM's memory settings."""
    from experiments.bench import page_reuse

    res = page_reuse.main(["--gib", "0.01", "--delays", "0", "0.01", "--json", str(tmp_path / "p.json")])
    saved = json.loads((tmp_path / "p.json").read_text())
    assert [r["delay_s"] for r in saved["rounds"]] == [0.0, 0.01] == [r["delay_s"] for r in res["rounds"]]
    assert all(r["wall_s"] > 0 and r["sys_s"] >= 0 for r in saved["rounds"])
    assert set(saved["machine"]) >= {"cpu", "thp", "balloon_free_page_reporting", "page_reporting_order"}
