"""Bounded staleness (stages[i].max_staleness = k): the sampler runs up to k updates ahead, each batch carries its
behaviour logprobs and is logged with its staleness, the off-policy correction applies, and a run stopped with k
batches pending resumes exactly. Default suite: the lookahead rule and the checkpoint round trip of the pending
batches; the end-to-end k = 2 run, stop and resume is marked slow."""
import json
import os

import numpy as np
import pytest

from experiments import launch
from rl import run as run_lib
from rl.metrics import depends_on_the_machine, read_jsonl
from test_run import _assert_same_records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments/configs/quickstart.py")


def _config(**grpo):
    """The tiny quickstart without its rejection round: its cold start (10 SFT epochs: enough for the format term to
    give every GRPO iteration signal, so each one updates), then 4 GRPO iterations with k = 2 and TIS."""
    c = launch.get_config(QUICKSTART + ":variant=tiny")
    c.stages = [c.stages[0], c.stages[2]]
    c.stages[1].update(dict(iterations=4, max_staleness=2, tis_cap=2.0, **grpo))
    c.eval.update(dict(every=0, initial=False, k=0))
    return c


def _train_records(workdir):
    out = []
    for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
        if r.get("phase") == "train" and r.get("stage") == "grpo":
            out.append({k: v for k, v in r.items() if not depends_on_the_machine(k)})
    return out


@pytest.mark.slow  # three tiny runs in one process: ~2 CPU-minutes
def test_k2_staleness_is_logged_and_resume_is_exact(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    run_lib.train(_config(), str(full))
    recs = _train_records(full)
    # batch u is sampled at iteration max(0, u - 2): 0, 1, 2, 2 updates behind when it trains
    trained = [r for r in recs if r.get("optimizer_steps")]
    assert len(trained) == 4, "every iteration must update, or staleness (counted in updates) tests nothing"
    assert [r["staleness"] for r in recs] == [0.0, 1.0, 2.0, 2.0]
    assert all("offpolicy/tis_weight_mean" in r for r in trained)
    # stale batches: the trainer at the start of the update differs from the sampler; fresh ones only by rounding
    stale = [r for r in trained if r["staleness"] > 0]
    assert stale and all(r["offpolicy/log_ratio_abs_max"] > 1e-3 for r in stale)
    assert all(r["mismatch/logp_max_abs"] <= 1e-4 for r in recs)  # same params at sampling time: exact match

    # stop after the 10 SFT epochs and GRPO iteration 0: iterations 1 and 2 are pending (sampled ahead)
    cfg = _config()
    cfg.run.stop_after = 11
    run_lib.train(cfg, str(part))
    ck = json.loads(json.dumps(_latest_meta(part)))
    assert [b["unit"] for b in ck["stage_meta"]["pending"]] == [1, 2]
    run_lib.train(_config(), str(part))
    _assert_same_records(recs, _train_records(part))
    assert json.loads((part / "summary.json").read_text())["eval"] == json.loads((full / "summary.json").read_text())["eval"]


def _latest_meta(workdir):
    from rl.checkpoint import Checkpointer

    ck = Checkpointer(os.path.join(workdir, "checkpoints"))
    try:
        return ck.restore_meta(ck.latest_step())
    finally:
        ck.close()


def test_lookahead_follows_max_staleness_overlap_and_curriculum():
    from types import SimpleNamespace

    from rl import stages
    from rl.stages.iteration import lookahead

    def fake(k, overlap, curriculum):  # just what lookahead reads
        cfg = stages.parse_stage({**stages.defaults("grpo"), "max_staleness": k})
        run_cfg = SimpleNamespace(run=SimpleNamespace(overlap=overlap))  # the typed RunConfig's run.overlap
        return SimpleNamespace(base=SimpleNamespace(cfg=cfg, ctx=SimpleNamespace(cfg=run_cfg)),
                               cur_state={} if curriculum else None)

    assert lookahead(fake(3, True, False)) == 3 and lookahead(fake(0, True, False)) == 0
    assert lookahead(fake(3, False, False)) == 0 and lookahead(fake(3, True, True)) == 0


def test_pending_batches_round_trip_through_a_checkpoint(tmp_path):
    """k batches sampled ahead (arrays of several dtypes, routes included) come back from a checkpoint exactly, with
    their unit, temperature and version; the layout written before bounded staleness (one batch) still loads."""
    from rl import rollout
    from rl.checkpoint import Checkpointer

    rng = np.random.default_rng(0)

    def batch(u):
        arrays = {"tokens": rng.integers(0, 259, (4, 6)).astype(np.int32),
                  "sample_logp": rng.normal(size=(4, 6)).astype(np.float32),
                  "routes": rng.integers(-1, 4, (4, 6, 2, 2)).astype(np.int32),
                  "stats": rng.normal(size=(6,)).astype(np.float64)}
        return {"arrays": arrays, "unit": u, "temperature": 0.7 + u / 10, "version": u - 1}

    pending = [batch(3), batch(4)]
    ck = Checkpointer(str(tmp_path / "ck"), keep=1, keep_best=False)
    ck.save(1, {"pending": rollout.pending_tree(pending)}, {"pending": rollout.pending_meta(pending)})
    meta = json.loads(json.dumps(ck.restore_meta(1)))  # as a JSON round trip gives it back
    tree = ck.restore(1, {"pending": rollout.pending_template(meta["pending"])})
    ck.close()
    back = rollout.pending_load(tree["pending"], meta["pending"])
    assert [(b["unit"], b["temperature"], b["version"]) for b in back] == [(3, 1.0, 2), (4, 1.1, 3)]
    for a, b in zip(pending, back):
        assert a["arrays"].keys() == b["arrays"].keys()
        for k in a["arrays"]:
            assert b["arrays"][k].dtype == a["arrays"][k].dtype
            np.testing.assert_array_equal(b["arrays"][k], a["arrays"][k])
    old_meta = {"shapes": rollout.pending_meta(pending[:1])[0]["shapes"], "unit": 3, "temperature": 1.0}
    old = rollout.pending_load(pending[0]["arrays"], old_meta, default_version=5)
    assert len(old) == 1 and old[0]["version"] == 5 and old[0]["unit"] == 3
    assert rollout.pending_template(old_meta).keys() == pending[0]["arrays"].keys()
    assert rollout.pending_load(None, None) == []
