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

import numpy as np

from rl.config_fields import field, integer, num
from rl.stages.base import StageConfig, StageRun, router_metrics, step_stats


def length_buckets_field():
    """The `length_buckets` field of the stages that fine-tune on demonstrations (sft, rejection)."""
    return field(0, "group rows of similar length into the minibatches and cut each one's padding to the narrowest "
                    "of this many widths (seq_len x i / N) holding its longest row: one compile per width used; "
                    "0 = every row padded to seq_len", integer(0, 64))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig(StageConfig):
    KIND = "sft"
    UNIT_FIELD = "epochs"

    kind: str = field("sft", "stage kind")
    epochs: int = field(3, "passes over the worked solutions", integer(1, 10**5))
    batch_size: int = field(32, "sequences per optimizer step (an epoch is split into near-equal minibatches of at "
                                "most this many)", integer(1, 10**5))
    n_problems: int = field(0, "training problems used (0 = all of tasks.n_train)", integer(0, 10**7))
    direct_share: float = field(0.0, "share of the math demonstrations written as the answer line alone, without "
                                     "steps (drawn once per run; 0 = every demonstration shows its steps)",
                                num(0.0, 1.0))
    length_buckets: int = length_buckets_field()


def sft_rows(batch_size: int, multiple: int) -> int:
    """Rows per SFT step: the batch size rounded up to the mesh's batch axes (one compiled shape)."""
    return max(multiple, -(-int(batch_size) // multiple) * multiple)


DIRECT_STREAM = 10**6  # rng stream of the direct_share draw (epochs use streams 0 .. epochs - 1)


def without_steps(problem):
    """The problem with its worked steps dropped (math only): it renders as the answer line alone."""
    return dataclasses.replace(problem, steps=None) if problem.reward == "math" else problem


class SFTRun(StageRun):
    def __init__(self, ctx, index, cfg: SFTConfig, params):
        super().__init__(ctx, index, cfg, params)
        from rl.sft import build_sft_batch

        probs = self.problems[: (cfg.n_problems or len(self.problems))]
        direct = ctx.rng("sft", index, DIRECT_STREAM).random(len(probs)) < cfg.direct_share
        probs = [without_steps(p) if d else p for p, d in zip(probs, direct)]
        self.batch = build_sft_batch([ctx.prompt(p) for p in probs], [ctx.solution(p) for p in probs], ctx.tok,
                                     ctx.seq_len)

    def run_unit(self, u: int) -> dict:
        m = self.train_on(self.batch, epochs=1, rng=self.ctx.rng("sft", self.index, u),
                          max_rows=sft_rows(self.cfg.batch_size, self.ctx.row_multiple), unit=u,
                          length_buckets=self.cfg.length_buckets)
        n_tok = float(self.batch["loss_mask"].sum())
        return {"loss": m.get("loss/total"), "grad_norm": m.get("grad_norm"), "n_examples": len(self.batch["tokens"]),
                "train_tokens_per_s": n_tok / max(m["time/train"], 1e-9), **step_stats(m), **router_metrics(m)}
