"""Warnings on a valid config: a field whose value was chosen for another setting than the one the run has.

    for line in warnings(cfg):        # cfg: a validated RunConfig; each line names the field, the setting its value
        print("warning:", line)       # was chosen for, and the value (or the algorithm name) that fits this run

They never stop a run (the config is valid; the value may be meant): rl.preflight.prepare prints them in the dry run
and at launch, after what each stage's algorithm name set (rl/stages/algorithms.py). Each rule is a small pure
function of the typed config; the rules on a stage's own fields are its kind's (rl.stages.Kind.warnings: the clip
rule in rl/stages/iteration.py, Dr. GRPO's and the refill cap's in rl/stages/grpo.py):

- clip ranges of another loss: GSPO clips a sequence ratio (~3e-4 / 4e-4), PPO and CISPO a token ratio (~0.2);
- Dr. GRPO half set: scale_by_std=False without its constant normaliser, or the normaliser with the std kept;
- the learning rate of LoRA on full fine-tuning (and the reverse), on a pretrained checkpoint: LORA_LR and
  FULL_FINETUNE_LR are the rates the SmolLM2 recipes measured (REPRODUCING.md), which the recipes take from here;
- tools on a prompt that never shows the tool's call markers, with no earlier SFT stage to teach them;
- a refill cap (max_refill_rounds) on a GRPO stage that does not refill.
"""
from __future__ import annotations

import math

from rewards.python_tool import byte_markers
from rl.stages import KINDS
from rl.stages import tools as stage_tools

LORA_LR = 2e-4  # the SmolLM2 recipes' learning rate with LoRA adapters (rank 16, every projection)
FULL_FINETUNE_LR = 1e-5  # theirs for full fine-tuning (20x smaller: every weight moves)


def warnings(cfg) -> list[str]:
    """Every warning of a validated RunConfig, each a line naming its field path."""
    out = []
    for i, st in enumerate(cfg.stages):
        p = f"stages[{i}]."
        out += [p + w for w in stage_warnings(st)]
        out += [p + w for w in lr_warnings(cfg, st)]
        out += [p + w for w in tools_warnings(cfg, i)]
    return out


def stage_warnings(st) -> list[str]:
    """A stage's own fields, by its kind (rl.stages.Kind.warnings): clip ranges of another loss, Dr. GRPO half set, a
    refill cap without the refill."""
    return KINDS[st.kind].warnings(st)


def lr_warnings(cfg, st) -> list[str]:
    """The learning rate of LoRA on full fine-tuning of a checkpoint, or the reverse."""
    if not (cfg.model.hf_path or cfg.model.pretrained):
        return []
    lora_on = cfg.model.lora is not None
    lr = st.loop.lr
    if not lora_on and math.isclose(lr, LORA_LR):
        return [f"lr={lr} was chosen for LoRA adapters (model.lora; {LORA_LR} in the SmolLM2 recipes, "
                f"{LORA_LR / FULL_FINETUNE_LR:.0f}x full fine-tuning's {FULL_FINETUNE_LR}), but model.lora is None: "
                f"full fine-tuning at it moves every weight that much further per step; set lr={FULL_FINETUNE_LR} "
                "(the recipes' lora=0 variant does)"]
    if lora_on and math.isclose(lr, FULL_FINETUNE_LR):
        return [f"lr={lr} was chosen for full fine-tuning ({FULL_FINETUNE_LR} in the SmolLM2 recipes), but "
                f"model.lora is set: the adapters, starting at zero, barely move at it; the recipes' LoRA rate is "
                f"{LORA_LR}"]
    return []


def tools_warnings(cfg, i: int) -> list[str]:
    """Tools on in stage i while the prompt never shows the call markers and no earlier SFT stage teaches them."""
    st = cfg.stages[i]
    tools = stage_tools(st)
    if tools is None:
        return []
    marker = byte_markers().call_start
    chat = bool(cfg.model.hf_path or cfg.model.pretrained) and cfg.model.chat_template
    prompt = cfg.model.system_prompt if chat else ""
    if marker in prompt or any(KINDS[s.kind].demonstrations for s in cfg.stages[:i]):
        return []
    where = ("model.system_prompt, written for answers without the tool" if prompt else
             "no model.system_prompt (the prompt is the question alone)")
    return [f"tools.kind={tools.kind!r}, but the prompt never shows the tool's call marker {marker!r} ({where}) and "
            f"no earlier sft stage teaches it, so the policy has no way to learn to call it: set "
            f"model.system_prompt to a tool prompt (rewards.python_tool.TOOL_SYSTEM_PROMPT, as "
            "experiments/configs/smollm2_tools.py does) or start with a cold start on tool demonstrations"]
