"""The functional train step: configs, optimizer, SFT overfit, GRPO toy problem, the sampling temperature against an
exact enumeration, PPO, KL measurement, sharding, non-finite containment."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.config import ModelConfig
from rl import advantages
from rl.logprobs import make_logprob_fn
from rl.losses import token_logprobs
from rl.train_step import (LossConfig, OptimConfig, init_train_state, make_loss_fn, make_optimizer,
                           make_train_step)
from schema import FieldErrors

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
    with pytest.raises(ValueError, match="score function"):
        LossConfig(mode="grpo", kl_kind="k1")  # k1 in the loss has zero expected gradient
    LossConfig(mode="ppo", kl_kind="k1", kl_in_loss=False)  # k1 in the reward is the unbiased choice
    # OptimConfig's fields carry their checks (schema/): FieldErrors names each bad field
    for bad, why in ((dict(grad_clip=-1.0), "must be None (off) or > 0.0"), (dict(grad_clip=0.0), "> 0.0"),
                     (dict(weight_decay=float("inf")), "finite"), (dict(weight_decay=-0.1), ">= 0.0"),
                     (dict(b1=1.0), "< 1.0"), (dict(b2=-0.5), ">= 0.0"), (dict(eps=0.0), "> 0.0"),
                     (dict(b1=True), "a number")):
        with pytest.raises(FieldErrors) as e:
            OptimConfig(**bad)
        assert [f for f, _ in e.value.errors] == list(bad) and why in e.value.errors[0][1], (bad, e.value.errors)
    with pytest.raises(FieldErrors) as e:  # every bad field at once
        OptimConfig(b1=2.0, eps=-1.0)
    assert [f for f, _ in e.value.errors] == ["b1", "eps"]
    assert OptimConfig() == OptimConfig(weight_decay=0.0, b1=0.9, b2=0.999, eps=1e-8, grad_clip=1.0)
    OptimConfig(grad_clip=None, b1=0.0, b2=0.0, weight_decay=1e3)  # the edges the optimizer accepts


HP = {"lr": 1e-4, "kl_coef": 0.1}


def test_optimizer_clips_global_norm():
    # Adam is scale-invariant per step, so the clip shows through the second moment: with clipping,
    # gradients g then 100 g give the same second update as g then g (both clipped to norm 0.5).
    opt = make_optimizer(OptimConfig(grad_clip=0.5))
    params = {"w": jnp.ones((3, 3))}
    g = {"w": jnp.arange(9.0).reshape(3, 3) + 1.0}

    def second_update(scale):
        _, st = opt.update(g, opt.init(params), params)
        up, _ = opt.update(jax.tree.map(lambda x: x * scale, g), st, params)
        return np.asarray(up["w"])

    np.testing.assert_allclose(second_update(100.0), second_update(1.0), rtol=1e-6)
    unclipped = make_optimizer(OptimConfig(grad_clip=None))
    _, st = unclipped.update(g, unclipped.init(params), params)
    up100, _ = unclipped.update(jax.tree.map(lambda x: x * 100.0, g), st, params)
    assert not np.allclose(np.asarray(up100["w"]), second_update(1.0), rtol=1e-3)


# ------------------------------------------------------------------------------------- SFT
def test_sft_overfits_tiny_batch():
    cfg = tiny_cfg()
    loss_cfg = LossConfig(mode="sft")
    optim = OptimConfig()
    state = init_train_state(cfg, loss_cfg, optim, jax.random.key(0))
    step = make_train_step(cfg, loss_cfg, optim)
    batch = toy_batch()
    first = None
    for _ in range(40):
        state, m = step(state, batch, {"lr": 2e-2})
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
    optim = OptimConfig()
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
        state, m = step(state, batch, {"lr": 3e-2})
    end = share_good(state["params"])
    assert end > start + 0.3 and end > 0.8, (start, end)


# ------------------------------------------------------------------------------------- sampling temperature
@pytest.mark.parametrize("temperature", [pytest.param(0.5, marks=pytest.mark.slow), 0.7])
def test_gradient_at_sampling_temperature_matches_exact_enumeration(temperature):
    """The policy gradient of J_T = sum_y pi_T(y) R(y), with pi_T the sampler's distribution softmax(logits / T),
    computed exactly over every 2-token response, equals the train step's expected gradient when each sequence is
    weighted by its sampling probability: the step's logprobs must be taken at the sampling temperature. Taking them
    at T = 1 (the old behaviour) gives a different vector (checked, so the test can tell)."""
    V = 6
    cfg = tiny_cfg(vocab_size=V, max_seq_len=8, router_aux_coef=0.0, router_z_coef=0.0)  # the policy loss alone
    from models import transformer

    params = transformer.init(cfg, jax.random.key(11))
    seqs = np.array([[1, a, b] for a in range(V) for b in range(V)], np.int32)  # BOS + every 2-token response
    N = len(seqs)
    attn = np.ones_like(seqs)
    mask = np.zeros_like(seqs)
    mask[:, 1:] = 1
    reward = np.random.default_rng(0).normal(size=N).astype(np.float64)

    def seq_logp(p, temp):
        logits, _ = transformer.forward(p, jnp.asarray(seqs), cfg)
        return (token_logprobs(logits, jnp.asarray(seqs), temp) * mask).sum(-1)

    def objective(p):  # J_T, exactly
        return jnp.sum(jnp.exp(seq_logp(p, temperature)) * reward)

    exact = jax.jit(jax.grad(objective))(params)  # jitted: the MoE's scans run eagerly op by op otherwise
    pi = np.exp(np.asarray(jax.jit(seq_logp, static_argnums=1)(params, temperature), np.float64))
    assert pi.sum() == pytest.approx(1.0, abs=1e-4)
    loss_fn = make_loss_fn(cfg, LossConfig(mode="grpo", agg="seq-mean-token-sum"), None, None)
    grad = jax.jit(jax.grad(lambda p, b: loss_fn(p, b, 0.0)[0]))  # one compile serves both temperatures

    def step_grad(batch_temp):
        # seq-mean-token-sum: loss = -(1/N) sum_y A_y * sum_t ratio_t; on-policy ratio 1, so the gradient is
        # -(1/N) sum_y A_y grad log pi(y); A_y = N * pi_T(y) * R(y) makes it the expectation under the sampler.
        batch = {"tokens": seqs, "attn_mask": attn, "loss_mask": mask, "temperature": np.full((N,), batch_temp, np.float32),
                 "advantages": (N * pi * reward).astype(np.float32)}
        return grad(params, batch)

    flat = lambda t: np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(t)])  # noqa: E731
    want = -flat(exact)
    np.testing.assert_allclose(flat(step_grad(temperature)), want, rtol=2e-4, atol=1e-6)
    wrong = flat(step_grad(1.0))
    assert np.linalg.norm(wrong - want) > 0.05 * np.linalg.norm(want)


def test_logprob_fn_takes_per_row_temperatures():
    cfg = tiny_cfg()
    from models import transformer

    params = transformer.init(cfg, jax.random.key(3))
    batch = toy_batch()
    fn = make_logprob_fn(cfg)
    temps = np.array([0.5, 1.0, 0.7, 2.0], np.float32)
    got = np.asarray(fn(params, batch["tokens"], batch["attn_mask"], temps))
    for r, t in enumerate(temps):
        row = np.asarray(fn(params, batch["tokens"][r : r + 1], batch["attn_mask"][r : r + 1], float(t)))
        np.testing.assert_allclose(got[r], row[0], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------- shared GRPO step
# One compiled GRPO step (adaptive KL, clip-higher, temperature 0.7) serves the tests below, so the
# file pays for its compile once.
@pytest.fixture(scope="module")
def grpo():
    # No load-balancing weight: it is the one term gradient accumulation only approximates (the
    # metric is still computed and compared).
    cfg = tiny_cfg(router_aux_coef=0.0)
    loss_cfg = LossConfig(mode="grpo", clip_high=0.28)
    # A small lr: Adam's first update is ~lr * sign(g), so parameters whose gradient is near 0 amplify
    # float32 reduction-order noise by lr / |g|; 1e-4 keeps that under the 1e-5 sharding tolerance.
    optim = OptimConfig()
    return dict(cfg=cfg, loss_cfg=loss_cfg, optim=optim, step=make_train_step(cfg, loss_cfg, optim),
                logprob_fn=make_logprob_fn(cfg))


def grpo_batch(g, params, temperature=0.7):
    batch = toy_batch()
    lp = np.asarray(g["logprob_fn"](params, batch["tokens"], batch["attn_mask"], temperature))
    return {**batch, "temperature": np.full((4,), temperature, np.float32),
            "advantages": np.array([1.0, -0.5, 0.25, -0.75], np.float32), "old_logp": lp,
            "ref_logp": lp - 0.3 * batch["loss_mask"]}  # a reference that differs: positive KL


def test_logprob_fn_matches_forward_and_step_is_on_policy(grpo):
    from models import transformer
    cfg = grpo["cfg"]
    state = init_train_state(cfg, grpo["loss_cfg"], grpo["optim"], jax.random.key(3))
    batch = grpo_batch(grpo, state["params"])
    fwd = jax.jit(lambda p, t, m: transformer.forward(p, t, cfg, attn_mask=m)[0])
    logits = fwd(state["params"], jnp.asarray(batch["tokens"]), jnp.asarray(batch["attn_mask"]))
    want = np.asarray(token_logprobs(logits, jnp.asarray(batch["tokens"]), 0.7)) * batch["attn_mask"]
    np.testing.assert_allclose(batch["old_logp"], want, rtol=1e-5, atol=1e-5)
    assert np.all(batch["old_logp"][:, 0] == 0)

    state, m = grpo["step"](state, batch, HP)
    # old_logp at the batch's temperature: the step's ratio starts at exactly 1
    assert float(m["policy/ratio_mean"]) == pytest.approx(1.0, abs=1e-4)
    assert float(m["kl_coef"]) == pytest.approx(0.1) and float(m["lr"]) == pytest.approx(1e-4)
    assert float(m["kl"]) > 0 and int(m["skipped"]) == 0


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_kl_metric_is_the_sequence_mean_whatever_the_aggregation():
    """The controller reads the mean over sequences of each sequence's masked token-mean KL: with
    seq-mean-token-sum-norm the loss's KL term is a different number, the `kl` metric is not (float64 reference)."""
    cfg = tiny_cfg(router_aux_coef=0.0)
    from models import transformer

    params = transformer.init(cfg, jax.random.key(12))
    batch = toy_batch()
    lp = np.asarray(make_logprob_fn(cfg)(params, batch["tokens"], batch["attn_mask"]), np.float64)
    ref = lp - np.random.default_rng(1).uniform(0.0, 0.5, lp.shape) * batch["loss_mask"]
    batch = {**batch, "old_logp": lp.astype(np.float32), "ref_logp": ref.astype(np.float32),
             "advantages": np.zeros((4,), np.float32)}
    d = ref - lp
    k3 = np.exp(d) - d - 1
    m = batch["loss_mask"].astype(np.float64)
    want = np.mean((k3 * m).sum(1) / m.sum(1))
    for agg in ("token-mean", "seq-mean-token-sum-norm"):
        loss_fn = make_loss_fn(cfg, LossConfig(mode="grpo", agg=agg, max_len_norm=32), None, None)
        _, met = loss_fn(params, batch, 0.1)
        assert float(met["kl"]) == pytest.approx(want, rel=1e-4), agg
    # the aggregated KL term of the Dr. GRPO loss is sum / max_len per sequence: about half of it here
    assert float(met["loss/kl"]) == pytest.approx(np.mean((k3 * m).sum(1) / 32), rel=1e-4)


def test_ppo_step_trains_value_head():
    cfg = tiny_cfg()
    loss_cfg = LossConfig(mode="ppo", kl_kind="k1", kl_in_loss=False)
    optim = OptimConfig()
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
        state, m = step(state, batch, {"lr": 1e-2})
        losses.append(float(m["loss/value"]))
    assert losses[-1] < losses[0]
    assert float(np.abs(np.asarray(state["params"]["value_head"]["w"])).sum()) > 0


def test_kl_in_the_reward_is_measured_not_trained():
    """PPO with the KL in the reward (kl_in_loss False) and ref_logp in the batch: `kl` is the sequence mean of the
    per-token k1 (float64 reference), loss/kl is 0 and the loss and gradient are those of the batch without it."""
    cfg = tiny_cfg(router_aux_coef=0.0)
    from models import transformer

    params = transformer.init(cfg, jax.random.key(5))
    batch = toy_batch()
    lp = np.asarray(make_logprob_fn(cfg)(params, batch["tokens"], batch["attn_mask"]), np.float64)
    ref = lp - np.random.default_rng(2).uniform(0.0, 0.5, lp.shape) * batch["loss_mask"]
    batch = {**batch, "old_logp": lp.astype(np.float32), "advantages": np.array([1.0, -0.5, 0.25, -0.75], np.float32)}
    loss_fn = make_loss_fn(cfg, LossConfig(mode="grpo", kl_kind="k1", kl_in_loss=False), None, None)
    grad = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, 0.1), has_aux=True))
    (tot, met), g = grad(params, {**batch, "ref_logp": ref.astype(np.float32)})
    (tot0, _), g0 = grad(params, batch)
    m = batch["loss_mask"].astype(np.float64)
    want = np.mean(((lp - ref) * m).sum(1) / m.sum(1))
    assert float(met["kl"]) == pytest.approx(want, rel=1e-4) and want > 0.1
    assert float(met["loss/kl"]) == 0 and float(tot) == float(tot0)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), g, g0)


# ------------------------------------------------------------------------------------- robustness
def _assert_unchanged(before, state):
    after = host({k: state[k] for k in ("params", "opt_state", "step")})
    jax.tree.map(np.testing.assert_array_equal, before, after)


def test_non_finite_batch_is_skipped(grpo):
    state = init_train_state(grpo["cfg"], grpo["loss_cfg"], grpo["optim"], jax.random.key(5))
    good = grpo_batch(grpo, state["params"])
    bad = {**good, "advantages": np.array([1.0, np.nan, 0.0, -1.0], np.float32)}
    before = host({k: state[k] for k in ("params", "opt_state", "step")})
    state, m = grpo["step"](state, bad, HP)
    assert int(m["skipped"]) == 1 and int(state["n_skipped"]) == 1 and int(m["nonfinite_inputs"]) == 1
    _assert_unchanged(before, state)
    # The next finite batch is applied normally.
    state, m = grpo["step"](state, good, HP)
    assert int(m["skipped"]) == 0 and int(state["step"]) == 1 and int(state["n_skipped"]) == 1


def test_nan_at_masked_positions_does_not_skip(grpo):
    """A NaN (or inf) in a prompt or padding position of old / reference logprobs counts for nothing."""
    state = init_train_state(grpo["cfg"], grpo["loss_cfg"], grpo["optim"], jax.random.key(5))
    b = grpo_batch(grpo, state["params"])
    b["old_logp"] = b["old_logp"].copy()
    b["ref_logp"] = b["ref_logp"].copy()
    b["old_logp"][:, 0] = np.nan  # position 0 is never a response token
    b["ref_logp"][1, 7] = np.inf  # padding of row 1
    state, m = grpo["step"](state, b, HP)
    assert int(m["skipped"]) == 0 and int(m["nonfinite_inputs"]) == 0 and np.isfinite(float(m["loss/total"]))
    # an infinite logprob where it counts is flagged and skips the step (no silent clamping)
    b["old_logp"][0, 5] = -np.inf
    state, m = grpo["step"](state, b, HP)
    assert int(m["skipped"]) == 1 and int(m["nonfinite_inputs"]) == 1


def test_absurd_learning_rate_never_reaches_the_weights(grpo):
    """Finite loss and gradient, infinite update: the guard checks the updated parameters too."""
    state = init_train_state(grpo["cfg"], grpo["loss_cfg"], grpo["optim"], jax.random.key(5))
    b = grpo_batch(grpo, state["params"])
    before = host({k: state[k] for k in ("params", "opt_state", "step")})
    state, m = grpo["step"](state, b, {"lr": float("inf"), "kl_coef": 0.1})
    assert int(m["skipped"]) == 1
    _assert_unchanged(before, state)


def test_microbatched_step_equals_whole_batch(grpo):
    cfg, loss_cfg, optim = grpo["cfg"], grpo["loss_cfg"], grpo["optim"]
    params = host(init_train_state(cfg, loss_cfg, optim, jax.random.key(8))["params"])
    batch = grpo_batch(grpo, params)
    batch["old_logp"] = batch["old_logp"] + 0.05 * batch["loss_mask"]
    whole, m1 = grpo["step"](init_train_state(cfg, loss_cfg, optim, jax.random.key(9), params=params), batch, HP)
    step2 = make_train_step(cfg, loss_cfg, optim, microbatches=2)
    split, m2 = step2(init_train_state(cfg, loss_cfg, optim, jax.random.key(9), params=params), batch, HP)
    for k in ("loss/total", "loss/policy", "loss/kl", "loss/router_z", "entropy", "grad_norm", "kl", "n_rows",
              "policy/clip_frac_high", "policy/ratio_mean", "policy/ratio_max"):
        np.testing.assert_allclose(float(m2[k]), float(m1[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(np.asarray(m2["router/expert_load"]), np.asarray(m1["router/expert_load"]), atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 host(split["params"]), host(whole["params"]))
    with pytest.raises(ValueError, match="microbatches"):
        make_train_step(cfg, loss_cfg, optim, microbatches=0)


# ------------------------------------------------------------------------------------- sharding
def test_sharded_step_equals_unsharded(grpo):
    from models import sharding, transformer
    cfg, loss_cfg, optim = grpo["cfg"], grpo["loss_cfg"], grpo["optim"]
    params = host(transformer.init(cfg, jax.random.key(6)))
    batch = grpo_batch(grpo, params)
    batch["old_logp"] = batch["old_logp"] + 0.05 * batch["loss_mask"]  # ratios away from 1: clipping is exercised

    plain = init_train_state(cfg, loss_cfg, optim, jax.random.key(7), params=params)
    plain, m_plain = grpo["step"](plain, batch, HP)

    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "expert": 2, "tensor": 2})
    sharded = init_train_state(cfg, loss_cfg, optim, jax.random.key(7), mesh=mesh, params=params)
    sharded, m_sh = make_train_step(cfg, loss_cfg, optim, mesh=mesh)(sharded, batch, HP)

    for k in ("loss/total", "loss/policy", "loss/kl", "loss/router_aux", "loss/router_z", "grad_norm", "entropy",
              "policy/clip_frac_high", "policy/ratio_max"):
        np.testing.assert_allclose(float(m_sh[k]), float(m_plain[k]), rtol=1e-5, atol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 host(sharded["params"]), host(plain["params"]))
    # The state keeps its explicit shardings through the donated step: the experts are split.
    w_gate = sharded["params"]["stack_0"]["moe"]["w_gate"]  # [layers, E, D, F]
    assert len(w_gate.sharding.device_set) == 8 and w_gate.sharding.spec[1] == "expert"
