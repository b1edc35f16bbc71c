"""The grouped layout (models/shared_prompt.py): each prompt computed once for its K answers gives the flat
[G*K, P + C] batch's logprobs, router statistics, loss and gradients; the train step and the logprob function
accept it, microbatches take whole prompts, and the sampler's logprobs are its logprobs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import sampling, shared_prompt, transformer
from models.config import ModelConfig
from rl.logprobs import make_logprob_fn
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_loss_fn, make_train_step

CFG = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32, n_experts=4,
           experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None, max_seq_len=32)
G, K, P, C = 4, 3, 6, 5


def cfg_of(**kw):
    return ModelConfig(**{**CFG, **kw})


def grouped_batch(seed=0, vocab=40):
    """Left-padded prompts of 2..P tokens, K answers each of 1..C tokens, with GRPO inputs."""
    rng = np.random.default_rng(seed)
    prompts = np.zeros((G, P), np.int32)
    pmask = np.zeros((G, P), np.int32)
    for g, n in enumerate(rng.integers(2, P + 1, size=G)):
        prompts[g, P - n:] = rng.integers(3, vocab, size=n)
        pmask[g, P - n:] = 1
    lengths = rng.integers(1, C + 1, size=G * K)
    lengths[0] = C
    amask = (np.arange(C)[None] < lengths[:, None]).astype(np.int32)
    tokens = rng.integers(3, vocab, size=(G * K, C)).astype(np.int32) * amask
    return {"prompt_tokens": prompts, "prompt_mask": pmask, "tokens": tokens, "attn_mask": amask,
            "loss_mask": amask.copy(), "advantages": rng.normal(size=G * K).astype(np.float32),
            "old_logp": (-rng.uniform(0.5, 3.0, size=(G * K, C)) * amask).astype(np.float32),
            "ref_logp": (-rng.uniform(0.5, 3.0, size=(G * K, C)) * amask).astype(np.float32)}


def to_flat(b):
    """The same rows as the flat layout: real prompt tokens then the answer, right-padded to P + C."""
    R = b["tokens"].shape[0]
    out = {k: np.zeros((R, P + C), v.dtype) for k, v in b.items() if k in ("tokens", "attn_mask", "loss_mask",
                                                                         "old_logp", "ref_logp")}
    starts = []
    for r in range(R):
        real = b["prompt_tokens"][r // K][b["prompt_mask"][r // K] > 0]
        n, L = len(real), int(b["attn_mask"][r].sum())
        out["tokens"][r, :n], out["tokens"][r, n:n + L] = real, b["tokens"][r, :L]
        out["attn_mask"][r, :n + L] = 1
        for k in ("loss_mask", "old_logp", "ref_logp"):
            out[k][r, n:n + L] = b[k][r, :L]
        starts.append(n)
    out["advantages"] = b["advantages"]
    return out, np.array(starts)


def answer_columns(flat_RT, starts, C_=C):
    """The flat layout's values at each row's answer positions, [R, C] (0 past the row's end)."""
    return np.stack([flat_RT[r, s:s + C_] for r, s in enumerate(starts)])


@pytest.mark.parametrize("n_experts", [4, 0])
def test_forward_matches_flat_layout(n_experts):
    cfg = cfg_of(n_experts=n_experts)
    params = transformer.init(cfg, jax.random.PRNGKey(0))
    b = grouped_batch()
    flat, starts = to_flat(b)
    logits, aux = shared_prompt.forward(params, b["prompt_tokens"], b["prompt_mask"], b["tokens"], b["attn_mask"],
                                        cfg)
    f_logits, f_aux = transformer.forward(params, flat["tokens"], cfg, attn_mask=flat["attn_mask"])
    assert logits.shape == (G * K, C, cfg.vocab_size) and aux["hidden"].shape == (G * K, C, cfg.d_model)
    # Column t of the grouped logits predicts answer token t: the flat logits at position start + t - 1.
    want = np.stack([np.asarray(f_logits)[r, s - 1:s - 1 + C] for r, s in enumerate(starts)])
    real = b["attn_mask"] > 0
    np.testing.assert_allclose(np.asarray(logits)[real], want[real], atol=2e-5, rtol=1e-5)
    for k in ("router_aux_loss", "router_z_loss", "expert_load", "router_prob"):
        assert aux[k].shape == f_aux[k].shape, k
        np.testing.assert_allclose(np.asarray(aux[k]), np.asarray(f_aux[k]), atol=1e-6, rtol=1e-5, err_msg=k)


@pytest.mark.parametrize("mode", ["grpo", "ppo"])
def test_loss_and_gradients_match_flat_layout(mode):
    cfg = cfg_of(router_aux_coef=0.01, router_z_coef=0.001)
    loss_cfg = LossConfig(mode=mode, kl_kind="k3", entropy_coef=0.01)
    state = init_train_state(cfg, loss_cfg, OptimConfig(), jax.random.PRNGKey(1))
    loss_fn = make_loss_fn(cfg, loss_cfg, None, None)
    b = grouped_batch(1)
    flat, starts = to_flat(b)
    if mode == "ppo":
        rng = np.random.default_rng(2)
        b["old_values"] = rng.normal(size=(G * K, C)).astype(np.float32) * b["attn_mask"]
        b["returns"] = rng.normal(size=(G * K, C)).astype(np.float32) * b["attn_mask"]
        for k in ("old_values", "returns"):
            flat[k] = np.zeros_like(flat["old_logp"])
            for r, s in enumerate(starts):
                flat[k][r, s:s + C] = b[k][r]
    grad = jax.jit(jax.grad(loss_fn, has_aux=True))
    g_grouped, m_grouped = grad(state["params"], b, jnp.float32(0.04))
    g_flat, m_flat = grad(state["params"], flat, jnp.float32(0.04))
    for k in ("loss/total", "loss/policy", "loss/kl", "loss/value", "loss/router_aux", "loss/router_z", "entropy",
              "kl", "n_tokens"):
        np.testing.assert_allclose(float(m_grouped[k]), float(m_flat[k]), rtol=2e-5, atol=1e-6, err_msg=k)
    for (path, a), bb in zip(jax.tree_util.tree_leaves_with_path(g_grouped), jax.tree.leaves(g_flat)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(bb), atol=2e-6, rtol=2e-4,
                                   err_msg=jax.tree_util.keystr(path))
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g_grouped)) > 1e-4  # a real gradient


def test_remat_applies_in_the_grouped_layout():
    """model.remat also rematerialises the answers' pass, which runs against the prompts' KV cache: the gradient is
    the same and XLA's compiled temporaries fall (the answers' activations are no longer all kept)."""
    cfg = cfg_of(n_experts=0, n_layers=4, d_ff=128)
    loss_cfg = LossConfig(mode="grpo", kl_kind="k3")
    params = init_train_state(cfg, loss_cfg, OptimConfig(), jax.random.PRNGKey(3))["params"]
    b = {k: jnp.asarray(v) for k, v in grouped_batch(3).items()}
    grads, temps = [], []
    for remat in (False, True):
        grad = jax.jit(jax.grad(make_loss_fn(cfg.replace(remat=remat), loss_cfg, None, None), has_aux=True))
        compiled = grad.lower(params, b, jnp.float32(0.04)).compile()
        grads.append(compiled(params, b, jnp.float32(0.04))[0])
        temps.append(compiled.memory_analysis().temp_size_in_bytes)
    jax.tree.map(lambda a, r: np.testing.assert_allclose(np.asarray(r), np.asarray(a), rtol=1e-5, atol=1e-7), *grads)
    assert temps[1] < 0.8 * temps[0], temps


@pytest.mark.slow  # ~24 s cold; microbatching itself: tests/test_train_step.py::test_microbatched_step_equals_whole_batch
def test_microbatches_take_whole_prompts():
    cfg = cfg_of(router_aux_coef=0.0)  # the load-balancing term is the only one microbatching approximates
    loss_cfg = LossConfig(mode="grpo", kl_kind="k3")
    b = grouped_batch(3)
    out = {}
    for n in (1, 4):
        state = init_train_state(cfg, loss_cfg, OptimConfig(), jax.random.PRNGKey(2))
        out[n] = make_train_step(cfg, loss_cfg, OptimConfig(), microbatches=n)(state, b, {"lr": 1e-3,
                                                                                       "kl_coef": 0.04})
    for n in (4,):
        for k in ("loss/total", "grad_norm", "entropy", "kl"):
            np.testing.assert_allclose(float(out[n][1][k]), float(out[1][1][k]), rtol=1e-5, err_msg=f"{n} {k}")
        for a, bb in zip(jax.tree.leaves(out[n][0]["params"]), jax.tree.leaves(out[1][0]["params"])):
            # 2% of an lr-1e-3 step: Adam divides by sqrt(v), so a near-zero gradient entry moves by a share of lr
            np.testing.assert_allclose(np.asarray(a), np.asarray(bb), atol=2e-5)
    assert int(out[1][1]["skipped"]) == 0
    state = init_train_state(cfg, loss_cfg, OptimConfig(), jax.random.PRNGKey(2))
    with pytest.raises(ValueError, match="must divide the batch's 4 prompts"):
        make_train_step(cfg, loss_cfg, OptimConfig(), microbatches=3)(state, b, {"lr": 1e-3})


def test_logprob_fn_and_chunked_logits_match():
    cfg = cfg_of()
    params = transformer.init(cfg, jax.random.PRNGKey(3))
    b = grouped_batch(4)
    flat, starts = to_flat(b)
    temp = np.linspace(0.7, 1.3, G * K).astype(np.float32)
    got = make_logprob_fn(cfg)(params, b["tokens"], b["attn_mask"], temp, prompt_tokens=b["prompt_tokens"],
                               prompt_mask=b["prompt_mask"])
    want = answer_columns(np.asarray(make_logprob_fn(cfg)(params, flat["tokens"], flat["attn_mask"], temp)), starts)
    np.testing.assert_allclose(np.asarray(got), want * b["attn_mask"], atol=2e-5)
    chunked = make_logprob_fn(cfg_of(logits_chunk=2))(params, b["tokens"], b["attn_mask"], temp,
                                                      prompt_tokens=b["prompt_tokens"], prompt_mask=b["prompt_mask"])
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(got), atol=2e-5)


def test_sampler_logprobs_are_the_grouped_logprobs():
    """generate's output is a grouped batch as is: its logprobs are the policy's logprobs of its tokens."""
    cfg = cfg_of()
    params = transformer.init(cfg, jax.random.PRNGKey(4))
    b = grouped_batch(5)
    out = sampling.generate(params, cfg, jnp.asarray(b["prompt_tokens"]), jax.random.PRNGKey(5),
                            prompt_mask=jnp.asarray(b["prompt_mask"]), num_samples=K, max_new_tokens=C,
                            temperature=0.9)
    amask = (np.arange(C)[None] < np.asarray(out.lengths)[:, None]).astype(np.int32)
    lp = make_logprob_fn(cfg)(params, out.tokens, amask, 0.9, prompt_tokens=b["prompt_tokens"],
                              prompt_mask=b["prompt_mask"])
    np.testing.assert_allclose(np.asarray(lp), np.asarray(out.logprobs) * amask, atol=5e-5)


def test_bad_grouped_batches_fail_clearly():
    cfg = cfg_of()
    params = transformer.init(cfg, jax.random.PRNGKey(0))
    b = grouped_batch()
    with pytest.raises(ValueError, match="multiple of the prompts"):
        shared_prompt.forward(params, b["prompt_tokens"], b["prompt_mask"], b["tokens"][:-1], b["attn_mask"][:-1],
                              cfg)
    loss_fn = make_loss_fn(cfg, LossConfig(mode="prm"), None, None)
    with pytest.raises(ValueError, match="grouped batch layout"):
        loss_fn(init_train_state(cfg, LossConfig(mode="prm"), OptimConfig(), jax.random.PRNGKey(0))["params"],
                {**b, "step_labels": np.zeros((G * K, C), np.float32)}, 0.0)
