"""A recipe on a pretrained checkpoint: the checkpoint's architecture wins, the recipe keeps its run-time choices.

    mcfg, notes = on_checkpoint(loaded_cfg, cfg.model.arch(), source="ckpt/Qwen3-1.7B")  # any loaded ModelConfig
    cfg, notes = port_lengths(cfg, longest_prompt=161, context=32768)                    # a byte-tokenizer recipe

`on_checkpoint` is the one rule for every loader (models.hf reads config.json today; a named GGUF checkpoint goes
through the same function): the architecture fields of the loaded ModelConfig are kept, the section's run-time
fields (RUNTIME_FIELDS) win when the section sets them (a value other than ModelConfig's default), and
model.max_seq_len is clipped to the checkpoint's context. Each section field that the checkpoint overrode (an
architecture field whose value, set or default, differs from the checkpoint's) or clipped gives one note
("model.d_model = 32 -> 16"); the launcher prints them once, in the pre-run checks.

`port_lengths` is for a recipe written for the byte tokenizer (experiments/configs/quickstart.py and the others
whose get_config sets no model.hf_path) when the command line adds model.hf_path: its token lengths counted bytes,
so tasks.max_prompt_len becomes the longest prompt rendered through the checkpoint's chat template when that is
longer, and model.max_seq_len the prompt plus sampling.max_new_tokens (notes say so). Whatever still exceeds the
checkpoint's context is reported by the pre-run checks with the value that fits (rl/preflight.py), never cut
silently. A recipe that sets model.hf_path itself (qwen_gsm8k.py) wrote its lengths for that tokenizer: they are
checked, not changed.
"""
from __future__ import annotations

import dataclasses

from models.config import ModelConfig
from rl.config_validation import RunConfig

# Fields a recipe may set on a checkpoint: how the model runs, not what it is.
# lora / upcycle: what the run does with the checkpoint (adapters on it, or an MoE made from it), not what it is.
RUNTIME_FIELDS = ("dtype", "param_dtype", "remat", "scan_layers", "capacity_factor", "router_aux_coef", "router_z_coef", "max_seq_len",
                  "logits_chunk", "lora", "upcycle")


def on_checkpoint(ckpt: ModelConfig, section: dict, source: str) -> tuple[ModelConfig, list[str]]:
    """(the run's ModelConfig, notes): `ckpt` (a ModelConfig read from a checkpoint) with the model section's
    run-time fields (`section`: its ModelConfig keyword arguments, ModelSection.arch()); see the module docstring."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    changes, notes = {}, []
    for name, default in defaults.items():
        value = section.get(name, default)
        value = tuple(value) if isinstance(value, list) else value
        have = getattr(ckpt, name)
        if value == have:
            continue
        if name not in RUNTIME_FIELDS:  # set by the recipe or at its default: either way not what runs
            notes.append(f"model.{name} = {value!r} -> {have!r}")
        elif value == default:
            continue  # a run-time field the section leaves alone: the checkpoint's
        elif name == "max_seq_len" and value > ckpt.max_seq_len:
            notes.append(f"model.max_seq_len = {value} -> {have} (clipped to the checkpoint's context, {source})")
        else:
            changes[name] = value
    return ckpt.replace(**changes), notes


def port_lengths(cfg: RunConfig, longest_prompt: int, context: int) -> tuple[RunConfig, list[str]]:
    """(cfg with the lengths of a byte-tokenizer recipe measured in the checkpoint's tokens, notes)."""
    tasks, model, notes = cfg.tasks, cfg.model, []
    P, N = tasks.max_prompt_len, cfg.sampling.max_new_tokens
    if longest_prompt > P:
        tasks = tasks.replace(max_prompt_len=longest_prompt)
        notes.append(f"tasks.max_prompt_len = {P} -> {longest_prompt} (the longest prompt in the checkpoint's "
                     f"tokenizer and chat template)")
    need = min(tasks.max_prompt_len + N, context)  # beyond the context: the pre-run checks report it
    if need > model.max_seq_len:
        notes.append(f"model.max_seq_len = {model.max_seq_len} -> {need} (tasks.max_prompt_len + "
                     f"sampling.max_new_tokens, at most the checkpoint's context)")
        model = model.replace(max_seq_len=need)
    return cfg.replace(tasks=tasks, model=model), notes
