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
        if self.kl_place == "reward":
            yield "kl_place", "'reward' needs kind ppo (GRPO's sequence advantages have no per-token reward)"


class GRPORun(PolicyGradientRun):
    def advantages(self, a, texts, scores, rewards, coef, kl_tok):
        """Token advantages [N, T] and the rows to train (groups with signal)."""
        del coef, kl_tok  # GRPO's KL is in the loss
        s = self.cfg
        ks, T = a["ks"], a["tokens"].shape[1]
        name = "rloo" if s.advantage == "rloo" else ("grpo" if s.scale_by_std else "dr_grpo")
        seq_adv = advm.grouped(advm.get_estimator(name), rewards.astype(np.float32), ks)
        if s.process_grpo:
            sc, pos, msk = self.step_scores(a, texts, scores)
            adv = advm.grouped(lambda x, k, p, m: advm.process_grpo(x, p, m, k, T), sc, ks, pos, msk)
        else:
            adv = np.broadcast_to(seq_adv[:, None], (len(rewards), T)).astype(np.float32)
            if s.step_rewards:
                sc, pos, msk = self.step_scores(a, texts)
                placed = np.asarray(advm.place_step_rewards(sc - 0.5, pos, T, msk))  # +-0.5 for a right / wrong step
                adv = adv + s.step_reward_weight * np.flip(np.cumsum(np.flip(placed, 1), 1), 1)
        adv = adv * a["loss_mask"]
        keep = np.ones(len(rewards), bool)
        if s.filter_zero_variance:
            for start, n, k in advm.group_runs(ks):
                for g in range(start, start + n, k):
                    rows = slice(g, g + k)
                    # with step scores a group can carry signal when its outcomes do not
                    signal = np.any(adv[rows] != 0) if s.process_grpo else rewards[rows].max() != rewards[rows].min()
                    keep[rows] = signal
        return {"advantages": adv}, keep
