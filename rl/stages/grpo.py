"""GRPO: group-relative advantages, no critic (DeepSeekMath), with the DAPO / Dr. GRPO switches.

    stage("grpo", "grpo", iterations=180, n_prompts=32, samples=8, clip_high=0.28, kl_coef=0.02)

Advantages per group of K answers to one problem (rl.advantages: grpo, dr_grpo when scale_by_std is off,
rloo, reinforce_pp), broadcast to the response tokens. `step_rewards` adds +-0.5 per exactly checked step (weight
step_reward_weight) to every token before the step's end; `process_grpo` replaces the outcome advantage by
normalised step scores (DeepSeekMath's process supervision), the answer line being the last step, scored by
the verifier. Groups whose rewards are all equal carry no signal (filter_zero_variance): "off" trains on them,
"drop" trains on the rest (the batch shrinks), "refill" is DAPO's dynamic sampling: the iteration draws more groups
until n_prompts carry variance or max_refill_rounds is reached (rl/stages/iteration.py, refill).
The iteration itself is rl/stages/iteration.py; this module is GRPO's config and advantage function.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from rl import advantages as advm
from rl.curriculum import CurriculumConfig
from rl.kl_control import KLConfig
from rl.losses import LossConfig
from rl.offpolicy import OffPolicyConfig
from rl.stages import algorithms, iteration
from rl.stages.common import Flat, StageInfo, section
from rl.tool_rollout import ToolsConfig
from rl.train_loop import LoopConfig
from schema import boolean, choice, field, integer

ADVANTAGES = ("grpo", "rloo", "reinforce_pp")  # rl.advantages.ESTIMATORS by config name (grpo: dr_grpo unscaled)
ZERO_VARIANCE = ("off", "drop", "refill")  # filter_zero_variance
# max_refill_rounds' default: DAPO's recipe (verl, recipe/dapo) samples 3x the training prompts per generation batch
# (gen_prompt_bsz = 3 x train_prompt_bsz) and stops after max_num_gen_batches = 10 of them; here a round draws
# n_prompts problems, so 3 rounds bound an update's sampling at 4x a full batch's (docs/training.md)
MAX_REFILL_ROUNDS = 3


def zero_variance_mode(v):
    """filter_zero_variance in today's spelling: True / False (what configs wrote before "refill") -> "drop" / "off";
    any other value unchanged (the field's check judges it)."""
    return ("drop" if v else "off") if isinstance(v, bool) else v


def advantage_check(v) -> str | None:
    """One of ADVANTAGES; an algorithm's name (dr_grpo, dapo, ...) gets the field that takes it."""
    msg = choice(*ADVANTAGES)(v)
    if msg and v in algorithms.ALGORITHMS:
        msg += (f"; {v!r} is an algorithm, not an advantage estimator: set algorithm={v!r} instead (it sets "
                f"{algorithms.settings(v)})")
    return msg


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig(Flat):
    KIND = "grpo"
    UNIT_FIELD = "iterations"
    # PPO's value-head / GAE keys, which every GRPO entry of a config.json written before they moved to PPOConfig
    # holds, at their old defaults; GRPO never read them, so any other value (once silently ignored) is refused
    # compat: grpo_ppo_keys
    LEGACY = {"gamma": 1.0, "lam": 0.95, "value_coef": 0.5, "value_clip": 0.2}
    # compat: zero_variance_bool
    SPELLINGS = {"filter_zero_variance": zero_variance_mode}  # True / False of older configs: "drop" / "off"

    stage: StageInfo = section(StageInfo, "name and problems")
    loop: LoopConfig = section(LoopConfig, "learning-rate schedule and optimizer")
    rl: iteration.IterationConfig = section(iteration.IterationConfig, "sampling, update, reward terms")
    loss: LossConfig = section(LossConfig, "the loss", keys=iteration.LOSS_KEYS,
                               factory=lambda: LossConfig(mode="grpo", kl_in_loss=False))
    kl: KLConfig = section(KLConfig, "the KL to the reference policy")
    offpolicy: OffPolicyConfig = section(OffPolicyConfig, "off-policy correction")
    curriculum: CurriculumConfig = section(CurriculumConfig, "difficulty-stratified sampling", nested=True)
    tools: ToolsConfig = section(ToolsConfig, "tool calls during rollouts (rl/tool_rollout.py)", nested=True)
    advantage: str = field("grpo", "grpo (group mean/std) | rloo (leave-one-out) | reinforce_pp (rewards whitened "
                                   "over the batch, no group baseline)", advantage_check)
    scale_by_std: bool = field(True, "divide by the group std (False = Dr. GRPO); advantage grpo only (set False "
                                     "with rloo and reinforce_pp)", boolean)
    filter_zero_variance: str = field("drop", "groups whose rewards are all equal (zero advantage): off (trained on) | "
                                              "drop (left out: the batch shrinks) | refill (DAPO's dynamic sampling: "
                                              "more groups drawn until n_prompts carry variance, at most "
                                              "max_refill_rounds rounds); true / false read as drop / off",
                                      choice(*ZERO_VARIANCE))
    max_refill_rounds: int = field(MAX_REFILL_ROUNDS, "refill: rounds of n_prompts more problems an iteration may draw "
                                                      "after its first batch (DAPO's recipe: up to 10 generation "
                                                      "batches of 3x the training prompts)", integer(1, 1000))
    process_grpo: bool = field(False, "process-supervised GRPO: advantages from normalised step rewards, the answer "
                                      "line being the last step, scored by the verifier", boolean)

    @property
    def refill_rounds(self) -> int:
        """Rounds an iteration may draw after its first batch: max_refill_rounds with "refill", else 0."""
        return self.max_refill_rounds if self.filter_zero_variance == "refill" else 0

    def cross_checks(self):
        yield from iteration.cross_checks(self)
        if self.process_grpo and self.rl.step_rewards:
            yield "process_grpo", "and step_rewards are alternatives; set only one"
        if any(k < 2 for k in iteration.group_sizes(self)):
            yield "samples", ("must be >= 2 for GRPO (group-relative advantages need a group), got "
                              f"{iteration.group_sizes(self)}")
        if self.advantage != "grpo" and self.scale_by_std:
            yield "scale_by_std", f"divides GRPO's advantages by the group std; {self.advantage} has no std " \
                                  f"scaling: set scale_by_std=False with advantage {self.advantage}"
        if self.kl.kl_place == "reward":
            yield "kl_place", "'reward' needs kind ppo (GRPO's sequence advantages have no per-token reward)"
        if self.filter_zero_variance == "refill" and self.curriculum.enabled:
            yield "filter_zero_variance", "'refill' draws its extra problems uniformly, the curriculum by difficulty " \
                                          "bucket: turn one of them off (drop keeps the curriculum)"


# -- what the run's planners ask of the kind (rl.stages.Kind; the rest is the iteration's) ----------------------
def zero_variance_draws(cfg: GRPOConfig, kept_share: float) -> tuple[float, float]:
    """(batches drawn, share of a batch's groups trained) per iteration when `kept_share` of a batch's groups carry
    reward variance: "drop" one draw and kept_share of it; "refill" the draws kept_share needs to fill a batch (at
    most 1 + max_refill_rounds) and a full batch; "off" one draw, all of it."""
    if cfg.filter_zero_variance == "drop":
        return 1.0, kept_share
    if cfg.filter_zero_variance == "refill":
        return float(min(math.ceil(1.0 / kept_share), 1 + cfg.max_refill_rounds)), 1.0
    return 1.0, 1.0


def seconds(cfg: GRPOConfig, run, price) -> dict:
    """Seconds of one iteration by part (iteration.seconds: no value head, the draws of its zero-variance filter at
    rl/time_estimate.py's expected share of groups with variance, price.kept_share)."""
    return iteration.seconds(cfg, run, price, value_head=False, draws=zero_variance_draws(cfg, price.kept_share))


def warnings(cfg: GRPOConfig) -> list[str]:
    """A GRPO stage's warnings: the RL ones, Dr. GRPO half set, a refill cap without the refill."""
    return [*iteration.warnings(cfg), *dr_grpo_warnings(cfg), *refill_warnings(cfg)]


def dr_grpo_warnings(cfg: GRPOConfig) -> list[str]:
    """scale_by_std=False without Dr. GRPO's constant normaliser (agg), or the normaliser with the std scaling kept."""
    if cfg.advantage != "grpo":
        return []
    norm, agg = "seq-mean-token-sum-norm", cfg.loss.agg
    if not cfg.scale_by_std and agg != norm:
        return [f"scale_by_std=False is Dr. GRPO's advantage, but agg={agg!r} still divides by each response's "
                f"or the batch's token count, the length bias Dr. GRPO removes with a constant normaliser "
                f"(agg={norm!r}); algorithm='dr_grpo' sets both"]
    if cfg.scale_by_std and agg == norm:
        return [f"agg={norm!r} is Dr. GRPO's constant normaliser, chosen for scale_by_std=False; with the std "
                "scaling kept the run is half Dr. GRPO: algorithm='dr_grpo' sets both (or agg='token-mean')"]
    return []


def refill_warnings(cfg: GRPOConfig) -> list[str]:
    """max_refill_rounds away from its default while filter_zero_variance is not "refill"."""
    rounds = cfg.max_refill_rounds
    if rounds == MAX_REFILL_ROUNDS or cfg.filter_zero_variance == "refill":
        return []
    return [f"max_refill_rounds={rounds} was chosen for filter_zero_variance='refill' (DAPO's dynamic sampling); "
            f"this stage has {cfg.filter_zero_variance!r}, which draws one batch per iteration"]


def grpo_token_advantages(cfg: GRPOConfig, rewards: np.ndarray, ks, loss_mask: np.ndarray, steps=None):
    """Token advantages [N, T] of a GRPO batch and the rows to train (groups with signal).

    rewards [N] with each group's K rows contiguous (group sizes `ks`); `steps` = (scores, end positions, mask)
    of the exactly checked steps (rl.advantages.step_scores), needed for step_rewards and
    process_grpo (where the answer line must be among them as the last step).
    """
    ks = np.asarray(ks)
    N, T = loss_mask.shape
    name = cfg.advantage if cfg.advantage != "grpo" else ("grpo" if cfg.scale_by_std else "dr_grpo")
    if cfg.process_grpo:
        sc, pos, msk = steps
        adv = advm.grouped(lambda x, k, p, m: advm.process_grpo(x, p, m, k, T), sc, ks, pos, msk)
    else:
        seq_adv = advm.grouped(advm.get_estimator(name), rewards.astype(np.float32), ks)
        adv = np.broadcast_to(seq_adv[:, None], (N, T)).astype(np.float32)
        if cfg.rl.step_rewards:
            sc, pos, msk = steps
            placed = np.asarray(advm.place_step_rewards(sc - 0.5, pos, T, msk))  # +-0.5 for a right / wrong step
            adv = adv + cfg.rl.step_reward_weight * np.flip(np.cumsum(np.flip(placed, 1), 1), 1)
    adv = adv * loss_mask
    keep = np.ones(N, bool)
    if cfg.filter_zero_variance != "off":
        for start, n, k in advm.group_runs(ks):
            for g in range(start, start + n, k):
                rows = slice(g, g + k)
                # with step scores a group can carry signal when its outcomes do not
                keep[rows] = np.any(adv[rows] != 0) if cfg.process_grpo else rewards[rows].max() != rewards[rows].min()
    return adv, keep


def advantages(st: iteration.State, a: dict, texts, rewards, coef, kl_tok):
    """GRPO's advantage function for the iteration: ({"advantages": [N, T]}, rows to keep). Its KL is in the
    loss, so coef and kl_tok are unused."""
    del coef, kl_tok
    s = st.base.cfg
    steps = None
    if s.process_grpo:  # the answer line is the last step, scored by the reward
        steps = iteration.batch_step_scores(st, a, texts, rewards)
    elif s.rl.step_rewards:
        steps = iteration.batch_step_scores(st, a, texts)
    adv, keep = grpo_token_advantages(s, rewards, a["ks"], a["loss_mask"].astype(np.float32), steps)
    return {"advantages": adv}, keep


def init(ctx, index: int, cfg: GRPOConfig, params) -> iteration.State:
    """A GRPO stage's state: the iteration with GRPO's advantages, no value head, its refill rounds."""
    return iteration.init(ctx, index, cfg, params, advantages=advantages, value_head=False,
                          refill_rounds=cfg.refill_rounds)


unit = iteration.unit
