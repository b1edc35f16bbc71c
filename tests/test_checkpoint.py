"""Tests for rl.checkpoint: exact round trips, and every kind of damage to the latest checkpoint is detected,
reported by file and survived by falling back to the intact one beside it."""
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rl.checkpoint import MANIFEST, Checkpointer, CheckpointError, verify_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tree(seed: int):
    rng = np.random.default_rng(seed)
    return {"params": {"w": rng.standard_normal((48, 32)).astype(np.float32),
                       "b": rng.standard_normal(32).astype(np.float32)},
            "step": np.int32(seed), "rng": jax.random.key_data(jax.random.key(seed))}


def _template():
    return jax.tree.map(np.zeros_like, _tree(0))


def _equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture
def two_checkpoints(tmp_path):
    """Steps 1 and 2 saved; returns (directory, the tree of step 1, the path of step 2)."""
    ck = Checkpointer(str(tmp_path / "ck"), keep=3, keep_best=False)
    ck.save(1, _tree(1), {"unit": 1})
    ck.save(2, _tree(2), {"unit": 2})
    ck.close()
    return str(tmp_path / "ck"), _tree(1), str(tmp_path / "ck" / "last" / "2")


def _largest_data_file(step_dir):
    files = [os.path.join(dp, n) for dp, _, ns in os.walk(os.path.join(step_dir, "state")) for n in ns]
    return max(files, key=os.path.getsize)


def _rewrite(path, fn):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    with open(path, "wb") as f:
        f.write(bytes(fn(data)))


def _flip(n, at: float = 0.5):
    def fn(data):
        start = min(int(len(data) * at), len(data) - n)
        for i in range(n):
            data[start + i] ^= 0xFF
        return data
    return fn


# The damage done to the latest checkpoint: (name, function of its directory).
CORRUPTIONS = [
    ("truncated data", lambda d: _rewrite(_largest_data_file(d), lambda b: b[: len(b) // 2])),
    ("empty data file", lambda d: _rewrite(_largest_data_file(d), lambda b: b"")),
    ("one flipped byte", lambda d: _rewrite(_largest_data_file(d), _flip(1))),
    ("64 flipped bytes", lambda d: _rewrite(_largest_data_file(d), _flip(64))),
    ("all-zero data file", lambda d: _rewrite(_largest_data_file(d), lambda b: bytes(len(b)))),
    ("empty meta", lambda d: _rewrite(os.path.join(d, "meta", "metadata"), lambda b: b"")),
    ("missing meta", lambda d: os.remove(os.path.join(d, "meta", "metadata"))),
    ("all-zero array metadata", lambda d: _rewrite(os.path.join(d, "state", "_METADATA"), lambda b: bytes(len(b)))),
    ("missing checkpoint metadata", lambda d: os.remove(os.path.join(d, "_CHECKPOINT_METADATA"))),
    ("truncated ocdbt manifest", lambda d: _rewrite(os.path.join(d, "state", "manifest.ocdbt"), lambda b: b[:10])),
    ("garbage checksums", lambda d: _rewrite(os.path.join(d, MANIFEST), lambda b: b"{not json")),
    ("edited checksums", lambda d: _rewrite(os.path.join(d, MANIFEST), lambda b: b.replace(b'"size": ', b'"size": 1', 1))),
    ("state directory gone", lambda d: __import__("shutil").rmtree(os.path.join(d, "state"))),
]


def test_round_trip_exact(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"), keep=2)
    tree = _tree(3)
    tree["key"] = jax.random.key(7)  # typed PRNG keys are stored as their raw data
    ck.save(5, tree, {"stage": 1, "unit": 4, "history": [{"a": 0.5}]}, val_pass1=0.25)
    assert ck.latest_step() == 5 and ck.best_step() == 5
    assert ck.restore_meta(5) == {"stage": 1, "unit": 4, "history": [{"a": 0.5}]}
    template = dict(_template(), key=np.zeros(2, np.uint32))
    got = ck.restore(5, template)
    assert _equal(got, dict(_tree(3), key=jax.random.key_data(jax.random.key(7))))
    assert verify_checkpoint(str(tmp_path / "ck" / "last" / "5")) == []


def test_fresh_directory_has_no_step(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"))
    assert ck.latest_step() is None and ck.best_step() is None and ck.restore_latest(lambda m: _template()) is None


@pytest.mark.parametrize("name,corrupt", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_damaged_latest_falls_back_to_intact(two_checkpoints, name, corrupt, capsys):
    directory, tree1, step2 = two_checkpoints
    corrupt(step2)
    ck = Checkpointer(directory, keep=3, keep_best=False)
    assert ck.latest_step() == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "damaged" in line]
    assert len(lines) == 1 and step2 in lines[0] and "resuming from step 1" in lines[0]
    assert ck.damaged[2]  # the damaged files are named
    assert all(":" in d for d in ck.damaged[2])
    assert ck.restore_meta(1) == {"unit": 1} and _equal(ck.restore(1, _template()), tree1)
    with pytest.raises(CheckpointError, match="damaged"):
        ck.restore(2, _template())  # asked for directly: refused, never loaded
    step, meta, tree = ck.restore_latest(lambda m: _template())
    assert step == 1 and meta == {"unit": 1} and _equal(tree, tree1)


def test_step_without_checksums_is_not_yet_written(two_checkpoints, capsys):
    # A kill between orbax's rename and the checksums: the step was never completed, so it is passed over (not
    # "damaged") and a later save of the same step replaces it.
    directory, tree1, step2 = two_checkpoints
    os.remove(os.path.join(step2, MANIFEST))
    ck = Checkpointer(directory, keep=3, keep_best=False)
    assert ck.latest_step() == 1 and ck.latest_step() == 1
    err = capsys.readouterr().err
    assert "damaged" not in err and err.count("not completely written") == 1 and step2 in err
    step, meta, tree = ck.restore_latest(lambda m: _template())
    assert step == 1 and _equal(tree, tree1)
    ck.save(2, _tree(22), {"unit": 2})
    assert ck.latest_step() == 2 and _equal(ck.restore(2, _template()), _tree(22))


def test_first_checkpoint_without_checksums_means_start_afresh(tmp_path, capsys):
    # The reproduction of the stuck workdir: the only checkpoint lost its checksums to a kill. It used to be
    # "no intact checkpoint" (CheckpointError, the rerun refused); it is not yet written: start from scratch.
    ck = Checkpointer(str(tmp_path / "ck"), keep=2)
    ck.save(1, _tree(1), {"unit": 1})
    os.remove(tmp_path / "ck" / "last" / "1" / MANIFEST)
    ck2 = Checkpointer(str(tmp_path / "ck"), keep=2)
    assert ck2.latest_step() is None and ck2.restore_latest(lambda m: _template()) is None
    assert "not completely written" in capsys.readouterr().err


def test_64_flipped_bytes_used_to_load_silently(two_checkpoints):
    # The reproduction: plain orbax restores such damage without an error, with wrong values. Whether a flip breaks
    # the compressed stream (and orbax raises) depends on where it lands: a single mid-file flip once did. So
    # several places are tried: plain orbax must load some of them silently, and the manifest must catch every one.
    directory, _, step2 = two_checkpoints
    target = _largest_data_file(step2)
    with open(target, "rb") as f:
        original = f.read()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _template())
    silent = 0
    for at in np.linspace(0.2, 0.9, 8):
        _rewrite(target, _flip(64, at))
        try:
            raw = ocp.Checkpointer(ocp.CompositeCheckpointHandler()).restore(
                step2, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
            silent += not _equal(raw, _tree(2))
        except ValueError:  # this flip broke the compressed stream: orbax noticed
            pass
        assert Checkpointer(directory).latest_step() == 1
        _rewrite(target, lambda b: original)
    assert Checkpointer(directory).latest_step() == 2  # undamaged again
    assert silent > 0


def test_named_file_is_the_damaged_one(two_checkpoints):
    _, _, step2 = two_checkpoints
    target = _largest_data_file(step2)
    _rewrite(target, _flip(1))
    assert verify_checkpoint(step2) == [os.path.relpath(target, step2) + ": checksum mismatch"]


def test_no_intact_checkpoint_is_a_clear_error(two_checkpoints):
    directory, _, step2 = two_checkpoints
    step1 = os.path.join(directory, "last", "1")
    _rewrite(_largest_data_file(step1), _flip(64))
    os.remove(os.path.join(step2, "meta", "metadata"))
    with pytest.raises(CheckpointError) as info:
        Checkpointer(directory).latest_step()
    msg = str(info.value)
    assert "no intact checkpoint" in msg and "step 2: meta/metadata: missing" in msg
    assert "step 1: state/" in msg and "checksum mismatch" in msg


def test_saving_again_after_a_fallback_replaces_the_damaged_step(two_checkpoints):
    directory, _, step2 = two_checkpoints
    _rewrite(_largest_data_file(step2), lambda b: b"")
    ck = Checkpointer(directory, keep=3, keep_best=False)
    assert ck.latest_step() == 1
    ck.save(2, _tree(22), {"unit": 2})
    assert ck.latest_step() == 2 and _equal(ck.restore(2, _template()), _tree(22))


def test_keep_and_best(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"), keep=2, keep_best=True)
    for step, val in [(1, 0.1), (2, 0.5), (3, 0.3), (4, None)]:
        ck.save(step, _tree(step), {"unit": step}, val_pass1=val)
    assert sorted(os.listdir(tmp_path / "ck" / "last")) == ["3", "4"]
    assert ck.best_step() == 2 and sorted(os.listdir(tmp_path / "ck" / "best")) == ["2"]
    assert _equal(ck.restore(2, _template(), best=True), _tree(2))
    # A damaged best copy is reported and ignored, never loaded.
    _rewrite(_largest_data_file(str(tmp_path / "ck" / "best" / "2")), _flip(64))
    assert Checkpointer(str(tmp_path / "ck")).best_step() is None


def test_temporary_directories_are_cleaned(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"), keep=2)
    ck.save(1, _tree(1), {"unit": 1})
    leftovers = [tmp_path / "ck" / "last" / "2.orbax-checkpoint-tmp-1712345", tmp_path / "ck" / "best" / "7.tmp-123"]
    for d in leftovers:
        (d / "state").mkdir(parents=True)
        (d / "state" / "x").write_bytes(b"partial")
    (tmp_path / "ck" / "last" / "1" / (MANIFEST + ".tmp-99")).write_text("{")
    ck2 = Checkpointer(str(tmp_path / "ck"), keep=2)
    assert not any(d.exists() for d in leftovers) and len(ck2.removed_tmp) == 3
    assert ck2.latest_step() == 1


SAVER = r'''
import sys, numpy as np
sys.path.insert(0, {repo!r})
from rl.checkpoint import Checkpointer
ck = Checkpointer({directory!r}, keep=1, keep_best=False)
rng = np.random.default_rng(0)
step = 0
while True:
    step += 1
    tree = {{"w": np.full((512, 512), step, np.float32), "v": rng.standard_normal((256, 256)).astype(np.float32)}}
    ck.save(step, tree, {{"unit": step}})
    print(step, flush=True)
'''


def test_kill_during_writes_leaves_an_intact_checkpoint(tmp_path):
    # keep=1: the only older checkpoint is deleted only after the new one has its checksums.
    directory = str(tmp_path / "ck")
    proc = subprocess.Popen([sys.executable, "-c", SAVER.format(repo=REPO, directory=directory)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for _ in range(3):
            assert proc.stdout.readline().strip()
        time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # at an arbitrary point of a later save
        proc.wait()
    finally:
        proc.kill()
    ck = Checkpointer(directory, keep=1, keep_best=False)
    step = ck.latest_step()
    assert step is not None and step >= 3
    tree = ck.restore(step, {"w": np.zeros((512, 512), np.float32), "v": np.zeros((256, 256), np.float32)})
    assert np.all(tree["w"] == step) and ck.restore_meta(step) == {"unit": step}
    assert not [n for n in os.listdir(os.path.join(directory, "last")) if not n.isdigit()]


def test_template_mismatch_is_a_checkpoint_error(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"))
    ck.save(1, _tree(1), {"unit": 1})
    with pytest.raises(CheckpointError, match="could not be restored"):
        ck.restore(1, {"params": {"w": np.zeros((3, 3), np.float32)}})


def test_device_arrays_saved(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"))
    ck.save(1, {"x": jnp.arange(4.0)}, {"unit": 1})
    assert np.array_equal(ck.restore(1, {"x": np.zeros(4, np.float32)})["x"], np.arange(4.0))


def test_invalid_keep():
    with pytest.raises(ValueError, match="keep"):
        Checkpointer("/tmp/unused-ck-dir", keep=0)


# ------------------------------------------------------------------------------------------ load_policy (rl/runs.py)
def _run_dir(tmp_path):
    """A workdir as a run leaves it: config.json, a best-policy copy and two `last` train states (with a PPO value
    head), written through the Checkpointer the trainer uses."""
    import json

    from experiments import launch
    from models import transformer
    from rl import config_validation as cv
    from rl.setup import build_model_cfg

    cfg = cv.validate(launch.get_config(os.path.join(REPO, "experiments/configs/quickstart.py") + ":variant=tiny"))
    wd = tmp_path / "run"
    wd.mkdir()
    (wd / "config.json").write_text(json.dumps(cfg.to_dict()))
    mcfg = build_model_cfg(cfg)
    params = [transformer.init(mcfg, jax.random.key(s)) for s in range(3)]
    best = Checkpointer(str(wd / "checkpoints" / "best_policy"), keep=1, keep_best=False)
    best.save(4, {"policy": params[0]}, {"stage": "cold_start", "unit": 3, "val_pass@1": 0.25, "global_unit": 4})
    last = Checkpointer(str(wd / "checkpoints"), keep=2, keep_best=True)
    for step, p in ((5, params[1]), (6, params[2])):
        state = {"params": {**p, "value_head": {"w": np.ones((mcfg.d_model, 1), np.float32)}}, "step": np.int32(step)}
        last.save(step, {"train_state": state, "ref_params": p}, {"stage": 2, "unit": step, "global_unit": step})
    return wd, params


def test_load_policy_best_last_and_by_unit(tmp_path):
    from rl.runs import find_policy, load_policy

    wd, params = _run_dir(tmp_path)
    for which, want in (("best", params[0]), ("last", params[2]), (5, params[1]), ("6", params[2])):
        cfg, mcfg, got, tok = load_policy(str(wd), which)
        assert _equal(got, want) and "value_head" not in got, which
        assert cfg.stages[0].stage.name == "cold_start" and mcfg.d_model == cfg.model.d_model
        assert tok.decode(tok.encode("Answer: 7", add_bos=False)) == "Answer: 7"
    path, step, meta = find_policy(str(wd), "best")
    assert step == 4 and meta["val_pass@1"] == 0.25 and path.endswith(os.path.join("best_policy", "last", "4"))
    with pytest.raises(CheckpointError, match="no checkpoint of unit 9"):
        find_policy(str(wd), 9)
    with pytest.raises(CheckpointError, match="best, last or a global unit"):
        find_policy(str(wd), "newest")
    with pytest.raises(CheckpointError, match="no config.json"):
        find_policy(str(tmp_path), "last")


def test_load_policy_from_a_relative_workdir(tmp_path, monkeypatch):
    from rl.runs import load_policy

    wd, params = _run_dir(tmp_path)
    monkeypatch.chdir(tmp_path)  # orbax wants absolute paths; users type runs/NAME
    assert _equal(load_policy("run", "best")[2], params[0]) and _equal(load_policy("run", "last")[2], params[2])


def test_load_policy_on_a_running_run_passes_over_a_step_being_written(tmp_path):
    from rl.runs import find_policy, load_policy

    wd, params = _run_dir(tmp_path)
    writing = wd / "checkpoints" / "last" / "7"
    writing.mkdir()
    (writing / "state").mkdir()  # orbax renamed it in, the checksums are not written yet
    before = sorted(os.listdir(wd / "checkpoints" / "last"))
    assert find_policy(str(wd), "last")[1] == 6
    assert _equal(load_policy(str(wd), "last")[2], params[2])
    assert sorted(os.listdir(wd / "checkpoints" / "last")) == before  # read-only: nothing removed or created
    # a checkpoint of another model is refused by shape, not loaded into the wrong structure
    cfg_path = wd / "config.json"
    import json

    cfg = json.loads(cfg_path.read_text())
    cfg["model"]["d_model"] = 64
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="does not hold a policy"):
        load_policy(str(wd), "best")
