"""models/layer_stack.py: the layer plan, stacked <-> per-layer conversion, and checkpoints of the per-layer layout
(written before the blocks were stored stacked) restored and resumed.

The fixture tests/data/per_layer_run/quickstart_tiny is a run directory written by the code before the stacked
layout (commit 32b004f, `experiments.launch --config experiments/configs/quickstart.py:variant=tiny
--config.stages[2].temperature_start=0.6 --config.stages[2].temperature_end=0.6 --config.run.stop_after=12
--config.log.tensorboard=False`), its checkpoint of unit 12 holding "block_i" trees.
"""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from experiments import launch
from models import layer_stack, lora, transformer
from models.config import ModelConfig
from rl import checkpoint as ckpt_lib
from rl import config_validation as cv
from rl import runs
from rl.metrics import depends_on_the_machine, read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD_RUN = os.path.join(ROOT, "tests", "data", "per_layer_run", "quickstart_tiny")
QUICKSTART = os.path.join(ROOT, "experiments/configs/quickstart.py")
BASE = dict(vocab_size=32, d_model=16, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24, n_experts=4, experts_per_token=2)


@pytest.mark.parametrize("kinds, want", [
    ((False,) * 5, [(0, (False,), 5)]),
    ((True,) * 3, [(0, (True,), 3)]),
    ((False, True) * 4, [(0, (False, True), 4)]),  # MoE every other block: one group of period 2
    ((False, True, True, True), [(0, (False,), 1), (1, (True,), 3)]),  # a dense first block, then all MoE
    ((False, True), [(0, (False,), 1), (1, (True,), 1)]),  # nothing repeats
    ((False, False, True) * 2 + (False,), [(0, (False, False, True), 2), (6, (False,), 1)]),
])
def test_plan_cuts_the_layers_into_repeated_periods(kinds, want):
    groups = layer_stack.plan(kinds)
    assert [(g.start, g.kinds, g.repeats) for g in groups] == want
    layers = sorted(i for name, lay, _ in layer_stack.stacks(groups) for i in lay)
    assert layers == list(range(len(kinds)))  # every layer in exactly one stack
    assert all(kinds[i] == moe for _, lay, moe in layer_stack.stacks(groups) for i in lay)


@pytest.mark.parametrize("extra", [dict(n_layers=3, moe_every=1), dict(n_layers=4, moe_every=2),
                                   dict(n_layers=3, n_experts=0), dict(n_layers=4, moe_every=1, dense_layers=(0,))])
def test_stacked_and_per_layer_views_round_trip(extra):
    cfg = ModelConfig(**{**BASE, **extra})
    params = transformer.init(cfg, jax.random.key(0))
    blocks = layer_stack.per_layer(params, cfg)
    assert sorted(k for k in blocks if k.startswith("block_")) == [f"block_{i}" for i in range(cfg.n_layers)]
    assert all(("moe" in blocks[f"block_{i}"]) == cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    again = layer_stack.stacked(blocks, cfg)
    jax.tree.map(np.testing.assert_array_equal, again, params)
    # the leading axis of every stacked leaf is its stack's length
    for name, layers, _ in layer_stack.stacks(layer_stack.layer_groups(cfg)):
        assert {x.shape[0] for x in jax.tree.leaves(params[name])} == {len(layers)}


def test_optimizer_state_and_templates_convert_both_ways():
    cfg = ModelConfig(**BASE, n_layers=4, moe_every=2)
    params = transformer.init(cfg, jax.random.key(1))
    opt = optax.adam(1e-3).init(params)
    per = layer_stack.to_per_layer({"params": params, "opt": opt}, cfg)
    assert layer_stack.is_per_layer(per) and "block_3" in per["opt"][0].mu
    back = layer_stack.to_stacked(per, cfg)
    assert jax.tree.structure(back) == jax.tree.structure({"params": params, "opt": opt})
    jax.tree.map(np.testing.assert_array_equal, back["opt"], opt)
    shapes = jax.eval_shape(lambda: params)
    assert jax.tree.map(lambda s: s.shape, layer_stack.to_per_layer(shapes, cfg)) == \
        jax.tree.map(lambda x: x.shape, layer_stack.per_layer(params, cfg))


def test_a_per_layer_checkpoint_restores_into_the_stacked_template(tmp_path):
    """Params, Adam moments and LoRA adapters saved per layer come back stacked, bit for bit."""
    cfg = ModelConfig(**BASE, n_layers=4, moe_every=2, lora=dict(rank=2, alpha=4.0, targets=("attn/wq", "moe/w_up")))
    params = transformer.init(cfg, jax.random.key(2))
    adapters = lora.init(params, cfg, jax.random.key(3))
    adapters = jax.tree.map(lambda x: x + 0.5, adapters)
    tree = {"params": params, "lora": adapters, "opt": optax.adam(1e-3).init(adapters), "step": jnp.int32(7)}
    old = layer_stack.to_per_layer(jax.tree.map(np.asarray, tree), cfg)
    groups = layer_stack.layer_groups(cfg)
    ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"), keep=1, keep_best=False, layers=groups)
    ck.save(1, old, {"note": "per-layer"})
    assert ckpt_lib.saved_per_layer(str(tmp_path / "ck" / "last" / "1"))
    got = ck.restore(1, tree)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, tree)
    ck.save(2, tree, {"note": "stacked"})
    assert not ckpt_lib.saved_per_layer(str(tmp_path / "ck" / "last" / "2"))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), ck.restore(2, tree), tree)
    with pytest.raises(ckpt_lib.CheckpointError):  # without the plan, a per-layer checkpoint does not fit the template
        ckpt_lib.Checkpointer(str(tmp_path / "ck"), keep=1, keep_best=False).restore(1, tree)
    ck.close()


def _train_records(workdir):
    return [{k: v for k, v in r.items() if not depends_on_the_machine(k)}
            for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")) if r.get("phase") == "train"]


def _resume(workdir):
    argv = ["--config", QUICKSTART + ":variant=tiny", "--workdir", str(workdir), "--config.log.tensorboard=False",
            "--config.stages[2].temperature_start=0.6", "--config.stages[2].temperature_end=0.6"]
    assert launch.main(argv) == 0


def test_an_old_run_directory_resumes_as_its_stacked_copy(tmp_path, capsys):
    """The per-layer fixture resumes with today's code (scan_layers was False then; it may differ on resume), and
    gives exactly the numbers of the same state saved in the stacked layout and resumed; load_policy reads the old
    best policy, its params equal to the per-layer arrays as saved."""
    old, new = tmp_path / "old", tmp_path / "new"
    shutil.copytree(OLD_RUN, old)
    shutil.copytree(OLD_RUN, new)
    cfg = json.loads((old / "config.json").read_text())
    assert cfg["model"]["scan_layers"] is False  # the default then
    from rl.setup import build_model_cfg
    model_cfg = build_model_cfg(cv.typed(cfg))
    groups = layer_stack.layer_groups(model_cfg)
    # the same state, rewritten in the stacked layout
    last = new / "checkpoints" / "last"
    step = int(os.listdir(last)[0])
    assert ckpt_lib.saved_per_layer(str(last / str(step)))
    raw = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
        os.path.abspath(last / str(step)), args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                                   meta=ocp.args.JsonRestore()))
    ck = ckpt_lib.Checkpointer(str(new / "checkpoints"), keep=2, keep_best=True, layers=groups)
    ck.save(step, layer_stack.to_stacked(raw["state"], groups), raw["meta"])
    ck.close()
    assert not ckpt_lib.saved_per_layer(str(last / str(step)))

    _, _, params, _ = runs.load_policy(str(old), "best")
    best_raw = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
        os.path.abspath(runs.find_policy(str(old), "best")[0]),
        args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]["policy"]
    assert "block_0" in best_raw and "stack_0" in params
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 layer_stack.per_layer(params, model_cfg), best_raw)

    _resume(old)
    assert "resuming from checkpoint" in capsys.readouterr().out
    _resume(new)
    a, b = json.loads((old / "summary.json").read_text()), json.loads((new / "summary.json").read_text())
    assert a["eval"] == b["eval"] and list(a["eval"]) == ["initial", "cold_start", "rejection", "grpo"]
    assert _train_records(old) == _train_records(new)
