"""generate_with_tools: tool ids verbatim after each call, policy_mask, logprobs against one teacher-forced forward,
max_turns, EOS, budgets, the cache re-alignment paths, and no-tool runs equal to generate.

The reference is independent of the sampler: one uncached forward over the final tokens (left-padded prompt, then
everything appended) with float64 log-softmax(logits / T), and a replay of the deterministic tool on the host.
Every test uses the same shapes (3 prompts x 2 samples, 24 new tokens, an 8-slot scratch block: tool outputs are
prefilled in chunks 4 or 8 wide, longer ones in several), so the sampler's programs compile once for the file.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import sampling, tool_sampling, transformer
from models.config import ModelConfig
from models.tokenizer import ByteTokenizer

# Tiny dropless MoE (as tests/test_sampling.py) so cached decoding is exactly the full forward.
CFG = ModelConfig(
    vocab_size=259, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
    n_experts=4, experts_per_token=2, moe_every=2, n_shared_experts=0, capacity_factor=None,
    max_seq_len=64, dtype="float32", param_dtype="float32", tie_embeddings=False,
)
N = 24
K = 2
TOK = ByteTokenizer()
PROMPTS = ["答案", "12+30=", "问题：3×4？"]  # 7, 7 and 16 ids with BOS: rows of different lengths
CALL = list(range(60, 100))  # 40 of 259 ids end a call: a random model samples one every ~7 tokens
EOS = list(range(200, 208))
NO_EOS = [-1] * len(EOS)  # same shape: no recompilation


@pytest.fixture(scope="module", autouse=True)
def small_scratch():
    old = tool_sampling.SCRATCH_SLOTS
    tool_sampling.SCRATCH_SLOTS = 8
    yield
    tool_sampling.SCRATCH_SLOTS = old


@pytest.fixture(scope="module")
def params():
    return transformer.init(CFG, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def batch():
    ids, mask = TOK.encode_batch(PROMPTS, pad_left=True)
    return np.asarray(ids), np.asarray(mask)


def tool(row):
    """Deterministic in the row's ids: 0-6 ids (some of them call-end or EOS ids), or None (not a call)."""
    n = len(row)
    if n % 11 == 0:
        return None
    return [(sum(row) * 13 + 7 * i) % 256 + 3 for i in range(n % 7)]


def _run(params, batch, *, tool_fn=tool, max_turns=2, eos=NO_EOS, temperature=1.0, seed=1, **kw):
    ids, mask = batch
    return tool_sampling.generate_with_tools(
        params, CFG, ids, jax.random.PRNGKey(seed), tool_fn=tool_fn, call_end_ids=CALL, max_turns=max_turns,
        max_new_tokens=N, temperature=temperature, eos_id=eos, pad_id=0, prompt_mask=mask, num_samples=K, **kw)


def _log_softmax64(logits, temperature):
    z = np.asarray(logits, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _teacher_forced(params, batch, out, temperature):
    """float64 log-softmax(logits / T) of every token given all before it, from ONE uncached forward over the final
    tokens; [R, L] (column 0 is 0)."""
    _, mask = batch
    P = mask.shape[1]
    tokens = np.asarray(out.tokens)
    L = tokens.shape[1]
    real = np.concatenate([np.repeat(mask, K, axis=0),
                           np.arange(N)[None, :] < np.asarray(out.lengths)[:, None]], axis=1).astype(np.int32)
    positions = np.maximum(np.cumsum(real, axis=1) - 1, 0)
    logits, _ = transformer.forward(params, jnp.asarray(tokens), CFG, positions=jnp.asarray(positions),
                                    attn_mask=jnp.asarray(real))
    logp = _log_softmax64(np.asarray(logits)[:, :-1], temperature)
    ref = np.zeros((tokens.shape[0], L))
    ref[:, 1:] = np.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    assert P + N == L
    return ref


def _replay(batch, out, *, max_turns, eos):
    """Walk each row like the sampler would and check every tool call: the tool's ids verbatim right after the
    call end (truncated at the budget), policy_mask 0 on them and 1 on every other appended token; nothing after
    the row's end. Returns (calls per row, rows that ended at EOS, rows with a call end sampled past max_turns)."""
    ids, mask = batch
    P = ids.shape[1]
    tokens, policy = np.asarray(out.tokens), np.asarray(out.policy_mask)
    calls, ended_eos, ignored = [], [], []
    for r in range(tokens.shape[0]):
        prompt = [int(t) for t in ids[r // K][mask[r // K] == 1]]
        np.testing.assert_array_equal(tokens[r, :P], ids[r // K])
        assert not policy[r, :P].any()
        n = int(out.lengths[r])
        app, pol = tokens[r, P:], policy[r, P:]
        i, turns, eos_end = 0, 0, False
        while i < n:
            assert pol[i] == 1, (r, i)
            tok = int(app[i])
            if tok in eos:
                eos_end = True
                assert i == n - 1, "EOS must end the row"
                break
            i += 1
            if tok in CALL and i < N:
                if turns == max_turns:
                    ignored.append(r)
                    continue
                result = tool(prompt + [int(t) for t in app[:i]])
                if result is None:
                    continue
                result = result[: N - i]
                np.testing.assert_array_equal(app[i: i + len(result)], result)
                assert not pol[i: i + len(result)].any()
                i += len(result)
                turns += 1
        assert eos_end or n == N, (r, n)
        assert (app[n:] == 0).all() and not pol[n:].any()
        assert not np.asarray(out.logprobs)[r, P + n:].any()
        assert int(out.turns[r]) == turns
        calls.append(turns)
        if eos_end:
            ended_eos.append(r)
    return np.asarray(calls), ended_eos, ignored


@pytest.mark.parametrize("temperature,eos", [(1.0, NO_EOS), (0.7, EOS)])
def test_tool_ids_verbatim_policy_mask_and_teacher_forced_logprobs(params, batch, temperature, eos):
    out = _run(params, batch, temperature=temperature, eos=eos, max_turns=2)
    R = len(PROMPTS) * K
    assert out.tokens.shape == (R, batch[0].shape[1] + N) and out.tokens.dtype == np.int32
    calls, ended_eos, ignored = _replay(batch, out, max_turns=2, eos=eos)
    # The run is not vacuous: tools were called, some row used every turn and sampled a call end after that.
    assert calls.sum() >= 3 and (calls == 2).any() and ignored
    if eos is EOS:
        assert ended_eos and len(ended_eos) < R  # rows of different lengths: some end at EOS, others at the budget
    policy = np.asarray(out.policy_mask).astype(bool)
    ref = _teacher_forced(params, batch, out, temperature)
    np.testing.assert_allclose(np.asarray(out.logprobs)[policy], ref[policy], atol=2e-5, rtol=1e-5)
    assert not np.asarray(out.logprobs)[~policy].any()


def test_without_tool_calls_it_is_generate(params, batch):
    """max_turns=0: every call-end token is ordinary, and the samples are generate's (same random streams)."""
    ids, mask = batch
    out = _run(params, batch, max_turns=0)
    ref = sampling.generate(params, CFG, ids, jax.random.PRNGKey(1), prompt_mask=mask, num_samples=K,
                            max_new_tokens=N, eos_id=-1)
    P = ids.shape[1]
    np.testing.assert_array_equal(out.tokens[:, P:], ref.tokens)
    np.testing.assert_allclose(out.logprobs[:, P:], ref.logprobs, atol=1e-6)
    assert (out.policy_mask[:, P:] == 1).all() and not out.turns.any()


def test_tool_output_fills_the_budget_and_the_cache_is_realigned(params, batch, monkeypatch):
    """Every row calls at its first token (every id ends a call). The first prompt's rows get all but two tokens of
    their budget from the tool (several chunks), the second's nothing, the third's more than their budget (cut
    there: the row ends with the tool's ids). The first race ahead in the cache and finish; the write slot then
    reaches the cache's end while the second still decode, and the cache is compacted."""
    ids, mask = batch
    p0 = int(mask[0].sum())
    compactions = []
    real_compact = tool_sampling._compact
    monkeypatch.setattr(tool_sampling, "_compact", lambda s: compactions.append(1) or real_compact(s))

    def long_tool(row):
        if row[:p0] == [int(t) for t in ids[0][mask[0] == 1]]:
            return [65] * (N - (len(row) - p0) - 2)  # leaves two tokens of budget
        return [66] * (N + 5) if row[:3] == [int(t) for t in ids[2][mask[2] == 1][:3]] else []

    out = tool_sampling.generate_with_tools(
        params, CFG, ids, jax.random.PRNGKey(3), tool_fn=long_tool, call_end_ids=list(range(CFG.vocab_size)),
        max_turns=1, max_new_tokens=N, eos_id=NO_EOS, pad_id=0, prompt_mask=mask, num_samples=K)
    P = ids.shape[1]
    assert compactions
    np.testing.assert_array_equal(out.lengths, N)
    for r in range(len(PROMPTS) * K):
        assert out.turns[r] == 1
        pol = out.policy_mask[r, P:]
        if r // K == 0:  # 1 sampled, N - 3 tool ids, 2 sampled
            assert pol.tolist() == [1] + [0] * (N - 3) + [1, 1]
        elif r // K == 2:  # the tool's N + 5 ids cut at the budget: the row ends with the tool's ids
            assert pol.tolist() == [1] + [0] * (N - 1)
            assert (out.tokens[r, P + 1:] == 66).all()
        else:
            assert pol.all()
    policy = out.policy_mask.astype(bool)
    ref = _teacher_forced(params, batch, out, 1.0)
    np.testing.assert_allclose(out.logprobs[policy], ref[policy], atol=2e-5, rtol=1e-5)


def test_bad_tool_output_and_arguments_are_named(params, batch):
    with pytest.raises(ValueError, match="tool_fn returned ids outside"):
        _run(params, batch, tool_fn=lambda row: [CFG.vocab_size])
    with pytest.raises(ValueError, match="max_turns"):
        _run(params, batch, max_turns=-1)
    with pytest.raises(ValueError, match="call_end_ids"):
        tool_sampling.generate_with_tools(params, CFG, batch[0], jax.random.PRNGKey(0), tool_fn=tool,
                                          call_end_ids=[], max_turns=1, max_new_tokens=N, eos_id=2, pad_id=0)


@pytest.mark.slow  # two sets of compilations: about 140 s on the loaded 2-core machine
def test_sharded_equals_unsharded(params, batch):
    """Params sharded over a (data=2, expert=2, tensor=2) mesh of forced CPU devices: the same tokens, tool calls
    and logprobs as the unsharded model (mesh / rules reach every forward, prefill and cache re-alignment)."""
    from models import sharding

    if len(jax.devices()) < 8:
        raise RuntimeError("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (tests/conftest.py)")
    ref = _run(params, batch)
    mesh = sharding.make_mesh({"data": 2, "expert": 2, "tensor": 2})
    sharded = jax.device_put(params, transformer.param_shardings(CFG, mesh, sharding.DEFAULT_RULES))
    out = _run(sharded, batch, mesh=mesh, rules=sharding.DEFAULT_RULES)
    assert ref.turns.sum() > 0
    for name in ("tokens", "policy_mask", "turns", "lengths"):
        np.testing.assert_array_equal(getattr(out, name), getattr(ref, name))
    np.testing.assert_allclose(out.logprobs, ref.logprobs, atol=1e-5)


@pytest.mark.slow  # a second set of compilations (~50 s on the loaded 2-core machine)
def test_the_other_cache_layout(params, monkeypatch):
    """keys [B, K, S, H] like the values (the layout other backends may pick, models/layers.py CACHE_LAYOUTS): the
    re-alignment gathers along the right axis. Other prompt shapes, so every program is traced afresh."""
    from models import layers

    monkeypatch.setitem(layers.CACHE_LAYOUTS, jax.default_backend(), "keys_like_values")
    ids, mask = TOK.encode_batch(["7*8=", "问题", "1+1"], pad_left=True)
    batch = (np.asarray(ids), np.asarray(mask))
    out = _run(params, batch, eos=EOS, temperature=0.9)
    calls, _, _ = _replay(batch, out, max_turns=2, eos=EOS)
    assert calls.sum() >= 2
    policy = out.policy_mask.astype(bool)
    ref = _teacher_forced(params, batch, out, 0.9)
    np.testing.assert_allclose(out.logprobs[policy], ref[policy], atol=2e-5, rtol=1e-5)


def test_with_the_python_tool(params, batch):
    """The sandboxed Python tool as tool_fn: every row pauses at its first token (every id ends a call) and the six
    calls of that pause run together; each row gets the program's output ids verbatim. The row's own text holds no
    call, so the tool is handed one (a random model does not write code)."""
    from rewards.python_tool import PythonTool

    tool = PythonTool(TOK)
    call = TOK.encode("<py>print(6 * 7)</py>", add_bos=False)
    seen = []

    def tool_fn(row):
        seen.append(len(row))
        return tool(row + call)

    ids, mask = batch
    out = tool_sampling.generate_with_tools(
        params, CFG, ids, jax.random.PRNGKey(5), tool_fn=tool_fn, call_end_ids=list(range(CFG.vocab_size)),
        max_turns=1, max_new_tokens=N, eos_id=NO_EOS, pad_id=0, prompt_mask=mask, num_samples=K)
    want = TOK.encode("<out>42\n</out>", add_bos=False)
    P = ids.shape[1]
    assert len(seen) == len(PROMPTS) * K
    np.testing.assert_array_equal(out.tokens[:, P + 1: P + 1 + len(want)], np.tile(want, (len(PROMPTS) * K, 1)))
    assert (out.turns == 1).all() and not out.policy_mask[:, P + 1: P + 1 + len(want)].any()
