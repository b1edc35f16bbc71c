"""PPO with a value head on the policy, GAE, and the KL to the reference in the per-token reward.

    stage("ppo", "ppo", iterations=60, kl_coef=0.05, kl_adaptive=True, kl_target=0.01, gamma=1.0, lam=0.95)

Token rewards: the outcome reward on the last response token, minus kl_coef * k1(behaviour, reference)
on every response token (kl_place "reward", the default, with the unbiased k1 estimator as in the
reference implementations), plus step rewards at step ends when `step_rewards` is on. Advantages come
from GAE over the value head's estimates at sampling time (rl.advantages.gae) and are whitened over the
batch; the value head is trained with a clipped value loss.
"""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from rl import advantages as advm
from rl.config_fields import boolean, choice, field
from rl.stages.policy_gradient import PolicyGradientRun, RLConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig(RLConfig):
    KIND = "ppo"

    kind: str = field("ppo", "stage kind")
    kl_kind: str = field("k1", "KL estimator: k1 | k2 | k3 (k1 only in the reward)", choice("k1", "k2", "k3"))
    kl_place: str = field("reward", "where the KL goes: loss (GRPO style) | reward (PPO style, per-token penalty)",
                          choice("loss", "reward"))
    filter_zero_variance: bool = field(False, "GRPO only (PPO's GAE advantages are not zero when a group's rewards "
                                              "are equal): must stay False", boolean)

    def cross_checks(self):
        yield from super().cross_checks()
        if self.process_grpo:
            yield "process_grpo", "needs kind grpo"
        if self.filter_zero_variance:
            yield "filter_zero_variance", ("is a GRPO setting: PPO trains every row (its GAE advantages against the "
                                           "value head are not zero when a group's rewards are equal)")
        if self.advantage != "grpo":
            yield "advantage", f"is a GRPO setting; PPO uses GAE, got {self.advantage!r}"


class PPORun(PolicyGradientRun):
    def advantages(self, a, texts, scores, rewards, coef, kl_tok):
        s = self.cfg
        T = a["tokens"].shape[1]
        mask = a["loss_mask"].astype(np.float32)
        last = np.clip(a["resp_start"] + a["lengths"] - 1, 0, T - 1)
        tr = np.zeros((len(rewards), T), np.float32)
        tr[np.arange(len(rewards)), last] = rewards
        if kl_tok is not None and s.kl_place == "reward":
            tr = tr - coef * kl_tok * mask
        if s.step_rewards:
            sc, pos, msk = self.step_scores(a, texts)
            tr = tr + s.step_reward_weight * np.asarray(advm.place_step_rewards(sc - 0.5, pos, T, msk))
        adv, ret = advm.gae(jnp.asarray(tr), jnp.asarray(a["old_values"]), jnp.asarray(mask), s.gamma, s.lam)
        adv = np.asarray(advm.whiten(adv, jnp.asarray(mask)))
        extra = {"advantages": adv * mask, "returns": np.asarray(ret) * mask, "old_values": a["old_values"]}
        return extra, np.ones(len(rewards), bool)
