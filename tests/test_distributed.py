"""Two processes, one run: JAX's distributed runtime on two local processes of 4 CPU devices each.

A test starts this file twice as a worker (`python tests/test_distributed.py --worker PART ID PORT WORKDIR`); the
two workers join through jax.distributed.initialize with a local coordinator and gloo CPU collectives and build one
mesh over the 8 devices of both. PART "dp":
  1. three GRPO train steps (rl.train_step) data-parallel over the 8 devices;
  2. save the train state with rl.checkpoint.Checkpointer (both processes call save, as the trainer does), read it
     back in both, and run a fourth step from the restored state and from the live one.
PART "ep": three steps of a model with 8 experts on a data 4 x expert 2 mesh whose expert pairs span the two
processes, so the expert-parallel all-to-all (models/moe_ep.py) crosses process boundaries.
Each worker writes what it saw to WORKDIR/result_ID.npz; the test compares both workers' parameters with one process
holding all 8 devices (this pytest process: tests/conftest.py forces 8 CPU devices) running the same steps.
Each test takes about 14 s on an idle 2-core machine, nearly all of it XLA compiling the train step in 3 processes.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_PROCESSES, LOCAL_DEVICES, STEPS = 2, 4, 3
HPARAMS = {"lr": 3e-3, "kl_coef": 0.0}


def _configs(n_experts: int):
    from models.config import ModelConfig
    from rl.train_step import LossConfig, OptimConfig

    # One MoE block: the smallest model with attention, router and experts (compiling is most of the test's time).
    model = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=32,
                        n_experts=n_experts, experts_per_token=2, moe_every=1, max_seq_len=16)
    return model, LossConfig(mode="grpo"), OptimConfig(grad_clip=1.0)


def _host_batch(step: int, rows: int = 16, length: int = 12) -> dict:
    """A GRPO batch from a fixed seed: every process builds the same one (the global batch)."""
    rng = np.random.default_rng(100 + step)
    tokens = rng.integers(3, 64, size=(rows, length)).astype(np.int32)
    attn = np.ones((rows, length), np.int32)
    attn[:, -3:] = rng.integers(0, 2, size=(rows, 3))
    attn = np.minimum.accumulate(attn, axis=1)  # right padding
    loss_mask = attn.copy()
    loss_mask[:, :4] = 0  # a 4-token prompt
    return {"tokens": tokens, "attn_mask": attn, "loss_mask": loss_mask.astype(np.float32),
            "advantages": rng.normal(size=(rows,)).astype(np.float32)}


def _global(tree, shardings):
    """Host arrays (identical in every process) -> global jax.Arrays; each process fills its own devices' shards."""
    import jax

    return jax.tree.map(lambda x, s: jax.make_array_from_callback(np.shape(x), s, lambda idx: np.asarray(x)[idx]),
                        tree, shardings)


def _from_host(host_tree, like):
    """Host NumPy (as Checkpointer.restore returns it) -> global arrays laid out like the leaves of `like`."""
    import jax

    def conv(h, x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):  # stored as its raw uint32 key data
            return jax.random.wrap_key_data(_global(h, x.sharding))
        return _global(h, x.sharding)

    return jax.tree.map(conv, host_tree, like)


def _to_host(tree):
    """Global arrays -> host NumPy in every process (process_allgather of each leaf)."""
    import jax
    from jax.experimental import multihost_utils

    def conv(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(conv, tree)


def _flat(tree, prefix: str) -> dict:
    import jax

    return {prefix + jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def run_steps(mesh, n_experts: int, steps: int = STEPS, state=None):
    """`steps` GRPO steps from a fresh state (or `state`) on `mesh`; returns (state, step function, batch sharding)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from rl.train_step import init_train_state, make_train_step

    model, loss, optim = _configs(n_experts)
    if state is None:
        state = init_train_state(model, loss, optim, jax.random.key(0), mesh=mesh)
    step = make_train_step(model, loss, optim, mesh=mesh)
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    for i in range(steps):
        batch = _global(_host_batch(i), jax.tree.map(lambda _: rows, _host_batch(i)))
        state, _ = step(state, batch, HPARAMS)
    return state, step, rows


def expert_mesh_devices(devices):
    """Interleave the processes' devices so each (data, expert) pair of a data 4 x expert 2 mesh spans both."""
    per_process = sorted({d.process_index for d in devices})
    by_process = [[d for d in devices if d.process_index == p] for p in per_process]
    return [d for group in zip(*by_process) for d in group]


# ---- worker ------------------------------------------------------------------------------------------------------------
def worker(part: str, process_id: int, port: int, workdir: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=N_PROCESSES,
                               process_id=process_id)
    from jax.sharding import NamedSharding

    from models import sharding
    from rl.checkpoint import Checkpointer

    out = {"device_count": np.int64(jax.device_count()), "local_device_count": np.int64(jax.local_device_count()),
           "process_index": np.int64(jax.process_index())}

    if part == "ep":
        # expert parallelism across the processes: data 4 x expert 2, each expert pair on two processes
        ep_mesh = sharding.make_mesh({"data": 4, "expert": 2}, devices=expert_mesh_devices(jax.devices()))
        ep_state, _, _ = run_steps(ep_mesh, n_experts=8)
        w_gate = ep_state["params"]["stack_0"]["moe"]["w_gate"]
        out["ep_local_expert_shapes"] = np.array(sorted({s.data.shape for s in w_gate.addressable_shards}))
        out.update(_flat(_to_host(ep_state["params"]), "ep"))
        np.savez(os.path.join(workdir, f"result_{process_id}.npz"), **out)
        jax.distributed.shutdown()
        return

    # 1. three data-parallel steps over the 8 devices of both processes
    mesh = sharding.make_mesh({"data": -1})
    state, step, rows = run_steps(mesh, n_experts=4)
    out.update(_flat(_to_host(state["params"]), "dp"))

    # 2. checkpoint: save from both processes, restore in both, continue one step from each copy
    ck = Checkpointer(os.path.join(workdir, "checkpoints"), keep=2, keep_best=False)
    ck.save(STEPS, state, {"step": STEPS})
    latest = ck.latest_step()
    out["latest_step"] = np.int64(-1 if latest is None else latest)
    restored = ck.restore(latest, state)
    out.update(_flat(restored["params"], "restored"))
    restored = _from_host(restored, state)
    batch = _global(_host_batch(STEPS), jax.tree.map(lambda _: rows, _host_batch(STEPS)))
    resumed, _ = step(restored, batch, HPARAMS)
    live, _ = step(state, batch, HPARAMS)
    out.update(_flat(_to_host(resumed["params"]), "resumed"))
    out.update(_flat(_to_host(live["params"]), "live"))
    ck.close()
    np.savez(os.path.join(workdir, f"result_{process_id}.npz"), **out)
    jax.distributed.shutdown()


# ---- the test ---------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_workers(part: str, workdir) -> list:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={LOCAL_DEVICES}",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    port = _free_port()
    return [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", part, str(i), str(port),
                              str(workdir)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for i in range(N_PROCESSES)]


def _wait(procs, workdir) -> list[dict]:
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"worker {i} failed:\n{logs[i][-4000:]}"
    results = [dict(np.load(workdir / f"result_{i}.npz")) for i in range(N_PROCESSES)]
    for i, res in enumerate(results):
        assert (res["device_count"], res["local_device_count"], res["process_index"]) == (8, 4, i)
    return results


def _host_params(state) -> dict:
    import jax

    return _flat(jax.tree.map(np.asarray, state["params"]), "")


def test_two_processes_train_and_checkpoint(tmp_path):
    """Three data-parallel steps over 2 processes x 4 devices equal one process with 8; a checkpoint saved by both
    processes restores in both and resumes exactly."""
    import jax

    from models import sharding

    assert jax.device_count() == 8, "tests/conftest.py must force 8 CPU devices before JAX starts"
    procs = _start_workers("dp", tmp_path)
    mesh = sharding.make_mesh({"data": -1})  # meanwhile, the same steps in this one process holding all 8 devices
    reference = _host_params(run_steps(mesh, n_experts=4)[0])
    fresh = _host_params(run_steps(mesh, n_experts=4, steps=0)[0])
    for i, res in enumerate(_wait(procs, tmp_path)):
        assert res["latest_step"] == STEPS
        for name, ref in reference.items():
            np.testing.assert_allclose(res["dp" + name], ref, rtol=1e-5, atol=1e-6, err_msg=f"worker {i} {name}")
            # the steps moved the parameters (two untouched inits would agree trivially)
            assert not np.allclose(ref, fresh[name], rtol=0, atol=1e-7), name
            np.testing.assert_array_equal(res["restored" + name], res["dp" + name])
            np.testing.assert_array_equal(res["resumed" + name], res["live" + name])


def test_two_processes_expert_parallel(tmp_path):
    """Expert pairs spanning the two processes: the all-to-all runs over gloo between processes; 4 of the 8 experts
    per device, parameters after three steps equal one process's."""
    import jax

    from models import sharding

    procs = _start_workers("ep", tmp_path)
    reference = _host_params(run_steps(sharding.make_mesh({"data": 4, "expert": 2}), n_experts=8)[0])
    for i, res in enumerate(_wait(procs, tmp_path)):
        assert res["ep_local_expert_shapes"].tolist() == [[1, 4, 16, 32]]  # [layer, experts of the shard, D, F]
        for name, ref in reference.items():
            np.testing.assert_allclose(res["ep" + name], ref, rtol=1e-5, atol=1e-6, err_msg=f"worker {i} ep {name}")


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--worker":
    sys.path.insert(0, ROOT)
    worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
