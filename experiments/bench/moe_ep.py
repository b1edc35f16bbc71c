"""MoE layer tokens/s with and without expert parallelism on 8 forced CPU devices (data 2 x expert 4).

    python -m experiments.bench.moe_ep                     # full run (about a minute on 2 cores)
    python -m experiments.bench.moe_ep --quick             # smoke run
    python -m experiments.bench.moe_ep --json /tmp/bench/moe_ep.json

One jitted forward + backward of one MoE layer (loss = sum(y * r) for a fixed random r), three ways, one after the
other in this process:
  ep      moe_layer(..., mesh=mesh): tokens travel to the devices holding their experts by all-to-all (models/moe_ep.py)
  auto    moe_layer(..., mesh=None) on the same sharded inputs: XLA's automatic partitioning (what sharded runs did
          before; it moves expert weights and activations as its partitioner sees fit)
  single  the same layer on one device, unsharded
Layer: d_model 512, 8 experts of width 1024, top-2, dropless, float32; tokens 16 x 256 (quick: 4 x 64). Experts are
sharded over the expert axis (2 per device), tokens over the data axis, exactly as models/sharding.py lays them out.
Prints tokens/s for each and the ep / auto ratio from this one run, the exchange rounds the ep path took, and the
collectives in each compiled program.

What a CPU can and cannot show: the 8 "devices" are threads of one process sharing this machine's cores and one
memory, so an all-to-all is a memory copy and no device is ever short of memory for whole experts. The ratio measures
how much work each partitioning makes the same cores do (gathers, padding, duplicated compute, copies), not the
network-bound scale-out expert parallelism exists for: on GPUs/TPUs the point is that each device stores and reads only
its own experts and sends token activations (k * tokens * d_model per layer) instead of weights.
"""
from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Must happen before JAX starts: 8 CPU devices for the data 2 x expert 4 mesh.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from experiments.bench import common  # noqa: E402
from models import moe, moe_ep, sharding  # noqa: E402
from models.config import ModelConfig  # noqa: E402

LAYER = dict(d_model=512, d_ff=1024, n_experts=8, experts_per_token=2, moe_every=1, capacity_factor=None)
MESH = {"data": 2, "expert": 4}
FULL = dict(batch=16, seq=256, reps=5)
QUICK = dict(batch=4, seq=64, reps=2)
COLLECTIVES = ("all-to-all", "all-gather", "all-reduce", "reduce-scatter", "collective-permute")


def _params(cfg, seed=0):
    rng = np.random.default_rng(seed)
    D, F, E = cfg.d_model, cfg.expert_ff, cfg.n_experts
    return {"router": jnp.asarray(rng.normal(size=(D, E)) * D ** -0.5, jnp.float32),
            "w_gate": jnp.asarray(rng.normal(size=(E, D, F)) * D ** -0.5, jnp.float32),
            "w_up": jnp.asarray(rng.normal(size=(E, D, F)) * D ** -0.5, jnp.float32),
            "w_down": jnp.asarray(rng.normal(size=(E, F, D)) * F ** -0.5, jnp.float32)}


def _step(cfg, mesh):
    def loss(p, x, r):
        y, stats = moe.moe_layer(p, x, cfg, mesh=mesh)
        return jnp.sum(y * r) + cfg.router_aux_coef * stats["router_aux_loss"]

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _collectives(compiled) -> dict:
    text = compiled.as_text()
    return {op: len(re.findall(rf"= [^=]*\b{op}(-start)?\(", text)) for op in COLLECTIVES}


def _measure(fn, args, reps):
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    sec, times = common.time_call(compiled, *args, reps=reps, warmup=1)
    return compiled, {"seconds": sec, "all_seconds": times, "compile_s": compile_s}


def run(quick: bool = False) -> dict:
    opts = QUICK if quick else FULL
    if jax.device_count() < 8:
        raise RuntimeError(f"needs 8 devices, found {jax.device_count()}: set XLA_FLAGS before JAX starts")
    cfg = ModelConfig(**LAYER)
    mesh = sharding.make_mesh(MESH, devices=jax.devices()[:8])
    B, T, D = opts["batch"], opts["seq"], cfg.d_model
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    r = jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32)
    p = _params(cfg)
    w_sh = NamedSharding(mesh, P("expert"))
    p_sh = {"router": jax.device_put(p["router"], NamedSharding(mesh, P())),
            **{k: jax.device_put(p[k], w_sh) for k in ("w_gate", "w_up", "w_down")}}
    tok = NamedSharding(mesh, P("data"))
    x_sh, r_sh = jax.device_put(x, tok), jax.device_put(r, tok)

    res = {"config": {**LAYER, "batch": B, "seq": T, "mesh": MESH, "reps": opts["reps"]},
           "machine": common.machine_info()}
    outputs = {}
    for name, mesh_arg, args in (("ep", mesh, (p_sh, x_sh, r_sh)), ("auto", None, (p_sh, x_sh, r_sh)),
                                 ("single", None, (p, x, r))):
        compiled, timing = _measure(_step(cfg, mesh_arg), args, opts["reps"])
        outputs[name] = compiled(*args)
        res[name] = {**timing, "tokens_per_s": B * T / timing["seconds"], "collectives": _collectives(compiled)}
    # The three must agree (same layer, same inputs): a wrong fast path would not be a speed-up.
    for name in ("ep", "auto"):
        diff = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
                   for a, b in zip(jax.tree.leaves(outputs[name]), jax.tree.leaves(outputs["single"])))
        res[name]["max_rel_diff_vs_single"] = diff

    # Rounds the ep exchange took for this routing (1 = no device overflowed its send buffer).
    _, weights, experts = moe.route(p["router"], x.reshape(B * T, D), cfg.experts_per_token)
    valid = jnp.ones((B, T, cfg.experts_per_token), bool)
    _, rounds = jax.jit(lambda p, x: moe_ep.expert_parallel(
        p, x, weights.reshape(B, T, -1), experts.reshape(B, T, -1), valid, mesh=mesh, return_rounds=True))(p_sh, x_sh)
    res["ep"]["rounds"] = int(rounds)
    res["ratio_ep_over_auto"] = res["ep"]["tokens_per_s"] / res["auto"]["tokens_per_s"]
    res["ratio_ep_over_single"] = res["ep"]["tokens_per_s"] / res["single"]["tokens_per_s"]
    res["machine_end"] = common.machine_info()
    return res


def report(res: dict, quick: bool) -> None:
    cfg = res["config"]
    print(f"## MoE layer, expert parallelism on 8 CPU devices{' (--quick)' if quick else ''}: "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print(f"Command: `python -m experiments.bench.moe_ep{' --quick' if quick else ''}`  ")
    m0, m1 = res["machine"], res["machine_end"]
    print(f"Machine: nproc={m0['nproc']}, jax {m0['jax']}, {m0['devices']} forced CPU devices, load average at start "
          f"{m0['loadavg']}, at end {m1['loadavg']}  ")
    print(f"Layer: d_model {cfg['d_model']}, {cfg['n_experts']} experts of width {cfg['d_ff']}, top-"
          f"{cfg['experts_per_token']}, dropless, float32; {cfg['batch']} x {cfg['seq']} tokens; mesh {cfg['mesh']}; "
          f"forward + backward, median of {cfg['reps']}\n")
    rows = []
    for name, label in (("ep", "expert parallel (all-to-all)"), ("auto", "XLA automatic partitioning"),
                        ("single", "one device, unsharded")):
        r = res[name]
        coll = ", ".join(f"{k} {v}" for k, v in r["collectives"].items() if v) or "none"
        rows.append([label, f"{r['tokens_per_s']:,.0f}", f"{r['seconds'] * 1e3:.1f}", f"{r['compile_s']:.1f}",
                     coll, "-" if name == "single" else f"{r['max_rel_diff_vs_single']:.1e}"])
    common.print_table(["MoE layer fwd+bwd", "tokens/s", "ms / step", "compile s", "collectives in the program",
                        "max |diff| / max |value| vs one device (loss and every gradient)"], rows)
    print(f"\nexpert parallel / automatic partitioning: {res['ratio_ep_over_auto']:.2f}x tokens/s; "
          f"expert parallel / one device: {res['ratio_ep_over_single']:.2f}x; exchange rounds taken: "
          f"{res['ep']['rounds']}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small batch: a smoke run")
    common.add_json_arg(ap)
    args = ap.parse_args(argv)
    res = run(args.quick)
    report(res, args.quick)
    common.write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
