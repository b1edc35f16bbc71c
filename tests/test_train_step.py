"""The functional train step: configs, schedule, SFT overfit, GRPO toy problem, PPO, sharding, NaN skip."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.config import ModelConfig
from rl import advantages
from rl.kl_control import AdaptiveKL
from rl.losses import token_logprobs
from rl.train_step import (LossConfig, OptimConfig, init_train_state, lr_schedule, make_logprob_fn, make_optimizer,
                           make_train_step, minibatches, update_kl)

# One MoE block: router losses and statistics are exercised while compiles stay short on 2 cores
# (the model's own tests cover deeper and mixed dense/MoE stacks).
TINY = dict(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32,
            n_experts=4, experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None,
            max_seq_len=16)


def tiny_cfg(**kw):
    return ModelConfig(**{**TINY, **kw})


def host(tree):
    return jax.tree.map(lambda x: np.array(x), tree)


def toy_batch(b=4, t=8, seed=0, vocab=16):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, vocab, size=(b, t)).astype(np.int32)
    attn = np.ones((b, t), np.int32)
    attn[1, 6:] = 0
    tokens[1, 6:] = 0
    loss = attn.copy()
    loss[:, :3] = 0
    return {"tokens": tokens, "attn_mask": attn, "loss_mask": loss}


# ------------------------------------------------------------------------------------- configs
def test_configs_validate_and_name_the_field():
    with pytest.raises(ValueError, match="mode"):
        LossConfig(mode="dpo")
    with pytest.raises(ValueError, match="agg"):
        LossConfig(mode="grpo", agg="mean")
    with pytest.raises(ValueError, match="dual_clip"):
        LossConfig(mode="grpo", dual_clip=1.0)
    with pytest.raises(ValueError, match="kl_kind"):
        LossConfig(mode="grpo", kl_kind="k5")
    with pytest.raises(ValueError, match="learning_rate"):
        OptimConfig(learning_rate=0.0)
    with pytest.raises(ValueError, match="warmup_steps"):
        OptimConfig(warmup_steps=20, total_steps=10)
    with pytest.raises(ValueError, match="grad_clip"):
        OptimConfig(grad_clip=-1.0)


def test_lr_schedule_matches_reference():
    cfg = OptimConfig(learning_rate=1e-3, warmup_steps=10, total_steps=110, end_lr_fraction=0.1)

    def ref(step):
        if step < 10:
            return 1e-3 * (step + 1) / 10
        return 1e-3 * (1 - 0.9 * min((step - 10) / 100, 1.0))

    sched = lr_schedule(cfg)
    for s in [0, 4, 9, 10, 50, 109, 110, 500]:
        assert float(sched(s)) == pytest.approx(ref(s), rel=1e-5)


def test_optimizer_clips_global_norm():
    # Adam is scale-invariant per step, so the clip shows through the second moment: with clipping,
    # gradients g then 100 g give the same second update as g then g (both clipped to norm 0.5).
    opt = make_optimizer(OptimConfig(learning_rate=0.1, grad_clip=0.5))
    params = {"w": jnp.ones((3, 3))}
    g = {"w": jnp.arange(9.0).reshape(3, 3) + 1.0}

    def second_update(scale):
        _, st = opt.update(g, opt.init(params), params)
        up, _ = opt.update(jax.tree.map(lambda x: x * scale, g), st, params)
        return np.asarray(up["w"])

    np.testing.assert_allclose(second_update(100.0), second_update(1.0), rtol=1e-6)
    unclipped = make_optimizer(OptimConfig(learning_rate=0.1, grad_clip=None))
    _, st = unclipped.update(g, unclipped.init(params), params)
    up100, _ = unclipped.update(jax.tree.map(lambda x: x * 100.0, g), st, params)
    assert not np.allclose(np.asarray(up100["w"]), second_update(1.0), rtol=1e-3)


# ------------------------------------------------------------------------------------- SFT
def test_sft_overfits_tiny_batch():
    cfg = tiny_cfg()
    loss_cfg = LossConfig(mode="sft")
    optim = OptimConfig(learning_rate=2e-2, warmup_steps=0, total_steps=40)
    state = init_train_state(cfg, loss_cfg, optim, jax.random.key(0))
    step = make_train_step(cfg, loss_cfg, optim)
    batch = toy_batch()
    first = None
    for _ in range(40):
        state, m = step(state, batch)
        first = float(m["loss/total"]) if first is None else first
    last = float(m["loss/policy"])
    assert last < 0.2 * first, (first, last)
    assert int(state["step"]) == 40 and int(state["n_skipped"]) == 0
    # Every term is reported separately; router terms are present for the MoE model.
    for key in ("loss/policy", "loss/router_aux", "loss/router_z", "entropy", "grad_norm", "lr"):
        assert np.isfinite(float(m[key])), key
    assert m["router/expert_load"].shape == (1, 4)
    assert m["router/dropped_fraction"].shape == (1,)


# ------------------------------------------------------------------------------------- GRPO toy problem
def test_grpo_moves_probability_to_rewarded_answer():
    """Prompt [BOS, 5]; the response is one token, 7 or 8; the one the initial model prefers less is
    rewarded. Sample a group, score, GRPO advantages, one step; repeat."""
    cfg = tiny_cfg()
    loss_cfg = LossConfig(mode="grpo")
    optim = OptimConfig(learning_rate=3e-2, total_steps=100)
    state = init_train_state(cfg, loss_cfg, optim, jax.random.key(1))
    step = make_train_step(cfg, loss_cfg, optim)
    logprob_fn = make_logprob_fn(cfg)
    group = 16
    prompt = np.tile(np.array([[1, 5]], np.int32), (group, 1))
    from models import transformer

    @jax.jit
    def probs(params):
        logits, _ = transformer.forward(params, jnp.asarray(prompt[:1]), cfg)
        return jax.nn.softmax(logits[0, -1])

    p0 = np.asarray(probs(state["params"]))
    good, bad = (7, 8) if p0[7] < p0[8] else (8, 7)

    def share_good(params):
        # Sampling is restricted to the two answers so every group carries a reward signal.
        p = np.asarray(probs(params))
        return float(p[good] / (p[good] + p[bad]))

    start = share_good(state["params"])
    key = jax.random.key(2)
    for _ in range(12):
        key, sub = jax.random.split(key)
        hit = np.asarray(jax.random.bernoulli(sub, share_good(state["params"]), (group,)))
        answer = np.where(hit, good, bad).astype(np.int32)
        tokens = np.concatenate([prompt, answer[:, None]], axis=1)
        attn = np.ones_like(tokens)
        loss_mask = np.zeros_like(tokens)
        loss_mask[:, 2] = 1
        adv = advantages.grpo(jnp.asarray(hit, jnp.float32), group)
        batch = {"tokens": tokens, "attn_mask": attn, "loss_mask": loss_mask, "advantages": adv,
                 "old_logp": logprob_fn(state["params"], tokens, attn)}
        state, m = step(state, batch)
    end = share_good(state["params"])
    assert end > start + 0.3 and end > 0.8, (start, end)


# ------------------------------------------------------------------------------------- shared GRPO step
# One compiled GRPO step (adaptive KL, clip-higher, temperature 0.7) serves the tests below, so the
# file pays for its compile once.
@pytest.fixture(scope="module")
def grpo():
    # No load-balancing weight: it is the one term gradient accumulation only approximates (the
    # metric is still computed and compared).
    cfg = tiny_cfg(router_aux_coef=0.0)
    loss_cfg = LossConfig(mode="grpo", kl_coef_init=0.1, clip_high=0.28, temperature=0.7)
    ctl = AdaptiveKL(init_coef=0.1, target=1e-6, horizon=10.0)
    # A small lr: Adam's first update is ~lr * sign(g), so parameters whose gradient is near 0 amplify
    # float32 reduction-order noise by lr / |g|; 1e-4 keeps that under the 1e-5 sharding tolerance.
    optim = OptimConfig(learning_rate=1e-4)
    return dict(cfg=cfg, loss_cfg=loss_cfg, optim=optim, ctl=ctl, step=make_train_step(cfg, loss_cfg, optim, ctl),
                logprob_fn=make_logprob_fn(cfg))


def grpo_batch(g, params):
    batch = toy_batch()
    lp = np.asarray(g["logprob_fn"](params, batch["tokens"], batch["attn_mask"], 0.7))
    return {**batch, "advantages": np.array([1.0, -0.5, 0.25, -0.75], np.float32), "old_logp": lp,
            "ref_logp": lp - 0.3 * batch["loss_mask"]}  # a reference that differs: positive KL


def test_logprob_fn_matches_forward_and_step_is_on_policy(grpo):
    from models import transformer
    cfg = grpo["cfg"]
    state = init_train_state(cfg, grpo["loss_cfg"], grpo["optim"], jax.random.key(3), kl_controller=grpo["ctl"])
    batch = grpo_batch(grpo, state["params"])
    fwd = jax.jit(lambda p, t, m: transformer.forward(p, t, cfg, attn_mask=m)[0])
    logits = fwd(state["params"], jnp.asarray(batch["tokens"]), jnp.asarray(batch["attn_mask"]))
    want = np.asarray(token_logprobs(logits, jnp.asarray(batch["tokens"]), 0.7)) * batch["attn_mask"]
    np.testing.assert_allclose(batch["old_logp"], want, rtol=1e-5, atol=1e-5)
    assert np.all(batch["old_logp"][:, 0] == 0)

    state, m = grpo["step"](state, batch)
    assert float(m["policy/ratio_mean"]) == pytest.approx(1.0, abs=1e-4)
    assert float(m["kl"]) > 0 and float(m["loss/kl"]) == float(m["kl"])
    # KL far above the tiny target: the adaptive controller raised the coefficient inside the step
    # (err clipped to 0.2, n_steps = 4 rows with response tokens, horizon 10).
    assert float(state["kl_state"]["coef"]) == pytest.approx(0.1 * (1 + 0.2 * 4 / 10.0), rel=1e-5)
    s2 = update_kl(state, grpo["ctl"], 0.0, 10)
    assert float(s2["kl_state"]["coef"]) < float(state["kl_state"]["coef"])


def test_ppo_step_trains_value_head():
    cfg = tiny_cfg()
    loss_cfg = LossConfig(mode="ppo")
    optim = OptimConfig(learning_rate=1e-2)
    state = init_train_state(cfg, loss_cfg, optim, jax.random.key(4))
    assert state["params"]["value_head"]["w"].shape == (cfg.d_model,)
    batch = toy_batch()
    lp, vals = make_logprob_fn(cfg, with_values=True)(state["params"], batch["tokens"], batch["attn_mask"])
    rng = np.random.default_rng(0)
    rewards = np.zeros(batch["tokens"].shape, np.float32)
    rewards[:, -1] = rng.normal(size=4)
    adv, ret = advantages.gae(rewards, vals, batch["loss_mask"], 1.0, 0.95)
    batch = {**batch, "old_logp": lp, "advantages": adv, "returns": ret, "old_values": vals}
    step = make_train_step(cfg, loss_cfg, optim)
    losses = []
    for _ in range(5):
        state, m = step(state, batch)
        losses.append(float(m["loss/value"]))
    assert losses[-1] < losses[0]
    assert float(np.abs(np.asarray(state["params"]["value_head"]["w"])).sum()) > 0


# ------------------------------------------------------------------------------------- robustness
def test_non_finite_batch_is_skipped(grpo):
    state = init_train_state(grpo["cfg"], grpo["loss_cfg"], grpo["optim"], jax.random.key(5),
                             kl_controller=grpo["ctl"])
    good = grpo_batch(grpo, state["params"])
    bad = {**good, "advantages": np.array([1.0, np.nan, 0.0, -1.0], np.float32)}
    before = host({k: state[k] for k in ("params", "opt_state", "step", "kl_state")})
    state, m = grpo["step"](state, bad)
    assert int(m["skipped"]) == 1 and int(state["n_skipped"]) == 1
    after = host({k: state[k] for k in ("params", "opt_state", "step", "kl_state")})
    jax.tree.map(np.testing.assert_array_equal, before, after)
    # The next finite batch is applied normally.
    state, m = grpo["step"](state, good)
    assert int(m["skipped"]) == 0 and int(state["step"]) == 1 and int(state["n_skipped"]) == 1


def test_microbatched_step_equals_whole_batch(grpo):
    cfg, loss_cfg, optim, ctl = grpo["cfg"], grpo["loss_cfg"], grpo["optim"], grpo["ctl"]
    params = host(init_train_state(cfg, loss_cfg, optim, jax.random.key(8))["params"])
    batch = grpo_batch(grpo, params)
    batch["old_logp"] = batch["old_logp"] + 0.05 * batch["loss_mask"]
    whole, m1 = grpo["step"](init_train_state(cfg, loss_cfg, optim, jax.random.key(9), params=params,
                                              kl_controller=ctl), batch)
    step2 = make_train_step(cfg, loss_cfg, optim, ctl, microbatches=2)
    split, m2 = step2(init_train_state(cfg, loss_cfg, optim, jax.random.key(9), params=params, kl_controller=ctl),
                      batch)
    for k in ("loss/total", "loss/policy", "loss/kl", "loss/router_z", "entropy", "grad_norm", "kl", "n_rows",
              "policy/clip_frac_high", "policy/ratio_mean", "policy/ratio_max"):
        np.testing.assert_allclose(float(m2[k]), float(m1[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(np.asarray(m2["router/expert_load"]), np.asarray(m1["router/expert_load"]), atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 host(split["params"]), host(whole["params"]))
    with pytest.raises(ValueError, match="microbatches"):
        make_train_step(cfg, loss_cfg, optim, microbatches=0)


def test_minibatches_respect_token_budget():
    b = toy_batch(b=5, t=8)
    b["attn_mask"][:] = 1
    b["attn_mask"][2, 4:] = 0  # lengths 8, 8, 4, 8, 8
    b["advantages"] = np.arange(5, dtype=np.float32)
    mbs = list(minibatches(b, token_budget=20))
    assert [len(mb["tokens"]) for mb in mbs] == [3, 2]  # 8 + 8 + 4 fits 20 exactly
    assert all(mb["attn_mask"].sum() <= 20 for mb in mbs)
    np.testing.assert_array_equal(np.concatenate([mb["advantages"] for mb in mbs]), b["advantages"])
    padded = list(minibatches(b, token_budget=20, pad_rows_to=2))
    assert [len(mb["tokens"]) for mb in padded] == [4, 2]
    assert padded[0]["loss_mask"][3].sum() == 0 and padded[0]["attn_mask"][3].sum() == 1
    assert [len(mb["tokens"]) for mb in minibatches(b, token_budget=16)] == [2, 2, 1]
    with pytest.raises(ValueError, match="token_budget"):
        list(minibatches(b, token_budget=4))


# ------------------------------------------------------------------------------------- sharding
def test_sharded_step_equals_unsharded(grpo):
    from models import sharding, transformer
    cfg, loss_cfg, optim, ctl = grpo["cfg"], grpo["loss_cfg"], grpo["optim"], grpo["ctl"]
    params = host(transformer.init(cfg, jax.random.key(6)))
    batch = grpo_batch(grpo, params)
    batch["old_logp"] = batch["old_logp"] + 0.05 * batch["loss_mask"]  # ratios away from 1: clipping is exercised

    plain = init_train_state(cfg, loss_cfg, optim, jax.random.key(7), params=params, kl_controller=ctl)
    plain, m_plain = grpo["step"](plain, batch)

    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "expert": 2, "tensor": 2})
    sharded = init_train_state(cfg, loss_cfg, optim, jax.random.key(7), mesh=mesh, params=params, kl_controller=ctl)
    sharded, m_sh = make_train_step(cfg, loss_cfg, optim, ctl, mesh=mesh)(sharded, batch)

    for k in ("loss/total", "loss/policy", "loss/kl", "loss/router_aux", "loss/router_z", "grad_norm", "entropy",
              "policy/clip_frac_high", "policy/ratio_max"):
        np.testing.assert_allclose(float(m_sh[k]), float(m_plain[k]), rtol=1e-5, atol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 host(sharded["params"]), host(plain["params"]))
    np.testing.assert_allclose(float(sharded["kl_state"]["coef"]), float(plain["kl_state"]["coef"]), rtol=1e-6)
    # The state keeps its explicit shardings through the donated step: the experts are split.
    w_gate = sharded["params"]["block_0"]["moe"]["w_gate"]
    assert len(w_gate.sharding.device_set) == 8 and w_gate.sharding.spec[0] == "expert"
