"""Peak temporary memory of loss + grad at a 151,936-entry vocabulary: full logits vs models/vocab.py's chunks.

    python -m experiments.bench.large_vocab                 # ~1-2 min on 2 cores (compilation only, nothing runs)
    python -m experiments.bench.large_vocab --chunks 64 256

Batch 8 x 1024 tokens. Each case is jax.jit(jax.value_and_grad(loss)) lowered and compiled; the figure is XLA's
compiled memory analysis (temp_size_in_bytes: the scratch the program needs beyond its inputs and outputs), so it
measures the program, not this machine's load. The loss is the train step's shape of computation: per-token
logprobs at the sampling temperature and the entropy, -mean(adv * logp) - 0.01 * mean(entropy).

  head   only the output layer: hidden [8, 1024, D] and the tied [V, D] table in the compute dtype; gradients for
         both. "full logits" is rl/train_step.py's default path (model.logits_chunk = 0: float32 [B, T, V] logits, one
         log_softmax feeding logprobs and entropy); "chunked" is vocab.chunked_logprobs, the train step's path
         with model.logits_chunk > 0.
  model  a 2-block Qwen3-0.6B-shaped model (d_model 1024, 16 heads of 128, 8 KV heads, d_ff 3072, q/k norm, tied
         embeddings), bf16 parameters; gradients for all parameters. "chunked" = forward(return_logits=False) +
         vocab.sequence_logprobs.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from experiments.bench.common import add_json_arg, machine_info, print_table, write_json
from models import transformer, vocab
from models.config import ModelConfig

V, B, T = 151_936, 8, 1024
GIB = 1024 ** 3


def _loss_from_logp(logp, ent, adv):
    return -jnp.mean(adv[:, None] * logp) - 0.01 * jnp.mean(ent)


def _full_logits_terms(logits_BTV, tokens_BT, temp_B):
    # rl/train_step.py's default computation: one float32 log-softmax for both logprobs and entropy
    logp_all = jax.nn.log_softmax(logits_BTV[:, :-1].astype(jnp.float32) / temp_B[:, None, None], axis=-1)
    logp = jnp.take_along_axis(logp_all, tokens_BT[:, 1:, None], axis=-1)[..., 0]
    ent = -(jnp.exp(logp_all) * logp_all).sum(-1)
    return logp, ent


def temp_bytes(fn, *args) -> int:
    compiled = jax.jit(jax.value_and_grad(fn, argnums=0)).lower(*args).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def head_cases(dtype: str, d_model: int, chunks):
    dt = jnp.dtype(dtype)
    hw = (jax.ShapeDtypeStruct((B, T, d_model), dt), jax.ShapeDtypeStruct((V, d_model), dt))
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    temp = adv = jax.ShapeDtypeStruct((B,), jnp.float32)

    def full(hw_, tokens_, temp_, adv_):
        h, w = hw_
        logits = jnp.einsum("BTD,VD->BTV", h, w, preferred_element_type=jnp.float32)
        return _loss_from_logp(*_full_logits_terms(logits, tokens_, temp_), adv_)

    def chunked(c):
        def loss(hw_, tokens_, temp_, adv_):
            h, w = hw_
            logp, ent = vocab.chunked_logprobs(h[:, :-1], w, tokens_[:, 1:], layout="VD", temperature=temp_,
                                               chunk_len=c)
            return _loss_from_logp(logp, ent, adv_)
        return loss

    rows = [("full logits", temp_bytes(full, hw, tokens, temp, adv))]
    rows += [(f"chunked, chunk_len {c}", temp_bytes(chunked(c), hw, tokens, temp, adv)) for c in chunks]
    return rows


def model_cases(chunks):
    cfg = ModelConfig(vocab_size=V, d_model=1024, n_layers=2, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=3072,
                      n_experts=0, moe_every=0, qk_norm=True, tie_embeddings=True, scale_tied_unembed=False,
                      max_seq_len=T, dtype="bfloat16", param_dtype="bfloat16")
    params = jax.eval_shape(lambda k: transformer.init(cfg, k), jax.random.key(0))
    tokens = jax.ShapeDtypeStruct((B, T), jnp.int32)
    temp = adv = jax.ShapeDtypeStruct((B,), jnp.float32)

    def full(p, tokens_, temp_, adv_):
        logits, _ = transformer.forward(p, tokens_, cfg)
        return _loss_from_logp(*_full_logits_terms(logits, tokens_, temp_), adv_)

    def chunked(c):
        def loss(p, tokens_, temp_, adv_):
            _, aux = transformer.forward(p, tokens_, cfg, return_logits=False)
            logp, ent = vocab.sequence_logprobs(p, cfg, aux["hidden"], tokens_, temp_, chunk_len=c)
            return _loss_from_logp(logp[:, 1:], ent[:, 1:], adv_)
        return loss

    rows = [("full logits", temp_bytes(full, params, tokens, temp, adv))]
    rows += [(f"chunked, chunk_len {c}", temp_bytes(chunked(c), params, tokens, temp, adv)) for c in chunks]
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, nargs="+", default=[32, 128])
    add_json_arg(ap)
    args = ap.parse_args(argv)
    print(f"batch {B} x {T}, vocabulary {V:,}; float32 [B, T, V] logits alone = {B * T * V * 4 / GIB:.2f} GiB; "
          f"backend {jax.default_backend()}")
    sections = [("head, float32, D=1024", head_cases("float32", 1024, args.chunks)),
                ("head, bfloat16, D=1536", head_cases("bfloat16", 1536, args.chunks)),
                ("model: 2 blocks Qwen3-0.6B-shaped, bfloat16", model_cases(args.chunks))]
    for title, rows in sections:
        base = rows[0][1]
        print(f"\n{title}: peak temporary memory of loss + grad (XLA compiled memory analysis)")
        print_table(["variant", "temp GiB", "vs full logits"],
                    [[name, f"{b / GIB:.2f}", f"{b / base:.3f}x"] for name, b in rows])
    out = {title: {name: {"temp_bytes": b, "vs_full": b / rows[0][1]} for name, b in rows} for title, rows in sections}
    write_json(args.json, {"batch": B, "seq": T, "vocab": V, "sections": out, "machine": machine_info()})
    return out


if __name__ == "__main__":
    main()
