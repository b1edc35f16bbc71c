"""Length-grouped SFT minibatches (stage field length_buckets): the row plan covers every row once with
even_minibatches' sizes, groups similar lengths, cutting a minibatch's padding columns leaves the SFT step's
loss, metrics and update unchanged (dropless MoE), and weighting each step by its share of the epoch's loss tokens
makes the bucketed epoch's gradients add up to the epoch's token-mean gradient."""
import jax
import numpy as np
import pytest

from models.config import ModelConfig
from rl import rollout
from rl.train_loop import bucketed_denominator
from rl.logprobs import compute_logprobs
from rl.train_step import LossConfig, OptimConfig, denom_share, init_train_state, make_loss_fn, make_train_step

TINY = dict(vocab_size=16, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32, n_experts=4,
            experts_per_token=2, moe_every=1, n_shared_experts=0, capacity_factor=None, max_seq_len=32)


def test_grouped_plan_covers_rows_with_even_sizes_and_sorted_windows():
    lengths = np.random.default_rng(0).integers(1, 100, size=70)
    order = np.random.default_rng(1).permutation(70)
    parts = rollout.length_grouped_minibatches(order, lengths, 8, np.random.default_rng(2), window=3)
    assert sorted(np.concatenate(parts).tolist()) == list(range(70))
    assert sorted(len(p) for p in parts) == sorted(len(p) for p in rollout.even_minibatches(order, 8))
    # the rows of one window (3 minibatches' worth of the shuffled order), sorted by length, make its minibatches
    window = order[:24]
    ranks = {int(r): i for i, r in enumerate(window[np.argsort(lengths[window], kind="stable")])}
    mine = [p for p in parts if int(p[0]) in ranks]
    assert len(mine) == 3 and sorted(sorted(ranks[int(r)] for r in p)[0] for p in mine) == [0, 8, 16]
    other = rollout.length_grouped_minibatches(order, lengths, 8, np.random.default_rng(3), window=3)
    assert [p.tolist() for p in other] != [p.tolist() for p in parts]  # batch order is shuffled per rng
    spread = np.mean([np.ptp(lengths[p]) for p in parts])
    assert spread < 0.5 * np.mean([np.ptp(lengths[p]) for p in rollout.even_minibatches(order, 8)])


def test_column_bucket_row_lengths_trim():
    assert [rollout.column_bucket(n, 544, 4) for n in (1, 136, 137, 300, 544)] == [136, 136, 272, 408, 544]
    assert [rollout.column_bucket(n, 96, 3) for n in (10, 33, 90)] == [32, 64, 96]
    assert [rollout.column_bucket(n, 20, 3) for n in (8, 9, 17)] == [8, 16, 20]  # multiples of 8, capped at seq_len
    attn = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert rollout.row_lengths(attn).tolist() == [2, 4, 0]
    out = rollout.trim_columns({"tokens": np.zeros((3, 4)), "attn_mask": attn, "temperature": np.ones(3)}, 2)
    assert out["tokens"].shape == (3, 2) and out["attn_mask"].shape == (3, 2) and out["temperature"].shape == (3,)


def test_epoch_minibatches_and_take_minibatch():
    lengths = np.array([3, 30, 5, 28, 4, 31])
    plain = rollout.epoch_minibatches(6, 2, np.random.default_rng(0))
    assert [p.tolist() for p in plain] == [p.tolist() for p in rollout.even_minibatches(
        np.random.default_rng(0).permutation(6), 2)]  # the same rng draw as before the helper
    grouped = rollout.epoch_minibatches(6, 2, np.random.default_rng(0), lengths)
    assert sorted(np.concatenate(grouped).tolist()) == list(range(6))
    batch = _sft_batch(rows=6)
    batch["attn_mask"][:] = (np.arange(32)[None] < lengths[:, None])
    mb = rollout.take_minibatch(batch, np.array([0, 2]), 4, length_buckets=4, lengths=lengths)
    assert mb["tokens"].shape == (4, 8) and not mb["attn_mask"][2:].any()  # padded rows, cut to 8
    assert rollout.take_minibatch(batch, np.array([0, 1]), 2)["tokens"].shape == (2, 32)  # no buckets: full width


def _sft_batch(rows=6, t=32, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 16, size=(rows, t)).astype(np.int32)
    lengths = rng.integers(4, 13, size=rows)
    attn = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    tokens *= attn
    loss = attn.copy()
    loss[:, :2] = 0
    return {"tokens": tokens, "attn_mask": attn, "loss_mask": loss}


def test_trimmed_sft_step_equals_padded_step():
    cfg = ModelConfig(**TINY)
    loss_cfg, optim = LossConfig(mode="sft"), OptimConfig()
    step = make_train_step(cfg, loss_cfg, optim)
    batch = _sft_batch()
    cols = rollout.column_bucket(int(rollout.row_lengths(batch["attn_mask"]).max()), 32, 4)
    assert cols == 16
    full, m_full = step(init_train_state(cfg, loss_cfg, optim, jax.random.key(0)), batch, {"lr": 1e-2})
    cut, m_cut = step(init_train_state(cfg, loss_cfg, optim, jax.random.key(0)), rollout.trim_columns(batch, cols),
                      {"lr": 1e-2})
    for k in ("loss/total", "loss/policy", "loss/router_aux", "loss/router_z", "entropy", "grad_norm"):
        np.testing.assert_allclose(float(m_cut[k]), float(m_full[k]), rtol=2e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(np.asarray(m_cut["router/expert_load"]), np.asarray(m_full["router/expert_load"]),
                               atol=1e-6)
    # the gradient itself (Adam's first step is about sign(g) * lr, so float noise on a ~0 gradient shows there)
    loss_fn = make_loss_fn(cfg, loss_cfg, None, None)
    params = init_train_state(cfg, loss_cfg, optim, jax.random.key(0))["params"]
    grad = jax.jit(jax.grad(lambda p, b: loss_fn(p, b, 0.0)[0]))  # jitted: eager scans would compile op by op
    g_full, g_cut = grad(params, batch), grad(params, rollout.trim_columns(batch, cols))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7),
                 g_cut, g_full)


def _mixed_lengths_batch(rows=16, t=32, seed=5):
    """Half short rows (5-8 tokens), half long ones (20-30), shuffled: length sorting separates them."""
    rng = np.random.default_rng(seed)
    lengths = rng.permutation(np.concatenate([rng.integers(5, 9, rows // 2), rng.integers(20, 31, rows // 2)]))
    attn = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    tokens = rng.integers(3, 16, size=(rows, t)).astype(np.int32) * attn
    loss = attn.copy()
    loss[:, :2] = 0
    return {"tokens": tokens, "attn_mask": attn, "loss_mask": loss}


def _flat64(tree):
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def test_bucketed_steps_add_up_to_the_epochs_token_mean_gradient():
    """With length buckets a step's loss is its summed token losses over bucketed_denominator (the epoch's loss
    tokens / its steps), so the steps' gradients add up (float64 sum) to steps x the gradient of the token mean over
    the whole epoch, computed in one pass over all rows: the unbucketed objective. Each step's own token mean, which
    length-sorted steps used before, weights every sequence about equally and misses it by far on this batch."""
    cfg = ModelConfig(**TINY, router_aux_coef=0.0, router_z_coef=0.0)  # the router terms stay per step
    loss_cfg = LossConfig(mode="sft")
    loss_fn = make_loss_fn(cfg, loss_cfg, None, None)
    params = init_train_state(cfg, loss_cfg, OptimConfig(), jax.random.key(1))["params"]
    batch = _mixed_lengths_batch()
    lengths = rollout.row_lengths(batch["attn_mask"])
    plan = rollout.epoch_minibatches(16, 4, np.random.default_rng(0), lengths)
    denom = bucketed_denominator(batch["loss_mask"], len(plan))
    assert denom == batch["loss_mask"].astype(np.float64).sum() / len(plan)
    weighted = jax.jit(jax.grad(lambda p, b, d: loss_fn(p, b, 0.0, denom_share(d))[0]))
    own = jax.jit(jax.grad(lambda p, b: loss_fn(p, b, 0.0)[0]))
    total, per_step_mean = 0.0, 0.0
    for idx in plan:
        mb = rollout.take_minibatch(batch, idx, 4)  # full width: one compile (cutting columns is exact, above)
        total = total + _flat64(weighted(params, mb, denom))
        per_step_mean = per_step_mean + _flat64(own(params, mb))
    want = len(plan) * _flat64(own(params, batch))
    np.testing.assert_allclose(total, want, rtol=2e-4, atol=1e-6 * np.abs(want).max())
    assert np.linalg.norm(per_step_mean - want) > 0.05 * np.linalg.norm(want)


def test_train_on_passes_the_epoch_denominator_only_with_buckets():
    """rl.train_loop.train_on with length_buckets gives every step hparams["loss_denom"] = the epoch's loss tokens /
    its steps (the same for every epoch); without buckets the step keeps its own token count (no loss_denom)."""
    from rl.train_loop import Carry, LoopConfig, Trainer, train_on

    seen = []

    def fake_step(state, mb, hp):
        seen.append({k: float(v) for k, v in hp.items()})
        return state, {"skipped": np.int32(0), "lr": hp["lr"], "loss/total": np.float32(0.0)}

    trainer = Trainer(step_fn=fake_step, loop=LoopConfig(), units=1, agg="token-mean")
    batch = _mixed_lengths_batch()
    carry, _ = train_on(trainer, Carry(state={}), batch, epochs=2, rng=np.random.default_rng(0), max_rows=4, unit=0,
                        length_buckets=4)
    assert len(seen) == 8 and all(h["loss_denom"] == pytest.approx(batch["loss_mask"].sum() / 4) for h in seen)
    assert carry.opt_steps == 8
    seen.clear()
    train_on(trainer, carry, batch, epochs=1, rng=np.random.default_rng(0), max_rows=4, unit=0)
    assert len(seen) == 4 and not any("loss_denom" in h for h in seen)


def test_step_divides_by_the_loss_denom_it_is_given():
    """hparams["loss_denom"] replaces the step's own token count: loss/policy = summed token NLL / loss_denom
    (float64 reference from the model's logprobs), not / the batch's loss tokens."""
    cfg = ModelConfig(**TINY)
    loss_cfg, optim = LossConfig(mode="sft"), OptimConfig()
    state = init_train_state(cfg, loss_cfg, optim, jax.random.key(2))
    batch = _sft_batch(rows=4)
    lp = np.asarray(compute_logprobs(state["params"], batch["tokens"], batch["attn_mask"], cfg), np.float64)
    nll = -(lp * batch["loss_mask"]).sum()
    assert batch["loss_mask"].sum() != 50
    step = make_train_step(cfg, loss_cfg, optim)
    _, m = step(state, batch, {"lr": 1e-3, "loss_denom": 50.0})
    np.testing.assert_allclose(float(m["loss/policy"]), nll / 50.0, rtol=1e-5)


@pytest.mark.parametrize("bad", [-1, 65, 1.5])
def test_length_buckets_field_is_validated(bad):
    from rl import stages

    with pytest.raises(Exception, match="length_buckets"):
        stages.parse_stage({"kind": "sft", "name": "cold_start", "length_buckets": bad})


@pytest.mark.slow  # compiles the R1 model's SFT step at every width (about a minute)
def test_bench_runs_and_reports_a_same_run_ratio(tmp_path):
    import json

    from experiments.bench import sft_buckets

    res = sft_buckets.main(["--rows", "64", "--reps", "1", "--json", str(tmp_path / "b.json")])
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["speedup"] == pytest.approx(res["speedup"]) and res["speedup"] > 0
    assert res["columns_per_epoch"]["bucketed"] < res["columns_per_epoch"]["padded"]  # it did cut the padding
