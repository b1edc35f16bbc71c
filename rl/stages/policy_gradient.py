"""What GRPO and PPO share: the RL stage config and the iteration loop (sample -> score -> advantages -> update).

One iteration (a unit):
  curriculum (or uniform) picks problems and K per problem
  -> sampler at the iteration's temperature; its logprobs ARE the behaviour policy (no extra forward)
  -> reward pool scores the texts while the device computes reference logprobs (and PPO values) at the same
     temperature, and, when run.overlap is on and no curriculum waits for this iteration's pass rates, samples
     ahead up to iteration u + max_staleness (bounded staleness; each batch carries its behaviour logprobs, the
     sampler's MoE routes when recorded, and the update count it was sampled at)
  -> advantages (the kind's `advantages` method), zero-variance groups dropped (GRPO)
  -> with an off-policy correction on (tis_cap / mis_* / icepop_*): the trainer's logprobs at the start of the
     update become the ratio's old policy and weight the advantages against the behaviour logprobs (rl/offpolicy.py)
  -> epochs over near-equal minibatches, train-side logprobs at the sampling temperature (replaying the
     sampler's experts with routing_replay); with batch_layout "auto" the minibatches hold whole groups in the
     grouped layout, each prompt computed once for its K answers (rl/grouped_batch.py; the reference and PPO
     value passes too)
  -> the KL controller reads the sampled batch's KL (mean over sequences of the per-token masked mean)

Every iteration logs `mismatch/logp_max_abs` (and `_mean_abs`, `mismatch/kl`): the largest |sampler logprob -
trainer logprob| over the response tokens of the first minibatch-sized chunk of the batch (all rows for PPO, whose
value pass computes them anyway), for the same parameters and temperature. In float32 it is ~1e-6; a change that
breaks the sampler / trainer match shows up here at once (sampler_dtype bfloat16 makes it ~1e-2 on purpose).
docs/training.md ("MoE RL") describes the mismatch fields.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from rewards.combine import PRM_CALIBRATIONS as CALIBRATIONS
from rl import curriculum as cur
from rl import grouped_batch, offpolicy, reward_terms, rollout, schedules
from rl.config_fields import boolean, choice, field, integer, num
from rl.stages.base import StageConfig, StageRun, router_metrics, step_stats

AGG = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLConfig(StageConfig):
    """Fields of GRPO and PPO stages (grpo.py / ppo.py set the kind-specific defaults and rules)."""

    UNIT_FIELD = "iterations"

    iterations: int = field(50, "RL iterations (sample -> score -> update)", integer(1, 10**6))
    n_prompts: int = field(16, "problems per iteration", integer(1, 10**6))
    samples: int = field(8, "answers per problem (GRPO group size K) when the curriculum is off", integer(1, 4096))
    temperature_start: float = field(1.0, "sampling temperature at the first iteration", num(0.0, 10.0, lo_open=True))
    temperature_end: float = field(0.7, "sampling temperature at the last iteration", num(0.0, 10.0, lo_open=True))
    temperature_kind: str = field("linear", "temperature schedule: linear | cosine | constant",
                                  choice("linear", "cosine", "constant"))
    epochs: int = field(1, "passes over each iteration's batch", integer(1, 1000))
    token_budget: int = field(4096, "tokens (rows x padded length) per minibatch; an epoch's rows are split into "
                                    "near-equal minibatches of at most this many rows", integer(1, 10**9))
    advantage: str = field("grpo", "grpo (group mean/std) | rloo (leave-one-out); GRPO kind only", choice("grpo", "rloo"))
    scale_by_std: bool = field(True, "GRPO: divide by the group std (False = Dr. GRPO); advantage grpo only (set "
                                     "False with rloo)", boolean)
    clip_low: float = field(0.2, "PPO ratio clip below 1 - clip_low (cispo: only with cispo_floor)", num(0.0, 0.99))
    clip_high: float = field(0.2, "PPO ratio clip above 1 + clip_high (clip-higher: > clip_low)", num(0.0, 9.99))
    dual_clip: float = field(0.0, "dual-clip constant c > 1 for negative advantages (0 = off)", num(0.0, 100.0))
    agg: str = field("token-mean", "loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum | "
                                   "seq-mean-token-sum-norm (Dr. GRPO: divided by sampling.max_new_tokens)", choice(*AGG))
    kl_kind: str = field("k3", "KL estimator: k1 | k2 | k3 (k1 only in the reward)", choice("k1", "k2", "k3"))
    kl_place: str = field("loss", "where the KL goes: loss (GRPO style) | reward (PPO style, per-token penalty)",
                          choice("loss", "reward"))
    kl_coef: float = field(0.04, "initial / fixed KL coefficient (0 and not adaptive = no reference policy)",
                           num(0.0, 100.0))
    kl_adaptive: bool = field(False, "adaptive KL controller towards kl_target", boolean)
    kl_target: float = field(0.01, "adaptive KL target (per-token KL, mean over sequences)", num(0.0, 100.0, lo_open=True))
    kl_horizon: int = field(10000, "adaptive KL horizon (in samples)", integer(1, 10**9))
    kl_ramp_steps: int = field(0, "ramp the KL coefficient linearly from 0 over N iterations (0 = off)",
                               integer(0, 10**6))
    language_weight: float = field(0.0, "this stage's language-consistency reward: subtracts weight x (1 - share of "
                                        "the expected script in the reasoning), on top of reward.w_language",
                                   num(0.0, 100.0))
    process_weight: float = field(0.0, "this stage's process reward: adds weight x the share of exactly checked steps "
                                       "that hold, on top of reward.w_process (a stage-level term keeps the cold "
                                       "start shared in a sweep over it)", num(0.0, 100.0))
    format_weight: float = field(0.0, "this stage's format reward: adds weight x the format score, on top of "
                                      "reward.w_format", num(0.0, 100.0))
    prm_weight: float = field(0.0, "this stage's PRM reward: adds weight x the response's PRM score, on top of "
                                   "reward.w_prm (needs reward.prm_path; prm/reward.py)", num(0.0, 100.0))
    prm_calibration: str = field("", "the PRM calibration map this stage applies: '' (the file's own) | none | "
                                     "temperature | platt (needs reward.prm_path)", choice("", *CALIBRATIONS))
    entropy_coef: float = field(0.0, "entropy bonus coefficient", num(0.0, 10.0))
    filter_zero_variance: bool = field(True, "drop groups whose rewards are all equal (zero advantage)", boolean)
    step_rewards: bool = field(False, "add step-level rewards (exactly checked arithmetic steps) at step ends", boolean)
    process_grpo: bool = field(False, "process-supervised GRPO: advantages from normalised step rewards, the answer "
                                      "line being the last step, scored by the verifier", boolean)
    step_reward_weight: float = field(0.1, "weight of the step-level rewards", num(0.0, 100.0))
    gamma: float = field(1.0, "PPO: discount", num(0.0, 1.0))
    lam: float = field(0.95, "PPO: GAE lambda", num(0.0, 1.0))
    value_coef: float = field(0.5, "PPO: value loss coefficient", num(0.0, 100.0))
    value_clip: float = field(0.2, "PPO: value clip range (0 = off)", num(0.0, 1e6))
    policy_loss: str = field("ppo", "policy loss (rl.losses.POLICY_LOSSES): ppo (clipped token ratio) | reinforce | "
                                    "gspo (clipped sequence ratio; needs agg seq-mean-token-mean) | cispo (clipped "
                                    "stop-gradient weight min(ratio, 1 + clip_high) x logprob)",
                        choice("ppo", "reinforce", "gspo", "cispo"))
    cispo_floor: bool = field(False, "cispo: also floor the importance weight at 1 - clip_low (False = clipped from "
                                     "above only, as in MiniMax-M1)", boolean)
    # Sampler / trainer mismatch (docs/training.md): routes, precision, off-policy correction, staleness.
    routing_replay: bool = field(False, "routing replay (R3, MoE models): the train step uses the experts the sampler "
                                        "chose for every token, gate weights from the current router", boolean)
    record_routes: bool = field(False, "record the sampler's experts and log router/replay_disagreement without "
                                       "replaying them (implied by routing_replay)", boolean)
    sampler_dtype: str = field("", "compute dtype the sampler runs the policy in ('' = model.dtype), e.g. bfloat16 "
                                   "sampling against float32 training", choice("", "float32", "bfloat16", "float16"))
    tis_cap: float = field(0.0, "truncated importance sampling: each token's policy loss weighted by min(rho, cap), "
                                "rho = trainer / sampler probability at the start of the update (0 = off, else >= 1)",
                           num(0.0, 1e6))
    mis_low: float = field(0.0, "MIS: mask sequences whose ratio is below this (0 = no lower bound)", num(0.0, 1e6))
    mis_high: float = field(0.0, "MIS: mask sequences whose ratio is above this (0 = no upper bound)", num(0.0, 1e6))
    mis_kind: str = field("product", "MIS sequence ratio: product of the token ratios | geometric (their geometric "
                                     "mean)", choice("product", "geometric"))
    icepop_low: float = field(0.0, "IcePop: each token weighted by its ratio rho, and by 0 when rho is below this "
                                    "(0 = no lower bound; not with tis_cap)", num(0.0, 1e6))
    icepop_high: float = field(0.0, "IcePop: each token weighted by its ratio rho, and by 0 when rho is above this "
                                     "(0 = no upper bound; not with tis_cap)", num(0.0, 1e6))
    max_staleness: int = field(1, "bounded staleness: the sampler runs up to k updates ahead (k batches sampled "
                                  "ahead, while rewards are computed; needs run.overlap and no curriculum); 0 = each "
                                  "batch sampled right before its update", integer(0, 64))
    batch_layout: str = field("auto", "update batches: auto (grouped: each prompt computed once for its K answers, "
                                      "minibatches of whole groups; flat when group sizes differ, a group exceeds "
                                      "token_budget or routes are recorded) | flat (prompt + answer in every row)",
                              choice("auto", "flat"))
    curriculum: cur.CurriculumConfig = dataclasses.field(default_factory=cur.CurriculumConfig,
                                                         metadata={"doc": "difficulty-stratified sampling"})

    @property
    def uses_reference(self) -> bool:
        return self.kl_coef > 0 or self.kl_adaptive

    @property
    def corrects_off_policy(self) -> bool:
        """Any off-policy correction on: the update recomputes the trainer's logprobs at its start."""
        return self.tis_cap > 0 or self.mis_low > 0 or self.mis_high > 0 or self.icepop_low > 0 or self.icepop_high > 0

    @property
    def records_routes(self) -> bool:
        return self.routing_replay or self.record_routes

    def reward_checks(self, reward: dict):
        """Rules that need the reward section (rl.config_validation.validate)."""
        for fld in ("prm_weight", "prm_calibration"):
            if getattr(self, fld) and not reward.get("prm_path"):
                yield fld, "needs reward.prm_path (a PRM file from experiments/train_prm.py)"

    def model_checks(self, model: dict):
        """Rules that need the model section (rl.config_validation.validate)."""
        moe = model.get("n_experts", 0) > 0 and model.get("moe_every", 0) > 0
        for fld in ("routing_replay", "record_routes"):
            if getattr(self, fld) and not moe:
                yield fld, "needs an MoE model (model.n_experts > 0 and model.moe_every > 0)"

    def group_sizes(self) -> list[int]:
        return list(self.curriculum.samples) if self.curriculum.enabled else [self.samples]

    def cross_checks(self):
        yield from super().cross_checks()
        if self.dual_clip != 0 and self.dual_clip <= 1:
            yield "dual_clip", f"must be 0 (off) or > 1, got {self.dual_clip}"
        if self.process_grpo and self.step_rewards:
            yield "process_grpo", "and step_rewards are alternatives; set only one"
        if self.policy_loss == "gspo" and self.agg != "seq-mean-token-mean":
            yield "agg", f"must be seq-mean-token-mean for policy_loss gspo (its mean over sequences), got {self.agg!r}"
        if self.policy_loss != "ppo" and self.dual_clip:
            yield "dual_clip", f"applies to policy_loss ppo only, got {self.dual_clip} with {self.policy_loss}"
        if self.cispo_floor and self.policy_loss != "cispo":
            yield "cispo_floor", f"applies to policy_loss cispo only, got {self.policy_loss!r}"
        if self.policy_loss == "cispo" and not self.cispo_floor and self.clip_low != _default(self, "clip_low"):
            yield "clip_low", (f"has no effect with policy_loss cispo (its weight is clipped from above only), got "
                               f"{self.clip_low}; set cispo_floor=True to floor the weight at 1 - clip_low")
        if 0 < self.tis_cap < 1:
            yield "tis_cap", f"must be 0 (off) or >= 1, got {self.tis_cap}"
        for name in ("mis", "icepop"):
            lo, hi = getattr(self, f"{name}_low"), getattr(self, f"{name}_high")
            if lo >= 1:
                yield f"{name}_low", f"must be < 1 (0 = no lower bound), got {lo}"
            if 0 < hi <= 1:
                yield f"{name}_high", f"must be > 1 (0 = no upper bound), got {hi}"
        if self.tis_cap and (self.icepop_low or self.icepop_high):
            yield "icepop_high" if self.icepop_high else "icepop_low", \
                "IcePop weights each token by its ratio rho already; set it or tis_cap, not both"
        try:
            self.components(max_new_tokens=1)
        except ValueError as e:  # the loss's own rules (e.g. k1 in the loss), named by the stage field
            msg = str(e)
            fld = next((f for f in ("kl_kind", "clip_low", "clip_high", "value_clip", "agg") if f"LossConfig.{f}" in msg),
                       "kl_kind")
            yield fld, msg.split(f"LossConfig.{fld} ", 1)[-1]

    def components(self, max_new_tokens: int):
        from rl.kl_control import AdaptiveKL, FixedKL
        from rl.train_step import LossConfig

        loss = LossConfig(
            mode=self.kind, clip_high=float(self.clip_high),
            clip_low=None if self.policy_loss == "cispo" and not self.cispo_floor else float(self.clip_low),
            dual_clip=float(self.dual_clip) if self.dual_clip else None, agg=self.agg,
            max_len_norm=int(max_new_tokens) if self.agg == "seq-mean-token-sum-norm" else None,
            kl_kind=self.kl_kind, kl_in_loss=self.kl_place == "loss" and self.uses_reference,
            entropy_coef=float(self.entropy_coef), value_coef=float(self.value_coef),
            value_clip=float(self.value_clip) or None, policy_loss=self.policy_loss,
            routing_replay=bool(self.routing_replay))
        ctl = None
        if self.kl_adaptive:
            ctl = AdaptiveKL(init_coef=float(self.kl_coef), target=float(self.kl_target), horizon=float(self.kl_horizon),
                             ramp_steps=int(self.kl_ramp_steps))
        elif self.kl_coef > 0:
            ctl = FixedKL(float(self.kl_coef), ramp_steps=int(self.kl_ramp_steps))
        return loss, self.optim_config(), ctl


def _default(cfg, name: str):
    """The declared default of a config field (a field left at it was not asked for)."""
    return type(cfg).__dataclass_fields__[name].default


class PolicyGradientRun(StageRun):
    """The RL iteration loop; GRPORun / PPORun provide `advantages(a, texts, scores, rewards, coef)`."""

    def __init__(self, ctx, index, cfg: RLConfig, params):
        super().__init__(ctx, index, cfg, params)
        self.max_rows = rollout.rows_for_budget(cfg.token_budget, ctx.seq_len, ctx.row_multiple)
        self.ref_params = None
        if cfg.uses_reference:
            self.ref_params = jax.tree.map(jnp.copy, self.policy_params())
        self.kl_state = self.kl_ctl.init() if self.kl_ctl is not None else None
        self.cur_state = cur.init_state(len(self.problems)) if cfg.curriculum.enabled else None
        self.prm = reward_terms.scorer(ctx, cfg, f"stages[{index}]")  # reward.prm_path: the PRM wing's, None when off
        self.prm_out = None  # the current batch's PRM scores (process reward and step scores share one forward)
        self.pending: list[dict] = []  # batches sampled ahead, oldest first (bounded staleness); checkpointed
        self.trained_units = 0  # updates so far: a batch's "version" is this count when it was sampled
        self.sample_cfg = ctx.model_cfg.replace(dtype=cfg.sampler_dtype) if cfg.sampler_dtype else ctx.model_cfg

    # -- checkpoint ---------------------------------------------------------------------------
    def tree(self) -> dict:
        t = super().tree()
        if self.ref_params is not None:
            t["ref_params"] = self.ref_params
        if self.kl_state is not None:
            t["kl_state"] = self.kl_state
        if self.cur_state is not None:
            t["curriculum"] = self.cur_state
        if self.pending:
            t["pending"] = rollout.pending_tree(self.pending)
        return t

    def meta(self) -> dict:
        m = {**super().meta(), "trained_units": self.trained_units}
        if self.pending:
            m["pending"] = rollout.pending_meta(self.pending)
        return m

    def template(self, meta: dict) -> dict:
        t = {k: v for k, v in self.tree().items() if k != "pending"}
        if meta.get("pending"):
            t["pending"] = rollout.pending_template(meta["pending"])
        return t

    def load(self, tree: dict, meta: dict) -> None:
        super().load(tree, meta)
        self.trained_units = int(meta.get("trained_units", 0))
        if "ref_params" in tree:
            self.ref_params = jax.tree.map(jnp.asarray, tree["ref_params"])
        if "kl_state" in tree:
            self.kl_state = {k: jnp.asarray(v, jnp.float32) for k, v in tree["kl_state"].items()}
        if "curriculum" in tree:
            self.cur_state = {k: np.asarray(v) for k, v in tree["curriculum"].items()}
        self.pending = rollout.pending_load(tree.get("pending"), meta.get("pending"),
                                            default_version=max(self.trained_units - 1, 0))

    # -- producing a batch --------------------------------------------------------------------
    def _pick(self, u: int):
        ctx, s = self.ctx, self.cfg
        if self.cur_state is not None:
            if cur.due_refresh(self.cur_state, u, s.curriculum.refresh_every):
                self.cur_state = cur.refresh(self.cur_state, u, s.curriculum)
            seed = int(ctx.rng("rl", self.index).integers(2**31))
            return cur.pick(self.cur_state, s.curriculum, s.n_prompts, seed, u)
        ids = ctx.rng("rl", self.index, u).choice(len(self.problems), size=s.n_prompts, replace=False)
        return np.sort(ids), np.full((len(ids),), s.samples, np.int64)

    def temperature(self, u: int) -> float:
        s = self.cfg
        return schedules.temperature_at(u, s.iterations, s.temperature_start, s.temperature_end, s.temperature_kind)

    def _produce(self, u: int) -> dict:
        """Sample iteration u's batch with the current params; reference logprobs (and PPO values) at the
        sampling temperature; the sampler / trainer logprob match measured on the same params."""
        ctx = self.ctx
        ids, ks = self._pick(u)
        temp = self.temperature(u)
        prompts = [ctx.prompt(self.problems[i]) for i in ids]
        params = self.policy_params()
        t0 = time.time()
        smpl = ctx.sample(params, prompts, ks, ctx.key("rl", self.index, u), temperature=temp,
                          model_cfg=self.sample_cfg, return_routes=self.cfg.records_routes)
        t_sample = time.time() - t0
        b = rollout.build_batch([ctx.tok.encode(p, add_bos=True) for p in prompts], smpl, ctx.seq_len,
                                pad_id=ctx.tok.PAD)
        b["temperature"] = np.full((len(smpl.texts),), temp, np.float32)
        t0 = time.time()
        rows, mask = self.max_rows, b["loss_mask"].astype(np.float32)
        layout = self.grouped_layout(ks)
        if self.kind_is_ppo:
            lp, values = self._chunked(ctx.value_fn, self.state["params"], b, layout)
            b["old_values"] = values * mask
            checked = slice(None)
        else:
            checked = slice(0, rows)
            part = {k: v[checked] for k, v in b.items()}
            lp = self._chunked(ctx.logprob_fn, params, part, None)  # flat: one minibatch's rows are enough
        _, mm = offpolicy.correction(lp, b["sample_logp"][checked], mask[checked])  # same params: numerics only
        if self.ref_params is not None:  # no routes: the reference policy routes its own way
            b["ref_logp"] = self._chunked(ctx.logprob_fn, self.ref_params, b, layout, routes=False) * mask
        t_logp = time.time() - t0
        arrays = {**b, "ids": ids.astype(np.int64), "ks": ks.astype(np.int64), "lengths": smpl.lengths,
                  "prompt_index": smpl.prompt_index.astype(np.int64),
                  "stats": np.array([t_sample, t_logp, float(smpl.lengths.sum()), mm["offpolicy/log_ratio_abs_max"],
                                     mm["offpolicy/log_ratio_abs_mean"], mm["offpolicy/kl"]], np.float64)}
        return {"arrays": arrays, "unit": u, "temperature": temp, "version": self.trained_units}

    def _logp_args(self, b: dict) -> tuple:
        """Per-row arguments of the trainer's logprob functions for batch `b`: temperatures, and the sampler's
        routes when the train step replays them (the trainer's logprobs are then those it trains on)."""
        return (b["temperature"], b["routes"]) if self.cfg.routing_replay else (b["temperature"],)

    @property
    def kind_is_ppo(self) -> bool:
        return self.cfg.kind == "ppo"

    def _texts(self, a: dict) -> list[str]:
        toks, start, lens = a["tokens"], a["resp_start"], a["lengths"]
        return [self.ctx.tok.decode(toks[r, start[r] : start[r] + lens[r]]) for r in range(toks.shape[0])]

    # -- one iteration ------------------------------------------------------------------------
    def lookahead(self) -> int:
        """Batches sampled ahead of the update: max_staleness, or 0 without run.overlap or with a curriculum (whose
        next pick must see this iteration's pass rates)."""
        return self.cfg.max_staleness if self.ctx.cfg["run"]["overlap"] and self.cur_state is None else 0

    def run_unit(self, u: int) -> dict:
        ctx = self.ctx
        self.pending = [b for b in self.pending if b["unit"] >= u]
        if not self.pending or self.pending[0]["unit"] != u:
            self.pending = [self._produce(u)]
        cur_b = self.pending.pop(0)
        a = cur_b["arrays"]
        texts = self._texts(a)
        fut = ctx.scorer.submit(texts, [self.problems[int(a["ids"][p])] for p in a["prompt_index"]], a["lengths"])
        # Producer / consumer: while the reward pool scores this batch, sample ahead up to iteration u + k with the
        # current params (batch u + k then trains k updates later: bounded staleness k).
        ahead = range(u + 1 + len(self.pending), min(u + self.lookahead(), self.units - 1) + 1)
        t0 = time.time()
        for v in ahead:
            self.pending.append(self._produce(v))
        t_overlap = time.time() - t0 if len(ahead) else 0.0
        t0 = time.time()
        scores = ctx.scorer.result(fut)
        t_wait = time.time() - t0
        staleness = self.trained_units - cur_b["version"]
        m = self._update(a, texts, scores, cur_b["temperature"], u)
        st = a["stats"]
        m.update({"time/sample": float(st[0]), "time/logprobs": float(st[1]), "time/score_wait": t_wait,
                  "time/overlap_sample": t_overlap, "sample_tokens_per_s": float(st[2]) / max(float(st[0]), 1e-9),
                  "mismatch/logp_max_abs": float(st[3]), "staleness": float(staleness)})
        if len(st) > 4:  # checkpoints from before these statistics hold four
            m.update({"mismatch/logp_mean_abs": float(st[4]), "mismatch/kl": float(st[5])})
        return m

    def _update(self, a: dict, texts: list[str], scores: list[dict], temp: float, u: int) -> dict:
        from rl import losses

        s = self.cfg
        rewards = np.array([sc["total"] for sc in scores], np.float64)
        rewards = rewards + stage_reward_terms(s, scores)
        m = reward_metrics(scores)
        if self.prm is not None:  # a model: scored here on the batch's own rows, not in the reward pool
            self.prm_out = self.prm.score_rows(a["tokens"], a["attn_mask"], texts, a["resp_start"])
            rewards, prm_m = self.prm.add_reward(rewards, self.prm_out, [sc.get("family") for sc in scores])
            m.update(prm_m)
        ks = a["ks"]
        if self.cur_state is not None:
            corr = np.array([sc["solved"] > 0.5 for sc in scores], np.float64)
            n_corr = np.add.reduceat(corr, np.concatenate([[0], np.cumsum(ks)[:-1]]))
            self.cur_state = cur.record(self.cur_state, a["ids"], n_corr, ks, s.curriculum.decay)
            m.update({f"curriculum/{k}": v for k, v in cur.bucket_counts(self.cur_state).items()})
        mask = a["loss_mask"].astype(np.float32)
        kl_seq, kl_tok = None, None
        if "ref_logp" in a:
            kl_tok = np.asarray(losses.kl_penalty(jnp.asarray(a["sample_logp"]), jnp.asarray(a["ref_logp"]), s.kl_kind))
            kl_seq = float(losses.aggregate(kl_tok, mask, "seq-mean-token-mean"))
        coef = self.kl_ctl.coef_at(self.kl_state, u) if self.kl_ctl is not None else 0.0
        extra, keep_rows = self.advantages(a, texts, scores, rewards, coef, kl_tok)
        batch = {k: a[k] for k in ("tokens", "attn_mask", "loss_mask", "temperature", "routes") if k in a}
        batch["old_logp"] = a["sample_logp"]  # the behaviour policy is the sampler's distribution
        if "ref_logp" in a:  # in the loss (kl_place "loss"), or only measured for kl/train (LossConfig.kl_in_loss)
            batch["ref_logp"] = a["ref_logp"]
        batch.update(extra)
        starts = np.concatenate([[0], np.cumsum(ks)[:-1]]).astype(np.int64)
        m.update({"kept_groups": float(np.mean(keep_rows[starts])), "response_length": float(np.mean(a["lengths"])),
                  "temperature": temp, "kl_coef": coef, "n_samples": int(np.sum(ks))})
        if kl_seq is not None:
            m["kl"] = kl_seq
        idx = np.nonzero(keep_rows)[0]
        if len(idx):
            batch = {k: np.asarray(v)[idx] for k, v in batch.items()}
            if s.corrects_off_policy:
                batch, om = self._correct(batch)
                m.update(om)
            layout = self.grouped_layout(ks)
            tm = self.train_on(batch, epochs=s.epochs, rng=self.ctx.rng("rl", self.index, u, 1), max_rows=self.max_rows,
                               unit=u, kl_coef=coef, grouped=layout, resp_start=a["resp_start"][idx])
            m["train/grouped"] = float(layout is not None)
            self.trained_units += 1
            m.update({"entropy": tm.get("entropy"), "loss": tm.get("loss/total"), "loss/policy": tm.get("loss/policy"),
                      "loss/kl": tm.get("loss/kl"), "loss/value": tm.get("loss/value"), "kl/train": tm.get("kl"),
                      "grad_norm": tm.get("grad_norm"), "train_tokens_per_s":
                          float(batch["attn_mask"].sum()) * s.epochs / max(tm["time/train"], 1e-9),
                      **step_stats(tm), **{k: v for k, v in tm.items() if k.startswith(("policy/", "value/"))},
                      **router_metrics(tm), **{k: v for k, v in tm.items() if k == "router/replay_disagreement"}})
        else:
            m["skipped_iteration"] = 1.0
        if self.kl_ctl is not None and kl_seq is not None:
            self.kl_state = self.kl_ctl.update(self.kl_state, kl_seq, len(rewards))
            m["kl_controller_finite_input"] = float(np.isfinite(kl_seq))
        return m

    def _chunked(self, fn, params, b: dict, layout, routes: bool = True):
        """A make_logprob_fn function over all rows of batch `b`: grouped with a layout (each prompt computed once,
        rl/grouped_batch.py), else flat in max_rows chunks with `_logp_args` (the recorded routes when replaying
        them, unless routes=False)."""
        if layout is not None:
            return grouped_batch.chunked_logprobs(fn, params, b, b["resp_start"], layout, b["temperature"])
        args = self._logp_args(b) if routes else (b["temperature"],)
        return rollout.chunked(fn, params, b, self.max_rows, *args)

    def grouped_layout(self, ks):
        """The update's grouped layout (rl/grouped_batch.py), or None for the flat one: batch_layout "flat",
        recorded routes (replay needs the flat layout), mixed group sizes or a group larger than a minibatch."""
        if self.cfg.batch_layout == "flat" or self.cfg.records_routes:
            return None
        c = self.ctx.cfg
        return grouped_batch.plan(ks, self.max_rows, self.ctx.row_multiple, c["tasks"]["max_prompt_len"],
                                  c["sampling"]["max_new_tokens"], self.ctx.tok.PAD)

    def _correct(self, batch: dict) -> tuple[dict, dict]:
        """Off-policy correction against the trainer's logprobs at the start of this update (rl/offpolicy.py)."""
        prox = self._chunked(self.ctx.logprob_fn, self.policy_params(), batch, None)
        return offpolicy.corrected_batch(batch, prox, self.cfg)

    def step_scores(self, a: dict, texts: list[str], final=None):
        if self.prm is not None and self.prm.steps:  # reward.prm_steps: the PRM's step probabilities
            return self.prm.step_scores(self.prm_out, final, a["lengths"], a["resp_start"])
        return step_scores(self.ctx.tok, texts, a["resp_start"], a["lengths"], final)


def step_scores(tok, texts: list[str], resp_start, lengths, final=None):
    """[N, S] exact step checks (1 right, 0 wrong; unchecked steps left out), each step's last-token position
    and a mask. With `final` ([N] scores of whole responses: the sequence reward), the answer line is appended as
    the last step with that score, at the response's last token (EOS included): process supervision then credits
    the answer, its format and penalties, not only the intermediate arithmetic."""
    from rewards.parse import step_spans
    from rewards.steps import check_steps

    rows = []
    for r, t in enumerate(texts):
        start = int(resp_start[r])
        row = [(float(c), start + len(tok.encode(t[:en], add_bos=False)) - 1)
               for (_, en), c in zip(step_spans(t), check_steps(t)) if c is not None]
        if final is not None:
            row.append((float(final[r]), start + int(lengths[r]) - 1))
        rows.append(row)
    return step_arrays(rows)


def step_arrays(rows: list[list[tuple[float, int]]]):
    """(scores, end positions, mask) [N, S] of per-response lists of (score, end position) steps."""
    S = max(1, max(len(r) for r in rows))
    sc = np.zeros((len(rows), S), np.float32)
    pos = np.zeros((len(rows), S), np.int32)
    msk = np.zeros((len(rows), S), np.int32)
    for i, row in enumerate(rows):
        for j, (c, p) in enumerate(row):
            sc[i, j], pos[i, j], msk[i, j] = c, p, 1
    return sc, pos, msk


def stage_reward_terms(s, scores: list[dict]) -> np.ndarray:
    """The stage's own reward terms per answer: + process_weight x process + format_weight x format
    - language_weight x language (each a component rewards.combine.score always returns). The format term skips
    the families whose format is their outcome (rewards.task_score.FORMAT_IS_OUTCOME: an instruction row's `format`
    is its share of constraints met, already in the total), as reward.w_format does."""
    from rewards.task_score import format_counts

    col = lambda k: np.array([float(sc[k]) for sc in scores], np.float64)  # noqa: E731
    out = np.zeros((len(scores),), np.float64)
    for weight, key, sign in ((s.process_weight, "process", 1.0), (s.format_weight, "format", 1.0),
                              (s.language_weight, "language", -1.0)):
        if weight:
            own = np.array([format_counts(sc) for sc in scores], np.float64) if key == "format" else 1.0
            out += sign * weight * col(key) * own
    return out


def reward_metrics(scores: list[dict]) -> dict:
    """Means of the numeric reward parts, accuracy and format rate of a scored batch."""
    tot = np.array([sc["total"] for sc in scores], np.float64)
    m = {"reward/mean": float(tot.mean()), "reward/std": float(tot.std())}
    for k in scores[0]:
        vals = [sc[k] for sc in scores if isinstance(sc.get(k), (int, float, bool, np.floating))]
        if len(vals) == len(scores):
            m[f"reward/{k}"] = float(np.mean(vals))
    m["accuracy"] = float(np.mean([sc["solved"] > 0.5 for sc in scores]))
    m["format_rate"] = float(np.mean([sc["format"] for sc in scores]))
    fams = [sc.get("family") or "error" for sc in scores]
    if len(set(fams)) > 1 or fams[0] != "math":  # a mixed batch: accuracy and share per task family
        for f in sorted(set(fams)):
            rows = [sc for sc, g in zip(scores, fams) if g == f]
            m[f"family_share/{f}"] = len(rows) / len(scores)
            m[f"accuracy/{f}"] = float(np.mean([sc["solved"] > 0.5 for sc in rows]))
    return m
