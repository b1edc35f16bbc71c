"""models/slot_sampling.py: continuous batching gives sampling.generate's rows (same tokens for the same keys, the
sampling being per-row deterministic), whatever the number of slots, refill size and prompt order; rows that end
early free their slot for the queue; the ring cache wraps without a row seeing another row's or its own old tokens."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import sampling, slot_sampling, transformer
from models.config import ModelConfig

jax.config.update("jax_default_matmul_precision", "highest")

CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, n_experts=0,
                  max_seq_len=64)
MOE = CFG.replace(n_experts=4, experts_per_token=2, moe_every=1)


def _prompts(U=5, P=7, seed=0):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(3, CFG.vocab_size, (U, P)).astype(np.int32)
    mask = np.ones((U, P), np.int32)
    for u in range(U):
        mask[u, : rng.integers(0, P - 1)] = 0  # left padding of various lengths
    return prompts, mask


def _static(params, cfg, prompts, mask, rows, key, **kw):
    """generate on the repeated rows in one call: row r's stream is fold_in(fold_in(key, r), step)."""
    return sampling.generate(params, cfg, prompts[rows], key, prompt_mask=mask[rows], **kw)


@pytest.mark.parametrize("cfg, temperature, slots, refill", [
    (CFG, 0.0, 4, 2),  # greedy, fewer slots than rows: the queue refills freed slots
    pytest.param(CFG, 1.0, 3, 3, marks=pytest.mark.slow),  # suite time: cfg0 / cfg3 refill the same way
    (CFG, 0.8, 16, 16),  # every row at once: one refill, one decode
    (MOE, 1.0, 5, 2),
])
def test_continuous_equals_static_rows(cfg, temperature, slots, refill):
    params = transformer.init(cfg, jax.random.key(1))
    prompts, mask = _prompts()
    rows = np.repeat(np.arange(5), [3, 1, 2, 4, 2])  # groups of answers per prompt, kept together
    key = jax.random.key(7)
    kw = dict(max_new_tokens=9, temperature=temperature, eos_id=[5, 6], pad_id=0)
    want = _static(params, cfg, prompts, mask, rows, key, **kw)
    got = slot_sampling.generate_slots(params, cfg, prompts, key,
                                       row_prompt=rows, prompt_mask=mask, slots=slots, refill=refill, **kw)
    np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(want.lengths))
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), rtol=0, atol=2e-5)
    assert np.asarray(want.lengths).min() < 9 < np.asarray(want.lengths).max() + 1  # some rows end early


def test_rows_sampled_in_any_order_are_the_same_rows():
    """A row's tokens depend on its index, not on when a slot serves it: reversing the queue reverses the output."""
    params = transformer.init(CFG, jax.random.key(2))
    prompts, mask = _prompts(seed=3)
    rows = np.array([0, 1, 2, 3, 4, 0, 1])
    kw = dict(max_new_tokens=12, temperature=1.0, eos_id=5, pad_id=0, slots=3, refill=1)
    a = slot_sampling.generate_slots(params, CFG, prompts, jax.random.key(3), row_prompt=rows, prompt_mask=mask, **kw)
    b = slot_sampling.generate_slots(params, CFG, prompts, jax.random.key(3), row_prompt=rows, prompt_mask=mask,
                                     **{**kw, "slots": 7, "refill": 7})
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


def test_ring_wraps_many_times_and_long_rows_are_exact():
    """Twenty rows through two slots: the write slot wraps the ring many times; every row still matches a fresh
    static sample (it sees only its own prompt and tokens)."""
    params = transformer.init(CFG, jax.random.key(4))
    prompts, mask = _prompts(U=4, seed=5)
    rows = np.arange(20) % 4
    kw = dict(max_new_tokens=15, temperature=1.0, eos_id=-1, pad_id=0)
    want = _static(params, CFG, prompts, mask, rows, jax.random.key(5), **kw)
    got = slot_sampling.generate_slots(params, CFG, prompts, jax.random.key(5), row_prompt=rows, prompt_mask=mask,
                                       slots=2, refill=1, **kw)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), rtol=0, atol=2e-5)


def test_bad_rows_are_refused():
    params = transformer.init(CFG, jax.random.key(0))
    prompts, mask = _prompts()
    with pytest.raises(ValueError, match="row_prompt"):
        slot_sampling.generate_slots(params, CFG, prompts, jax.random.key(0), row_prompt=[0, 9], prompt_mask=mask,
                                     max_new_tokens=8)


def test_per_row_temperatures_greedy_and_samples_in_one_call():
    """A greedy answer and k samples of each prompt in one call (evaluation's draw): each row as generate gives it at
    its own temperature, the greedy rows exactly the greedy call's."""
    params = transformer.init(CFG, jax.random.key(8))
    prompts, mask = _prompts(U=3, seed=9)
    k = 3
    rows = np.repeat(np.arange(3), 1 + k)
    temps = np.tile([0.0] + [0.9] * k, 3).astype(np.float32)
    kw = dict(max_new_tokens=10, eos_id=5, pad_id=0)
    want = _static(params, CFG, prompts, mask, rows, jax.random.key(9), temperature=temps, **kw)
    got = slot_sampling.generate_slots(params, CFG, prompts, jax.random.key(9), row_prompt=rows, prompt_mask=mask,
                                       temperature=temps, slots=4, refill=4, **kw)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    greedy = sampling.generate(params, CFG, prompts, jax.random.key(0), prompt_mask=mask, temperature=0.0, **kw)
    np.testing.assert_array_equal(np.asarray(got.tokens)[:: 1 + k], np.asarray(greedy.tokens))
    with pytest.raises(ValueError, match="temperature"):
        slot_sampling.generate_slots(params, CFG, prompts, jax.random.key(9), row_prompt=rows, prompt_mask=mask,
                                     temperature=temps[:-1], **kw)
