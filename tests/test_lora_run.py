"""model.lora and model.upcycle in the trainer (rl/; docs/lora_upcycling.md "Wiring into the trainer").

LoRA: the train state holds the adapters only (the optimizer state is twice their size), the base is never changed
and never checkpointed, the KL reference is the base (KL 0 at the first iteration, whose adapters are zero) or,
after a LoRA cold start, the cold-started adapters, the
train step's gradient is the chain rule through the merge (against a float64 NumPy reference), a stopped and resumed
run equals an uninterrupted one, and load_policy returns the merged weights. Upcycling: a dense checkpoint becomes
an MoE at the start and trains with routing replay and the router metrics of any MoE.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiments.configs import qwen_gsm8k, quickstart
from models import hf, layer_stack, lora, transformer
from models.config import ModelConfig
from rl import config_validation as cv
from rl import context, preflight, run, runs, setup, stages
from rl.losses import LossConfig
from rl.metrics import depends_on_the_machine, read_jsonl
from rl.train_step import OptimConfig, init_train_state, make_loss_fn, make_train_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN3 = os.path.join(ROOT, "tests", "data", "hf", "qwen3")
LORA = dict(rank=2, alpha=4.0, targets=("attn/wq", "attn/wv", "moe/w_up"))  # the tiny quickstart model is all-MoE


def _lora_config(**grpo):
    """The tiny quickstart with LoRA adapters and one GRPO stage that trains from its first iteration (an entropy
    bonus gives a gradient even when every group's rewards are equal)."""
    c = quickstart.get_config("variant=tiny")
    c.model.lora = dict(LORA)
    c.stages = [c.stages[2]]
    c.stages[0].update(dict(iterations=3, filter_zero_variance="off", entropy_coef=0.01, kl_coef=0.04, lr=3e-2, **grpo))
    c.eval.update(dict(initial=False, every=0))
    return cv.validate(c)


def test_a_lora_target_the_model_lacks_is_a_config_error_before_any_compute():
    """An MoE target on a dense model failed inside the memory plan with a traceback (exit 1)."""
    c = quickstart.get_config("variant=tiny")
    c.model.update(dict(n_experts=0, lora=dict(rank=2, alpha=4.0, targets=("moe/w_gate",))))
    with pytest.raises(cv.ConfigError, match=r"model\.lora\.targets: lora\.targets \['moe/w_gate'\] match no "
                                             r"parameter of this model"):
        preflight.prepare(c, verbose=False)


def _size(tree) -> int:
    return int(sum(np.size(x) for x in jax.tree.leaves(tree)))


def test_the_run_config_keeps_lora_and_upcycle_also_on_a_checkpoint():
    """Replaces the refusal of the sections (rl/setup.py build_model_cfg): the section's lora and upcycle reach
    the run's model config, from scratch and on a checkpoint (rl/pretrained.py RUNTIME_FIELDS)."""
    got = setup.build_model_cfg(cv.typed({"model": {"lora": dict(rank=3), "n_experts": 0}}))
    assert got.lora.rank == 3
    got = setup.build_model_cfg(cv.typed({"model": {"hf_path": QWEN3, "lora": dict(rank=3), "n_experts": 0}}))
    assert got.lora.rank == 3 and got.vocab_size == 96
    up = setup.build_model_cfg(cv.typed({"model": {"hf_path": QWEN3, "n_experts": 0,
                                                   "upcycle": dict(n_experts=4, top_k=2, moe_every=1)}}))
    assert (up.n_experts, up.experts_per_token, up.moe_layers, up.upcycle) == (4, 2, (0, 1), None)
    dense = setup.dense_model_cfg(cv.typed({"model": {"hf_path": QWEN3, "n_experts": 0,
                                                     "upcycle": dict(n_experts=4)}}))
    assert dense.n_experts == 0 and dense.upcycle.n_experts == 4
    with pytest.raises(cv.ConfigError, match="model.upcycle"):
        setup.build_model_cfg(cv.typed({"model": {"n_experts": 0, "n_layers": 1, "upcycle": dict(moe_every=2)}}))


def test_lora_grpo_trains_only_the_adapters_against_the_base(tmp_path):
    cfg = _lora_config()
    ctx = context.build_context(cfg, str(tmp_path))
    try:
        base0 = jax.device_get(context.start_weights(cfg, ctx.model_cfg))
        st = stages.init(ctx, 0, cfg.stages[0], ctx.init_params())
        state = st.base.carry.state
        assert set(state["params"]) == {"lora"}
        n_adapters = _size(state["params"])
        assert n_adapters == ctx.adaptation_record()["lora"]["adapter_params"] < _size(base0) / 10
        # AdamW's two moments of the adapters and nothing of the base (the step counts are scalars)
        assert _size([x for x in jax.tree.leaves(state["opt_state"]) if np.ndim(x)]) == 2 * n_adapters
        assert st.ref_params is ctx.frozen_base()  # the KL reference is the base itself: no second copy
        st, m0 = stages.unit(st, 0)
        assert abs(m0["kl"]) < 1e-6 and abs(m0["kl/train"]) < 1e-6  # zero adapters: policy == base
        assert "skipped_iteration" not in m0 and np.isfinite(m0["loss"])  # it trained at once
        for u in (1, 2):
            st, m = stages.unit(st, u)
        assert m["kl"] > 1e-6  # the adapters moved the policy away from the base
        adapters = st.base.carry.state["params"]["lora"]
        assert any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree.leaves(adapters) if x.ndim) and \
            np.abs(np.asarray(adapters["stack_0"]["attn"]["wq"]["b"][0])).max() > 0
        base = ctx.frozen_base()  # bit-identical after the run (never donated, never updated)
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), base, base0)
        policy = stages.policy_params(st)  # the base with the adapters attached, merged layer by layer in forward
        assert policy["stack_0"]["lora"] is adapters["stack_0"] and policy["embed"] is base["embed"]
        merged = lora.merge(base0, adapters, ctx.model_cfg)
        tokens = jnp.arange(12)[None] % ctx.model_cfg.vocab_size
        np.testing.assert_allclose(np.asarray(transformer.forward(policy, tokens, ctx.model_cfg)[0]),
                                   np.asarray(transformer.forward(merged, tokens, ctx.model_cfg)[0]), atol=1e-5)
        tree, meta = stages.tree(st), stages.meta(st)
        assert "ref_params" not in tree and set(tree["train_state"]["params"]) == {"lora"}
        assert meta["lora"] == {"rank": 2, "alpha": 4.0, "targets": list(LORA["targets"])}
        # another rank is refused on load, naming the difference
        with pytest.raises(ValueError, match="lora"):
            stages.load(st, tree, {**meta, "lora": {**meta["lora"], "rank": 3}})
    finally:
        ctx.close()


@pytest.mark.slow  # ~22 s cold; the GRPO LoRA run tests stay in the default suite
def test_lora_ppo_and_rejection_stages(tmp_path):
    """PPO trains the adapters and its value head (the train state's params), the base frozen; rejection sampling
    samples from the merged policy and hands the adapters on."""
    c = quickstart.get_config("variant=tiny")
    c.model.lora = dict(LORA)
    c.stages = [c.stages[1], stages.defaults("ppo") | dict(name="ppo", iterations=1, n_prompts=2, samples=2,
                                                               token_budget=1024, lr=3e-2, warmup_steps=0)]
    c.eval.update(dict(initial=False, every=0))
    cfg = cv.validate(c)
    ctx = context.build_context(cfg, str(tmp_path))
    try:
        base0 = jax.device_get(context.start_weights(cfg, ctx.model_cfg))
        st = stages.init(ctx, 0, cfg.stages[0], ctx.init_params())
        st, m = stages.unit(st, 0)
        assert m["n_kept"] >= 0 and set(stages.carried_params(st)) == {"lora"}
        st = stages.init(ctx, 1, cfg.stages[1], stages.carried_params(st))
        assert set(st.base.carry.state["params"]) == {"lora", "value_head"}
        st, m = stages.unit(st, 0)
        head = st.base.carry.state["params"]["value_head"]
        assert np.abs(np.asarray(head["w"])).max() > 0 and np.isfinite(m["loss"])  # trained through the merge
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), ctx.frozen_base(), base0)
    finally:
        ctx.close()


def _records(wd):
    return [{k: v for k, v in r.items() if not depends_on_the_machine(k)}
            for r in read_jsonl(os.path.join(wd, "metrics.jsonl")) if r.get("phase") == "train"]


def test_lora_run_resumes_exactly_checkpoints_adapters_and_loads_merged(tmp_path):
    cfg = _lora_config()
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    run.train(cfg, full)
    run.train(cfg.replace(run=cfg.run.replace(stop_after=1)), part)
    summary = run.train(cfg, part)
    assert _records(full) == _records(part)
    assert summary["model"]["lora"]["adapter_params"] > 0
    with open(os.path.join(full, "config.json"), "w", encoding="utf-8") as f:  # what the launcher writes
        json.dump(cfg.to_dict(), f)
    # the checkpoint: adapters and their optimizer state, never the base or a reference copy
    path, _, meta = runs.find_policy(full, "last")
    saved = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
        os.path.abspath(path), args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    assert "ref_params" not in saved and set(saved["train_state"]["params"]) == {"lora"}
    assert meta["stage_meta"]["lora"]["rank"] == 2
    # load_policy (eval / sample): the merged weights
    _, model_cfg, params, _ = runs.load_policy(full, "last")
    base = context.start_weights(cfg, model_cfg)
    want = lora.merge(base, jax.tree.map(jnp.asarray, saved["train_state"]["params"]["lora"]), model_cfg)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, want)
    assert not np.array_equal(np.asarray(params["stack_0"]["attn"]["wq"]), np.asarray(base["stack_0"]["attn"]["wq"]))


def _cold_start_config():
    """LoRA SFT (a cold start) then GRPO with a KL term: the GRPO stage starts from trained adapters."""
    c = quickstart.get_config("variant=tiny")
    c.model.lora = dict(LORA)
    c.stages = [c.stages[0], c.stages[2]]
    c.stages[0].update(dict(epochs=2, n_problems=16, lr=3e-2))
    c.stages[1].update(dict(iterations=3, filter_zero_variance="off", entropy_coef=0.01, kl_coef=0.04, lr=3e-2))
    c.eval.update(dict(initial=False, every=0))
    return cv.validate(c)


def test_after_a_lora_cold_start_the_kl_reference_is_the_cold_started_policy(tmp_path):
    """As without LoRA (docs/training.md), the reference of an RL stage is the policy it starts from: after a LoRA
    SFT stage a copy of its adapters (small; the base is still held once), so the first iteration's KL is 0; the
    checkpoint holds that copy (never the base) and a resumed run equals an uninterrupted one."""
    cfg = _cold_start_config()
    ctx = context.build_context(cfg, str(tmp_path / "ctx"))
    try:
        st = stages.init(ctx, 0, cfg.stages[0], ctx.init_params())
        for u in range(2):
            st, _ = stages.unit(st, u)
        cold = jax.device_get(stages.carried_params(st)["lora"])
        assert not lora.is_identity(cold)
        st = stages.init(ctx, 1, cfg.stages[1], stages.carried_params(st))
        assert set(st.ref_params) == {"lora"} and st.ref_params["lora"] is not st.base.carry.state["params"]["lora"]
        base = ctx.frozen_base()
        ref = lora.merge(base, st.ref_params["lora"], ctx.model_cfg)
        assert not np.array_equal(np.asarray(ref["stack_0"]["attn"]["wq"]), np.asarray(base["stack_0"]["attn"]["wq"]))
        st, m0 = stages.unit(st, 0)  # the reference is the cold-started policy: KL 0, not the distance to the base
        assert abs(m0["kl"]) < 1e-6 and abs(m0["kl/train"]) < 1e-6 and np.isfinite(m0["loss"])
        for u in (1, 2):  # a batch sampled ahead (run.overlap) still has the reference's params at iteration 1
            st, m = stages.unit(st, u)
        assert m["kl"] > 1e-6
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), st.ref_params["lora"], cold)
        tree, meta = stages.tree(st), stages.meta(st)
        assert set(tree["ref_params"]) == {"lora"} and meta["reference"] == "adapters"
        assert set(stages.template(st, meta)["ref_params"]) == {"lora"}
    finally:
        ctx.close()
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    run.train(cfg, full)
    run.train(cfg.replace(run=cfg.run.replace(stop_after=3)), part)  # 2 SFT units and 1 GRPO iteration
    run.train(cfg, part)
    assert _records(full) == _records(part)


def test_lora_sft_stage_trains_only_the_adapters(tmp_path):
    c = quickstart.get_config("variant=tiny")
    c.model.lora = dict(LORA)
    c.stages = [c.stages[0]]
    c.stages[0].update(dict(epochs=2, n_problems=16))
    c.eval.update(dict(initial=False, every=0))
    cfg = cv.validate(c)
    ctx = context.build_context(cfg, str(tmp_path))
    try:
        base0 = jax.device_get(context.start_weights(cfg, ctx.model_cfg))
        st = stages.init(ctx, 0, cfg.stages[0], ctx.init_params())
        st, m0 = stages.unit(st, 0)
        st, m1 = stages.unit(st, 1)
        assert m1["loss"] < m0["loss"]
        assert set(stages.carried_params(st)) == {"lora"}
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), ctx.frozen_base(), base0)
    finally:
        ctx.close()


DENSE = ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=0,
                    max_seq_len=16, lora=dict(rank=2, alpha=3.0, targets=("attn/wq", "mlp/w_down")))


def test_lora_step_gradient_is_the_chain_rule_through_the_merge():
    """The step's gradient norm (no clipping) against float64 NumPy: dL/dA = s G B^T, dL/dB = s A^T G with G the
    full model's gradient of each merged weight (adapters with B != 0, so both parts count); microbatches equal."""
    base = transformer.init(DENSE, jax.random.key(0))
    ad = lora.init(base, DENSE, jax.random.key(1))
    ad = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(2), x.shape), ad)  # B != 0
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 40, (4, 12)).astype(np.int32)
    batch = {"tokens": tokens, "attn_mask": np.ones_like(tokens), "loss_mask": (np.arange(12) >= 4)[None].repeat(4, 0)
             .astype(np.int32)}
    loss_cfg, opt_cfg = LossConfig(mode="sft"), OptimConfig(grad_clip=None)
    # the full model's gradient of every weight at the merged params (plain params, no LoRA in the config)
    plain = DENSE.replace(lora=None)
    merged = lora.merge(base, ad, DENSE)
    st_full = init_train_state(plain, loss_cfg, opt_cfg, jax.random.key(3), params=merged)
    fn = make_loss_fn(plain, loss_cfg, None, None)
    g_full = jax.jit(jax.grad(lambda p, b: fn(p, b, 0.0, None)[0]))(st_full["params"], batch)
    s = DENSE.lora.scale
    want = 0.0
    ad, g_full = layer_stack.per_layer(ad, DENSE), layer_stack.per_layer(g_full, DENSE)  # per layer, as the algebra
    for blk in ("block_0", "block_1"):
        for path in (("attn", "wq"), ("mlp", "w_down")):
            a = np.asarray(ad[blk][path[0]][path[1]]["a"], np.float64)
            b = np.asarray(ad[blk][path[0]][path[1]]["b"], np.float64)
            g = np.asarray(g_full[blk][path[0]][path[1]], np.float64)
            a2, b2 = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)  # [in, r], [r, out]
            g2 = g.reshape(a2.shape[0], -1)
            want += np.sum((s * g2 @ b2.T) ** 2) + np.sum((s * a2.T @ g2) ** 2)
    norms = []
    for micro in (1, 2):
        state = init_train_state(DENSE, loss_cfg, opt_cfg, jax.random.key(3),
                                 params={"lora": layer_stack.stacked(ad, DENSE)})  # donated: a fresh copy
        step = make_train_step(DENSE, loss_cfg, opt_cfg, microbatches=micro)
        new, m = step(state, batch, {"lr": 1e-3}, base)
        norms.append(float(m["grad_norm"]))
        assert set(new["params"]) == {"lora"}
    np.testing.assert_allclose(norms[0], np.sqrt(want), rtol=1e-4)
    np.testing.assert_allclose(norms[1], norms[0], rtol=1e-5)


def test_an_upcycled_start_computes_the_dense_checkpoint():
    """model.upcycle on a dense checkpoint (the qwen3 fixture): the run's starting weights are the MoE of
    upcycle.upcycle_params, its logits the dense checkpoint's (float32)."""
    c = quickstart.get_config("variant=tiny")
    c.model = type(c.model)(dict(hf_path=QWEN3, n_experts=0, upcycle=dict(n_experts=4, top_k=2)))
    cfg = cv.validate(c)
    model_cfg = setup.build_model_cfg(cfg)
    params = context.start_weights(cfg, model_cfg)
    dense_cfg, dense = hf.load(QWEN3)
    blocks = layer_stack.per_layer(params, model_cfg)
    assert "moe" in blocks["block_1"] and "mlp" in blocks["block_0"]  # moe_every 2: every other block
    assert set(k for k in params if k.startswith("stack_")) == {"stack_0", "stack_1"}  # dense and MoE stacks
    tokens = jnp.arange(12)[None] % dense_cfg.vocab_size
    np.testing.assert_allclose(np.asarray(transformer.forward(params, tokens, model_cfg)[0]),
                               np.asarray(transformer.forward(dense, tokens, dense_cfg)[0]), atol=2e-5)


@pytest.mark.slow  # ~19 s cold; routing replay itself: tests/test_routing_replay.py
def test_upcycled_grpo_replays_routes_and_logs_the_router(tmp_path):
    """A tiny dense model from scratch, upcycled (model.upcycle) and trained by GRPO with routing replay: the router
    metrics and the replay disagreement are logged as for any MoE."""
    c = quickstart.get_config("variant=tiny")
    c.model.update(dict(n_experts=0, upcycle=dict(n_experts=4, top_k=2, moe_every=1)))
    c.stages = [c.stages[2]]
    c.stages[0].update(dict(iterations=1, n_prompts=2, samples=2, routing_replay=True, filter_zero_variance="off",
                            entropy_coef=0.01))
    cfg = cv.validate(c)
    ctx = context.build_context(cfg, str(tmp_path))
    try:
        assert ctx.model_cfg.n_experts == 4 and ctx.adaptation_record()["upcycled"]["from"].startswith("random")
        st = stages.init(ctx, 0, cfg.stages[0], ctx.init_params())
        st, m = stages.unit(st, 0)
    finally:
        ctx.close()
    assert {"router/replay_disagreement", "router/max_load_ratio", "router/aux_loss"} <= set(m)
    assert len(m["router/max_load_ratio"]) == 2 and m["mismatch/logp_max_abs"] < 1e-4 and np.isfinite(m["loss"])


@pytest.mark.slow  # ~60 s on 2 loaded cores: compiles a new model's sampler, step and evaluation
def test_upcycled_checkpoint_runs_grpo_with_routing_replay(tmp_path):
    """model.upcycle on the tiny qwen3 checkpoint of configs/fixtures.py (a dense model with a tokenizer): the
    run starts from the upcycled MoE, GRPO replays the sampler's routes, the router metrics appear, summary.json
    names the checkpoint."""
    c = qwen_gsm8k.get_config("variant=tiny")
    c.model.update(dict(n_experts=0, upcycle=dict(n_experts=4, top_k=2, moe_every=1)))
    c.stages = [c.stages[1]]
    c.stages[0].update(dict(iterations=1, n_prompts=2, samples=2, routing_replay=True, filter_zero_variance="off",
                            entropy_coef=0.01))
    c.sampling.update(dict(max_new_tokens=16, batch_rows=4))
    c.eval.update(dict(k=1, n_val=2, n_test=2))
    c.checkpoint.keep_best = False
    cfg = cv.validate(c)
    summary = run.train(cfg, str(tmp_path))
    with open(tmp_path / "config.json", "w", encoding="utf-8") as f:  # what the launcher writes
        json.dump(cfg.to_dict(), f)
    assert summary["model"]["upcycled"]["from"] == c.model.hf_path
    assert summary["model"]["upcycled"]["moe_params"] > summary["model"]["upcycled"]["dense_params"]
    rec = _records(str(tmp_path))[0]
    assert {"router/replay_disagreement", "router/max_load_ratio/0", "router/aux_loss"} <= set(rec)
    assert rec["mismatch/logp_max_abs"] < 0.05  # bf16 compute; finite, sampler and trainer agree
    path, _, _ = runs.find_policy(str(tmp_path), "last")
    saved = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
        os.path.abspath(path), args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    assert saved["train_state"]["params"]["stack_0"]["moe"]["w_up"].shape[1] == 4  # the MoE is what is saved
