"""Rejection sampling (STaR / RFT): sample K answers per problem, keep the verified and well-formed ones,
fine-tune on them. It samples from the policy the stage starts from and improves, so it can follow a
cold start or an RL stage (R1's recycling step).

    stage("rejection", "rejection", rounds=4, n_problems=512, samples=8, temperature=0.7, epochs=2)

A unit is one round: sample -> score (reward pool) -> keep (outcome verified, format >= min_format,
distinct after whitespace normalisation, at most max_keep_per_problem per problem) -> SFT on the kept
answers, plus `gold_replay` x as many gold solutions of the stage's problems (cold-start data replay). With
`families` set, only those task families are sampled; each answer is judged by its own family's reward
(`solved`: verified math, every code test passing, every instruction constraint met). The kept share per round
is logged.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from rl.losses import LossConfig
from rl.sft import build_sft_batch
from rl.stages import common
from rl.stages.common import Base, Flat, StageInfo, section
from rl.stages.sft import length_buckets_field, sft_rows
from rl.train_loop import LoopConfig, router_metrics, step_stats
from schema import field, integer, num


@dataclasses.dataclass(frozen=True, kw_only=True)
class RejectionConfig(Flat):
    KIND = "rejection"
    UNIT_FIELD = "rounds"

    stage: StageInfo = section(StageInfo, "name and problems")
    loop: LoopConfig = section(LoopConfig, "learning-rate schedule and optimizer")
    rounds: int = field(3, "STaR / RFT rounds (sample, filter, fine-tune)", integer(1, 10**5))
    n_problems: int = field(64, "problems sampled per round", integer(1, 10**7))
    samples: int = field(8, "answers sampled per problem (K)", integer(1, 4096))
    temperature: float = field(0.7, "sampling temperature", num(0.0, 10.0, lo_open=True))
    epochs: int = field(1, "fine-tuning passes over the kept answers each round", integer(1, 10**4))
    batch_size: int = field(32, "sequences per optimizer step (near-equal minibatches of at most this many)",
                            integer(1, 10**5))
    min_format: float = field(1.0, "keep an answer only if its format reward is >= this", num(0.0, 1.0))
    max_keep_per_problem: int = field(4, "at most this many distinct kept answers per problem", integer(1, 4096))
    gold_replay: float = field(0.0, "gold solutions added to each round's fine-tuning set, as a share of the kept "
                                    "answers (cold-start data replay; 0 = off)", num(0.0, 100.0))
    length_buckets: int = length_buckets_field()


# -- what the run's planners ask of the kind (rl.stages.Kind; its train step and step rows are SFT's) -----------
def problems(cfg: RejectionConfig) -> tuple[str, int]:
    """(the field counting the training problems it asks for, that count): n_problems, drawn afresh each round."""
    return "n_problems", cfg.n_problems


def answers(cfg: RejectionConfig) -> int:
    """Answers a round samples and scores: n_problems x samples."""
    return cfg.n_problems * cfg.samples


def trained_rows(cfg: RejectionConfig, n_train: int) -> int:
    """Rows a round trains on at most (every answer kept), epochs counted."""
    del n_train
    return cfg.epochs * answers(cfg)


def seconds(cfg: RejectionConfig, run, price) -> dict:
    """Seconds of one round by part, priced by rl/time_estimate.py's `price` (run: the RunConfig): sampling the
    answers, the update on all of them."""
    seq = run.tasks.max_prompt_len + run.sampling.max_new_tokens
    rows = answers(cfg)
    return {"sampling": price.decode(rows, cfg.n_problems),
            "update": cfg.epochs * price.train(rows * seq, cfg.batch_size * seq)}


@dataclasses.dataclass(frozen=True)
class State:
    base: Base


def init(ctx, index: int, cfg: RejectionConfig, params) -> State:
    return State(base=common.init_base(ctx, index, cfg, params, LossConfig(mode="sft")))


def unit(st: State, u: int) -> tuple[State, dict]:
    """One round: sample -> score -> keep -> fine-tune on the kept answers (and replayed gold solutions)."""
    ctx, s, index, problems = st.base.ctx, st.base.cfg, st.base.index, st.base.problems
    rng = ctx.rng("rejection", index, u)
    ids = rng.choice(len(problems), size=s.n_problems, replace=False)
    probs = [problems[i] for i in ids]
    prompts = [ctx.prompt(p) for p in probs]
    t0 = time.time()
    smpl = ctx.sample(common.policy_params(st), prompts, [s.samples] * len(probs), ctx.key("rejection", index, u),
                      temperature=s.temperature)
    t_sample = time.time() - t0
    t0 = time.time()
    scores = ctx.scorer.result(ctx.scorer.submit(smpl.texts, [probs[i] for i in smpl.prompt_index], smpl.lengths))
    t_score = time.time() - t0
    kept = keep_verified(smpl.texts, smpl.prompt_index, scores, s.min_format, s.max_keep_per_problem)
    out = {"kept_share": len(kept) / len(smpl.texts),
           "problems_with_kept": len({int(smpl.prompt_index[r]) for r in kept}) / len(probs),
           "sample_accuracy": float(np.mean([sc["solved"] > 0.5 for sc in scores])), "n_kept": len(kept),
           "format_rate": float(np.mean([sc["format"] for sc in scores])),
           "reward/mean": float(np.mean([sc["total"] for sc in scores])),
           "response_length": float(np.mean(smpl.lengths)),
           "sample_tokens_per_s": float(smpl.lengths.sum()) / max(t_sample, 1e-9),
           "time/sample": t_sample, "time/score": t_score}
    if kept:
        xs, ys = [prompts[smpl.prompt_index[r]] for r in kept], [smpl.texts[r] for r in kept]
        n_gold = min(int(round(s.gold_replay * len(kept))), len(problems))
        if n_gold:  # replay the cold-start data beside the recycled answers
            gold = [problems[i] for i in rng.choice(len(problems), size=n_gold, replace=False)]
            xs += [ctx.prompt(p) for p in gold]
            ys += [ctx.solution(p) for p in gold]
            out["n_gold_replayed"] = n_gold
        batch = build_sft_batch(xs, ys, ctx.tok, ctx.seq_len)
        st, m = common.train(st, batch, epochs=s.epochs, rng=rng, max_rows=sft_rows(s.batch_size, ctx.row_multiple),
                             unit=u, length_buckets=s.length_buckets)
        out.update({"loss": m.get("loss/total"), "grad_norm": m.get("grad_norm"),
                    "train_tokens_per_s": float(batch["loss_mask"].sum()) * s.epochs / max(m["time/train"], 1e-9),
                    **step_stats(m), **router_metrics(m)})
    return st, out


def keep_verified(texts, prompt_index, scores, min_format: float, max_keep: int) -> list[int]:
    """Rows to keep: verified, format >= min_format, distinct per problem (whitespace-normalised), <= max_keep each."""
    kept, per_problem, seen = [], {}, set()
    for r, (text, sc) in enumerate(zip(texts, scores)):
        if sc["solved"] <= 0.5 or sc["format"] < min_format:
            continue
        pi = int(prompt_index[r])
        key = (pi, " ".join(text.split()))
        if key in seen or per_problem.get(pi, 0) >= max_keep:
            continue
        seen.add(key)
        per_problem[pi] = per_problem.get(pi, 0) + 1
        kept.append(r)
    return kept
