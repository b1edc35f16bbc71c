"""LoRA on a bfloat16 base (issue 52, item 7): a small adapter update (B = 1e-3) changes the logits in the trainer's
forward (attach: low-rank attention / MLP targets, merged routed experts) and in the sampler's decode view
(transformer.decode_params: every target merged), and the two agree with the same base held in float32; the
low-rank projection adds its update in float32 before the one cast to bfloat16 activations."""
import jax
import jax.numpy as jnp
import numpy as np

from models import layers, lora, transformer
from models.config import ModelConfig

TARGETS = ("attn/wq", "attn/wk", "attn/wv", "attn/wo", "mlp/w_gate", "mlp/w_up", "mlp/w_down", "moe/w_gate",
           "moe/w_up", "moe/w_down")
# Block 0 dense, block 1 MoE: the low-rank targets and the merged experts' alike.
CFG = ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=4,
                  experts_per_token=2, moe_every=2, max_seq_len=16, param_dtype="bfloat16",
                  lora=dict(rank=4, alpha=8.0, targets=TARGETS))
FWD = jax.jit(transformer.forward, static_argnames=("cfg",))


def _with_b(adapters, value):
    return jax.tree_util.tree_map_with_path(lambda path, x: jnp.full_like(x, value) if path[-1].key == "b" else x,
                                            adapters)


def test_small_update_moves_trainer_and_sampler_logits_on_a_bf16_base():
    base = transformer.init(CFG, jax.random.key(0))
    assert base["stack_0"]["attn"]["wq"].dtype == jnp.bfloat16
    adapters = lora.init(base, CFG, jax.random.key(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 7)), jnp.int32)

    def trainer(ad):
        return np.asarray(FWD(lora.attach(base, ad, CFG), tokens, cfg=CFG)[0], np.float64)

    def sampler(ad):
        return np.asarray(FWD(transformer.decode_params(lora.attach(base, ad, CFG), CFG), tokens, cfg=CFG)[0],
                          np.float64)

    # the reference: the same bfloat16 values held in float32, merged in float32
    cfg32 = CFG.replace(param_dtype="float32")
    base32 = jax.tree.map(lambda x: x.astype(jnp.float32), base)

    def reference(ad):
        return np.asarray(FWD(lora.merge(base32, ad, cfg32), tokens, cfg=cfg32)[0], np.float64)

    small = _with_b(adapters, 1e-3)
    want = reference(small) - reference(adapters)
    assert np.abs(want).max() > 1e-3  # the update matters in float32
    for run in (trainer, sampler):
        got = run(small) - run(adapters)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-3 * np.abs(want).max())


def test_low_rank_projection_adds_its_update_before_the_bf16_cast():
    """bfloat16 activations, outputs near 4-8 (a last place of 2^-5): an update of ~1e-3 added in bfloat16 changed
    no output; added in float32 before the one cast it moves the outputs its size says it should."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0.5, 1.0, (64, 16)), jnp.bfloat16)
    w = jnp.asarray(rng.uniform(0.5, 1.0, (16, 8)) / 2, jnp.bfloat16)
    a = jnp.asarray(rng.uniform(0.0, 0.1, (16, 2)), jnp.float32)
    b = jnp.full((2, 8), 1e-3, jnp.float32)
    y0 = np.asarray(layers.project("nd,df->nf", x, layers.LowRank(w, a, jnp.zeros_like(b), 2.0)), np.float64)
    y1 = np.asarray(layers.project("nd,df->nf", x, layers.LowRank(w, a, b, 2.0)), np.float64)
    f = lambda v: np.asarray(v, np.float64)  # noqa: E731
    exact0 = f(x) @ f(w)
    exact1 = exact0 + 2.0 * (f(x) @ f(a)) @ f(b)
    ulp = 2.0 ** (np.floor(np.log2(np.abs(exact1))) - 7)
    assert np.all(np.abs(y1 - exact1) <= ulp / 2 + 1e-12) and np.all(np.abs(y0 - exact0) <= ulp / 2 + 1e-12)
    assert (y1 != y0).mean() > 0.05  # about update / last place of the outputs change
