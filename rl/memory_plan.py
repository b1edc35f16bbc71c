"""The memory plan: what one device holds to run a config, from the config alone, checked before any compute.

    plan = memory_plan.plan_for_config(cfg, model_cfg, mesh_sizes, rules)   # cfg: a RunConfig (rl.config_validation)
                                  # model_cfg: rl.setup.build_model_cfg(cfg) (with model.upcycle: the upcycled MoE)
    print(plan.text())            # one line per part, GiB per device, and the peak against the budget
    plan.check()                  # ConfigError naming what to change when the peak exceeds the budget

Parts, per device (the mesh shards them; `mesh_sizes` are the resolved axis sizes):
  resident       params             every array of the policy in model.param_dtype, each sharded as
                                    models.sharding.logical_to_spec places it (shard sizes exact, uneven dims
                                    replicated as there)
                 optimizer          Adam's two moments, in the parameters' dtype (optax keeps their dtype)
                 reference          a copy of the params when an RL stage keeps a reference policy (KL)
  train step     gradients          one per parameter, in its dtype
                 activations        what the backward keeps for the largest minibatch of any stage (rows =
                                    the stage's rows per optimizer step, over the batch axes data x fsdp), per
                                    token and block in the compute dtype: normed inputs, q/k/v and their rotated
                                    copies, attention output, the SwiGLU (expert) gate, up, silu and product, the
                                    residuals, plus [heads, keys] float32 scores and softmax and compute-dtype
                                    probabilities; with model.remat only each block's input plus one block. An
                                    estimate: 0.97-1.16x of XLA's compiled temporaries on CPU without remat (float32,
                                    dense and MoE; XLA on CPU computes bf16 in float32 and keeps most activations
                                    under remat, so there the bf16 and remat figures are lower bounds).
                 logits             float32 [rows, length, vocab] x LOGITS_COPIES: the train step's log-softmax,
                                    its exp and their gradients (measured: experiments/bench/large_vocab.py,
                                    23.2 GiB of temporaries for 4.64 GiB of logits at 8 x 1024 x 151,936); with
                                    model.logits_chunk = C > 0, CHUNK_COPIES x float32 [rows, C, vocab] instead
                                    (models/vocab.py's backward; the same bench: 0.93 GiB at C = 32)
  sampling       kv cache           layers x [batch_rows, kv_heads, prompt + new tokens, head_dim] for k and v in the
                                    compute dtype, rows over data x fsdp and kv heads over tensor; with continuous
                                    batching 1.5x: the tail's compaction copies the running slots into a ring half
                                    the size while the full one is still held (models/slot_sampling.py)
                 sampler temps      prefill attention scores (float32 + probabilities) and a few float32
                                    [rows, vocab] decode-step logits; with continuous batching also a refill's
                                    prompt cache and the ring rows it places (its prompts x (prompt + ring) slots)
peak = resident + max(train step, sampling).

With model.lora (models/lora.py; docs/lora_upcycling.md "In the trainer") the parts are the adapters' where the
base is frozen (sizes from lora_leaves: models.lora.init's arrays and the weights its targets name):
  resident       params             the base, held once: the train step's frozen (not donated) argument, the KL
                                    reference and what the merge reads are the same arrays
                 adapters           A [*lead, *in, r] and B [*lead, r, *out] of every targeted weight (per block, and
                                    per expert for moe/* targets), float32, sharded as their weight's in / out axes
                 optimizer          Adam's two moments of the adapters (2 x adapters)
                 reference          0: the KL reference is the frozen base itself; when an RL stage with a
                                    reference follows another stage, a copy of that stage's starting adapters
                                    (the cold-started policy; merged into the base for each reference pass, as
                                    the sampler merges, one merged copy at a time)
  train step     gradients          the adapters' only (the base is a constant of the differentiated function)
  train step     merged weights     the routed experts' targeted weights (moe/*) of one layer and their gradient,
                                    in the params' dtype: the step merges them layer by layer inside its scan; the
                                    attention and dense-MLP targets stay low-rank (x W + s (x A) B), nothing merged
                                    (the sampler's merged weights are its decode view)
An upcycled run (model.upcycle) is planned as the MoE it trains: model_cfg is the upcycled config (E experts per
MoE block), so params, optimizer, reference and gradients are the MoE's.

`check()` compares the peak with `budget` (run.device_memory_gib, or `device_budget`'s default: the accelerator's
own limit, 80% of host RAM split over the mesh's CPU devices) and names the largest part's remedy.
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import jax
import psutil

from models import layer_stack, lora, transformer
from models.slot_sampling import REFILL
from models.sharding import DEFAULT_RULES, logical_to_spec
from rl import config_validation as cv
from rl import stages as stage_lib

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
LOGITS_COPIES = 5  # float32 logits-sized temporaries of the train step's loss + grad (bench above: 23.16 / 4.64)
CHUNK_COPIES = 3  # models/vocab.py: logits, probabilities and their gradient of one chunk in the backward pass
SAMPLER_LOGITS_COPIES = 4  # decode step: logits, scaled, sorted (top-p), log-softmax, each [rows, vocab] float32
ADAPTER_BYTES = 4  # models/lora.py keeps the adapters in float32 whatever the base's dtype

REMEDY = {
    "params": "shard the parameters over more devices (mesh.fsdp; mesh.expert for MoE experts) or store them in "
              "bfloat16 (model.param_dtype)",
    "optimizer": "shard the parameters over more devices (mesh.fsdp; mesh.expert for MoE experts) or keep them in "
                 "bfloat16 (model.param_dtype, which also stores the Adam moments in bfloat16)",
    "reference": "shard over more devices (mesh.fsdp) or drop the reference policy (stages[i].kl_coef=0)",
    "gradients": "shard the parameters over more devices (mesh.fsdp; mesh.expert for MoE experts)",
    "update": "shard the parameters over more devices (mesh.fsdp; mesh.expert for MoE experts)",
    "activations": "lower the rows per optimizer step (stages[i].token_budget for grpo/ppo, stages[i].batch_size "
                   "for sft/rejection), set model.remat=True, or add data/fsdp devices",
    "logits": "set model.logits_chunk (e.g. 128: logprobs chunk by chunk, never the full logits), lower the rows "
              "per optimizer step (stages[i].token_budget / stages[i].batch_size) or shard the vocabulary (mesh.tensor)",
    "kv cache": "lower sampling.batch_rows, or sampling.max_new_tokens / tasks.max_prompt_len",
    "sampler temps": "lower sampling.batch_rows",
    "adapters": "lower model.lora.rank or name fewer model.lora.targets",
    "runtime": "nothing in the config: it is the process itself",
    "decode view": "store the parameters in bfloat16 (model.param_dtype) or shard them over more devices (mesh.fsdp)",
    "merged weights": "name fewer model.lora.targets (each targeted weight is copied by the merge) or shard the "
                      "parameters over more devices (mesh.fsdp; mesh.expert for MoE experts)",
}
# The phase each part lives in.
PHASES = {"runtime": "resident", "params": "resident", "adapters": "resident", "optimizer": "resident",
          "reference": "resident", "gradients": "train step", "update": "train step", "activations": "train step",
          "logits": "train step",
          "merged weights": "train step", "kv cache": "sampling", "decode view": "sampling",
          "sampler temps": "sampling"}
# What the process holds besides its arrays: Python, JAX / XLA, the libraries, the tokenizer and problems, the
# compiled programs and the heap they leave. Measured (every unit's mem/rss_gib - mem/arrays_gib; summary.json
# memory.besides_arrays_gib): smollm2_grpo.py 0.85-0.87 GiB at the unit ends of a shortened run, 1.12-1.20 GiB over
# a whole one before a GGUF load released its file and parsed reader (0.27 GiB), so ~0.93 GiB at its last unit.
RUNTIME_BYTES = int(0.95 * GIB)


# ---- pieces (pure functions of shapes and sizes) -----------------------------------------------------------------
def fmt(n: int) -> str:
    """Bytes as GiB / MiB / KiB, three significant digits."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size or unit == "KiB":
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def shard_factor(shape, axes, mesh_sizes: dict, rules) -> int:
    """Into how many pieces the mesh cuts an array with these logical axes (models.sharding's placement)."""
    spec = logical_to_spec(axes, rules, shape=tuple(shape), mesh=SimpleNamespace(shape=dict(mesh_sizes)))
    factor = 1
    for entry in spec:
        for axis in (() if entry is None else (entry,) if isinstance(entry, str) else entry):
            factor *= int(mesh_sizes[axis])
    return factor


def sharded_bytes(leaves, mesh_sizes: dict, rules, itemsize: int) -> int:
    """Bytes one device holds of arrays given as (shape, logical axes) pairs."""
    return sum(math.prod(shape) // shard_factor(shape, axes, mesh_sizes, rules) * itemsize for shape, axes in leaves)


def _is_axes(x) -> bool:
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def model_leaves(model_cfg) -> list[tuple[tuple[int, ...], tuple]]:
    """(shape, logical axes) of every parameter of models.transformer.init(model_cfg) (abstract: no arrays)."""
    shapes = jax.eval_shape(lambda k: transformer.init(model_cfg, k), jax.random.key(0))
    axes = transformer.param_axes(model_cfg)
    return [(tuple(s.shape), a) for s, a in zip(jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=_is_axes))]


def lora_leaves(model_cfg) -> tuple[list, list]:
    """(adapters, merged): (shape, logical axes) of every array of models.lora.init on the model (A and B of
    each targeted weight, lora.param_axes) and of the targeted weights the train step merges (the routed experts'
    moe/* targets; attention and dense-MLP targets stay low-rank there, models.lora.merge_block)."""
    base = jax.eval_shape(lambda k: transformer.init(model_cfg, k), jax.random.key(0))
    adapters = jax.eval_shape(lambda k: lora.init(base, model_cfg, k), jax.random.key(0))
    base_axes = transformer.param_axes(model_cfg)
    ad_axes = lora.param_axes(base_axes, model_cfg)
    ad = [(tuple(s.shape), a) for s, a in zip(jax.tree.leaves(adapters), jax.tree.leaves(ad_axes, is_leaf=_is_axes))]
    merged = [(tuple(w.shape), a) for (_, t, w), (_, _, a) in zip(lora.targeted_weights(base, model_cfg),
                                                                  lora.targeted_weights(base_axes, model_cfg))
              if t.startswith("moe/")]
    return ad, merged


def activation_bytes_per_token(m, seq_len: int, tensor: int = 1) -> int:
    """Bytes the backward keeps per token (see the module docstring); `tensor` divides the head and MLP terms."""
    c = DTYPE_BYTES[m.dtype]
    N, K, H, D = -(-m.n_heads // tensor), -(-m.n_kv_heads // tensor), m.head_dim, m.d_model
    attn = c * (D + (N + 2 * K) * H + (N + K) * H + N * H) + N * seq_len * (8 + c)

    def ffn(i):
        if not m.is_moe_layer(i):
            return c * (D + 4 * -(-m.d_ff // tensor))
        shared = 4 * -(-m.n_shared_experts * m.expert_ff // tensor)
        return c * (D + m.experts_per_token * (2 * D + 4 * m.expert_ff) + shared) + 4 * 2 * m.n_experts

    blocks = [attn + ffn(i) + c * 2 * D for i in range(m.n_layers)]
    if m.remat:
        return c * D * m.n_layers + max(blocks) + 2 * c * D
    return sum(blocks) + 2 * c * D  # + the embedding output and the final norm


def decode_view_bytes(m, mesh_sizes: dict, rules, dtype: str) -> int:
    """Bytes per device of the sampler's per-layer view (models.transformer.decode_params): every stacked block
    weight sliced per layer, the matrices in the sampler's dtype (norm scales and biases in their own); the
    embedding tables too when that dtype differs from the params' (cast; otherwise passed through, not copied)."""
    shapes = jax.eval_shape(lambda k: transformer.init(m, k), jax.random.key(0))
    axes = transformer.param_axes(m)
    total = 0
    for key in shapes:
        stacked = bool(layer_stack.STACK_KEY.fullmatch(key))
        for s, a in zip(jax.tree.leaves(shapes[key]), jax.tree.leaves(axes[key], is_leaf=_is_axes)):
            matrix = len(s.shape) - int(stacked) >= 2
            if not stacked and not (matrix and dtype != m.param_dtype):
                continue
            item = DTYPE_BYTES[dtype] if matrix else DTYPE_BYTES[m.param_dtype]
            total += math.prod(s.shape) // shard_factor(s.shape, a, mesh_sizes, rules) * item
    return total


def kv_cache_bytes(m, rows: int, length: int, mesh_sizes: dict) -> int:
    """Bytes per device of the sampler's KV cache for `rows` rows of `length` slots."""
    batch = int(mesh_sizes.get("data", 1)) * int(mesh_sizes.get("fsdp", 1))
    kv_heads = -(-m.n_kv_heads // int(mesh_sizes.get("tensor", 1)))
    return 2 * m.n_layers * -(-rows // batch) * kv_heads * length * m.head_dim * DTYPE_BYTES[m.dtype]


# ---- the plan -------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of each part (PHASES order) with a note on how it was counted; budget in bytes."""

    parts: dict
    notes: dict
    budget: int
    budget_note: str
    devices: int

    def phase(self, name: str) -> int:
        """Bytes of one phase: "resident", "train step" or "sampling"."""
        return sum(v for k, v in self.parts.items() if _in_phase(k, name))

    @property
    def peak(self) -> int:
        return self.phase("resident") + max(self.phase("train step"), self.phase("sampling"))

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    def text(self) -> str:
        lines = [f"memory plan per device ({self.devices} device{'s' if self.devices != 1 else ''}):"]
        for k, v in self.parts.items():
            lines.append(f"  {PHASES[k]:<11} {k:<14} {fmt(v):>10}  {self.notes.get(k, '')}")
        lines.append(f"  peak = resident + max(train step, sampling) = {fmt(self.peak)} of a {fmt(self.budget)} "
                     f"budget ({self.budget_note})")
        return "\n".join(lines)

    def check(self) -> None:
        """ConfigError naming the largest part and its remedy when the peak exceeds the budget."""
        if self.fits:
            return
        phase = "train step" if self.phase("train step") >= self.phase("sampling") else "sampling"
        live = {k: v for k, v in self.parts.items() if _in_phase(k, "resident") or _in_phase(k, phase)}
        worst = max(live, key=live.get)
        raise cv.ConfigError(
            f"model / mesh: {self.peak / GIB:.1f} GiB needed to train this model per device, more than the budget of "
            f"{self.budget / GIB:.1f} GiB ({self.budget_note}{'' if 'device_memory_gib' in self.budget_note else '; run.device_memory_gib sets it'}); the largest part is "
            f"{worst} ({live[worst] / GIB:.1f} GiB): {REMEDY[worst]}.\n{self.text()}")


def _in_phase(part: str, name: str) -> bool:
    return PHASES[part] == name


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one optimizer step computes: `passes`, (query tokens, keys each query's attention row spans) of each
    forward pass (flat: rows x T queries over T keys; grouped: G x P prompt queries over P keys, then G x K x C
    answer queries over P + C keys), and `logit_rows` x `logit_len` positions of logits (the answers only when
    grouped). `note` says which it is."""

    passes: tuple[tuple[int, int], ...]
    logit_rows: int
    logit_len: int
    note: str

    @classmethod
    def flat(cls, rows: int, seq_len: int) -> "StepShape":
        return cls(passes=((rows * seq_len, seq_len),), logit_rows=rows, logit_len=seq_len,
                   note=f"{rows} rows x {seq_len} tokens")

    @classmethod
    def grouped(cls, groups: int, k: int, prompt_len: int, answer_len: int) -> "StepShape":
        return cls(passes=((groups * prompt_len, prompt_len), (groups * k * answer_len, prompt_len + answer_len)),
                   logit_rows=groups * k, logit_len=answer_len,
                   note=f"{groups} prompt(s) x {k} answers, grouped ({prompt_len} + {answer_len} tokens)")


def plan(m, mesh_sizes: dict, rules, *, leaves, train_rows: int, seq_len: int, sample_rows: int, prompt_len: int,
         new_tokens: int, reference: bool, budget: int, budget_note: str = "", lora_sizes=None,
         adapters_reference: bool = False, step: StepShape | None = None, sample_dtype: str = "",
         prefill_rows: int | None = None, runtime: int = RUNTIME_BYTES) -> MemoryPlan:
    """The plan from sizes alone (see the module docstring). leaves: model_leaves(m); train_rows: the largest
    rows per optimizer step of any stage; sample_rows: sampling.batch_rows; lora_sizes: lora_leaves(m), needed
    when m.lora is set; adapters_reference: with LoRA, an RL stage's reference is a copy of trained adapters.
    step: the largest step's shape (step_shape; default: train_rows flat rows of seq_len); sample_dtype: the
    sampler's compute dtype ('' = m.dtype); prefill_rows: prompts prefilled at once (continuous batching's refill;
    None = sample_rows, static batching); runtime: the process's own bytes (RUNTIME_BYTES)."""
    step = StepShape.flat(train_rows, seq_len) if step is None else step
    if (m.lora is None) != (lora_sizes is None):
        raise ValueError("lora_sizes (lora_leaves(m)) must be given exactly when the model config sets lora")
    p = sharded_bytes(leaves, mesh_sizes, rules, DTYPE_BYTES[m.param_dtype])
    batch = int(mesh_sizes.get("data", 1)) * int(mesh_sizes.get("fsdp", 1))
    tensor = int(mesh_sizes.get("tensor", 1))
    rows_dev, sample_dev = -(-step.logit_rows // batch), -(-sample_rows // batch)
    vocab_dev = m.vocab_size // tensor if m.vocab_size % tensor == 0 else m.vocab_size
    heads_dev = -(-m.n_heads // tensor)
    length = prompt_len + new_tokens
    sd = sample_dtype or m.dtype
    prefill_dev = sample_dev if prefill_rows is None else -(-int(prefill_rows) // batch)
    slots = prefill_rows is not None  # continuous batching (models/slot_sampling.py): refills and a compacted tail
    # the train step's logits-sized float32 temporaries: full [rows, T, V] ones, or one chunk's [rows, C, V] ones
    logit_copies, logit_len = ((CHUNK_COPIES, min(m.logits_chunk, step.logit_len)) if m.logits_chunk
                               else (LOGITS_COPIES, step.logit_len))
    c, pd = m.dtype, m.param_dtype
    sampler_m = m.replace(dtype=sd)
    ring = kv_cache_bytes(sampler_m, sample_rows, length, mesh_sizes)
    refill = kv_cache_bytes(sampler_m, prefill_rows, prompt_len + length, mesh_sizes) if slots else 0
    parts = {"runtime": int(runtime), "params": p, "optimizer": 2 * p, "reference": p if reference else 0,
             "gradients": p, "update": p,
             "activations": sum(-(-q // batch) * activation_bytes_per_token(m, keys, tensor) for q, keys in step.passes),
             "logits": logit_copies * rows_dev * logit_len * vocab_dev * 4,
             "kv cache": ring + (ring // 2 if slots else 0),
             "decode view": decode_view_bytes(m, mesh_sizes, rules, sd),
             "sampler temps": (prefill_dev * heads_dev * prompt_len * length * (4 + DTYPE_BYTES[sd])
                               + SAMPLER_LOGITS_COPIES * sample_dev * vocab_dev * 4 + refill)}
    notes = {"runtime": "Python, JAX / XLA, the libraries, the compiled programs (RUNTIME_BYTES, measured)",
             "params": f"{pd}", "optimizer": f"Adam mu + nu, {pd}",
             "update": "the step's new parameters, held until the finite check selects them", "reference": "KL reference copy" if reference else
             "no stage keeps a reference", "gradients": f"{pd}",
             "activations": f"{step.note}, {c}{', remat' if m.remat else ''} (estimate)",
             "logits": f"{logit_copies} x float32 [{rows_dev}, {logit_len}, {vocab_dev}]"
                       + (" (logits_chunk)" if m.logits_chunk else ""),
             "kv cache": f"{sample_dev} rows x {length} slots, {sd}" + (", and the tail's half copy" if slots else ""),
             "decode view": f"the blocks' weights sliced per layer for decoding, {sd} (transformer.decode_params)",
             "sampler temps": f"prefill scores of {prefill_dev} prompts + {SAMPLER_LOGITS_COPIES} x float32 "
                              f"[{sample_dev}, {vocab_dev}]" + (" + a refill's cache rows" if slots else "")}
    if m.lora is not None:
        parts, notes = _with_lora(parts, notes, m, lora_sizes, mesh_sizes, rules, reference, adapters_reference)
    return MemoryPlan(parts=parts, notes=notes, budget=int(budget), budget_note=budget_note,
                      devices=math.prod(int(v) for v in mesh_sizes.values()))


def _with_lora(parts: dict, notes: dict, m, lora_sizes, mesh_sizes: dict, rules, reference: bool,
               adapters_reference: bool):
    """A LoRA run's parts (docs/lora_upcycling.md, "In the trainer"): the base is held once (the train step's frozen
    argument, the KL reference, what the merge reads); the optimizer and the gradients are the adapters'; the train
    step keeps attention and dense-MLP targets low-rank (x W + s (x A) B) and merges routed-expert targets one layer
    at a time inside its scan (models.lora.merge_block: the merged layer and its gradient, recomputed in the backward
    pass); the sampler's decode view holds them merged."""
    adapters, merged = lora_sizes
    a = sharded_bytes(adapters, mesh_sizes, rules, ADAPTER_BYTES)
    pd, r = m.param_dtype, m.lora.rank
    ref = a if reference and adapters_reference else 0
    per_layer = [(shape[1:], axes[1:]) for shape, axes in merged]  # one layer of each stacked weight
    parts = {"runtime": parts["runtime"], "params": parts["params"], "adapters": a, "optimizer": 2 * a,
             "reference": ref, "gradients": a, "update": a, **{k: parts[k] for k in ("activations", "logits")},
             "merged weights": 2 * sharded_bytes(per_layer, mesh_sizes, rules, DTYPE_BYTES[pd]),
             **{k: parts[k] for k in ("kv cache", "decode view", "sampler temps")}}
    notes = {**notes, "params": f"{pd}, the frozen base, held once (train step's frozen argument, KL reference)",
             "adapters": f"LoRA rank {r}: A + B of {len(adapters) // 2} stacked weights, float32",
             "optimizer": "Adam mu + nu of the adapters, float32",
             "reference": ("no stage keeps a reference" if not reference else
                           "LoRA: the stage-start adapters (the base is held once)" if adapters_reference else
                           "LoRA: the KL reference is the frozen base (no copy)"),
             "gradients": "of the adapters only, float32", "update": "the step's new adapters",
             "merged weights": (f"one layer of the {len(merged)} expert weights and its gradient, {pd} (merged "
                                "layer by layer inside the step)") if merged else
                               "none: attention / MLP targets stay low-rank in the step (x W + s (x A) B)"}
    return parts, notes


def step_shape(cfg: cv.RunConfig, row_multiple: int) -> StepShape:
    """The largest optimizer step of any stage (by its activation tokens): an RL stage that trains in the grouped
    layout (rl/grouped_batch.py: batch_layout auto, one group size, a group fits the step, no recorded routes) steps
    on whole groups of K answers, each prompt once; everything else on flat rows of prompt + answer."""
    P, N = cfg.tasks.max_prompt_len, cfg.sampling.max_new_tokens
    shapes = []
    for s in cfg.stages:
        kind = stage_lib.KINDS[s.kind]
        rows = kind.step_rows(s, P + N, row_multiple)
        layout = kind.step_layout(s, rows, row_multiple, P, N)
        shapes.append(StepShape.flat(rows, P + N) if layout is None else
                      StepShape.grouped(layout.groups, layout.k, P, N))
    return max(shapes, key=lambda st: sum(q * keys for q, keys in st.passes) + sum(q for q, _ in st.passes))


def train_rows(cfg: cv.RunConfig, row_multiple: int) -> int:
    """The largest rows per optimizer step of any stage (its kind's own rule, rl.stages.Kind.step_rows)."""
    seq_len = cfg.tasks.max_prompt_len + cfg.sampling.max_new_tokens
    return max(stage_lib.KINDS[s.kind].step_rows(s, seq_len, row_multiple) for s in cfg.stages)


def device_budget(run_gib: float, n_devices: int) -> tuple[int, str]:
    """(bytes, how it was chosen): run.device_memory_gib when > 0; else the first device's own limit
    (memory_stats' bytes_limit on GPU / TPU); else, on CPU, 80% of host RAM split over the mesh's devices."""
    if run_gib > 0:
        return int(run_gib * GIB), "run.device_memory_gib"
    dev = jax.devices()[0]
    if dev.platform != "cpu":
        try:
            limit = (dev.memory_stats() or {}).get("bytes_limit")
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            limit = None
        if limit:
            return int(limit), f"{dev.device_kind} memory limit"
        return 16 * GIB, f"{dev.device_kind} reports no memory limit; 16 GiB assumed"
    total = psutil.virtual_memory().total
    return int(0.8 * total / max(1, n_devices)), f"80% of {total / GIB:.0f} GiB host RAM over {n_devices} CPU device(s)"


def plan_for_config(cfg: cv.RunConfig, model_cfg, mesh_sizes: dict, rules=None,
                    row_multiple: int | None = None) -> MemoryPlan:
    """The plan of a validated config on a resolved mesh (axis sizes without -1), against device_budget.
    model_cfg is the run's (rl.setup.build_model_cfg): with model.upcycle the upcycled MoE, not the dense one."""
    if model_cfg.upcycle is not None:
        raise ValueError("plan_for_config needs the model the run trains: with model.upcycle the upcycled MoE "
                         "(rl.setup.build_model_cfg), not the dense config")
    rules = DEFAULT_RULES if rules is None else rules
    if row_multiple is None:
        row_multiple = int(mesh_sizes.get("data", 1)) * int(mesh_sizes.get("fsdp", 1))
    n_dev = math.prod(int(v) for v in mesh_sizes.values())
    budget, note = device_budget(float(cfg.run.device_memory_gib), n_dev)
    P, N = cfg.tasks.max_prompt_len, cfg.sampling.max_new_tokens
    reference = any(stage_lib.KINDS[s.kind].uses_reference(s) for s in cfg.stages)
    after_training = any(stage_lib.KINDS[s.kind].uses_reference(s) for s in cfg.stages[1:])  # LoRA: trained adapters
    continuous = cfg.sampling.batching == "continuous" and n_dev == 1
    return plan(model_cfg, mesh_sizes, rules, leaves=model_leaves(model_cfg), train_rows=train_rows(cfg, row_multiple),
                seq_len=P + N, sample_rows=cfg.sampling.batch_rows, prompt_len=P, new_tokens=N,
                step=step_shape(cfg, row_multiple), sample_dtype=cfg.sampling.dtype,
                prefill_rows=min(REFILL, cfg.sampling.batch_rows) if continuous else None,
                reference=reference, budget=budget, budget_note=note,
                lora_sizes=None if model_cfg.lora is None else lora_leaves(model_cfg), adapters_reference=after_training)
