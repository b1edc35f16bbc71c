"""RL on tool trajectories: the stage's `tools` section, the tool rollout, what the policy wrote, tool metrics.

A GRPO / PPO stage with `tools=dict(kind="python", max_turns=2, ...)` samples with
models.tool_sampling.generate_with_tools and rewards.python_tool.PythonTool (docs/tools.md) instead of
models.sampling.generate; rl/stages/iteration.py calls the four functions below and nothing else changes:

    smpl = sample(ctx, params, prompts, ks, key, temperature=t, model_cfg=mc, cfg=stage_cfg.tools)   # ToolSamples
    b = with_policy_mask(rollout.build_batch(...), smpl)   # loss_mask := the policy's own tokens (0 on tool ids)
    arrays.update(tool_arrays(smpl))                       # per-row turns / tool tokens / errors / copied answers
    texts = policy_texts(tok, arrays)                      # what the policy wrote, tool output removed
    metrics(arrays)                                        # tools/calls_per_sample, tools/errors, ...

The train step reads only `loss_mask` for the loss, the KL, the entropy, the advantages (multiplied by it) and the
token-sum normalisers, so with loss_mask = policy_mask none of them sees a tool token, and the sampler's logprobs
(0 on tool ids) meet the trainer's on exactly the sampled tokens: the mismatch metric stays at float32 round-off.
The trajectory is never decoded and re-encoded: the train rows hold the sampled and tool ids as generated.

Rewards score `policy_texts`: each policy segment (a run of policy_mask 1) decoded on its own and joined, so a
tool that prints "Answer: 42" or "\\boxed{42}" cannot answer for the policy (and a chat tool turn's EOS ids are
never decoded into the policy's text). `copied` marks answers the policy took from a program that only prints a
literal (`<py>print(4200)</py>` then "Answer: 4200"): the tool computed nothing, so the call only launders a
guess; rl/hacking.py flags a stage where this share rises.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

from models.tool_sampling import generate_with_tools
from rewards.code_exec import ExecConfig
from rewards.parse import extract_answer
from rewards.python_tool import PythonTool, byte_markers, chat_markers
from rl import rollout
from schema import Checked, choice, field, integer, num

KINDS = ("", "python")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolsConfig(Checked):
    """A stage's tool use (GRPO and PPO): off (kind '') by default, and then the stage samples as before."""

    kind: str = field("", "'' (no tools) | python (the sandboxed Python tool of docs/tools.md: the policy writes "
                          "<py> code </py>, the output comes back in <out> ... </out>)", choice(*KINDS))
    max_turns: int = field(2, "tool calls allowed per answer", integer(1, 64))
    max_output_tokens: int = field(32, "tokens of one tool output (markers included); they count against "
                                       "sampling.max_new_tokens", integer(2, 4096))
    timeout_s: float = field(5.0, "wall-clock limit of one tool call (seconds)", num(0.1, 120.0))

    @property
    def on(self) -> bool:
        return bool(self.kind)


def make_tool(tok, cfg: ToolsConfig) -> PythonTool:
    """The tool_fn of a tools section (kind python)."""
    per_call = min(3.0, cfg.timeout_s)
    return PythonTool(tok, max_output_tokens=int(cfg.max_output_tokens),
                      exec_cfg=ExecConfig(timeout_s=float(cfg.timeout_s), per_test_timeout_s=per_call,
                                          cpu_s=max(1, int(round(cfg.timeout_s))), max_output_chars=14000))


@dataclasses.dataclass
class ToolSamples(rollout.Samples):
    """rollout.Samples plus where the policy wrote: policy_mask [N, max_new] (1 on sampled tokens) and turns [N]."""

    policy_mask: np.ndarray = None
    turns: np.ndarray = None


def sample(ctx, params, prompts: list[str], ks, key, *, temperature: float, model_cfg, cfg: ToolsConfig,
           tool=None) -> ToolSamples:
    """ks[i] answers per prompt with tool calls, in fixed-size sampler calls like rollout.sample (call c uses
    fold_in(key, c)); texts are the policy's own (policy_texts). `tool`: a tool_fn (default make_tool)."""
    tok, smp = ctx.tok, ctx.cfg.sampling
    tool = tool or make_tool(tok, cfg)
    ks = np.asarray(ks, np.int64)
    P = ctx.cfg.tasks.max_prompt_len
    ids, pmask, _ = rollout.encode_prompts(tok, prompts, multiple=P, max_len=P)
    row_prompt = np.repeat(np.arange(len(prompts)), ks)
    rows = smp.batch_rows
    parts = []
    for c, start in enumerate(range(0, len(row_prompt), rows)):
        sel = row_prompt[start : start + rows]
        real = len(sel)
        sel = np.concatenate([sel, np.full((rows - real,), sel[-1])])
        o = generate_with_tools(params, model_cfg, ids[sel], jax.random.fold_in(key, c), prompt_mask=pmask[sel],
                                tool_fn=tool, call_end_ids=tool.call_end_ids, max_turns=int(cfg.max_turns),
                                max_new_tokens=int(smp.max_new_tokens), temperature=float(temperature),
                                top_p=float(smp.top_p), top_k=int(smp.top_k), eos_id=list(tok.stop_ids),
                                pad_id=tok.PAD, mesh=ctx.mesh, rules=ctx.rules)
        W = ids.shape[1]  # the output holds the prompt first: the response is everything after it
        parts.append((o.tokens[:real, W:], o.logprobs[:real, W:], o.lengths[:real], o.policy_mask[:real, W:],
                      o.turns[:real]))
    toks, lps, lens, pm, turns = (np.concatenate(x, 0) for x in zip(*parts))
    pm = pm.astype(np.int32) * (np.arange(pm.shape[1])[None] < lens[:, None])
    texts = [_policy_text(tok, toks[r], pm[r], int(lens[r])) for r in range(len(toks))]
    return ToolSamples(prompt_index=row_prompt, tokens=toks.astype(np.int32), logprobs=lps.astype(np.float32),
                       lengths=lens.astype(np.int32), texts=texts, group_sizes=ks, policy_mask=pm,
                       turns=turns.astype(np.int32))


def with_policy_mask(b: dict, smpl) -> dict:
    """The built batch with loss_mask on the policy's own tokens only (unchanged without tools)."""
    if not isinstance(smpl, ToolSamples):
        return b
    loss = np.zeros_like(b["loss_mask"])
    for r, s in enumerate(b["resp_start"]):
        L = int(smpl.lengths[r])
        loss[r, s : s + L] = smpl.policy_mask[r, :L]
    return {**b, "loss_mask": loss}


# -- what the policy wrote ----------------------------------------------------------------------------------------
def segments(mask_row: np.ndarray, length: int) -> list[tuple[int, int, bool]]:
    """(start, end, is_policy) runs of a response's mask over its first `length` positions."""
    out, start = [], 0
    for t in range(1, length + 1):
        if t == length or bool(mask_row[t]) != bool(mask_row[start]):
            out.append((start, t, bool(mask_row[start])))
            start = t
    return out


def _policy_text(tok, toks, mask_row, length: int) -> str:
    return "".join(tok.decode(toks[a:b]) for a, b, pol in segments(mask_row, length) if pol)


def tool_text(tok, ids) -> str:
    """A tool segment's text, special tokens kept. A chat tool turn holds EOS ids (the assistant turn's end before
    the output, the tool turn's end after it) and a tokenizer's decode stops at the first EOS, so each run between
    them is decoded on its own."""
    eos, out, run = int(tok.eos_id), [], []
    for i in map(int, ids):
        if i == eos:
            out += [tok.decode(run, skip_special=False), tok.decode([eos], skip_special=False)]
            run = []
        else:
            run.append(i)
    return "".join(out) + tok.decode(run, skip_special=False)


def turn_records(tok, toks, mask_row, length: int) -> list[dict]:
    """A response as its turns: [{"role": "policy" | "tool", "text": ...}] (samples.jsonl)."""
    return [{"role": "policy" if pol else "tool", "text": tool_text(tok, toks[a:b]) if not pol
             else tok.decode(toks[a:b])} for a, b, pol in segments(mask_row, length)]


def _response_view(a: dict, r: int):
    s, L = int(a["resp_start"][r]), int(a["lengths"][r])
    return a["tokens"][r, s : s + L], a["loss_mask"][r, s : s + L], L


def policy_texts(tok, a: dict) -> list[str]:
    """The policy's own text of every row of a produced batch (tool outputs removed)."""
    return [_policy_text(tok, *_response_view(a, r)) for r in range(a["tokens"].shape[0])]


# -- per-row tool facts -------------------------------------------------------------------------------------------
# The tool's reply to a raising program is the error's last line ("ZeroDivisionError: division by zero",
# "TimeoutError: ...", "Error: ..."); a program printing such a line counts too (a metric, never a reward).
_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)|Error)(?::|$)")
# A program that computes nothing: print of one number or one quoted string without quotes inside.
_LITERAL_PRINT = re.compile(r"""^\s*print\(\s*(?:[-+]?\d[\d_]*(?:\.\d+)?|"[^"\\]*"|'[^'\\]*')\s*\)\s*$""")


def _inner(text: str, start: str, end: str) -> str:
    i = text.find(start)
    j = text.rfind(end)
    return text[i + len(start): j] if 0 <= i and i + len(start) <= j else text


def row_facts(tok, toks, mask_row, length: int, markers) -> tuple[int, int, int]:
    """(tool tokens, tool errors, copied answer 0/1) of one response."""
    segs = segments(mask_row, length)
    n_tool = sum(b - a for a, b, pol in segs if not pol)
    outputs = [_inner(tool_text(tok, toks[a:b]), markers.out_start, markers.out_end).strip()
               for a, b, pol in segs if not pol]
    errors = sum(bool(_ERROR.match(o)) for o in outputs)
    text = _policy_text(tok, toks, mask_row, length)
    ans = extract_answer(text)
    literal = set()
    codes = re.findall(re.escape(markers.call_start) + r"(.*?)" + re.escape(markers.call_end), text, re.S)
    for code, out in zip(codes, outputs):
        if _LITERAL_PRINT.match(code):
            literal.add(out)
    copied = int(ans is not None and ans.strip() != "" and ans.strip() in literal)
    return n_tool, errors, copied


def tool_arrays(smpl, tok=None, markers=None) -> dict:
    """Per-row tool arrays of a produced batch ({} without tools): tool_turns, tool_tokens, tool_errors, copied."""
    if not isinstance(smpl, ToolSamples):
        return {}
    markers = markers or make_markers(tok)
    facts = np.array([row_facts(tok, smpl.tokens[r], smpl.policy_mask[r], int(smpl.lengths[r]), markers)
                      for r in range(len(smpl.tokens))], np.int64).reshape(-1, 3)
    return {"tool_turns": smpl.turns.astype(np.int64), "tool_tokens": facts[:, 0], "tool_errors": facts[:, 1],
            "tool_copied": facts[:, 2]}


def make_markers(tok):
    return chat_markers(tok) if getattr(tok, "chat_template", None) else byte_markers()


def metrics(a: dict) -> dict:
    """The tool metrics of a produced batch ({} without tools)."""
    if "tool_turns" not in a:
        return {}
    turns = a["tool_turns"].astype(np.float64)
    n_tok = a["tool_tokens"].astype(np.float64)
    return {"tools/calls_per_sample": float(turns.mean()), "tools/samples_with_call": float((turns > 0).mean()),
            "tools/errors": float(a["tool_errors"].sum()),
            "tools/error_rate": float(a["tool_errors"].sum() / max(turns.sum(), 1.0)),
            "tools/turns": float((turns + 1).mean()), "tools/tokens": float(n_tok.mean()),
            "tools/token_share": float(n_tok.sum() / max(float(np.sum(a["lengths"])), 1.0)),
            "tools/copied_answer": float(a["tool_copied"].mean())}
