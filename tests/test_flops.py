"""models/flops.py, the one FLOP convention of the benches (issue 52, item 8): LoRA's path against a float64
enumeration of every matmul (forward, and a backward that forms dX for every weight but dW only for the adapters and
the merged routed-expert targets), full fine-tuning as 3 x the forward, and the W1 / W2 benches' grouped-batch
counts (each prompt once, every query-key pair)."""
import numpy as np
import pytest

from models import flops
from models.config import ModelConfig

DENSE = dict(vocab_size=40, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=0,
             max_seq_len=64)
MOE = dict(vocab_size=40, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=4,
           experts_per_token=2, moe_every=1, max_seq_len=64)


def _matrices(cfg):
    """(name, d_in, d_out, copies per token) of every block matmul a token runs through, layer by layer."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    out = []
    for layer in range(cfg.n_layers):
        out += [("attn/wq", d, q, 1), ("attn/wk", d, kv, 1), ("attn/wv", d, kv, 1), ("attn/wo", q, d, 1)]
        if cfg.is_moe_layer(layer):
            f, k = cfg.expert_ff, cfg.experts_per_token
            out += [("router", d, cfg.n_experts, 1), ("moe/w_gate", d, f, k), ("moe/w_up", d, f, k),
                    ("moe/w_down", f, d, k)]
        else:
            out += [("mlp/w_gate", d, cfg.d_ff, 1), ("mlp/w_up", d, cfg.d_ff, 1), ("mlp/w_down", cfg.d_ff, d, 1)]
    return out


def _reference(cfg, tokens, pairs, rank=None, targets=()):
    """float64 (forward, training) FLOPs by enumeration; rank None = full fine-tuning."""
    fwd = bwd = 0.0
    for name, d_in, d_out, n in _matrices(cfg):
        w = 2.0 * d_in * d_out * n * tokens
        fwd += w
        trains_w = rank is None or (name in targets and name.startswith("moe/"))  # merged: W's gradient is formed
        bwd += 2 * w if trains_w else w  # dX (+ dW)
        if rank is not None and name in targets and not name.startswith("moe/"):
            adapter = 2.0 * rank * (d_in + d_out) * tokens  # x A, (x A) B
            fwd += adapter
            bwd += 2 * adapter  # dX and dW of A and of B
    head = 2.0 * cfg.d_model * cfg.vocab_size * tokens
    attn = 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * pairs
    fwd += head + attn
    bwd += (2 * head if rank is None else head) + 2 * attn
    return fwd, fwd + bwd


def test_full_fine_tuning_is_three_forwards():
    cfg = ModelConfig(**DENSE)
    fwd, train = _reference(cfg, 7.0, 23.0)
    assert flops.forward_flops(cfg, 7, 23) == pytest.approx(fwd, rel=1e-12)
    assert flops.train_flops(cfg, 7, 23) == pytest.approx(train, rel=1e-12) == pytest.approx(3 * fwd, rel=1e-12)


@pytest.mark.parametrize("spec, targets", [
    (DENSE, ("attn/wq", "attn/wk", "attn/wv", "attn/wo", "mlp/w_gate", "mlp/w_up", "mlp/w_down")),
    (DENSE, ("attn/wq", "attn/wv")),
    (MOE, ("attn/wq", "moe/w_up", "moe/w_down")),
])
def test_lora_count_matches_a_float64_enumeration(spec, targets):
    cfg = ModelConfig(**spec, lora=dict(rank=2, alpha=4.0, targets=targets))
    fwd, train = _reference(cfg, 7.0, 23.0, rank=2, targets=targets)
    assert flops.train_flops(cfg, 7, 23) == pytest.approx(train, rel=1e-12)
    assert flops.forward_flops(cfg, 7, 23, merged=False) == pytest.approx(fwd, rel=1e-12)
    # the sampler's merged weights: the base's forward, no adapter work
    assert flops.forward_flops(cfg, 7, 23) == pytest.approx(_reference(ModelConfig(**spec), 7.0, 23.0)[0], rel=1e-12)
    # LoRA's step is cheaper than full fine-tuning's (the frozen weights' dW is skipped)
    assert flops.train_flops(cfg, 7, 23) < flops.train_flops(ModelConfig(**spec), 7, 23)


def test_head_tokens_and_causal_pairs():
    cfg = ModelConfig(**DENSE)
    head = 2.0 * cfg.d_model * cfg.vocab_size
    assert flops.forward_flops(cfg, 7, 23, head_tokens=2) == pytest.approx(flops.forward_flops(cfg, 7, 23) - 5 * head)
    # prompts of 3 and 4 tokens, two answers each of (2, 4) and (1, 3) tokens: enumerate each query's keys
    want = sum(q + 1 for q in range(3)) + sum(q + 1 for q in range(4))
    want += sum(3 + q + 1 for a in (2, 4) for q in range(a)) + sum(4 + q + 1 for a in (1, 3) for q in range(a))
    assert flops.causal_pairs([3, 4], [2, 4, 1, 3], 2) == want
    with pytest.raises(ValueError, match="answer_lens"):
        flops.causal_pairs([3, 4], [2, 4, 1], 2)


def test_update_flops_counts_each_prompt_once_and_every_query_key_pair():
    cfg = ModelConfig(vocab_size=40, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24,
                      n_experts=0, max_seq_len=64)  # dense, as SmolLM2
    pmask = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])  # prompts of 3 and 4 real tokens, left-padded
    attn = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])  # K = 2 answers per prompt
    # float64 reference by enumeration: every real token once (prompt tokens once per prompt), and for each real
    # query token the keys it attends to (itself and every real token before it in its sequence).
    weights = (cfg.n_layers * (2 * cfg.d_model * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
                               + 3 * 2 * cfg.d_model * cfg.d_ff) + 2 * cfg.d_model * cfg.vocab_size) / 2.0
    tokens = pairs = 0.0
    for g in range(2):
        p = int(pmask[g].sum())
        for q in range(p):
            tokens += 1
            pairs += q + 1
        for k in range(2):
            for q in range(int(attn[2 * g + k].sum())):
                tokens += 1
                pairs += p + q + 1
    expected = 3 * (2 * weights * tokens + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * pairs)
    assert flops.grouped_update_flops(cfg, pmask, attn, 2) == pytest.approx(expected, rel=1e-12)
    # sampling is one forward over the same tokens (prefill once per prompt, each generated token), but the prefill
    # computes only the prompt's last logits: no LM head on the prompt tokens (models/flops.py's convention); the
    # floor adds the reference's forward only with a KL term
    lengths = attn.sum(1)
    decode = flops.grouped_decode_flops(cfg, pmask, lengths, 2)
    assert decode == pytest.approx(expected / 3 - 2 * cfg.d_model * cfg.vocab_size * pmask.sum(), rel=1e-12)
    assert flops.step_floor_flops(expected, decode, kl=0.04) == pytest.approx(expected * 4 / 3 + decode, rel=1e-12)
    assert flops.step_floor_flops(expected, decode, kl=0.0) == pytest.approx(expected + decode, rel=1e-12)
