"""Optional (the hf-reference extra): checkpoints written by models.hf.save load in transformers and compute the same
logits. Skipped when transformers is not importable; the default tests compare against committed fixtures instead.

    pip install -e '.[test,hf-reference]' && python -m pytest tests/test_hf_transformers.py -q
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="needs the hf-reference extra (torch + transformers)")
torch = pytest.importorskip("torch", reason="needs the hf-reference extra (torch + transformers)")

from models import hf, transformer  # noqa: E402
from models.config import ModelConfig  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

DATA = Path(__file__).parent / "data" / "hf"


def _transformers_logits(folder, tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens), dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "qwen3_moe", "mixtral", "llama"])
def test_saved_fixture_models_load_in_transformers(arch, tmp_path):
    cfg, params = hf.load(DATA / arch)
    hf.save(tmp_path, cfg, params, max_shard_bytes=30_000 if arch == "qwen3_moe" else None)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 7))
    ours = np.asarray(transformer.forward(params, jnp.asarray(tokens, jnp.int32), cfg)[0])
    np.testing.assert_allclose(_transformers_logits(tmp_path, tokens), ours, rtol=0, atol=1e-4)


@pytest.mark.parametrize("cfg", [
    # from-scratch style: tied, scaled embeddings (written as an explicit lm_head), one dense block, q/k norm
    ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=4,
                experts_per_token=2, moe_every=1, dense_layers=(0,), expert_d_ff=8, qk_norm=True),
    # dense llama with untied embeddings
    ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=4, n_kv_heads=1, head_dim=4, d_ff=24, n_experts=0,
                tie_embeddings=False, rope_theta=5e5, norm_eps=1e-5),
    # bfloat16 parameters are written as BF16 tensors
    ModelConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=0,
                attn_bias=True, tie_embeddings=True, scale_tied_unembed=False, param_dtype="bfloat16"),
])
def test_native_models_round_trip_through_transformers(cfg, tmp_path):
    params = transformer.init(cfg, jax.random.key(0))
    if cfg.attn_bias:  # non-zero biases, so a dropped bias would show
        params["block_0"]["attn"]["bq"] = jnp.full_like(params["block_0"]["attn"]["bq"], 0.5)
    model_type = hf.save(tmp_path, cfg, params)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, 6))
    ours = np.asarray(transformer.forward(params, jnp.asarray(tokens, jnp.int32), cfg.replace(dtype="float32"))[0])
    theirs = _transformers_logits(tmp_path, tokens)
    assert transformers.AutoConfig.from_pretrained(tmp_path).model_type == model_type
    np.testing.assert_allclose(theirs, ours, rtol=0, atol=1e-4)
