"""experiments/bench/gpu.py: the --smoke mode runs the whole benchmark (bf16 matmul peak, GRPO train step, batch
decode) on a tiny config on the CPU; its FLOP accounting is checked against a count of the real parameter arrays."""

import json

import jax
import numpy as np
import pytest

from experiments.bench import gpu
from models import layer_stack, transformer
from models.config import ModelConfig


def _matmul_weights_per_token(cfg: ModelConfig) -> int:
    """Weights a token multiplies, counted from the arrays init creates: attention projections, the router, k of the
    E experts (each expert's three matrices), the untied unembedding. The input embedding is a lookup; norms are
    elementwise."""
    params = layer_stack.per_layer(transformer.init(cfg, jax.random.key(0)), cfg)
    total = params["unembed"].size
    for i in range(cfg.n_layers):
        block = params[f"block_{i}"]
        total += sum(block["attn"][name].size for name in ("wq", "wk", "wv", "wo"))
        if "moe" in block:
            moe = block["moe"]
            total += moe["router"].size
            total += sum(moe[name].size for name in ("w_gate", "w_up", "w_down")) * cfg.experts_per_token // cfg.n_experts
        else:
            total += sum(block["mlp"][name].size for name in ("w_gate", "w_up", "w_down"))
    return total


def test_smoke_run_on_cpu(tmp_path, capsys):
    path = tmp_path / "gpu.json"
    res = gpu.main(["--smoke", "--json", str(path)])
    assert json.loads(path.read_text())["train"]["mfu"] == pytest.approx(res["train"]["mfu"])
    printed = capsys.readouterr().out
    assert "model FLOPs utilisation" in printed and "decode, batch 8" in printed

    cfg = ModelConfig(**res["model"])
    assert cfg.dtype == "bfloat16"
    tr, dec, run = res["train"], res["decode"], res["run"]
    # model FLOPs (models/flops.py): 6 x matmul weights per token + 12 x layers x heads x head_dim per causal
    # (query, key) pair, seq (seq + 1) / 2 pairs per row, over batch x seq tokens
    per_row = (6 * _matmul_weights_per_token(cfg) * run["seq"]
               + 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * run["seq"] * (run["seq"] + 1) / 2)
    assert tr["model_flops_per_step"] == pytest.approx(float(run["batch"] * per_row), rel=1e-12)
    assert tr["tokens_per_step"] == run["batch"] * run["seq"]
    assert tr["tokens_per_s"] == pytest.approx(tr["tokens_per_step"] / tr["step_s"])
    assert tr["mfu"] == pytest.approx(tr["model_flops_per_step"] / tr["step_s"] / 1e12 / res["peak"]["tflops"])
    assert res["peak"]["tflops"] == max(res["peak"]["before"]["tflops"], res["peak"]["after"]["tflops"]) > 0
    assert np.isfinite(tr["loss"]) and tr["skipped"] == 0 and tr["mfu"] > 0
    assert dec["tokens_per_s"] == pytest.approx(dec["batch"] * dec["new_tokens"] / dec["seconds"])


def test_full_run_refuses_the_cpu():
    if jax.default_backend() != "cpu":
        pytest.fail("this test expects the CPU backend forced by tests/conftest.py")
    with pytest.raises(RuntimeError, match="needs a GPU"):
        gpu.run(smoke=False)
