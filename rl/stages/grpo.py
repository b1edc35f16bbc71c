"""GRPO: group-relative advantages, no critic (DeepSeekMath), with the DAPO / Dr. GRPO switches.

    stage("grpo", "grpo", iterations=180, n_prompts=32, samples=8, clip_high=0.28, kl_coef=0.02)

Advantages per group of K answers to one problem (rl.advantages: grpo, dr_grpo when scale_by_std is off,
rloo), broadcast to the response tokens. `step_rewards` adds +-0.5 per exactly checked step (weight
step_reward_weight) to every token before the step's end; `process_grpo` replaces the outcome advantage by
normalised step scores (DeepSeekMath's process supervision), the answer line being the last step, scored by
the verifier. Groups whose rewards are all equal carry no signal and are dropped (filter_zero_variance).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from rl import advantages as advm
from rl.config_fields import field
from rl.stages.policy_gradient import PolicyGradientRun, RLConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig(RLConfig):
    KIND = "grpo"

    kind: str = field("grpo", "stage kind")

    def cross_checks(self):
        yield from super().cross_checks()
        if any(k < 2 for k in self.group_sizes()):
            yield "samples", f"must be >= 2 for GRPO (group-relative advantages need a group), got {self.group_sizes()}"
        if self.advantage == "rloo" and self.scale_by_std:
            yield "scale_by_std", "divides GRPO's advantages by the group std; RLOO's leave-one-out baseline has no " \
                                  "std scaling: set scale_by_std=False with advantage rloo"
        if self.kl_place == "reward":
            yield "kl_place", "'reward' needs kind ppo (GRPO's sequence advantages have no per-token reward)"


def grpo_token_advantages(cfg: GRPOConfig, rewards: np.ndarray, ks, loss_mask: np.ndarray, steps=None):
    """Token advantages [N, T] of a GRPO batch and the rows to train (groups with signal).

    rewards [N] with each group's K rows contiguous (group sizes `ks`); `steps` = (scores, end positions, mask)
    of the exactly checked steps (rl.stages.policy_gradient.step_scores), needed for step_rewards and
    process_grpo (where the answer line must be among them as the last step).
    """
    ks = np.asarray(ks)
    N, T = loss_mask.shape
    name = "rloo" if cfg.advantage == "rloo" else ("grpo" if cfg.scale_by_std else "dr_grpo")
    if cfg.process_grpo:
        sc, pos, msk = steps
        adv = advm.grouped(lambda x, k, p, m: advm.process_grpo(x, p, m, k, T), sc, ks, pos, msk)
    else:
        seq_adv = advm.grouped(advm.get_estimator(name), rewards.astype(np.float32), ks)
        adv = np.broadcast_to(seq_adv[:, None], (N, T)).astype(np.float32)
        if cfg.step_rewards:
            sc, pos, msk = steps
            placed = np.asarray(advm.place_step_rewards(sc - 0.5, pos, T, msk))  # +-0.5 for a right / wrong step
            adv = adv + cfg.step_reward_weight * np.flip(np.cumsum(np.flip(placed, 1), 1), 1)
    adv = adv * loss_mask
    keep = np.ones(N, bool)
    if cfg.filter_zero_variance:
        for start, n, k in advm.group_runs(ks):
            for g in range(start, start + n, k):
                rows = slice(g, g + k)
                # with step scores a group can carry signal when its outcomes do not
                keep[rows] = np.any(adv[rows] != 0) if cfg.process_grpo else rewards[rows].max() != rewards[rows].min()
    return adv, keep


class GRPORun(PolicyGradientRun):
    def advantages(self, a, texts, scores, rewards, coef, kl_tok):
        del coef, kl_tok  # GRPO's KL is in the loss
        s = self.cfg
        steps = None
        if s.process_grpo:
            steps = self.step_scores(a, texts, rewards)  # the answer line is the last step, scored by the reward
        elif s.step_rewards:
            steps = self.step_scores(a, texts)
        adv, keep = grpo_token_advantages(s, rewards, a["ks"], a["loss_mask"].astype(np.float32), steps)
        return {"advantages": adv}, keep
