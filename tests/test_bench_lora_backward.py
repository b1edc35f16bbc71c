"""experiments/bench/lora_backward.py on the tiny fixture checkpoint (a smoke run of the harness): both sides train,
the timings and their ratio are reported, and the two formulations give the same adapters up to rounding."""
from experiments.bench import lora_backward
from experiments.configs.fixtures import make_tiny_files


def test_smoke_run_on_the_tiny_checkpoint(tmp_path):
    folder = make_tiny_files()
    res = lora_backward.main(["--model", f"{folder}/model", "--reps", "1", "--json", str(tmp_path / "out.json")])
    assert set(res["median_s"]) == {"2-D products", "einsums"} and res["ratio"] > 0
    assert res["adapter_max_abs_diff"] < 1e-5
    assert (tmp_path / "out.json").exists()
