"""The launcher's grouped update layout (rl/grouped_batch.py): a flat RL batch's groups rewritten as prompts-once
rows give the sampler's layout exactly, the same loss and gradients as the flat rows (padding groups change
nothing), plan() falls back to flat when it must, and a GRPO stage's first update is the flat one's."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import launch
from models.config import ModelConfig
from rl import grouped_batch, rollout
from rl.metrics import read_jsonl
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_loss_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32, n_experts=4,
                  experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None, max_seq_len=32)
G, K, P, C, PAD = 3, 4, 7, 6, 0


def sampled(seed=0):
    """Prompt ids (BOS + 2..P tokens) and K sampled answers each, as rl.rollout.sample returns them."""
    rng = np.random.default_rng(seed)
    prompt_ids = [list(rng.integers(3, 40, size=int(n))) for n in rng.integers(2, P + 1, size=G)]
    lengths = rng.integers(1, C + 1, size=G * K).astype(np.int32)
    live = np.arange(C)[None] < lengths[:, None]
    toks = (rng.integers(3, 40, size=(G * K, C)) * live).astype(np.int32)
    logp = (-rng.uniform(0.1, 3.0, size=(G * K, C)) * live).astype(np.float32)
    s = rollout.Samples(prompt_index=np.repeat(np.arange(G), K), tokens=toks, logprobs=logp, lengths=lengths,
                        texts=[""] * (G * K), group_sizes=np.full(G, K))
    return prompt_ids, s


def flat_batch(prompt_ids, s, seed=0):
    rng = np.random.default_rng(seed + 1)
    b = rollout.build_batch(prompt_ids, s, P + C, pad_id=PAD)
    mask = b["loss_mask"].astype(np.float32)
    batch = {"tokens": b["tokens"], "attn_mask": b["attn_mask"], "loss_mask": b["loss_mask"],
             "old_logp": b["sample_logp"], "ref_logp": (b["sample_logp"] - 0.1 * mask).astype(np.float32),
             "advantages": (rng.normal(size=(G * K, 1)) * mask).astype(np.float32),
             "temperature": np.full((G * K,), 0.9, np.float32)}
    return batch, b["resp_start"]


def layout(groups=G):
    return grouped_batch.GroupedLayout(k=K, groups=groups, prompt_len=P, answer_len=C, pad_id=PAD)


def test_rows_become_the_samplers_prompts_once_layout():
    """An independent construction from the sampler's output: left-padded prompts, answers from column 0."""
    prompt_ids, s = sampled()
    batch, start = flat_batch(prompt_ids, s)
    out = grouped_batch.to_grouped(batch, start, layout())
    for g, ids in enumerate(prompt_ids):
        want = np.zeros(P, np.int32)
        want[P - len(ids):] = ids
        np.testing.assert_array_equal(out["prompt_tokens"][g], want)
        np.testing.assert_array_equal(out["prompt_mask"][g], (np.arange(P) >= P - len(ids)).astype(np.int32))
    live = (np.arange(C)[None] < s.lengths[:, None]).astype(np.int32)
    np.testing.assert_array_equal(out["tokens"], s.tokens)
    np.testing.assert_array_equal(out["attn_mask"], live)
    np.testing.assert_array_equal(out["loss_mask"], live)
    np.testing.assert_array_equal(out["old_logp"], s.logprobs)
    np.testing.assert_array_equal(out["temperature"], batch["temperature"])
    for r in range(G * K):  # per-token advantages follow their tokens
        np.testing.assert_array_equal(out["advantages"][r, : s.lengths[r]],
                                      batch["advantages"][r, start[r] : start[r] + s.lengths[r]])


@pytest.mark.parametrize("mode", ["grpo", pytest.param("ppo", marks=pytest.mark.slow)])  # ppo: test_shared_prompt
def test_loss_and_gradients_equal_the_flat_rows_with_padding_groups(mode):
    prompt_ids, s = sampled(1)
    batch, start = flat_batch(prompt_ids, s, 1)
    if mode == "ppo":
        mask = batch["loss_mask"].astype(np.float32)
        rng = np.random.default_rng(5)
        batch.update(old_values=(rng.normal(size=mask.shape) * mask).astype(np.float32),
                     returns=(rng.normal(size=mask.shape) * mask).astype(np.float32))
    loss_cfg = LossConfig(mode=mode, kl_kind="k3", value_clip=0.2 if mode == "ppo" else 0.0)
    params = init_train_state(CFG, loss_cfg, OptimConfig(), jax.random.PRNGKey(0))["params"]
    loss_fn = make_loss_fn(CFG, loss_cfg, None, None)
    grad = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, jnp.float32(0.04)), has_aux=True))
    (flat_loss, flat_m), flat_g = grad(params, {k: jnp.asarray(v) for k, v in batch.items()})
    grouped = grouped_batch.to_grouped(batch, start, layout(groups=G + 2))  # two padding groups
    assert grouped["prompt_tokens"].shape == (G + 2, P) and grouped["tokens"].shape == ((G + 2) * K, C)
    (g_loss, g_m), g_g = grad(params, {k: jnp.asarray(v) for k, v in grouped.items()})
    np.testing.assert_allclose(float(g_loss), float(flat_loss), rtol=1e-5, atol=1e-6)
    for name in ("loss/policy", "loss/kl", "entropy", "loss/value"):
        np.testing.assert_allclose(float(g_m[name]), float(flat_m[name]), rtol=1e-4, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_g), jax.tree.leaves(flat_g)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    # the flat layout's padding rows (rl.rollout.pad_rows) change nothing either, the router terms included
    (p_loss, p_m), _ = grad(params, {k: jnp.asarray(v) for k, v in rollout.pad_rows(batch, G * K + 5).items()})
    for name in ("loss/total", "loss/router_aux", "loss/router_z"):
        np.testing.assert_allclose(float(p_m[name]), float(flat_m[name]), rtol=1e-6, atol=1e-7, err_msg=name)


def test_chunked_logprobs_equal_the_flat_passes():
    """The reference pass (and PPO's logprob + value pass) in the grouped layout, 2 groups per call (the second call
    padded), against rl.rollout.chunked's flat pass at each row's answer positions."""
    from rl.logprobs import make_logprob_fn

    prompt_ids, s = sampled(3)
    batch, start = flat_batch(prompt_ids, s, 3)
    params = init_train_state(CFG, LossConfig(mode="grpo"), OptimConfig(), jax.random.PRNGKey(1))["params"]
    fn = make_logprob_fn(CFG)
    mask = batch["loss_mask"].astype(np.float32)
    flat = rollout.chunked(fn, params, batch, 5, batch["temperature"]) * mask
    grouped = grouped_batch.chunked_logprobs(fn, params, batch, start, layout(groups=2), batch["temperature"])
    np.testing.assert_allclose(grouped * mask, flat, rtol=1e-5, atol=1e-5)
    assert np.all(grouped[mask == 0] == 0)
    # PPO's pass: logprobs and values (the value head's state before each answer token)
    vparams = init_train_state(CFG, LossConfig(mode="ppo"), OptimConfig(), jax.random.PRNGKey(2))["params"]
    vfn = make_logprob_fn(CFG, with_values=True)
    flat_lp, flat_v = rollout.chunked(vfn, vparams, batch, 5, batch["temperature"])
    g_lp, g_v = grouped_batch.chunked_logprobs(vfn, vparams, batch, start, layout(groups=2), batch["temperature"])
    np.testing.assert_allclose(g_lp * mask, flat_lp * mask, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g_v * mask, flat_v * mask, rtol=1e-5, atol=1e-5)


def test_plan_falls_back_to_flat_when_it_must():
    assert grouped_batch.plan([4, 4, 4], 16, 1, P, C, PAD) == layout(groups=4)
    assert grouped_batch.plan([4, 4, 4], 17, 2, P, C, PAD).groups == 4  # a multiple of the mesh's batch shards
    assert grouped_batch.plan([4, 2, 4], 16, 1, P, C, PAD) is None  # the curriculum's mixed K
    assert grouped_batch.plan([8, 8], 6, 1, P, C, PAD) is None  # a group larger than a minibatch
    assert grouped_batch.plan([4, 4], 4, 2, P, C, PAD) is None  # one group cannot cover two batch shards
    np.testing.assert_array_equal(grouped_batch.group_rows([2, 0], 3), [6, 7, 8, 0, 1, 2])


def test_bad_rows_fail_clearly():
    prompt_ids, s = sampled(2)
    batch, start = flat_batch(prompt_ids, s, 2)
    with pytest.raises(ValueError, match="share one prompt"):
        swapped = {k: np.asarray(v)[np.r_[0:3, K:K + 1, 4:G * K]] if np.ndim(v) else v for k, v in batch.items()}
        grouped_batch.to_grouped(swapped, start[np.r_[0:3, K:K + 1, 4:G * K]], layout())
    with pytest.raises(ValueError, match="whole groups"):
        grouped_batch.to_grouped({k: np.asarray(v)[:-1] for k, v in batch.items()}, start[:-1], layout())
    with pytest.raises(ValueError, match="more than the 2"):
        grouped_batch.to_grouped(batch, start, layout(groups=2))


@pytest.mark.slow  # ~55 s cold; the step-level equality of the layouts is in this file and test_shared_prompt
def test_grpo_stage_first_update_equals_the_flat_layouts(tmp_path):
    """The quickstart tiny run's GRPO stage, grouped (the default) against batch_layout=flat: the first
    iteration samples the same batch, so its loss and gradient norm agree to float rounding."""
    runs = {}
    for lay in ("auto", "flat"):
        wd = tmp_path / lay
        cfg = os.path.join(ROOT, "experiments/configs/quickstart.py") + ":variant=tiny"
        rl_index = 2
        assert launch.main(["--config", cfg, "--workdir", str(wd), f"--config.stages[{rl_index}].batch_layout={lay}",
                            f"--config.stages[{rl_index}].iterations=1", "--config.eval.initial=false"]) == 0
        recs = [r for r in read_jsonl(wd / "metrics.jsonl") if r["phase"] == "train" and "train/grouped" in r]
        assert len(recs) == 1, recs
        runs[lay] = recs[0]
    assert runs["auto"]["train/grouped"] == 1.0 and runs["flat"]["train/grouped"] == 0.0
    for k in ("loss", "grad_norm", "entropy", "reward/mean"):
        np.testing.assert_allclose(runs["auto"][k], runs["flat"][k], rtol=1e-4, atol=1e-6, err_msg=k)
