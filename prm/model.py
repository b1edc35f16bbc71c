"""The process reward model itself: the policy's transformer (models/transformer.py) with a scoring head, the
token rows it reads, batched jitted scoring and calibration parameters (its files: prm/checkpoint.py).

    enc = encode(tok, prompts, solutions, seq_len, labels)    # rows + step-end positions (+ labels)
    z = step_logits(params, model_cfg, enc)                   # [N, S] raw logits at the step ends
    prm = PRM(model_cfg, params, calib={"kind": "platt", "a": 0.8, "b": 0.1}, threshold=0.5, calibs=fitted)
    prm.probs(z)                                              # calibrated P(step good)
    prm.calibrated("temperature")                             # the same PRM with another stored map
    score_texts(prm, tok, prompts, solutions)                 # list of per-step probabilities per solution
    prm.checkpoint.save(prm, "runs/prm/prm"); prm = prm.checkpoint.load("runs/prm/prm")

Model. params = the policy's parameter tree plus "value_head" = {"w": [d_model], "b": []}, the linear head the
train step already has (rl/train_step.py, mode "prm": binary cross-entropy at labelled step ends). A step ending
at token t gets the logit

    z = w . hidden[t] + b  (+ log p(step tokens), the sum of log p(token) over the step, when `likelihood`)

over the final-normed hidden state and the model's own LM head, so it reads the prompt and the solution up to and
including t (causal attention): a step's score never depends on what follows it. The likelihood term makes the
starting point the policy's own confidence in the step (measured alone, it already ranks steps well: see
docs/rewards.md); the head and the fine-tuned weights learn the rest. The PRM starts from the policy's own
weights (it reads the policy's tokens with the policy's tokenizer) or from a fresh init.

Rows are prompt (with BOS) + solution tokens, right-padded to seq_len (the trainer's row length); steps that end
past seq_len are not scored. A step's position is len(tok.encode(prompt + solution[:end], add_bos=True)) - 1,
the same rule as rl.advantages.step_scores, so trainer rows and text rows agree.

Calibration. `calib` is the map probs() applies (the file's own: Platt scaling from prm/pipeline.py);
`calibs` holds every map fitted on the calibration split ({"none", "temperature", "platt"}), so a user picks one
at use time (an RL stage's stages[i].prm_calibration) without refitting. Files written before `calibs`
existed load with {"none", their own map}.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from models import transformer
from models.config import ModelConfig
from prm import metrics
from prm.data import step_ends
from rewards.parse import as_text
from rl.losses import token_logprobs
from rl.rollout import chunked

__all__ = ["PRM", "Encoded", "utf8_safe", "encode", "step_prev", "train_batch", "logits_fn", "step_logits",
           "logits_at", "score_texts"]


@dataclasses.dataclass(frozen=True)
class PRM:
    """A trained PRM: the model config, parameters (policy tree + "value_head"), the calibration map
    (metrics.calibrate), the first-error threshold on calibrated probabilities, the aggregation of step scores
    into a solution score (metrics.aggregate) and what training measured (meta)."""

    model_cfg: ModelConfig
    params: Any
    calib: dict = dataclasses.field(default_factory=lambda: {"kind": "none"})
    threshold: float = 0.5
    agg: str = "min"
    meta: dict = dataclasses.field(default_factory=dict)
    likelihood: bool = False  # the logit adds the step's log-likelihood under the model's LM head
    calibs: dict = dataclasses.field(default_factory=dict)  # every stored map by name (metrics.CALIBRATIONS)

    def probs(self, logits) -> np.ndarray:
        return metrics.calibrate(logits, self.calib)

    def stored_calibrations(self) -> dict:
        """{name: map} of the maps this PRM can apply: `calibs`, plus "none" and its own map's kind."""
        return {"none": {"kind": "none"}, self.calib.get("kind", "none"): self.calib, **self.calibs}

    def calibrated(self, name: str = "") -> "PRM":
        """This PRM applying its stored map `name` (none | temperature | platt; "" = its own); ValueError naming
        the maps it has when `name` is not one of them."""
        if not name:
            return self
        have = self.stored_calibrations()
        if name not in metrics.CALIBRATIONS or name not in have:
            raise ValueError(f"calibration {name!r} is not stored in this PRM (it has {', '.join(sorted(have))}; "
                             "prm/pipeline.py (python -m experiments.train_prm) stores none, temperature and platt)")
        return dataclasses.replace(self, calib=dict(have[name]))


class Encoded:
    """Token rows of N solutions and their S step-end positions: tokens / attn_mask [N, T] int32, pos / mask
    [N, S] int32 (mask 0 for padding steps and steps cut by seq_len), prev [N, S] (the previous step's end; the
    prompt's last token for the first step), labels [N, S] float32 (0 where None or absent) and label_mask [N, S]
    (1 where a label is given and the step is scored)."""

    def __init__(self, tokens, attn_mask, pos, mask, labels, label_mask, prev):
        self.tokens, self.attn_mask, self.pos, self.mask = tokens, attn_mask, pos, mask
        self.labels, self.label_mask, self.prev = labels, label_mask, prev

    def rows(self, idx) -> "Encoded":
        return Encoded(*(getattr(self, k)[idx] for k in ("tokens", "attn_mask", "pos", "mask", "labels",
                                                         "label_mask", "prev")))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def utf8_safe(text) -> str:
    """as_text(text) with lone surrogates replaced by "?" (one character each, so character spans stay valid):
    tokenizers encode UTF-8 and would raise on them."""
    return as_text(text).encode("utf-8", errors="replace").decode("utf-8")


def encode(tok, prompts: Sequence[str], solutions: Sequence[str], seq_len: int, labels=None) -> Encoded:
    """Rows and step positions of (prompt, solution) pairs; `labels` (one tuple per solution, aligned with
    prm.data.step_ends) fills labels / label_mask."""
    rows, steps = [], []
    for i, (p, s) in enumerate(zip(prompts, solutions)):
        p, s = utf8_safe(p), utf8_safe(s)
        ids = tok.encode(p + s, add_bos=True)[:seq_len]
        pos = [len(tok.encode(p + s[:e], add_bos=True)) - 1 for e in step_ends(s)]
        prev = [len(tok.encode(p, add_bos=True)) - 1] + pos[:-1]
        lab = list(labels[i]) if labels is not None else [None] * len(pos)
        if len(lab) != len(pos):
            raise ValueError(f"solution {i}: {len(lab)} labels for {len(pos)} steps")
        rows.append(ids)
        steps.append([(q, y, r) for q, y, r in zip(pos, lab, prev) if q < len(ids)])
    N, S = len(rows), max([1] + [len(x) for x in steps])
    out = Encoded(np.zeros((N, seq_len), np.int32), np.zeros((N, seq_len), np.int32), np.zeros((N, S), np.int32),
                  np.zeros((N, S), np.int32), np.zeros((N, S), np.float32), np.zeros((N, S), np.int32),
                  np.zeros((N, S), np.int32))
    for i, (ids, st) in enumerate(zip(rows, steps)):
        out.tokens[i, :len(ids)], out.attn_mask[i, :len(ids)] = ids, 1
        for j, (q, y, r) in enumerate(st):
            out.pos[i, j], out.mask[i, j], out.prev[i, j] = q, 1, r
            if y is not None:
                out.labels[i, j], out.label_mask[i, j] = float(y), 1
    return out


def step_prev(pos, mask, prev, T: int) -> np.ndarray:
    """[N, T] int32: at each step end the previous step's end, elsewhere the position itself (an empty span)."""
    out = np.broadcast_to(np.arange(T, dtype=np.int32), (len(pos), T)).copy()
    r, j = np.nonzero(np.asarray(mask) > 0)
    out[r, np.asarray(pos)[r, j]] = np.asarray(prev)[r, j]
    return out


def train_batch(enc: Encoded, idx, likelihood: bool = False) -> dict:
    """The train step's "prm" batch for rows idx: tokens, attn_mask, loss_mask (1 at labelled step ends),
    step_labels (the label there) and, with `likelihood`, step_prev (rl/train_step.py adds each step's
    log-likelihood to its logit)."""
    idx = np.asarray(idx)
    n, T = len(idx), enc.tokens.shape[1]
    loss_mask = np.zeros((n, T), np.int32)
    step_labels = np.zeros((n, T), np.float32)
    rows = np.repeat(np.arange(n), enc.pos.shape[1])
    lm, pos, lab = enc.label_mask[idx].ravel(), enc.pos[idx].ravel(), enc.labels[idx].ravel()
    keep = lm > 0
    loss_mask[rows[keep], pos[keep]] = 1
    step_labels[rows[keep], pos[keep]] = lab[keep]
    out = {"tokens": enc.tokens[idx], "attn_mask": enc.attn_mask[idx], "loss_mask": loss_mask,
           "step_labels": step_labels}
    if likelihood:
        out["step_prev"] = step_prev(enc.pos[idx], enc.mask[idx], enc.prev[idx], T)
    return out


_LOGITS: dict = {}


def logits_fn(model_cfg: ModelConfig, likelihood: bool = False):
    """Jitted (params, tokens, attn_mask, step_prev) -> [B, T] step logits at every token (cached): the head, plus
    with `likelihood` the log-likelihood of (step_prev[t], t] (rl/train_step.py's "prm" loss, the same formula)."""
    key = (model_cfg, bool(likelihood))
    if key not in _LOGITS:
        def fn(params, tokens, attn_mask, prev):
            body = {k: v for k, v in params.items() if k != "value_head"}
            logits, aux = transformer.forward(body, tokens, model_cfg, attn_mask=attn_mask, return_hidden=True,
                                              return_logits=likelihood)
            head = params["value_head"]
            z = jnp.einsum("btd,d->bt", aux["hidden"].astype(jnp.float32), head["w"]) + head["b"]
            if likelihood:
                f = jnp.cumsum(token_logprobs(logits, tokens) * attn_mask, axis=1)
                z = z + f - jnp.take_along_axis(f, prev.astype(jnp.int32), axis=1)
            return z

        _LOGITS[key] = jax.jit(fn)
    return _LOGITS[key]


def logits_at(params, model_cfg: ModelConfig, tokens, attn_mask, pos, mask, prev, likelihood: bool = False,
              rows: int = 64) -> np.ndarray:
    """Step logits [N, S] at positions pos [N, S] (prev: each step's previous end) of token rows, in fixed chunks of
    `rows` (one compile)."""
    if len(tokens) == 0:
        return np.zeros(np.shape(pos), np.float32)
    T = np.shape(tokens)[1]
    z = chunked(logits_fn(model_cfg, likelihood), params,
                {"tokens": np.asarray(tokens), "attn_mask": np.asarray(attn_mask)}, rows, step_prev(pos, mask, prev, T))
    return np.take_along_axis(z, np.asarray(pos, np.int64), axis=1)


def step_logits(params, model_cfg: ModelConfig, enc: Encoded, rows: int = 64, likelihood: bool = False) -> np.ndarray:
    """Step logits [N, S] at the encoded step ends (meaningful where enc.mask is 1)."""
    return logits_at(params, model_cfg, enc.tokens, enc.attn_mask, enc.pos, enc.mask, enc.prev, likelihood, rows)


def score_texts(prm: PRM, tok, prompts: Sequence[str], solutions: Sequence[str], seq_len: int | None = None,
                rows: int = 64) -> list[list[float]]:
    """Calibrated P(good) of every scored step of every solution (steps cut by seq_len, default the model's
    max_seq_len, are left out)."""
    enc = encode(tok, prompts, solutions, seq_len or prm.model_cfg.max_seq_len)
    p = prm.probs(step_logits(prm.params, prm.model_cfg, enc, rows, prm.likelihood))
    return [[float(x) for x, m in zip(pr, mk) if m] for pr, mk in zip(p, enc.mask)]
