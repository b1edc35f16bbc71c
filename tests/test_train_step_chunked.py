"""The train step with ModelConfig.logits_chunk > 0 (logprobs and entropy chunk by chunk from the hidden states,
models/vocab.py) against the full-logits path: loss, every metric and the gradients for sft / grpo / ppo / prm, the
logprob function, bf16, routing replay, a sharded vocabulary, compiled temporaries, and (slow) a quickstart run whose
sampler and trainer logprobs still agree. The chunked kernel itself is checked against float64 NumPy in
tests/test_vocab.py; here the reference is the default path (itself checked against NumPy in tests/test_train_step.py
and tests/test_losses.py)."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import sharding, transformer
from models.config import ModelConfig
from rl.logprobs import make_logprob_fn
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_loss_fn, make_train_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One MoE block (router terms, routes) and a vocabulary of 16 (shardable over tensor=2). T = 9: the 8 scored
# positions are not a multiple of the chunk of 3, so the last chunk is padded.
TINY = dict(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32, n_experts=4,
            experts_per_token=2, moe_every=1, max_seq_len=16)
CHUNK = 3
B, T = 4, 9
HP = {"lr": 1e-3, "kl_coef": 0.1}


def cfgs(**kw):
    full = ModelConfig(**{**TINY, **kw})
    return full, full.replace(logits_chunk=CHUNK)


def make_batch(mode, params, cfg, seed=0):
    """Right-padded rows (row 1 has 2 padding tokens), loss on the response, per-row temperatures, old logprobs
    away from the current ones (ratios clip on both sides), a reference that differs (positive KL)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, cfg.vocab_size, size=(B, T)).astype(np.int32)
    attn = np.ones((B, T), np.int32)
    attn[1, T - 2:], tokens[1, T - 2:] = 0, 0
    loss = attn.copy()
    loss[:, :3] = 0
    batch = {"tokens": tokens, "attn_mask": attn, "loss_mask": loss}
    if mode == "sft":
        return batch
    if mode == "prm":
        loss = np.zeros_like(attn)
        loss[:, [4, 6]] = 1
        prev = np.zeros_like(attn)
        prev[:, 6] = 4
        return {**batch, "loss_mask": loss, "step_labels": (rng.uniform(size=(B, T)) > 0.5).astype(np.float32),
                "step_prev": prev}
    temp = np.array([0.7, 1.0, 0.5, 1.3], np.float32)
    lp = np.asarray(make_logprob_fn(cfg)(params, tokens, attn, temp))
    batch.update(temperature=temp, advantages=np.array([1.0, -0.5, 0.25, -0.75], np.float32),
                 old_logp=(lp + rng.uniform(-0.4, 0.4, size=lp.shape) * loss).astype(np.float32),
                 ref_logp=(lp - 0.3 * loss).astype(np.float32))
    if mode == "ppo":
        batch.update(old_values=rng.normal(size=(B, T)).astype(np.float32),
                     returns=rng.normal(size=(B, T)).astype(np.float32))
    return batch


def value_and_grad(cfg, loss_cfg, params, batch):
    loss_fn = make_loss_fn(cfg, loss_cfg, None, None)
    return jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, jnp.float32(0.1)), has_aux=True))(params, batch)


def assert_trees_close(a, b, rtol, atol):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                                         rtol=rtol, atol=atol), a, b)


@pytest.mark.parametrize("mode, model_kw, loss_kw", [
    ("sft", dict(tie_embeddings=False), {}),  # untied [D, V] unembedding ("DV" layout)
    ("grpo", {}, dict(clip_high=0.28, entropy_coef=0.01)),  # tied, scaled table ("VD"), entropy in the loss
    pytest.param("ppo", dict(tie_embeddings=False), dict(kl_kind="k2", dual_clip=3.0),  # value head, same hidden
                 marks=pytest.mark.slow),
    pytest.param("prm", {}, {}, marks=pytest.mark.slow),  # value head logit + each step's log-likelihood under the LM head
])
def test_chunked_loss_metrics_and_gradients_equal_full_logits(mode, model_kw, loss_kw):
    full, chunked = cfgs(**model_kw)
    loss_cfg = LossConfig(mode=mode, **loss_kw)
    params = init_train_state(full, loss_cfg, OptimConfig(), jax.random.key(1))["params"]
    batch = make_batch(mode, params, full)
    (tot_f, met_f), g_f = value_and_grad(full, loss_cfg, params, batch)
    (tot_c, met_c), g_c = value_and_grad(chunked, loss_cfg, params, batch)
    assert set(met_c) == set(met_f)
    for k in met_f:
        np.testing.assert_allclose(np.asarray(met_c[k]), np.asarray(met_f[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(float(tot_c), float(tot_f), rtol=1e-6, atol=1e-6)
    assert_trees_close(g_c, g_f, rtol=1e-4, atol=1e-6)
    # the comparison can tell: the batch exercises what it claims
    if mode in ("grpo", "ppo"):
        assert float(met_f["policy/clip_frac_high"]) > 0 and float(met_f["policy/clip_frac_low"]) > 0
        assert float(met_f["kl"]) > 0 and float(met_f["entropy"]) > 0
    if mode == "prm":
        assert float(met_f["loss/prm"]) > 0


def test_chunked_logprob_fn_with_values_equals_full_logits():
    full, chunked = cfgs()
    params = init_train_state(full, LossConfig(mode="ppo"), OptimConfig(), jax.random.key(2))["params"]
    params["value_head"] = {"w": jnp.linspace(-1.0, 1.0, full.d_model), "b": jnp.float32(0.3)}
    b = make_batch("sft", params, full)
    temp = np.array([0.6, 1.0, 1.7, 0.9], np.float32)
    lp_f, v_f = make_logprob_fn(full, with_values=True)(params, b["tokens"], b["attn_mask"], temp)
    lp_c, v_c = make_logprob_fn(chunked, with_values=True)(params, b["tokens"], b["attn_mask"], temp)
    np.testing.assert_allclose(lp_c, lp_f, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(v_c, v_f)  # the value head reads the same hidden states
    assert np.all(np.asarray(lp_c)[1, T - 2:] == 0) and np.all(np.asarray(lp_c)[:, 0] == 0)


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_routing_replay_and_bf16_compute():
    """Replayed routes reach the chunked path's forward; bf16 compute gives float32 logprobs within bf16 rounding
    of the full path (the two differ only in where the tied table's scale is applied)."""
    full, chunked = cfgs(dtype="bfloat16")
    loss_cfg = LossConfig(mode="grpo", routing_replay=True)
    params = init_train_state(full, loss_cfg, OptimConfig(), jax.random.key(3))["params"]
    batch = make_batch("grpo", params, full)
    _, aux = transformer.forward(params, jnp.asarray(batch["tokens"]), full, attn_mask=batch["attn_mask"],
                                 return_routes=True)
    routes = np.asarray(aux["routes"]).copy()
    for r, t in ((0, 4), (2, 6)):  # recorded routes that differ from the trainer's own at two tokens
        routes[r, t, 0, 0] = next(e for e in range(full.n_experts) if e not in routes[r, t, 0])
    batch["routes"] = routes
    (tot_f, met_f), g_f = value_and_grad(full, loss_cfg, params, batch)
    (tot_c, met_c), g_c = value_and_grad(chunked, loss_cfg, params, batch)
    assert float(met_c["router/replay_disagreement"]) == float(met_f["router/replay_disagreement"]) > 0
    for k in ("loss/total", "loss/policy", "loss/kl", "entropy", "kl", "policy/ratio_mean"):
        np.testing.assert_allclose(float(met_c[k]), float(met_f[k]), rtol=2e-2, atol=2e-2, err_msg=k)
    lp = make_logprob_fn(chunked)(params, batch["tokens"], batch["attn_mask"], batch["temperature"], routes)
    assert lp.dtype == jnp.float32
    lp_f = make_logprob_fn(full)(params, batch["tokens"], batch["attn_mask"], batch["temperature"], routes)
    np.testing.assert_allclose(lp, lp_f, atol=5e-2)
    flat = lambda g: np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(g)])  # noqa: E731
    cos = flat(g_c) @ flat(g_f) / (np.linalg.norm(flat(g_c)) * np.linalg.norm(flat(g_f)))
    assert cos > 0.99


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_sharded_chunked_step_equals_unsharded():
    """A mesh with the vocabulary split over tensor=2 (16 / 2) and rows over data=2: the same metrics and update."""
    _, cfg = cfgs(router_aux_coef=0.0)
    loss_cfg, optim = LossConfig(mode="grpo", clip_high=0.28), OptimConfig()
    params = jax.tree.map(np.asarray, transformer.init(cfg, jax.random.key(6)))
    batch = make_batch("grpo", params, cfg)
    plain, m_plain = make_train_step(cfg, loss_cfg, optim)(
        init_train_state(cfg, loss_cfg, optim, jax.random.key(7), params=params), batch, HP)
    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "expert": 2, "tensor": 2})
    state = init_train_state(cfg, loss_cfg, optim, jax.random.key(7), mesh=mesh, params=params)
    assert state["params"]["embed"].sharding.spec[0] == "tensor"  # the vocabulary axis really is split
    lp_sh = np.asarray(make_logprob_fn(cfg, mesh=mesh)(state["params"], batch["tokens"], batch["attn_mask"],
                                                       batch["temperature"]))  # before the step donates the state
    sharded, m_sh = make_train_step(cfg, loss_cfg, optim, mesh=mesh)(state, batch, HP)
    for k in ("loss/total", "loss/policy", "loss/kl", "loss/router_z", "grad_norm", "entropy", "kl",
              "policy/clip_frac_high", "policy/clip_frac_low", "policy/ratio_max"):
        np.testing.assert_allclose(float(m_sh[k]), float(m_plain[k]), rtol=1e-5, atol=1e-5, err_msg=k)
    assert_trees_close(sharded["params"], plain["params"], rtol=1e-5, atol=1e-5)
    lp = make_logprob_fn(cfg)(params, batch["tokens"], batch["attn_mask"], batch["temperature"])
    np.testing.assert_allclose(lp_sh, lp, rtol=1e-5, atol=1e-6)


def test_chunked_train_step_never_holds_full_logits():
    """XLA's compiled temporaries of the whole train step: the full path holds several float32 [B, T, V] arrays, the
    chunked one less than one more than its model without the output layer needs."""
    V, rows, length = 8192, 2, 256
    full = ModelConfig(vocab_size=V, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32,
                       n_experts=0, moe_every=0, max_seq_len=length)
    loss_cfg, optim = LossConfig(mode="grpo"), OptimConfig()
    spec = lambda shape, dt=jnp.int32: jax.ShapeDtypeStruct(shape, dt)  # noqa: E731
    batch = {"tokens": spec((rows, length)), "attn_mask": spec((rows, length)), "loss_mask": spec((rows, length)),
             "temperature": spec((rows,), jnp.float32), "advantages": spec((rows,), jnp.float32),
             "old_logp": spec((rows, length), jnp.float32)}
    hp = {"lr": spec((), jnp.float32), "kl_coef": spec((), jnp.float32)}

    def temp_bytes(cfg):
        state = jax.eval_shape(lambda: init_train_state(cfg, loss_cfg, optim, jax.random.key(0)))
        compiled = make_train_step(cfg, loss_cfg, optim).lower(state, batch, hp).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    logits = rows * length * V * 4
    assert temp_bytes(full) > 3 * logits
    assert temp_bytes(full.replace(logits_chunk=16)) < logits


def test_logits_chunk_is_validated():
    with pytest.raises(ValueError, match="logits_chunk"):
        ModelConfig(logits_chunk=-1)
    with pytest.raises(ValueError, match="logits_chunk"):
        ModelConfig(logits_chunk=2.5)


@pytest.mark.slow  # one tiny quickstart run, ~40 CPU seconds
def test_quickstart_run_with_chunked_logits_matches_the_sampler(tmp_path):
    """The sampler's logprobs (full logits of each decode step) are the chunked trainer's for the same params and
    temperature: mismatch/logp_max_abs <= 1e-4, as with full logits (tests/test_run.py)."""
    from experiments import launch

    wd = tmp_path / "run"
    spec = os.path.join(ROOT, "experiments/configs/quickstart.py") + ":variant=tiny"
    assert launch.main(["--config", spec, "--workdir", str(wd), "--config.model.logits_chunk=8",
                        "--config.eval.every=0", "--config.eval.initial=False"]) == 0
    assert json.loads((wd / "config.json").read_text())["model"]["logits_chunk"] == 8
    recs = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in recs if r.get("phase") == "train" and "mismatch/logp_max_abs" in r]
    assert rl and any(r.get("optimizer_steps") for r in rl)
    assert all(r["mismatch/logp_max_abs"] <= 1e-4 for r in rl)
