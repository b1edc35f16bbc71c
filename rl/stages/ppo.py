"""PPO with a value head on the policy, GAE, and the KL to the reference in the per-token reward.

    stage("ppo", "ppo", iterations=60, kl_coef=0.05, kl_adaptive=True, kl_target=0.01, gamma=1.0, lam=0.95)

Token rewards: the outcome reward on the last response token, minus kl_coef * k1(behaviour, reference)
on every response token (kl_place "reward", the default, with the unbiased k1 estimator as in the
reference implementations), plus step rewards at step ends when `step_rewards` is on. Advantages come
from GAE over the value head's estimates at sampling time (rl.advantages.gae) and are whitened over the
batch; the value head is trained with a clipped value loss. The iteration itself is rl/stages/iteration.py; this
module is PPO's config (its value-head and GAE fields) and advantage function.
"""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from rl import advantages as advm
from rl.curriculum import CurriculumConfig
from rl.kl_control import KLConfig
from rl.losses import LossConfig
from rl.offpolicy import OffPolicyConfig
from rl.stages import iteration
from rl.stages.common import Flat, StageInfo, section
from rl.tool_rollout import ToolsConfig
from rl.train_loop import LoopConfig
from schema import field, num


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig(Flat):
    KIND = "ppo"
    UNIT_FIELD = "iterations"
    # GRPO's keys, which every PPO entry of a config.json written before they moved to GRPOConfig holds (at the one
    # value PPO accepted; scale_by_std at its old default: PPO never read it, so False, once silently ignored, is
    # refused: PPO whitens its GAE advantages over the batch)
    # compat: ppo_grpo_keys
    LEGACY = {"advantage": "grpo", "filter_zero_variance": False, "process_grpo": False, "scale_by_std": True}

    stage: StageInfo = section(StageInfo, "name and problems")
    loop: LoopConfig = section(LoopConfig, "learning-rate schedule and optimizer")
    rl: iteration.IterationConfig = section(iteration.IterationConfig, "sampling, update, reward terms")
    loss: LossConfig = section(LossConfig, "the loss (with the value head's)",
                               keys=(*iteration.LOSS_KEYS, "value_coef", "value_clip"),
                               factory=lambda: LossConfig(mode="ppo", kl_kind="k1", kl_in_loss=False))
    kl: KLConfig = section(KLConfig, "the KL to the reference policy", factory=lambda: KLConfig(kl_place="reward"))
    offpolicy: OffPolicyConfig = section(OffPolicyConfig, "off-policy correction")
    curriculum: CurriculumConfig = section(CurriculumConfig, "difficulty-stratified sampling", nested=True)
    tools: ToolsConfig = section(ToolsConfig, "tool calls during rollouts (rl/tool_rollout.py)", nested=True)
    gamma: float = field(1.0, "discount", num(0.0, 1.0))
    lam: float = field(0.95, "GAE lambda", num(0.0, 1.0))

    def cross_checks(self):
        """The RL rules between sections (iteration.cross_checks); PPO adds none."""
        yield from iteration.cross_checks(self)


def advantages(st: iteration.State, a: dict, texts, rewards, coef, kl_tok):
    """PPO's advantage function for the iteration: token rewards (outcome at the last token, - coef x k1 with
    kl_place reward, step rewards) -> GAE against the sampled values -> whitened; every row kept."""
    s = st.base.cfg
    T = a["tokens"].shape[1]
    mask = a["loss_mask"].astype(np.float32)
    last = np.clip(a["resp_start"] + a["lengths"] - 1, 0, T - 1)
    if "tool_turns" in a:  # a row may end with tool ids: the outcome goes on its last policy token
        last = np.where(mask.any(1), T - 1 - np.argmax(mask[:, ::-1] > 0, axis=1), last)
    tr = np.zeros((len(rewards), T), np.float32)
    tr[np.arange(len(rewards)), last] = rewards
    if kl_tok is not None and s.kl.kl_place == "reward":
        tr = tr - coef * kl_tok * mask
    if s.rl.step_rewards:
        sc, pos, msk = iteration.batch_step_scores(st, a, texts)
        tr = tr + s.rl.step_reward_weight * np.asarray(advm.place_step_rewards(sc - 0.5, pos, T, msk))
    adv, ret = advm.gae(jnp.asarray(tr), jnp.asarray(a["old_values"]), jnp.asarray(mask), s.gamma, s.lam)
    adv = np.asarray(advm.whiten(adv, jnp.asarray(mask)))
    extra = {"advantages": adv * mask, "returns": np.asarray(ret) * mask, "old_values": a["old_values"]}
    return extra, np.ones(len(rewards), bool)


init = functools.partial(iteration.init, advantages=advantages, value_head=True)
unit = iteration.unit
seconds = functools.partial(iteration.seconds, value_head=True)  # its value pass checks the whole batch
