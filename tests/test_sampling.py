"""Sampler: cached decoding vs a full forward, padding invariance, keys, EOS, filters, logprobs.

References are independent of the sampler: a full-sequence forward (no cache) over
prompt + generated tokens, with log-softmax and the top-k / top-p sets recomputed in
float64 NumPy.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import sampling, transformer
from models.config import ModelConfig
from models.tokenizer import ByteTokenizer

# Tiny dropless MoE (every second block) so cached decoding is exactly the full forward.
CFG = ModelConfig(
    vocab_size=259, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
    n_experts=4, experts_per_token=2, moe_every=2, n_shared_experts=0, capacity_factor=None,
    max_seq_len=64, dtype="float32", param_dtype="float32", tie_embeddings=False,
)
N_NEW = 10
K = 2  # samples per prompt; one value everywhere keeps the number of compilations small
TOK = ByteTokenizer()
# The two short prompts have the same byte length, so running each alone needs one compilation.
PROMPTS = ["答案", "12+30=", "问题：3×4？"]


@pytest.fixture(scope="module")
def params():
    return transformer.init(CFG, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def batch():
    ids, mask = TOK.encode_batch(PROMPTS, pad_left=True)
    return jnp.asarray(ids), jnp.asarray(mask)


_jit_forward = jax.jit(transformer.forward, static_argnums=2)


def _log_softmax64(logits, temperature):
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _full_forward_logprobs(params, prompts, mask, out, num_samples, temperature):
    """Float64 log-softmax(logits / T) of each generated token, from ONE uncached forward
    over [left-padded prompt ; generated tokens]. Returns [B*K, N]."""
    prompts = np.repeat(np.asarray(prompts), num_samples, axis=0)
    mask = np.repeat(np.asarray(mask), num_samples, axis=0)
    tokens = np.asarray(out.tokens)
    n = tokens.shape[1]
    gen_mask = (np.arange(n)[None, :] < np.asarray(out.lengths)[:, None]).astype(np.int32)
    seq = np.concatenate([prompts, tokens], axis=1)
    seq_mask = np.concatenate([mask, gen_mask], axis=1)
    positions = np.maximum(np.cumsum(seq_mask, axis=1) - 1, 0)
    logits, _ = _jit_forward(params, jnp.asarray(seq), CFG, positions=jnp.asarray(positions),
                             attn_mask=jnp.asarray(seq_mask))
    p = prompts.shape[1]
    # logits at slot p-1+i predict generated token i
    logp = _log_softmax64(np.asarray(logits)[:, p - 1 : p - 1 + n], temperature)
    return np.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0], gen_mask


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_cached_decoding_matches_full_forward(params, batch, temperature, top_p):
    ids, mask = batch
    out = sampling.generate(params, CFG, ids, jax.random.PRNGKey(1), prompt_mask=mask, num_samples=K,
                            max_new_tokens=N_NEW, temperature=temperature, top_p=top_p, eos_id=-1)
    assert out.tokens.shape == (3 * K, N_NEW) and out.tokens.dtype == jnp.int32
    assert out.logprobs.dtype == jnp.float32
    np.testing.assert_array_equal(out.lengths, N_NEW)
    ref, _ = _full_forward_logprobs(params, ids, mask, out, K, temperature)
    np.testing.assert_allclose(np.asarray(out.logprobs), ref, atol=1e-5, rtol=1e-5)


def test_greedy_padded_batch_equals_each_prompt_alone(params, batch):
    ids, mask = batch
    together = sampling.generate(params, CFG, ids, jax.random.PRNGKey(0), prompt_mask=mask, num_samples=K,
                                 max_new_tokens=N_NEW, temperature=0.0, eos_id=-1)
    # greedy: the K copies of a prompt agree
    np.testing.assert_array_equal(together.tokens[0::K], together.tokens[1::K])
    # the two shorter prompts are left-padded in the batch; alone they have no padding
    for row, text in enumerate(PROMPTS[:2]):
        alone_ids, _ = TOK.encode_batch([text])
        alone = sampling.generate(params, CFG, alone_ids, jax.random.PRNGKey(5), num_samples=K,
                                  max_new_tokens=N_NEW, temperature=0.0, eos_id=-1)
        np.testing.assert_array_equal(together.tokens[row * K], alone.tokens[0])
        np.testing.assert_allclose(together.logprobs[row * K], alone.logprobs[0], atol=1e-5)
    # greedy logprobs are under T = 1 and the greedy token is each step's argmax
    ref, _ = _full_forward_logprobs(params, ids, mask, together, K, 1.0)
    np.testing.assert_allclose(np.asarray(together.logprobs), ref, atol=1e-5, rtol=1e-5)


def test_same_key_same_output_different_key_different(params, batch):
    ids, mask = batch
    gen = lambda k: sampling.generate(params, CFG, ids, jax.random.PRNGKey(k), prompt_mask=mask,
                                      num_samples=K, max_new_tokens=N_NEW, eos_id=-1)
    a, b, c = gen(3), gen(3), gen(4)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    assert not np.array_equal(a.tokens, c.tokens)
    # the K samples of one prompt are independent draws, not copies
    assert not np.array_equal(a.tokens[0], a.tokens[1])


def test_top_k_one_and_tiny_top_p_equal_greedy(params, batch):
    ids, mask = batch
    common = dict(prompt_mask=mask, num_samples=K, max_new_tokens=N_NEW, eos_id=-1)
    greedy = sampling.generate(params, CFG, ids, jax.random.PRNGKey(0), temperature=0.0, **common)
    top1 = sampling.generate(params, CFG, ids, jax.random.PRNGKey(9), temperature=1.0, top_k=1, **common)
    nucleus = sampling.generate(params, CFG, ids, jax.random.PRNGKey(9), temperature=1.0, top_p=1e-6, **common)
    np.testing.assert_array_equal(top1.tokens, greedy.tokens)
    np.testing.assert_array_equal(nucleus.tokens, greedy.tokens)
    # same tokens at T = 1 -> same logprobs (under the untruncated softmax)
    np.testing.assert_allclose(top1.logprobs, greedy.logprobs, atol=1e-6)


def test_no_recompile_across_temperatures(params, batch):
    ids, mask = batch
    for t in (0.0, 0.5, 1.3):
        sampling.generate(params, CFG, ids, jax.random.PRNGKey(0), prompt_mask=mask, num_samples=K,
                          max_new_tokens=N_NEW, temperature=t, top_p=0.9, eos_id=-1)
    before = sampling._generate._cache_size()
    sampling.generate(params, CFG, ids, jax.random.PRNGKey(1), prompt_mask=mask, num_samples=K,
                      max_new_tokens=N_NEW, temperature=0.8, top_p=0.95, top_k=5, eos_id=2, pad_id=0)
    assert sampling._generate._cache_size() == before


# ---------------------------------------------------------------------------------------
# Token choice against float64 NumPy references
# ---------------------------------------------------------------------------------------
def _np_allowed(logits, temperature, top_k, top_p):
    """Allowed token set of top-k then top-p on softmax(logits / T), float64."""
    z = np.asarray(logits, np.float64) / temperature
    allowed = np.ones_like(z, bool)
    if top_k > 0:
        kth = np.sort(z)[::-1][top_k - 1]
        allowed &= z >= kth
    zz = np.where(allowed, z, -np.inf)
    p = np.exp(zz - zz.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    mass_before = np.cumsum(p[order]) - p[order]
    keep = np.zeros_like(allowed)
    keep[order[mass_before < top_p]] = True
    return allowed & keep, p


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 0.6), (0.5, 5, 1.0), (2.0, 8, 0.8)])
def test_choose_tokens_support_and_frequencies(temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=12) * 2.0
    n = 20000
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    tokens, logp = jax.jit(sampling.choose_tokens)(
        jnp.asarray(np.tile(logits, (n, 1)), jnp.float32), keys, jnp.float32(temperature),
        jnp.float32(top_p), top_k)
    tokens, logp = np.asarray(tokens), np.asarray(logp)
    allowed, _ = _np_allowed(logits, temperature, top_k, top_p)
    assert set(np.unique(tokens)) <= set(np.flatnonzero(allowed))
    # frequencies match the renormalised truncated distribution
    z = np.where(allowed, logits / temperature, -np.inf)
    q = np.exp(z - z.max())
    q /= q.sum()
    freq = np.bincount(tokens, minlength=12) / n
    np.testing.assert_allclose(freq, q, atol=0.015)
    # logprobs are under the untruncated softmax(logits / T)
    np.testing.assert_allclose(logp, _log_softmax64(logits, temperature)[tokens], atol=1e-5)


def test_choose_tokens_greedy():
    logits = jnp.asarray([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]], jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    tokens, logp = sampling.choose_tokens(logits, keys, jnp.float32(0.0), jnp.float32(1.0), 0)
    np.testing.assert_array_equal(tokens, [1, 0])
    ref = _log_softmax64(np.asarray(logits), 1.0)[[0, 1], [1, 0]]
    np.testing.assert_allclose(logp, ref, atol=1e-6)


# ---------------------------------------------------------------------------------------
# EOS
# ---------------------------------------------------------------------------------------
def _eos_biased(params, bias):
    """Params whose logits favour EOS by about `bias` nats on every row.

    A large constant is added to feature 0 of every token embedding, so after the final
    RMSNorm feature 0 is ~sqrt(d_model) and every other feature is ~0 on every position;
    the unembedding then reads feature 0 into the EOS logit only. Logits become ~0 for all
    tokens except EOS, whose logit is ~bias.
    """
    p = jax.tree.map(lambda x: x, params)
    p["embed"] = p["embed"].at[:, 0].add(1e4)
    unembed = jnp.zeros_like(p["unembed"])
    p["unembed"] = unembed.at[0, TOK.EOS].set(bias / np.sqrt(CFG.d_model))
    return p


def test_eos_stops_every_row_at_once(params, batch):
    ids, mask = batch
    out = sampling.generate(_eos_biased(params, 30.0), CFG, ids, jax.random.PRNGKey(2), prompt_mask=mask,
                            num_samples=K, max_new_tokens=N_NEW, temperature=1.0)
    np.testing.assert_array_equal(out.lengths, 1)
    np.testing.assert_array_equal(out.tokens[:, 0], TOK.EOS)
    np.testing.assert_array_equal(out.tokens[:, 1:], TOK.PAD)
    np.testing.assert_array_equal(out.logprobs[:, 1:], 0.0)


def test_eos_stops_rows_at_different_steps(params, batch):
    ids, mask = batch
    # EOS has probability e^b / (e^b + 258) ~ 0.25 per step: rows end at different times.
    biased = _eos_biased(params, np.log(86.0))
    out = sampling.generate(biased, CFG, ids, jax.random.PRNGKey(7), prompt_mask=mask, num_samples=K,
                            max_new_tokens=N_NEW, temperature=1.0)
    tokens, lengths, logprobs = map(np.asarray, (out.tokens, out.lengths, out.logprobs))
    for row in range(tokens.shape[0]):
        eos_at = np.flatnonzero(tokens[row] == TOK.EOS)
        expected = eos_at[0] + 1 if eos_at.size else N_NEW
        assert lengths[row] == expected
        assert np.all(tokens[row, expected:] == TOK.PAD) and np.all(logprobs[row, expected:] == 0.0)
        assert np.all(logprobs[row, :expected] < 0.0)
    assert len(set(lengths.tolist())) > 1 and lengths.min() < N_NEW
    # logprobs up to and including the EOS still match a full forward
    ref, gen_mask = _full_forward_logprobs(biased, ids, mask, out, K, 1.0)
    np.testing.assert_allclose(logprobs, np.where(gen_mask, ref, 0.0), atol=1e-5)


def test_invalid_arguments(params, batch):
    ids, mask = batch
    gen = lambda **kw: sampling.generate(params, CFG, ids, jax.random.PRNGKey(0),
                                           **{"prompt_mask": mask, "max_new_tokens": 4, **kw})
    with pytest.raises(ValueError, match="temperature"):
        gen(temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        gen(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        gen(top_k=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen(max_new_tokens=CFG.max_seq_len)
    with pytest.raises(ValueError, match="LEFT-padded"):
        gen(prompt_mask=np.asarray(mask)[:, ::-1])
    with pytest.raises(ValueError, match="at least one real token"):
        gen(prompt_mask=np.zeros_like(mask))
    with pytest.raises(ValueError, match="num_samples"):
        gen(num_samples=0)


def test_sharded_generation_matches_single_device(params, batch):
    """Params sharded over a (data=2, expert=2, tensor=2) mesh of forced CPU devices give the
    same samples as the unsharded model (mesh/rules are passed through to forward)."""
    from models import sharding

    if len(jax.devices()) < 8:
        raise RuntimeError("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/conftest.py)")
    ids, mask = batch
    kw = dict(prompt_mask=mask, num_samples=K, max_new_tokens=N_NEW, eos_id=-1)
    ref = sampling.generate(params, CFG, ids, jax.random.PRNGKey(1), **kw)
    mesh = sharding.make_mesh({"data": 2, "expert": 2, "tensor": 2})
    sharded = jax.device_put(params, transformer.param_shardings(CFG, mesh, sharding.DEFAULT_RULES))
    out = sampling.generate(sharded, CFG, ids, jax.random.PRNGKey(1), mesh=mesh, rules=sharding.DEFAULT_RULES, **kw)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


def test_sample_rows_draws_from_the_softmax_across_blocks():
    """The two-level draw (block by mass, then token inside it) against the float64 softmax, on a vocabulary of
    three blocks with a padded last block, heavy tokens in each block and forbidden (-inf) ones."""
    S = sampling.SAMPLE_BLOCK
    V = 2 * S + 37
    rng = np.random.default_rng(1)
    z = rng.normal(size=V) - 2.0
    heavy = [3, S - 1, S + 5, 2 * S + 1, 2 * S + 36]
    z[heavy] = [2.0, 1.0, 2.5, 0.5, 1.5]
    z[[0, S, 2 * S]] = -np.inf
    p = np.exp(z - z.max())
    p /= p.sum()
    n = 20000
    keys = jax.random.split(jax.random.PRNGKey(3), n)
    tokens = np.asarray(jax.jit(sampling.sample_rows)(keys, jnp.asarray(np.tile(z, (n, 1)), jnp.float32)))
    assert tokens.min() >= 0 and tokens.max() < V and not np.isin(tokens, [0, S, 2 * S]).any()
    freq = np.bincount(tokens, minlength=V) / n
    np.testing.assert_allclose(freq[heavy], p[heavy], atol=0.015)
    blocks = np.add.reduceat(freq, [0, S, 2 * S]), np.add.reduceat(p, [0, S, 2 * S])
    np.testing.assert_allclose(*blocks, atol=0.015)


def test_argmax_rows_is_the_first_maximum():
    x = jnp.asarray([[0.0, 3.0, 3.0, 1.0], [-1.0, -2.0, -1.0, -5.0], [7.0, 7.0, 7.0, 7.0]], jnp.float32)
    np.testing.assert_array_equal(sampling.argmax_rows(x), np.argmax(np.asarray(x), axis=-1))


def test_a_diverged_policy_still_draws_valid_ids():
    """NaN logits (every update skipped as non-finite, say) give ids inside the vocabulary, greedy and sampled, so the
    tokenizer can decode what the sampler wrote (an id == V made ByteTokenizer.decode raise)."""
    V = 300
    logits = jnp.full((3, V), jnp.nan, jnp.float32)
    keys = jax.random.split(jax.random.key(0), 3)
    for t in (0.0, 1.0, jnp.asarray([0.0, 0.7, 1.0])):
        tokens, _ = sampling.choose_tokens(logits, keys, t, 1.0, 0)
        assert np.all((np.asarray(tokens) >= 0) & (np.asarray(tokens) < V)), (t, tokens)
