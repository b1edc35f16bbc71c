"""Model FLOPs: the one convention every bench counts by (experiments/bench/gpu.py, w1.py / w2.py, model_step.py,
grpo_step.py, profile_w1.py; models.config.flops_per_token is a per-token view of it).

    fwd = forward_flops(cfg, tokens=n, pairs=causal_pairs(prompt_lens, answer_lens, k), head_tokens=m)
    upd = train_flops(cfg, tokens=n, pairs=..., head_tokens=n)      # forward + backward; cfg.lora decides the path
    grouped_update_flops(cfg, prompt_mask, attn_mask, k), grouped_decode_flops(...), step_floor_flops(upd, dec, kl)

The convention (model FLOPs: the useful work of the model, whatever the program pads or recomputes):
- Weights: 2 FLOPs per matmul weight per real token (a multiply and an add): attention projections q, k, v, o, the
  dense SwiGLU (3 matrices), the router and the active experts' SwiGLU (experts_per_token routed + shared) of a MoE
  layer. The input embedding is a lookup (free); norms, biases, rotary and softmax are not counted.
- LM head (d_model x vocab): only on the positions whose logits the program computes (`head_tokens`): the trainer
  and the logprob passes take logits at every real position (prompt tokens included: they are computed, though no
  loss reads them); the sampler's prefill takes only each prompt's last position, so sampling counts one logits row
  per sampled token and none for the other prompt tokens.
- Attention: causal, q.k and p.v: 2 x 2 x n_heads x head_dim per layer for each (query, key) pair a real token sees
  (itself and every real token before it in its sequence; `pairs` sums them: causal_pairs). Padding is not counted.
- Training = forward + backward. Full fine-tuning: backward = 2 x forward (dX and dW of every matmul), so 3 x forward.
  LoRA (cfg.lora): the base weights are frozen, so their backward is one matmul (dX), not two: 2 x their forward,
  the LM head included. The trainer keeps the attention and dense-MLP targets low-rank (models.layers.LowRank:
  x W + s (x A) B): each adds 2 r (d_in + d_out) per token to the forward (x A, then (x A) B) and 3 x that to a
  training step (both adapters get dX and dW). Routed-expert targets (moe/*) are merged into the expert weights
  inside the forward (models.lora.merge_block), so the backward forms their full weight gradient: 3 x forward, as
  full fine-tuning; their per-step merge (A @ B, not per token) is not counted. Attention's q.k and p.v have no
  weights: 3 x forward either way.
- The sampler runs merged weights (models.lora.merge_blocks): a forward with merged=True has no adapter term.
"""
from __future__ import annotations

import numpy as np


def causal_pairs(prompt_lens, answer_lens, n_samples: int = 1) -> float:
    """(query, key) pairs of causal attention over real tokens: each prompt of p tokens once (p (p + 1) / 2), then
    each of its n_samples answers of a tokens after it (a p + a (a + 1) / 2). prompt_lens [G], answer_lens [G * K]."""
    p = np.asarray(prompt_lens, np.float64)
    a = np.asarray(answer_lens, np.float64)
    p_rows = np.repeat(p, n_samples)
    if p_rows.shape != a.shape:
        raise ValueError(f"answer_lens has {a.size} rows, prompt_lens x n_samples = {p_rows.size}")
    return float((p * (p + 1) / 2).sum() + (a * p_rows + a * (a + 1) / 2).sum())


def _layer_weights(cfg, layer: int) -> float:
    """Matmul weights a token touches in one block (no norms, no biases)."""
    d, hd = cfg.d_model, cfg.head_dim
    attn = d * hd * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)  # q, o and k, v
    if not cfg.is_moe_layer(layer):
        return attn + 3 * d * cfg.d_ff
    return attn + d * cfg.n_experts + (cfg.experts_per_token + cfg.n_shared_experts) * 3 * d * cfg.expert_ff


def body_weights(cfg) -> float:
    """Matmul weights per token in the blocks (no LM head, no embedding lookup)."""
    return float(sum(_layer_weights(cfg, i) for i in range(cfg.n_layers)))


def head_weights(cfg) -> float:
    """The LM head's matmul weights (d_model x vocab), tied or not."""
    return float(cfg.d_model * cfg.vocab_size)


def _attention_per_pair(cfg) -> float:
    return 2.0 * 2.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim  # q.k and p.v, 2 FLOPs per multiply-add


def _lora_dims(cfg, target: str) -> tuple[int, int]:
    """(d_in, d_out) of a low-rank target's weight (attention and dense MLP)."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {"attn/wq": (d, q), "attn/wk": (d, kv), "attn/wv": (d, kv), "attn/wo": (q, d),
            "mlp/w_gate": (d, cfg.d_ff), "mlp/w_up": (d, cfg.d_ff), "mlp/w_down": (cfg.d_ff, d)}[target]


def lora_split(cfg) -> tuple[float, float]:
    """(adapter FLOPs per token of one forward through the low-rank targets, base weights per token of the merged
    moe/* targets) for cfg.lora; (0, 0) without LoRA."""
    lcfg = getattr(cfg, "lora", None)
    if lcfg is None:
        return 0.0, 0.0
    adapter = merged = 0.0
    for layer in range(cfg.n_layers):
        moe = cfg.is_moe_layer(layer)
        for t in lcfg.targets:
            if t.startswith("attn/") or (t.startswith("mlp/") and not moe):
                d_in, d_out = _lora_dims(cfg, t)
                adapter += 2.0 * lcfg.rank * (d_in + d_out)  # x A, then (x A) B
            elif t.startswith("moe/shared/") and moe:
                merged += cfg.n_shared_experts * cfg.d_model * cfg.expert_ff
            elif t.startswith("moe/") and not t.startswith("moe/shared/") and moe:
                merged += cfg.experts_per_token * cfg.d_model * cfg.expert_ff
    return adapter, merged


def forward_flops(cfg, tokens: float, pairs: float, head_tokens: float | None = None, *,
                  merged: bool = True) -> float:
    """FLOPs of one forward over `tokens` real tokens with `pairs` causal (query, key) pairs, the LM head on
    `head_tokens` positions (default: every token). merged=False with cfg.lora: the trainer's low-rank forward
    (x W + s (x A) B), which adds the adapters' work; merged=True: the sampler's merged weights, no adapter term."""
    head_tokens = tokens if head_tokens is None else head_tokens
    out = 2.0 * body_weights(cfg) * tokens + 2.0 * head_weights(cfg) * head_tokens + _attention_per_pair(cfg) * pairs
    if not merged:
        out += lora_split(cfg)[0] * tokens
    return float(out)


def train_flops(cfg, tokens: float, pairs: float, head_tokens: float | None = None) -> float:
    """FLOPs of one forward + backward (a training step's model work) over the same tokens: 3 x forward for full
    fine-tuning; with cfg.lora, 2 x the frozen weights' forward (dX only), 3 x the merged moe/* targets' (their
    weight gradient is formed), 3 x the adapters' and 3 x attention's (see the module docstring)."""
    head_tokens = tokens if head_tokens is None else head_tokens
    fwd = forward_flops(cfg, tokens, pairs, head_tokens)
    if getattr(cfg, "lora", None) is None:
        return 3.0 * fwd
    adapter, merged = lora_split(cfg)
    frozen = 2.0 * (body_weights(cfg) - merged) * tokens + 2.0 * head_weights(cfg) * head_tokens
    return float(fwd + frozen + 2.0 * (2.0 * merged * tokens) + 2.0 * _attention_per_pair(cfg) * pairs
                 + 3.0 * adapter * tokens)


# -- a GRPO step on the grouped batch (each prompt once, its K answers after it): the W1 / W2 benches' counts --
def grouped_update_flops(cfg, prompt_mask, attn_mask, n_samples: int) -> float:
    """Model FLOPs of one update on the grouped batch (train_flops: forward + backward, 3 x forward for
    full fine-tuning, LoRA's path with cfg.lora): each prompt's real tokens once, each answer's real tokens once, the
    LM head on every one of them (the trainer computes logits at every position), causal attention over the keys
    each real token sees. Padding positions the program also computes are not useful work: not counted."""
    p = np.asarray(prompt_mask).sum(1)  # [G] real prompt tokens
    a = np.asarray(attn_mask).sum(1)  # [R] real answer tokens (incl. EOS)
    return train_flops(cfg, float(p.sum() + a.sum()), causal_pairs(p, a, n_samples))


def grouped_decode_flops(cfg, prompt_mask, lengths, n_samples: int) -> float:
    """Model FLOPs of sampling (forward_flops on the merged weights): each prompt's prefill once, then
    each generated token, with causal attention over the prompt and the tokens before it; the LM head once per
    sampled token (the prefill computes only the prompt's last position's logits, so none for the other prompt
    tokens). The sampler's padded positions, finished rows and its logits over the vocabulary's padding are not
    counted."""
    p = np.asarray(prompt_mask).sum(1)  # [G]
    a = np.asarray(lengths)  # [R] generated tokens per row
    return forward_flops(cfg, float(p.sum() + a.sum()), causal_pairs(p, a, n_samples), head_tokens=float(a.sum()))


def step_floor_flops(update: float, decode: float, kl: float) -> float:
    """The step's compute floor in FLOPs: the update (3 x forward), the reference pass (one forward, when KL > 0)
    and sampling. Divided by the same run's matmul peak it is the fastest this machine could take the step."""
    return update + (update / 3.0 if kl > 0 else 0.0) + decode
