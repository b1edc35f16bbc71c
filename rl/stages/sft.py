"""Cold-start SFT: worked solutions from the tasks, loss on the solution tokens (and EOS) only.

    stage("sft", "cold_start", epochs=5, batch_size=32, n_problems=2000, lr=3e-3)

A unit is one epoch over the first `n_problems` training problems, rendered as prompt + worked
solution (rl.tasks.render) and batched by rl.sft.build_sft_batch.

`direct_share` writes that share of the math demonstrations as the answer line alone, without the steps (a
fixed draw per run and stage): cold-start data that mixes worked solutions with bare answers, as human-written
data does. A policy imitating it reasons on some problems and guesses on others; the quickstart shows RL learning
to reason because reasoning is what the verifier pays for.
"""
from __future__ import annotations

import dataclasses

from rl.losses import LossConfig
from rl.sft import build_sft_batch
from rl.stages import common
from rl.stages.common import Base, Flat, StageInfo, section
from rl.train_loop import LoopConfig, router_metrics, step_stats
from schema import field, integer, num


def length_buckets_field():
    """The `length_buckets` field of the stages that fine-tune on demonstrations (sft, rejection)."""
    return field(0, "group rows of similar length into the minibatches and cut each one's padding to the narrowest "
                    "of this many widths (seq_len x i / N) holding its longest row: one compile per width used; "
                    "0 = every row padded to seq_len", integer(0, 64))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig(Flat):
    KIND = "sft"
    UNIT_FIELD = "epochs"

    stage: StageInfo = section(StageInfo, "name and problems")
    loop: LoopConfig = section(LoopConfig, "learning-rate schedule and optimizer")
    epochs: int = field(3, "passes over the worked solutions", integer(1, 10**5))
    batch_size: int = field(32, "sequences per optimizer step (an epoch is split into near-equal minibatches of at "
                                "most this many)", integer(1, 10**5))
    n_problems: int = field(0, "training problems used (0 = all of tasks.n_train)", integer(0, 10**7))
    direct_share: float = field(0.0, "share of the math demonstrations written as the answer line alone, without "
                                     "steps (drawn once per run; 0 = every demonstration shows its steps)",
                                num(0.0, 1.0))
    length_buckets: int = length_buckets_field()


def components(cfg, max_new_tokens: int):
    """(LossConfig, OptimConfig, KL controller or None) of the train step a stage that fine-tunes on answers (SFT,
    rejection) runs: the SFT loss, no KL."""
    del max_new_tokens
    return LossConfig(mode="sft"), cfg.loop.optim(), None


def sft_rows(batch_size: int, multiple: int) -> int:
    """Rows per SFT step: the batch size rounded up to the mesh's batch axes (one compiled shape)."""
    return max(multiple, -(-int(batch_size) // multiple) * multiple)


# -- what the run's planners ask of the kind (rl.stages.Kind) ---------------------------------------------------
def problems(cfg: SFTConfig) -> tuple[str, int]:
    """(the field counting the training problems it asks for, that count): n_problems, 0 = all of its families."""
    return "n_problems", cfg.n_problems


def step_rows(cfg, seq_len: int, row_multiple: int) -> int:
    """Rows per optimizer step of a stage that fine-tunes on answers (SFT, rejection): sft_rows of its batch_size."""
    del seq_len
    return sft_rows(cfg.batch_size, row_multiple)


def answers(cfg: SFTConfig) -> int:
    """Answers an epoch samples and scores: none (it trains on the tasks' worked solutions)."""
    del cfg
    return 0


def trained_rows(cfg: SFTConfig, n_train: int) -> int:
    """Rows an epoch trains on: n_problems, or tasks.n_train with n_problems 0."""
    return cfg.n_problems or n_train


def seconds(cfg: SFTConfig, run, price) -> dict:
    """Seconds of one epoch by part, priced by rl/time_estimate.py's `price` (run: the RunConfig): the update."""
    seq = run.tasks.max_prompt_len + run.sampling.max_new_tokens
    return {"update": price.train(trained_rows(cfg, run.tasks.n_train) * seq, cfg.batch_size * seq)}


DIRECT_STREAM = 10**6  # rng stream of the direct_share draw (epochs use streams 0 .. epochs - 1)


def without_steps(problem):
    """The problem with its worked steps dropped (math only): it renders as the answer line alone."""
    return dataclasses.replace(problem, steps=None) if problem.reward == "math" else problem


@dataclasses.dataclass(frozen=True)
class State:
    base: Base
    batch: dict  # the stage's demonstrations, built once (rl.sft.build_sft_batch)


def init(ctx, index: int, cfg: SFTConfig, params) -> State:
    base = common.init_base(ctx, index, cfg, params, LossConfig(mode="sft"))
    probs = base.problems[: (cfg.n_problems or len(base.problems))]
    direct = ctx.rng("sft", index, DIRECT_STREAM).random(len(probs)) < cfg.direct_share
    probs = [without_steps(p) if d else p for p, d in zip(probs, direct)]
    batch = build_sft_batch([ctx.prompt(p) for p in probs], [ctx.solution(p) for p in probs], ctx.tok, ctx.seq_len)
    return State(base=base, batch=batch)


def unit(st: State, u: int) -> tuple[State, dict]:
    """One epoch over the demonstrations."""
    ctx, cfg, index = st.base.ctx, st.base.cfg, st.base.index
    st, m = common.train(st, st.batch, epochs=1, rng=ctx.rng("sft", index, u),
                         max_rows=sft_rows(cfg.batch_size, ctx.row_multiple), unit=u,
                         length_buckets=cfg.length_buckets)
    n_tok = float(st.batch["loss_mask"].sum())
    return st, {"loss": m.get("loss/total"), "grad_norm": m.get("grad_norm"), "n_examples": len(st.batch["tokens"]),
                "train_tokens_per_s": n_tok / max(m["time/train"], 1e-9), **step_stats(m), **router_metrics(m)}
