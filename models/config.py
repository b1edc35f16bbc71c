"""ModelConfig: the policy's architecture as a frozen, validated dataclass, plus size/FLOP helpers.

Build one with keywords (every field has a default giving a tiny byte-level model), derive variants with
`dataclasses.replace(cfg, d_model=512)` or `cfg.replace(...)`, and load one from an experiment config with
`ModelConfig.from_dict(d)`. Invalid values raise ValueError naming the field on construction. The optional sections
`lora` and `upcycle` are the typed configs of models/lora.py and models/upcycle.py (a dict becomes one).

`num_params`, `active_params_per_token` and `flops_per_token` are computed from the config alone (no arrays), so
benchmarks and logs can report model size and MFU without building the model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from models.lora import LoraConfig
from models.upcycle import UpcycleConfig

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Decoder-only transformer with optional Mixture-of-Experts feed-forward blocks."""

    vocab_size: int = 259  # 256 bytes + pad/bos/eos (models/tokenizer.py)
    d_model: int = 64  # residual stream width
    n_layers: int = 2  # decoder blocks
    n_heads: int = 4  # query heads
    n_kv_heads: int = 2  # key/value heads (grouped-query attention); must divide n_heads
    head_dim: int = 16  # width of each attention head
    d_ff: int = 128  # hidden width of the dense SwiGLU blocks
    n_experts: int = 4  # routed experts per MoE block (0 = all-dense model)
    experts_per_token: int = 2  # top-k routing
    moe_every: int = 2  # block i is MoE iff (i + 1) % moe_every == 0 and i not in dense_layers (0 = all dense)
    expert_d_ff: int | None = None  # hidden width of each expert (None = d_ff); small for fine-grained experts
    n_shared_experts: int = 0  # always-on experts (DeepSeekMoE), each of width expert_d_ff
    capacity_factor: float | None = None  # None = dropless; else capacity = ceil(cf * tokens * k / n_experts)
    router_aux_coef: float = 0.01  # weight of the load-balancing loss E * sum_e f_e p_e (used by the train step)
    router_z_coef: float = 1e-3  # weight of the router z-loss mean(logsumexp(logits)^2) (used by the train step)
    max_seq_len: int = 512  # longest sequence (prompt + response) the model is used with
    rope_theta: float = 10_000.0  # rotary embedding base
    norm_eps: float = 1e-6  # RMSNorm epsilon
    dtype: str = "float32"  # compute dtype of activations and matmuls (logits and router are always float32)
    param_dtype: str = "float32"  # storage dtype of parameters
    tie_embeddings: bool = True  # unembedding = embedding table (scaled by d_model**-0.5 if scale_tied_unembed)
    remat: bool = False  # rematerialise each block in the backward pass (saves activation memory)
    logits_chunk: int = 0  # train step: logprobs + entropy N positions at a time, no [B, T, V] logits (0 = full)
    # Fields that pretrained checkpoints need (models/hf.py sets them); the defaults reproduce the from-scratch model.
    attn_bias: bool = False  # learned bias on the q/k/v projections (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before the rotary embedding (Qwen3)
    scale_tied_unembed: bool = True  # tied unembedding multiplied by d_model**-0.5 (False for HF checkpoints)
    norm_topk_prob: bool = True  # renormalise the top-k router probabilities to sum to 1 (False: raw softmax probs)
    dense_layers: tuple[int, ...] = ()  # blocks kept dense whatever moe_every says (HF mlp_only_layers)
    # Adaptation of a pretrained model (a dict in an experiment config becomes the typed section):
    lora: LoraConfig | None = None  # LoRA adapters, dict(rank=, alpha=, targets=) (models/lora.py); None = none
    upcycle: UpcycleConfig | None = None  # upcycle this dense model into an MoE, dict(n_experts=, top_k=, ...)
    # (models/upcycle.py); None = none

    def __post_init__(self):
        errors = _section_errors(self) + _field_errors(self)
        if errors:  # every bad field at once, each named
            raise ValueError("; ".join(errors))
        # Lists (from JSON or a ConfigDict) become a sorted tuple: the config is a static jit argument, so hashable.
        object.__setattr__(self, "dense_layers", tuple(sorted(set(self.dense_layers))))

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


# Upper bounds keep a typo (1e9 layers, an infinite rope base) from reaching the model: a real checkpoint is far
# inside them (vocabularies of 262k, 128 heads, 1M positions, rope bases of 1e7).
_INT_RANGES = {"vocab_size": (1, 10**7), "d_model": (1, 2**17), "n_layers": (1, 10**4), "n_heads": (1, 4096),
               "n_kv_heads": (1, 4096), "head_dim": (1, 4096), "d_ff": (1, 2**20), "max_seq_len": (1, 2**24),
               "n_experts": (0, 4096), "moe_every": (0, 10**4), "n_shared_experts": (0, 4096), "logits_chunk": (0, 2**24),
               "experts_per_token": (1, 4096)}
_FLOAT_RANGES = {"router_aux_coef": (0.0, 1e3, False), "router_z_coef": (0.0, 1e3, False),
                 "rope_theta": (0.0, 1e12, True), "norm_eps": (0.0, 1.0, True)}  # (lo, hi, lo excluded)
_BOOLS = ("tie_embeddings", "remat", "attn_bias", "qk_norm", "scale_tied_unembed", "norm_topk_prob")


def _int_error(name: str, value: Any, lo: int, hi: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        return f"{name} must be an int in [{lo}, {hi}], got {value!r}"
    return None


def _float_error(name: str, value: Any, lo: float, hi: float, lo_open: bool) -> str | None:
    """Booleans are not numbers; inf / nan and values past the bound are refused."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value > lo if lo_open else value >= lo) and value <= hi)
    return None if ok else f"{name} must be a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}"


def _section_errors(cfg: "ModelConfig") -> list[str]:
    """Turns the lora / upcycle sections (None, a typed config, a dict or ConfigDict) into their typed configs;
    their own validation errors (each naming lora.<field> / upcycle.<field>)."""
    errors = []
    for name, cls in (("lora", LoraConfig), ("upcycle", UpcycleConfig)):
        value = getattr(cfg, name)
        if value is not None:
            try:
                object.__setattr__(cfg, name, cls.from_value(value))
            except (TypeError, ValueError) as e:
                errors.append(str(e))
    return errors


def _field_errors(cfg: "ModelConfig") -> list[str]:
    """Every invalid field of cfg, as messages naming it (the cross-field rules only once the fields are sound)."""
    errors = [e for name, (lo, hi) in _INT_RANGES.items() if (e := _int_error(name, getattr(cfg, name), lo, hi))]
    if cfg.expert_d_ff is not None and (e := _int_error("expert_d_ff", cfg.expert_d_ff, 1, 2**20)):
        errors.append(e)
    if cfg.capacity_factor is not None and (e := _float_error("capacity_factor", cfg.capacity_factor, 0.0, 1e3, True)):
        errors.append(e.replace("must be", "must be None (dropless) or"))
    errors += [e for name, (lo, hi, lo_open) in _FLOAT_RANGES.items()
               if (e := _float_error(name, getattr(cfg, name), lo, hi, lo_open))]
    errors += [f"{name} must be one of {_DTYPES}, got {getattr(cfg, name)!r}" for name in ("dtype", "param_dtype")
               if getattr(cfg, name) not in _DTYPES]
    errors += [f"{name} must be a bool, got {getattr(cfg, name)!r}" for name in _BOOLS
               if not isinstance(getattr(cfg, name), bool)]
    if not isinstance(cfg.dense_layers, (tuple, list)):
        errors.append(f"dense_layers must be a tuple of block indices, got {cfg.dense_layers!r}")
    if errors:
        return errors
    if cfg.n_heads % cfg.n_kv_heads:
        errors.append(f"n_heads ({cfg.n_heads}) must be divisible by n_kv_heads ({cfg.n_kv_heads})")
    if cfg.head_dim % 2:
        errors.append(f"head_dim ({cfg.head_dim}) must be even for rotary embeddings")
    if cfg.n_experts > 0 and cfg.experts_per_token > cfg.n_experts:
        errors.append(f"experts_per_token ({cfg.experts_per_token}) must be <= n_experts ({cfg.n_experts})")
    if isinstance(cfg.upcycle, UpcycleConfig) and cfg.is_moe_model:
        errors.append(f"upcycle needs a dense model to upcycle (n_experts = 0 or moe_every = 0), got n_experts="
                      f"{cfg.n_experts}, moe_every={cfg.moe_every}")
    errors += [f"dense_layers entries must be ints in [0, n_layers={cfg.n_layers}), got {i!r}"
               for i in cfg.dense_layers if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < cfg.n_layers]
    return errors




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


def matmul_params_per_token(cfg: ModelConfig) -> int:
    """Active parameters used in matmuls: the input embedding is a lookup, the (tied or not) unembedding is a matmul."""
    lookup_only = cfg.vocab_size * cfg.d_model if not cfg.tie_embeddings else 0
    return active_params_per_token(cfg) - lookup_only


def flops_per_token(cfg: ModelConfig, seq_len: int, *, training: bool = True) -> float:
    """Model FLOPs per token (PaLM-style MFU accounting).

    training: 6 * N_matmul + 12 * n_layers * n_heads * head_dim * seq_len (forward + backward);
    inference: a third of that (2 * N + 4 * L * H * d_head * T). Attention is counted over the full sequence length,
    without halving for causality, as is conventional for MFU.
    """
    n = matmul_params_per_token(cfg)
    attn = 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * seq_len
    per_pass = 2 * n + 2 * attn  # QK^T and AV each cost 2 * T * d_attn per token per layer
    return float(3 * per_pass if training else per_pass)
