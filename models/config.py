"""ModelConfig: the policy's architecture as a frozen, validated dataclass, plus size/FLOP helpers.

Build one with keywords (every field has a default giving a tiny byte-level model), derive variants with
`dataclasses.replace(cfg, d_model=512)` or `cfg.replace(...)`, and load one from an experiment config with
`ModelConfig.from_dict(d)`. Each field carries its default, doc and range check (schema/; the run config's
model section lists them with --help_config); invalid values raise FieldErrors (a ValueError) naming every bad field
on construction. The optional sections
`lora` and `upcycle` are the typed configs of models/lora.py and models/upcycle.py (a dict becomes one).

`num_params`, `active_params_per_token` and `flops_per_token` are computed from the config alone (no arrays), so
benchmarks and logs can report model size and MFU without building the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from models.adaptation import LoraConfig, UpcycleConfig
from models import flops as _flops
from schema import Checked, boolean, choice, field, integer, num, optional

_DTYPES = ("float32", "bfloat16", "float16")


def _section(cls):
    """The check of an optional section once __post_init__ has read it: None (off) or the typed section."""
    return lambda v: None if v is None or isinstance(v, cls) else f"must be None or a {cls.__name__}, got {v!r}"


def _block_indices(v) -> str | None:
    if not isinstance(v, (tuple, list)):
        return f"must be a tuple of block indices, got {v!r}"
    return None


@dataclass(frozen=True, kw_only=True)
class ModelConfig(Checked):
    """Decoder-only transformer with optional Mixture-of-Experts feed-forward blocks. Upper bounds keep a typo (1e9
    layers, an infinite rope base) from reaching the model: a real checkpoint is far inside them (vocabularies of
    262k, 128 heads, 1M positions, rope bases of 1e7)."""

    vocab_size: int = field(259, "256 bytes + pad/bos/eos (models/tokenizer.py)", integer(1, 10**7))
    d_model: int = field(64, "residual stream width", integer(1, 2**17))
    n_layers: int = field(2, "decoder blocks", integer(1, 10**4))
    n_heads: int = field(4, "query heads", integer(1, 4096))
    n_kv_heads: int = field(2, "key/value heads (grouped-query attention); must divide n_heads", integer(1, 4096))
    head_dim: int = field(16, "width of each attention head", integer(1, 4096))
    d_ff: int = field(128, "hidden width of the dense SwiGLU blocks", integer(1, 2**20))
    n_experts: int = field(4, "routed experts per MoE block (0 = all-dense model)", integer(0, 4096))
    experts_per_token: int = field(2, "top-k routing", integer(1, 4096))
    moe_every: int = field(2, "block i is MoE iff (i + 1) % moe_every == 0 and i not in dense_layers (0 = all dense)",
                           integer(0, 10**4))
    expert_d_ff: int | None = field(None, "hidden width of each expert (None = d_ff); small for fine-grained experts",
                                    optional(integer(1, 2**20), "= d_ff"))
    n_shared_experts: int = field(0, "always-on experts (DeepSeekMoE), each of width expert_d_ff", integer(0, 4096))
    capacity_factor: float | None = field(None, "None = dropless; else capacity = ceil(cf * tokens * k / n_experts)",
                                          optional(num(0.0, 1e3, lo_open=True), "dropless"))
    router_aux_coef: float = field(0.01, "weight of the load-balancing loss E * sum_e f_e p_e (used by the train step)",
                                   num(0.0, 1e3))
    router_z_coef: float = field(1e-3, "weight of the router z-loss mean(logsumexp(logits)^2) (used by the train step)",
                                 num(0.0, 1e3))
    max_seq_len: int = field(512, "longest sequence (prompt + response) the model is used with", integer(1, 2**24))
    rope_theta: float = field(10_000.0, "rotary embedding base", num(0.0, 1e12, lo_open=True))
    norm_eps: float = field(1e-6, "RMSNorm epsilon", num(0.0, 1.0, lo_open=True))
    dtype: str = field("float32", "compute dtype of activations and matmuls (logits and router are always float32)",
                       choice(*_DTYPES))
    param_dtype: str = field("float32", "storage dtype of parameters", choice(*_DTYPES))
    tie_embeddings: bool = field(True, "unembedding = embedding table (scaled by d_model**-0.5 if scale_tied_unembed)",
                                 boolean)
    remat: bool = field(False, "rematerialise each block in the backward pass (saves activation memory)", boolean)
    scan_layers: bool = field(True, "run each group of stacked blocks (models/layer_stack.py) as one lax.scan (forward "
                                    "passes and gradients; the sampler's decode steps always run unrolled); False "
                                    "unrolls every block over slices of the stacked weights (a program n_layers "
                                    "blocks long: for comparisons)", boolean)
    logits_chunk: int = field(0, "train step: logprobs + entropy N positions at a time, no [B, T, V] logits (0 = full)",
                              integer(0, 2**24))
    # Fields that pretrained checkpoints need (models/hf.py sets them); the defaults reproduce the from-scratch model.
    attn_bias: bool = field(False, "learned bias on the q/k/v projections (Qwen2)", boolean)
    qk_norm: bool = field(False, "per-head RMSNorm of queries and keys before the rotary embedding (Qwen3)", boolean)
    scale_tied_unembed: bool = field(True, "tied unembedding multiplied by d_model**-0.5 (False for HF checkpoints)",
                                     boolean)
    norm_topk_prob: bool = field(True, "renormalise the top-k router probabilities to sum to 1 (False: raw softmax "
                                       "probs)", boolean)
    dense_layers: tuple[int, ...] = field((), "blocks kept dense whatever moe_every says (HF mlp_only_layers)",
                                          _block_indices)

    # Adaptation of a pretrained model (a dict in an experiment config becomes the typed section):
    lora: LoraConfig | None = field(None, "LoRA adapters, dict(rank=, alpha=, targets=) (models/lora.py); None = "
                                          "none; setting one field (model.lora.rank=16) turns it on, the rest at the "
                                          "defaults below", _section(LoraConfig), section=LoraConfig)
    upcycle: UpcycleConfig | None = field(None, "upcycle this dense model into an MoE, dict(n_experts=, top_k=, ...) "
                                                "(models/upcycle.py); None = none; setting one field "
                                                "(model.upcycle.n_experts=4) turns it on, the rest at the defaults "
                                                "below", _section(UpcycleConfig), section=UpcycleConfig)

    def __post_init__(self):
        super().__post_init__()  # every bad field at once, each named; lora / upcycle dicts become their sections
        # Lists (from JSON or a ConfigDict) become a sorted tuple: the config is a static jit argument, so hashable.
        object.__setattr__(self, "dense_layers", tuple(sorted(set(self.dense_layers))))

    def cross_checks(self):
        if self.n_heads % self.n_kv_heads:
            yield "n_heads", f"({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})"
        if self.head_dim % 2:
            yield "head_dim", f"({self.head_dim}) must be even for rotary embeddings"
        if self.n_experts > 0 and self.experts_per_token > self.n_experts:
            yield "experts_per_token", f"({self.experts_per_token}) must be <= n_experts ({self.n_experts})"
        if self.upcycle is not None and self.is_moe_model:
            yield "upcycle", (f"needs a dense model to upcycle (n_experts = 0 or moe_every = 0), got n_experts="
                              f"{self.n_experts}, moe_every={self.moe_every}")
        for i in self.dense_layers:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers:
                yield "dense_layers", f"entries must be ints in [0, n_layers={self.n_layers}), got {i!r}"

    # ---- derived quantities -------------------------------------------------------------------------------------
    @property
    def is_moe_model(self) -> bool:
        return self.n_experts > 0 and self.moe_every > 0

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe_model and (i + 1) % self.moe_every == 0 and i not in self.dense_layers

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if self.is_moe_layer(i))

    @property
    def expert_ff(self) -> int:
        return self.d_ff if self.expert_d_ff is None else self.expert_d_ff

    # ---- construction helpers -----------------------------------------------------------------------------------
    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Builds a config from a mapping (e.g. an ml_collections ConfigDict); unknown keys are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        d = dict(d)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**d)


# ---- sizes and FLOPs ----------------------------------------------------------------------------------------------
def _attn_params(cfg: ModelConfig) -> int:
    q_and_o = 2 * cfg.d_model * cfg.n_heads * cfg.head_dim
    k_and_v = 2 * cfg.d_model * cfg.n_kv_heads * cfg.head_dim
    bias = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim if cfg.attn_bias else 0
    qk_norm = 2 * cfg.head_dim if cfg.qk_norm else 0
    return q_and_o + k_and_v + bias + qk_norm + 2 * cfg.d_model  # + the two RMSNorm scales of the block


def _ffn_params(cfg: ModelConfig, layer: int, *, active: bool) -> int:
    swiglu = 3 * cfg.d_model
    if not cfg.is_moe_layer(layer):
        return swiglu * cfg.d_ff
    n_routed = cfg.experts_per_token if active else cfg.n_experts
    router = cfg.d_model * cfg.n_experts
    return router + swiglu * cfg.expert_ff * (n_routed + cfg.n_shared_experts)


def _embedding_params(cfg: ModelConfig) -> int:
    return cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2) + cfg.d_model  # + final norm


def num_params(cfg: ModelConfig) -> int:
    """Total parameter count (matches the arrays created by models.transformer.init)."""
    blocks = sum(_attn_params(cfg) + _ffn_params(cfg, i, active=False) for i in range(cfg.n_layers))
    return _embedding_params(cfg) + blocks


def active_params_per_token(cfg: ModelConfig) -> int:
    """Parameters a token touches: all but the routed experts it is not sent to (embeddings included)."""
    blocks = sum(_attn_params(cfg) + _ffn_params(cfg, i, active=True) for i in range(cfg.n_layers))
    return _embedding_params(cfg) + blocks


def flops_per_token(cfg: ModelConfig, seq_len: int, *, training: bool = True) -> float:
    """Model FLOPs per token of a full sequence of seq_len tokens, in models/flops.py's one convention (2 x matmul
    weights, the LM head on every position, causal attention: seq_len (seq_len + 1) / 2 pairs; training = forward +
    backward, LoRA's path when cfg.lora is set). The benches call models.flops directly."""
    pairs = seq_len * (seq_len + 1) / 2
    total = _flops.train_flops(cfg, seq_len, pairs) if training else _flops.forward_flops(cfg, seq_len, pairs)
    return float(total / seq_len)
