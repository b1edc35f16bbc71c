"""The process reward model on the trainer side: a process reward, step-level rewards and best-of-k reranking.

The PRM is a model, so it is scored here, in batched jitted forwards over the RL batch's own token rows beside
the policy's, not in the plain-Python reward pool. The stages and the evaluation (rl/) cannot import this wing:
register() (called by prm.install(), which every entry point calls) puts for_context and eval_rerank into
rl/reward_terms.py (slot "prm"), through which they call them, and the prm config section into
rl/config_validation.py. Config (the wing's section, prm/config.py):

    prm.path     a PRM checkpoint written by prm/pipeline.py (python -m experiments.train_prm; "" = off); an old
                 .npz file is still read until its date in rl/compat.py (prm/checkpoint.py)
    prm.weight   total reward += weight * the response's PRM score (0.1-0.3 when on; math rows only)
    prm.agg      the response's PRM score from its calibrated step probabilities: min | mean | prod | last
    prm.steps    step_rewards / process_grpo take their step scores from the PRM instead of the checker

An RL stage adds its own terms (rl/stages/iteration.py; stage-level, so a sweep over them shares the cold
start): stages[i].prm_weight (+ weight x the PRM score, on top of prm.weight) and stages[i].prm_calibration (the
map its probabilities use: none | temperature | platt, each stored in the file by prm/pipeline.py; ""
= the file's own). "{seed}" in prm.path is replaced by the run's seed (one PRM per seed in a sweep).

    scorer = for_context(ctx, stage_cfg, "stages[1]")   # None when prm.path is ""; loaded once per process
    out = scorer.score_rows(tokens, attn_mask, texts, resp_start)       # PRM probabilities per step
    rewards, m = scorer.add_reward(rewards, out, families)              # + weight * score; prm/* metrics
    sc, pos, msk = scorer.step_scores(out, final)                       # the step_scores layout
    eval_rerank(ctx, prompts, samples, scores, k)                        # {"prm@k", prm/seconds_per_solution}

A response's PRM steps are prm.data.step_ends: its step lines, then its final answer; step-level rewards
use the step lines only (the answer is the outcome reward's, or `final`'s in process GRPO). Positions follow
rl.advantages.step_scores: resp_start + len(tok.encode(text[:end])) - 1. Every scoring call reports
its cost (`prm/seconds`, `prm/seconds_per_solution`).
"""
from __future__ import annotations

import time

import numpy as np

from prm.checkpoint import load
from prm.config import PRMSection
from prm.data import step_ends
from prm.metrics import aggregate
from prm.model import logits_at, utf8_safe
from rewards.parse import step_spans
from rl import config_validation, reward_terms
from rl.rollout import build_batch
from rl.advantages import step_arrays

__all__ = ["PRMScorer", "for_context", "load_scorer", "prm_file", "eval_rerank", "register"]


class PRMScorer:
    """A loaded PRM with the run's tokenizer and PRM settings (w: prm.weight plus the stage's prm_weight)."""

    def __init__(self, prm, tok, *, w: float, agg: str, steps: bool, rows: int = 64):
        self.prm, self.tok, self.w, self.agg, self.steps, self.rows = prm, tok, float(w), agg, bool(steps), int(rows)

    def score_rows(self, tokens, attn_mask, texts, resp_start) -> dict:
        """Calibrated step probabilities of N rows (prompt + response tokens, responses decoded in `texts`):
        {"probs": [N, S], "pos": [N, S], "mask": [N, S], "answer": [N] bool (the last step is the answer),
         "score": [N] the aggregated response score, "seconds": float}."""
        t0 = time.time()
        T = np.shape(tokens)[1]
        rows = []
        answer = np.zeros((len(texts),), bool)
        for r, t in enumerate(texts):
            t, start = utf8_safe(t), int(resp_start[r])
            ends = step_ends(t)
            answer[r] = len(ends) > len(step_spans(t))
            rows.append([start + len(self.tok.encode(t[:e], add_bos=False)) - 1 for e in ends])
        S = max([1] + [len(x) for x in rows])
        pos, mask, prev = (np.zeros((len(texts), S), np.int32) for _ in range(3))
        for r, ps in enumerate(rows):
            for j, p in enumerate(ps):
                if p < T:
                    pos[r, j], mask[r, j] = p, 1
                    prev[r, j] = ps[j - 1] if j else int(resp_start[r]) - 1  # the first step starts the response
        z = logits_at(self.prm.params, self.prm.model_cfg, tokens, attn_mask, pos, mask, prev, self.prm.likelihood,
                      self.rows)
        probs = np.where(mask > 0, self.prm.probs(z), 0.0).astype(np.float32)
        score = np.array([aggregate(probs[r][mask[r] > 0], self.agg) for r in range(len(texts))], np.float64)
        return {"probs": probs, "pos": pos, "mask": mask, "answer": answer, "score": score,
                "seconds": time.time() - t0}

    def add_reward(self, rewards: np.ndarray, out: dict, families) -> tuple[np.ndarray, dict]:
        """rewards + w * PRM score on the math rows (the PRM judges arithmetic steps); prm/* metrics."""
        math_rows = np.array([f == "math" for f in families], bool)
        new = rewards + self.w * np.where(math_rows, out["score"], 0.0)
        n = max(len(rewards), 1)
        m = {"prm/score": float(out["score"][math_rows].mean()) if math_rows.any() else 0.0,
             "prm/seconds": float(out["seconds"]), "prm/seconds_per_solution": float(out["seconds"]) / n}
        return new, m

    def step_scores(self, out: dict, final=None, lengths=None, resp_start=None):
        """(scores, end positions, mask) of the step lines (the answer step dropped), in the layout of
        rl.advantages.step_scores; with `final`, each response's final score is appended as the last
        step at its last token (process GRPO)."""
        probs, pos, mask = out["probs"], out["pos"], out["mask"].copy()
        for r in np.flatnonzero(out["answer"]):
            j = int(mask[r].sum()) - 1
            if j >= 0:
                mask[r, j] = 0  # the answer step: the outcome's, not the PRM's

        rows = [[(float(probs[r, j]), int(pos[r, j])) for j in np.flatnonzero(mask[r])] for r in range(len(probs))]
        if final is not None:
            for r in range(len(rows)):
                rows[r].append((float(final[r]), int(resp_start[r]) + int(lengths[r]) - 1))
        return step_arrays(rows)

    def rerank(self, batch: dict, texts, correct, k: int) -> dict:
        """PRM best-of-k on evaluation samples: batch = rl.rollout.build_batch rows of n * k samples (k per
        problem, contiguous); prm@k = share of problems whose highest-scoring sample is correct."""
        out = self.score_rows(batch["tokens"], batch["attn_mask"], texts, batch["resp_start"])
        s = out["score"].reshape(-1, k)
        c = np.asarray(correct, bool).reshape(-1, k)
        picked = c[np.arange(len(c)), np.argmax(s, axis=1)]
        return {"prm@k": float(picked.mean()), "prm/seconds_per_solution": out["seconds"] / max(len(texts), 1)}


def eval_rerank(ctx, prompts, samples, scores, k: int) -> dict:
    """{"prm@k", "prm/seconds_per_solution"} of an evaluation's k >= 1 samples per prompt when the run has a PRM
    (rows built as the trainer's: rl.rollout.build_batch at ctx.seq_len), else {}. rl.reward_terms.eval_metrics
    calls it only when there are samples."""
    scorer = for_context(ctx)
    if scorer is None:
        return {}
    b = build_batch([ctx.tok.encode(p, add_bos=True) for p in prompts], samples, ctx.seq_len,
                            pad_id=ctx.tok.PAD)
    return scorer.rerank(b, samples.texts, [sc["solved"] > 0.5 for sc in scores], k)


def load_scorer(path: str, tok, section: PRMSection, *, w_extra: float = 0.0, calibration: str = "",
                calibration_field: str = "prm_calibration") -> PRMScorer:
    """A PRMScorer of the file `path` with the prm section's settings, plus `w_extra` on prm.weight and the stored
    map `calibration` ("" = the file's own); ValueError naming prm.path for a bad file, `calibration_field` for a map
    the file does not hold."""
    try:
        prm = load(path)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"prm.path {path!r}: {e} (train one: python -m experiments.train_prm --config "
                         "experiments/configs/prm_arith.py --workdir runs/prm)") from None
    try:
        prm = prm.calibrated(calibration)
    except ValueError as e:
        raise ValueError(f"{calibration_field} {calibration!r} with prm.path {path!r}: {e}") from None
    return PRMScorer(prm, tok, w=section.weight + float(w_extra), agg=section.agg, steps=section.steps)


def prm_file(section: PRMSection, seed: int) -> str:
    """prm.path with "{seed}" replaced by the run's seed ("" = no PRM)."""
    return section.path.replace("{seed}", str(int(seed)))


def for_context(ctx, stage=None, where: str = "stages[i]") -> PRMScorer | None:
    """The run's PRM scorer (cached per file and settings in the process), None when prm.path is "" (or the config
    has no prm section). With an RL stage config, its prm_weight adds to prm.weight and its prm_calibration (when
    set) picks the map; `where` names the stage in errors."""
    section = ctx.cfg.prm
    path = prm_file(section, ctx.cfg.seed) if section is not None else ""
    if not path:
        return None
    w_extra = float(stage.rl.prm_weight) if stage is not None else 0.0
    calibration = str(stage.rl.prm_calibration) if stage is not None else ""
    key = ("prm", path, section.weight, section.agg, section.steps, w_extra, calibration)
    return ctx.cached(key, lambda: load_scorer(path, ctx.tok, section, w_extra=w_extra, calibration=calibration,
                                               calibration_field=f"{where}.prm_calibration"))


def register() -> None:
    """Fill the "prm" slots the term needs (prm.install() calls it): the config section its settings live in
    (rl/config_validation.py: prm.*, PRMSection) and the reward term of rl/reward_terms.py (for_context and
    eval_rerank)."""
    config_validation.register_section("prm", PRMSection)
    reward_terms.register("prm", scorer=for_context, eval_rerank=eval_rerank)
