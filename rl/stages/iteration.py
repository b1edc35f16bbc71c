"""The RL iteration of the GRPO and PPO stages: produce -> score -> advantages -> update, as functions over a state.

GRPO (grpo.py) and PPO (ppo.py) differ only in their advantage function and in PPO's value head; each passes its own
to `init`, and everything else is here:

    st = init(ctx, index, cfg, params, advantages=grpo.advantages, value_head=False)
    st, metrics = unit(st, u)          # one iteration (the function below reads top to bottom)

One iteration:
  curriculum (or uniform) picks problems and K per problem
  -> sampler at the iteration's temperature; its logprobs ARE the behaviour policy (no extra forward)
  -> reward pool scores the texts while the device computes reference logprobs (and PPO values) at the same
     temperature, and, when run.overlap is on and no curriculum waits for this iteration's pass rates, samples
     ahead up to iteration u + max_staleness (bounded staleness; each batch carries its behaviour logprobs, the
     sampler's MoE routes when recorded, and the update count it was sampled at)
  -> advantages (the kind's function), zero-variance groups dropped (GRPO's filter_zero_variance "drop"), or with
     "refill" (DAPO's dynamic sampling) more groups drawn, sampled and scored now, until n_prompts carry variance
     or max_refill_rounds is reached (refill below)
  -> with an off-policy correction on (tis_cap / mis_* / icepop_*): the trainer's logprobs at the start of the
     update become the ratio's old policy and weight the advantages against the behaviour logprobs (rl/offpolicy.py)
  -> epochs over near-equal minibatches (rl.train_loop.train_on), train-side logprobs at the sampling temperature
     (replaying the sampler's experts with routing_replay); with batch_layout "auto" the minibatches hold whole groups
     in the grouped layout, each prompt computed once for its K answers (rl/grouped_batch.py; the reference and PPO
     value passes too)
  -> the KL controller reads the sampled batch's KL (mean over sequences of the per-token masked mean)

Every iteration logs `mismatch/logp_max_abs` (and `_mean_abs`, `mismatch/kl`): the largest |sampler logprob -
trainer logprob| over the response tokens of the first minibatch-sized chunk of the batch (all rows for PPO, whose
value pass computes them anyway), for the same parameters and temperature. In float32 it is ~1e-6; a change that
breaks the sampler / trainer match shows up here at once (sampler_dtype bfloat16 makes it ~1e-2 on purpose).
docs/training.md ("MoE RL") describes the mismatch fields.

Config: `IterationConfig` holds the fields GRPO and PPO share that belong to the iteration itself; the loss, KL,
off-policy and curriculum fields are their modules' sections (rl.losses.LossConfig, rl.kl_control.KLConfig,
rl.offpolicy.OffPolicyConfig, rl.curriculum.CurriculumConfig), composed by each kind's config. The functions
under "config rules" are the rules both kinds' configs apply (plain functions of the config: each config's
cross_checks calls cross_checks, rl.stages.Kind carries the others).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from models import kernels
from rewards.combine import PRM_CALIBRATIONS as CALIBRATIONS
from rewards.task_score import format_counts
from rl import advantages as advm
from rl import curriculum as cur
from rl import grouped_batch, kl_control, losses, offpolicy, reward_terms, rollout, schedules, tool_rollout
from rl.losses import LossConfig
from rl.stages import algorithms, common
from rl.stages.common import Base
from rl.train_loop import router_metrics, step_stats
from schema import Checked, boolean, choice, field, integer, num

# LossConfig keys every RL stage writes flat; PPO adds value_coef and value_clip (its value head's)
LOSS_KEYS = ("policy_loss", "clip_low", "clip_high", "dual_clip", "cispo_floor", "agg", "kl_kind", "entropy_coef",
             "routing_replay")


@dataclasses.dataclass(frozen=True, kw_only=True)
class IterationConfig(Checked):
    """The iteration's own fields (GRPO and PPO): how much to sample, at which temperature, how to update, the
    stage's reward terms and the sampler / trainer mismatch switches."""

    algorithm: str = field("", "an RL algorithm by name (rl/stages/algorithms.py; docs/training.md): sets the fields "
                               "its paper uses that the stage leaves at their defaults: grpo | dr_grpo | dapo | gspo | "
                               "cispo | rloo | reinforce_pp (kind grpo) | ppo (kind ppo); '' = the fields as written",
                           choice("", *algorithms.NAMES))
    applied_algorithm: str = field("", "written by stage() and config.json, not by hand: the algorithm whose fields "
                                       "the entry already holds; a new `algorithm` replaces only the fields still at "
                                       "that name's values ('' = the kind's defaults)", choice("", *algorithms.NAMES))
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
    language_weight: float = field(0.0, "this stage's language-consistency reward: subtracts weight x (1 - share of "
                                        "the expected script in the reasoning), on top of reward.w_language",
                                   num(0.0, 100.0))
    process_weight: float = field(0.0, "this stage's process reward: adds weight x the share of exactly checked steps "
                                       "that hold, on top of reward.w_process (a stage-level term keeps the cold "
                                       "start shared in a sweep over it)", num(0.0, 100.0))
    format_weight: float = field(0.0, "this stage's format reward: adds weight x the format score, on top of "
                                      "reward.w_format", num(0.0, 100.0))
    prm_weight: float = field(0.0, "this stage's PRM reward: adds weight x the response's PRM score, on top of "
                                   "prm.weight (needs prm.path; prm/reward.py)", num(0.0, 100.0))
    prm_calibration: str = field("", "the PRM calibration map this stage applies: '' (the file's own) | none | "
                                     "temperature | platt (needs prm.path)", choice("", *CALIBRATIONS))
    step_rewards: bool = field(False, "add step-level rewards (exactly checked arithmetic steps) at step ends", boolean)
    step_reward_weight: float = field(0.1, "weight of the step-level rewards", num(0.0, 100.0))
    # Sampler / trainer mismatch (docs/training.md): routes, precision, staleness (routing_replay: LossConfig's).
    record_routes: bool = field(False, "record the sampler's experts and log router/replay_disagreement without "
                                       "replaying them (implied by routing_replay)", boolean)
    sampler_dtype: str = field("", "compute dtype this stage's rollouts run the policy in ('' = sampling.dtype, else "
                                   "model.dtype), e.g. bfloat16 sampling against float32 training",
                               choice("", "float32", "bfloat16", "float16"))
    max_staleness: int = field(1, "bounded staleness: the sampler runs up to k updates ahead (k batches sampled "
                                  "ahead, while rewards are computed; needs run.overlap and no curriculum); 0 = each "
                                  "batch sampled right before its update", integer(0, 64))
    batch_layout: str = field("auto", "update batches: auto (grouped: each prompt computed once for its K answers, "
                                      "minibatches of whole groups; flat when group sizes differ, a group exceeds "
                                      "token_budget or routes are recorded) | flat (prompt + answer in every row)",
                              choice("auto", "flat"))


# -- config rules (GRPO's and PPO's) -------------------------------------------------------------------------------
def loss_for(cfg, max_new_tokens: int) -> LossConfig:
    """The train step's LossConfig of an RL stage config: its loss section with the fields the stage derives."""
    return dataclasses.replace(
        cfg.loss, mode=cfg.KIND, kl_in_loss=cfg.kl.kl_place == "loss" and cfg.kl.uses_reference,
        max_len_norm=int(max_new_tokens) if cfg.loss.agg == "seq-mean-token-sum-norm" else None)


def components(cfg, max_new_tokens: int):
    """(LossConfig, OptimConfig, KL controller or None) of the train step an RL stage runs."""
    return loss_for(cfg, max_new_tokens), cfg.loop.optim(), kl_control.controller(cfg.kl)


def tools(cfg):
    """The stage's tools section (rl/tool_rollout.ToolsConfig) when its tool is on, else None."""
    return cfg.tools if cfg.tools.on else None


def uses_reference(cfg) -> bool:
    """Whether the stage holds a KL reference policy (some KL coefficient can be > 0: rl.kl_control.KLConfig)."""
    return cfg.kl.uses_reference


def records_routes(cfg) -> bool:
    """Whether its rollouts record the sampler's MoE routes (to replay them, or only to measure the disagreement)."""
    return cfg.loss.routing_replay or cfg.rl.record_routes


def group_sizes(cfg) -> list[int]:
    """The answers per problem it samples: the curriculum's per bucket, else `samples`."""
    return list(cfg.curriculum.samples) if cfg.curriculum.enabled else [cfg.rl.samples]


def cross_checks(cfg):
    """Rules between sections (each section checks its own fields)."""
    if msg := algorithms.kind_error(cfg.rl.algorithm, cfg.KIND):
        yield "algorithm", msg
    elif cfg.rl.applied_algorithm != cfg.rl.algorithm:  # rl.stages.with_algorithm could not move the fields from it
        yield "applied_algorithm", (f"{cfg.rl.applied_algorithm!r} is not a {cfg.KIND} algorithm; it is written by "
                                    "stage() and config.json, not by hand: remove it")
    if cfg.tools.on and records_routes(cfg):
        yield "tools", "tool rollouts record no MoE routes: turn routing_replay and record_routes off"
    try:
        loss_for(cfg, max_new_tokens=1)
    except ValueError as e:  # the loss's rules that need the stage (k1 in the loss with kl_place loss)
        yield from getattr(e, "errors", [("kl_kind", str(e))])


def prm_checks(cfg, prm: dict):
    """Rules that need the PRM wing's section (rl.config_validation.validate: its plain dict, {} without one)."""
    for fld in ("prm_weight", "prm_calibration"):
        if getattr(cfg.rl, fld) and not prm.get("path"):
            yield fld, "needs prm.path (a PRM file from experiments/train_prm.py)"


def model_checks(cfg, model: dict):
    """Rules that need the model section (rl.config_validation.validate)."""
    moe = model.get("n_experts", 0) > 0 and model.get("moe_every", 0) > 0 or model.get("upcycle") is not None
    for fld, on in (("routing_replay", cfg.loss.routing_replay), ("record_routes", cfg.rl.record_routes)):
        if on and not moe:
            yield fld, "needs an MoE model (model.n_experts > 0 and model.moe_every > 0, or model.upcycle)"


# -- what the run's planners ask of an RL kind (rl.stages.Kind) ------------------------------------------------
def problems(cfg) -> tuple[str, int]:
    """(the field counting the training problems it asks for, that count): n_prompts, drawn afresh each iteration."""
    return "n_prompts", cfg.rl.n_prompts


def step_rows(cfg, seq_len: int, row_multiple: int) -> int:
    """Rows per optimizer step: token_budget over the padded length (rl.rollout.rows_for_budget)."""
    return rollout.rows_for_budget(cfg.rl.token_budget, seq_len, row_multiple)


def step_layout(cfg, rows: int, row_multiple: int, prompt_len: int, new_tokens: int):
    """The grouped layout its steps take (rl/grouped_batch.py), or None for flat rows: batch_layout "flat", recorded
    routes or group sizes that differ are flat (the update's rule, grouped_layout, on the config's group sizes)."""
    if not steps_grouped(cfg):
        return None
    return grouped_batch.plan(group_sizes(cfg), rows, row_multiple, prompt_len, new_tokens, 0)


def steps_grouped(cfg) -> bool:
    """Whether its steps take the grouped layout: batch_layout not "flat", no recorded routes, one group size."""
    return cfg.rl.batch_layout != "flat" and not records_routes(cfg) and len(set(group_sizes(cfg))) == 1


def answers(cfg) -> int:
    """Answers an iteration samples and scores (its first draw): n_prompts x the group size (the curriculum's mean)."""
    k = float(np.mean(cfg.curriculum.samples)) if cfg.curriculum.enabled else cfg.rl.samples
    return int(cfg.rl.n_prompts * k)


def trained_rows(cfg, n_train: int) -> int:
    """Rows an iteration trains on at most (every group kept), epochs counted."""
    del n_train
    return cfg.rl.epochs * answers(cfg)


def seconds(cfg, run, price, *, value_head: bool, draws: tuple[float, float] = (1.0, 1.0)) -> dict:
    """Seconds of one iteration by part, priced by rl/time_estimate.py's `price` (run: the RunConfig): sampling, the
    logprob passes (the KL reference over the batch; the sampler / trainer check over one minibatch, or with a
    value head the old logprobs and values over the batch) and the update, in the grouped layout's tokens when its
    steps take it. `draws`: (batches drawn, share of a batch's groups trained), the kind's (GRPO's zero-variance
    filter)."""
    P, N = run.tasks.max_prompt_len, run.sampling.max_new_tokens
    seq = P + N
    r = cfg.rl
    sizes = group_sizes(cfg)
    rows = int(round(r.n_prompts * float(np.mean(sizes))))
    tokens = r.n_prompts * P + rows * N if steps_grouped(cfg) else rows * seq  # grouped: each prompt once
    step = max(1, r.token_budget // seq)
    n_draws, kept = draws
    logprobs = price.forward(tokens if value_head else min(rows, step) * seq)
    if uses_reference(cfg):
        logprobs += price.forward(tokens)
    return {"sampling": n_draws * price.decode(rows, r.n_prompts, r.sampler_dtype),
            "logprobs": n_draws * logprobs,
            "update": r.epochs * kept * price.train(tokens, r.token_budget)}


def trained_units(st) -> int:
    """Iterations that updated the policy so far (an iteration whose groups all had equal rewards did not)."""
    return st.trained_units


# -- warnings on an RL stage's values (rl/config_warnings.py prints them) ----------------------------------------
SEQUENCE_CLIP_MAX = 0.01  # clip ranges below this are sequence-ratio ranges (GSPO: 3e-4 / 4e-4), above token-ratio


def warnings(cfg) -> list[str]:
    """An RL stage's warnings (GRPO's add its own): clip ranges chosen for another policy loss."""
    return clip_warnings(cfg)


def _clips(cfg) -> dict:
    """The clip fields the stage's policy loss reads (cispo's clip_low only with cispo_floor)."""
    loss = cfg.loss
    keys = ("clip_high",) if loss.policy_loss == "cispo" and not loss.cispo_floor else ("clip_low", "clip_high")
    return {k: getattr(loss, k) for k in keys}


def clip_warnings(cfg) -> list[str]:
    """Clip ranges of a token-ratio loss on GSPO's sequence ratio, or the reverse."""
    clips, loss = _clips(cfg), cfg.loss.policy_loss
    if loss == "gspo":
        wide = {k: v for k, v in clips.items() if v >= SEQUENCE_CLIP_MAX}
        if wide:
            return [f"{_fields(wide)} {_were(wide)} chosen for a token-ratio loss (policy_loss ppo: PPO and DAPO clip "
                    "at ~0.2); policy_loss gspo clips the sequence ratio, which moves far less per step: GSPO's "
                    "paper uses clip_low=0.0003, clip_high=0.0004 (algorithm='gspo' sets them)"]
    elif loss in ("ppo", "cispo"):
        narrow = {k: v for k, v in clips.items() if 0 < v < SEQUENCE_CLIP_MAX}
        if narrow:
            return [f"{_fields(narrow)} {_were(narrow)} chosen for policy_loss gspo (a sequence ratio); policy_loss "
                    f"{loss} clips each token's ratio, which at 1 +- {max(narrow.values())} stops almost "
                    "every token's update: the token-ratio ranges are ~0.2 (0.2 / 0.28 with DAPO's clip-higher)"]
    return []


def _fields(d: dict) -> str:
    """'clip_low=0.2, clip_high=0.28'."""
    return ", ".join(f"{k}={v}" for k, v in d.items())


def _were(d: dict) -> str:
    """The verb for one field or several."""
    return "was" if len(d) == 1 else "were"


# -- state ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class State:
    """An RL stage between iterations (frozen: each iteration returns a new one)."""

    base: Base  # context, config, problems, the optimizer loop and the train state (rl/stages/common.py)
    advantages: Callable  # the kind's: (st, a, texts, rewards, coef, kl_tok) -> (extra batch keys, rows to keep)
    value_head: bool  # PPO: values at sampling time (old_values) from the train state's value head
    kl_ctl: Any  # rl.kl_control controller or None
    max_rows: int  # rows per minibatch (token_budget over the padded length)
    sample_cfg: Any  # the model config the sampler runs (sampler_dtype)
    prm: Any  # the PRM wing's scorer (rl/reward_terms.py) or None (prm.path "")
    ref_params: Any = None  # the reference policy (a KL term), else None
    kl_state: Any = None
    cur_state: Any = None  # curriculum state (rl/curriculum.py), else None
    pending: tuple = ()  # batches sampled ahead, oldest first (bounded staleness); checkpointed
    trained_units: int = 0  # updates so far: a batch's "version" is this count when it was sampled
    prm_out: Any = None  # the current batch's PRM scores (process reward and step scores share one forward)
    refill_rounds: int = 0  # rounds an iteration may draw after its first batch (GRPO's filter_zero_variance "refill")


def init(ctx, index: int, cfg, params, *, advantages: Callable, value_head: bool, refill_rounds: int = 0) -> State:
    """An RL stage's state: the kind's advantage function, its value head (PPO) and refill rounds (GRPO's
    filter_zero_variance "refill"), the KL reference, controller and curriculum state its config asks for."""
    loss_cfg, _, kl_ctl = components(cfg, ctx.cfg.sampling.max_new_tokens)
    base = common.init_base(ctx, index, cfg, params, loss_cfg)
    st = State(base=base, advantages=advantages, value_head=value_head, kl_ctl=kl_ctl,
               max_rows=rollout.rows_for_budget(cfg.rl.token_budget, ctx.seq_len, ctx.row_multiple),
               sample_cfg=ctx.model_cfg.replace(dtype=cfg.rl.sampler_dtype) if cfg.rl.sampler_dtype else ctx.sampler_cfg,
               prm=reward_terms.scorer(ctx, cfg, f"stages[{index}]"),  # prm.path: the PRM wing's, else None
               refill_rounds=refill_rounds)
    return dataclasses.replace(
        st, ref_params=common.reference_params(st) if cfg.kl.uses_reference else None,
        kl_state=kl_ctl.init() if kl_ctl is not None else None,
        cur_state=cur.init_state(len(base.problems)) if cfg.curriculum.enabled else None)


# -- one iteration --------------------------------------------------------------------------------------------
def unit(st: State, u: int) -> tuple[State, dict]:
    """Iteration u: produce (or take the batch sampled ahead) -> score -> advantages (-> refill) -> update."""
    ctx, cfg = st.base.ctx, st.base.cfg
    pending = [b for b in st.pending if b["unit"] >= u]
    if pending and pending[0]["unit"] == u:
        cur_b = pending.pop(0)
    else:
        st, cur_b = produce(st, u)
        pending = []
    a = cur_b["arrays"]
    texts = _texts(ctx.tok, a)
    fut = ctx.scorer.submit(texts, _problems(st, a), a["lengths"])
    # Producer / consumer: while the reward pool scores this batch, sample ahead up to iteration u + k with the
    # current params (batch u + k then trains k updates later: bounded staleness k).
    ahead = range(u + 1 + len(pending), min(u + lookahead(st), cfg.units - 1) + 1)
    t0 = time.time()
    for v in ahead:
        st, b = produce(st, v)
        pending.append(b)
    t_overlap = time.time() - t0 if len(ahead) else 0.0
    st = dataclasses.replace(st, pending=tuple(pending))
    kernels.phase_end()  # sampling and the reference pass are done: their freed buffers go before the update's come
    t0 = time.time()
    scores = ctx.scorer.result(fut)
    t_wait = time.time() - t0
    staleness = st.trained_units - cur_b["version"]

    coef = st.kl_ctl.coef_at(st.kl_state, u) if st.kl_ctl is not None else 0.0
    st, d = judge(st, a, texts, scores, coef)
    if st.refill_rounds:  # DAPO's dynamic sampling: more groups, drawn now, until n_prompts carry variance
        st, d = refill(st, u, d, coef)
    a, m = d["a"], d["m"]
    st, um = update(st, a, d["extra"], d["keep"], coef, u)
    kernels.phase_end()
    if st.kl_ctl is not None and d["kl"] is not None:
        st = dataclasses.replace(st, kl_state=st.kl_ctl.update(st.kl_state, d["kl"], len(d["rewards"])))
        um["kl_controller_finite_input"] = float(np.isfinite(d["kl"]))

    m.update({"kept_groups": float(np.mean(d["keep"][group_starts(a["ks"])])),
              "response_length": float(np.mean(a["lengths"])), "temperature": cur_b["temperature"], "kl_coef": coef,
              "n_samples": int(np.sum(a["ks"]))})
    if d["kl"] is not None:
        m["kl"] = d["kl"]
    m.update(um)
    m.update(produce_metrics(a["stats"]))
    m.update(tool_rollout.metrics(a))
    m.update({"time/score_wait": t_wait, "time/overlap_sample": t_overlap, "staleness": float(staleness)})
    return st, m


def judge(st: State, a: dict, texts: list[str], scores: list[dict], coef: float) -> tuple[State, dict]:
    """One scored draw: {"a": its arrays, "scores", "rewards", "m": the reward metrics (score), "kl": the sampled
    KL (or None), "extra": the kind's advantage arrays, "keep": the rows to train}."""
    st, rewards, m = score(st, a, texts, scores)
    kl_tok, kl_seq = sampled_kl(a, st.base.cfg.loss.kl_kind)
    extra, keep = st.advantages(st, a, texts, rewards, coef, kl_tok)
    return st, {"a": a, "scores": scores, "rewards": rewards, "m": m, "kl": kl_seq, "extra": extra, "keep": keep}


# -- refill (DAPO's dynamic sampling) -------------------------------------------------------------------------
REFILL_STREAM = 2  # the rng / key part of refill draws: (u, REFILL_STREAM, round); the update shuffles with (u, 1)


def refill(st: State, u: int, first: dict, coef: float) -> tuple[State, dict]:
    """DAPO's dynamic sampling (GRPO's filter_zero_variance "refill"): while fewer than n_prompts of the iteration's
    groups carry reward variance, draw n_prompts more problems (among those not drawn yet in this iteration, from
    the rng stream of (u, round)), sample them with the current params and score them, synchronously; at most
    st.refill_rounds rounds, fewer when not n_prompts problems are left. The first n_prompts kept groups train
    (merge); refill/groups_drawn, refill/groups_kept (groups trained) and refill/rounds join the metrics."""
    ctx, n = st.base.ctx, st.base.cfg.rl.n_prompts
    draws, t0 = [first], time.time()
    while kept_groups(draws) < n and len(draws) <= st.refill_rounds:
        drawn = np.concatenate([d["a"]["ids"] for d in draws])
        if len(st.base.problems) - len(np.unique(drawn)) < n:
            break
        st, b = produce(st, u, draw=len(draws), drawn=drawn)
        a = b["arrays"]
        texts = _texts(ctx.tok, a)
        scores = ctx.scorer.result(ctx.scorer.submit(texts, _problems(st, a), a["lengths"]))
        st, d = judge(st, a, texts, scores, coef)
        draws.append(d)
    if len(draws) > 1:
        kernels.phase_end()  # the rounds' sampling and reference passes are done, as the first draw's were
    d = merge(draws, n)
    d["m"].update({"refill/groups_drawn": float(len(d["a"]["ks"])), "refill/rounds": float(len(draws) - 1),
                   "refill/groups_kept": float(np.sum(d["keep"][group_starts(d["a"]["ks"])])),
                   "time/refill": time.time() - t0})
    return st, d


def group_starts(ks) -> np.ndarray:
    """The first row of each contiguous group of sizes `ks`."""
    return np.concatenate([[0], np.cumsum(ks)[:-1]]).astype(np.int64)


def kept_groups(draws: list[dict]) -> int:
    """Groups whose rows the judged draws keep (groups with reward variance), all draws together."""
    return int(sum(np.sum(d["keep"][group_starts(d["a"]["ks"])]) for d in draws))


def first_kept(keep: np.ndarray, ks, n: int) -> np.ndarray:
    """Rows to keep [N] with only the first n kept groups (in batch order) kept."""
    kept = keep[group_starts(ks)]
    return keep & np.repeat(kept & (np.cumsum(kept) <= n), ks)


def merge(draws: list[dict], n_groups: int) -> dict:
    """The judged draws of one iteration as one (judge's keys), in draw order: rows, groups and the kind's arrays
    concatenated, prompt_index counting groups across the draws, the first draw's produce statistics (timings, the
    sampler / trainer match); rows to keep: those of the first n_groups kept groups. Reward metrics are over every
    drawn answer, the others (PRM) the first draw's; the sampled KL is the mean over every drawn sequence."""
    arrays = [d["a"] for d in draws]
    a = {k: np.concatenate([x[k] for x in arrays]) for k in arrays[0] if k not in ("stats", "prompt_index")}
    offsets = np.cumsum([0] + [len(x["ks"]) for x in arrays[:-1]])
    a["prompt_index"] = np.concatenate([x["prompt_index"] + o for x, o in zip(arrays, offsets)])
    a["stats"] = arrays[0]["stats"]
    scores = [sc for d in draws for sc in d["scores"]]
    rows = [len(d["rewards"]) for d in draws]
    kl = None if draws[0]["kl"] is None else float(np.average([d["kl"] for d in draws], weights=rows))
    keep = first_kept(np.concatenate([d["keep"] for d in draws]), a["ks"], n_groups)
    return {"a": a, "scores": scores, "rewards": np.concatenate([d["rewards"] for d in draws]),
            "m": {**draws[0]["m"], **reward_metrics(scores)}, "kl": kl, "keep": keep,
            "extra": {k: np.concatenate([np.asarray(d["extra"][k]) for d in draws]) for k in draws[0]["extra"]}}


def lookahead(st: State) -> int:
    """Batches sampled ahead of the update: max_staleness, or 0 without run.overlap or with a curriculum (whose
    next pick must see this iteration's pass rates)."""
    return st.base.cfg.rl.max_staleness if st.base.ctx.cfg.run.overlap and st.cur_state is None else 0


# -- produce ------------------------------------------------------------------------------------------------------
def draw_parts(u: int, draw: int) -> tuple[int, ...]:
    """The rng / key parts of iteration u's draw: (u,) for its batch, (u, REFILL_STREAM, round) for a refill round."""
    return (u,) if draw == 0 else (u, REFILL_STREAM, draw)


def pick(st: State, u: int, draw: int = 0, drawn=()) -> tuple[State, tuple[np.ndarray, np.ndarray]]:
    """(problem ids, samples per problem) of iteration u's draw (0: its batch; a refill round: among the problems
    not `drawn` yet), with the curriculum's buckets refreshed when due (no refill with a curriculum)."""
    ctx, s, index = st.base.ctx, st.base.cfg, st.base.index
    if st.cur_state is not None:
        if cur.due_refresh(st.cur_state, u, s.curriculum.refresh_every):
            st = dataclasses.replace(st, cur_state=cur.refresh(st.cur_state, u, s.curriculum))
        seed = int(ctx.rng("rl", index).integers(2**31))
        return st, cur.pick(st.cur_state, s.curriculum, s.rl.n_prompts, seed, u)
    rest = np.setdiff1d(np.arange(len(st.base.problems)), np.asarray(drawn, np.int64))
    ids = ctx.rng("rl", index, *draw_parts(u, draw)).choice(rest, size=s.rl.n_prompts, replace=False)
    return st, (np.sort(ids), np.full((len(ids),), s.rl.samples, np.int64))


def temperature(cfg, u: int) -> float:
    r = cfg.rl
    return schedules.temperature_at(u, r.iterations, r.temperature_start, r.temperature_end, r.temperature_kind)


def produce(st: State, u: int, draw: int = 0, drawn=()) -> tuple[State, dict]:
    """Sample iteration u's batch (or its refill round `draw`, among the problems not `drawn`) with the current
    params; reference logprobs (and PPO values) at the sampling temperature; the sampler / trainer logprob match
    measured on the same params."""
    ctx, cfg, index = st.base.ctx, st.base.cfg, st.base.index
    st, (ids, ks) = pick(st, u, draw, drawn)
    key = ctx.key("rl", index, *draw_parts(u, draw))
    temp = temperature(cfg, u)
    prompts = [ctx.prompt(st.base.problems[i]) for i in ids]
    params = common.policy_params(st)
    t0 = time.time()
    if cfg.tools.on:  # tool calls (rl/tool_rollout.py): the loss mask is the policy's own tokens
        smpl = tool_rollout.sample(ctx, params, prompts, ks, key, temperature=temp,
                                   model_cfg=st.sample_cfg, cfg=cfg.tools)
    else:
        smpl = ctx.sample(params, prompts, ks, key, temperature=temp, model_cfg=st.sample_cfg,
                          return_routes=records_routes(cfg))
    t_sample = time.time() - t0
    b = rollout.build_batch([ctx.tok.encode(p, add_bos=True) for p in prompts], smpl, ctx.seq_len, pad_id=ctx.tok.PAD)
    b = tool_rollout.with_policy_mask(b, smpl)
    b["temperature"] = np.full((len(smpl.texts),), temp, np.float32)
    t0 = time.time()
    rows, mask = st.max_rows, b["loss_mask"].astype(np.float32)
    layout = grouped_layout(st, ks)
    if st.value_head:
        lp, values = _chunked(st, ctx.value_fn, common.model_params(st), b, layout)
        b["old_values"] = values * mask
        checked = slice(None)
    else:
        checked = slice(0, rows)
        part = {k: v[checked] for k, v in b.items()}
        lp = _chunked(st, ctx.logprob_fn, params, part, None)  # flat: one minibatch's rows are enough
    _, mm = offpolicy.correction(lp, b["sample_logp"][checked], mask[checked])  # same params: numerics only
    del params  # LoRA: the sampler's merged copy goes before a reference of adapters is merged (one at a time)
    if st.ref_params is not None:  # no routes: the reference policy routes its own way
        ref = ctx.policy_weights(st.ref_params)  # plain params; LoRA's stage-start adapters merged into the base
        b["ref_logp"] = _chunked(st, ctx.logprob_fn, ref, b, layout, routes=False) * mask
        del ref
    t_logp = time.time() - t0
    arrays = {**b, "ids": ids.astype(np.int64), "ks": ks.astype(np.int64), "lengths": smpl.lengths,
              "prompt_index": smpl.prompt_index.astype(np.int64),
              "stats": np.array([t_sample, t_logp, float(smpl.lengths.sum()), mm["offpolicy/log_ratio_abs_max"],
                                 mm["offpolicy/log_ratio_abs_mean"], mm["offpolicy/kl"]], np.float64),
              **tool_rollout.tool_arrays(smpl, ctx.tok)}
    return st, {"arrays": arrays, "unit": u, "temperature": temp, "version": st.trained_units}


def produce_metrics(st_: np.ndarray) -> dict:
    """The metrics of a produced batch's `stats` row (sampling and logprob times, the sampler / trainer match)."""
    m = {"time/sample": float(st_[0]), "time/logprobs": float(st_[1]),
         "sample_tokens_per_s": float(st_[2]) / max(float(st_[0]), 1e-9), "mismatch/logp_max_abs": float(st_[3])}
    if len(st_) > 4:  # checkpoints from before these statistics hold four
        m.update({"mismatch/logp_mean_abs": float(st_[4]), "mismatch/kl": float(st_[5])})
    return m


def _chunked(st: State, fn, params, b: dict, layout, routes: bool = True):
    """A make_logprob_fn function over all rows of batch `b`: grouped with a layout (each prompt computed once,
    rl/grouped_batch.py), else flat in max_rows chunks with the row temperatures (and the recorded routes when
    the train step replays them, unless routes=False: the trainer's logprobs are then those it trains on)."""
    if layout is not None:
        return grouped_batch.chunked_logprobs(fn, params, b, b["resp_start"], layout, b["temperature"])
    args = (b["temperature"], b["routes"]) if routes and st.base.cfg.loss.routing_replay else (b["temperature"],)
    return rollout.chunked(fn, params, b, st.max_rows, *args)


def grouped_layout(st: State, ks):
    """The update's grouped layout (rl/grouped_batch.py), or None for the flat one: batch_layout "flat",
    recorded routes (replay needs the flat layout), mixed group sizes or a group larger than a minibatch."""
    cfg, ctx = st.base.cfg, st.base.ctx
    if cfg.rl.batch_layout == "flat" or records_routes(cfg):
        return None
    c = ctx.cfg
    return grouped_batch.plan(ks, st.max_rows, ctx.row_multiple, c.tasks.max_prompt_len, c.sampling.max_new_tokens,
                              ctx.tok.PAD)


def _problems(st: State, a: dict) -> list:
    """The problem of each row of a produced batch (what the reward pool scores it against)."""
    return [st.base.problems[int(a["ids"][p])] for p in a["prompt_index"]]


def _texts(tok, a: dict) -> list[str]:
    if "tool_turns" in a:  # tool calls: what the policy wrote, the tools' output removed (rl/tool_rollout.py)
        return tool_rollout.policy_texts(tok, a)
    toks, start, lens = a["tokens"], a["resp_start"], a["lengths"]
    return [tok.decode(toks[r, start[r] : start[r] + lens[r]]) for r in range(toks.shape[0])]


# -- score ----------------------------------------------------------------------------------------------------
def score(st: State, a: dict, texts: list[str], scores: list[dict]) -> tuple[State, np.ndarray, dict]:
    """Rewards [N] (the pool's totals + the stage's terms + the PRM's), their metrics, and the curriculum's record."""
    s = st.base.cfg
    rewards = np.array([sc["total"] for sc in scores], np.float64)
    rewards = rewards + stage_reward_terms(s.rl, scores)
    m = reward_metrics(scores)
    if st.prm is not None:  # a model: scored here on the batch's own rows, not in the reward pool
        st = dataclasses.replace(st, prm_out=st.prm.score_rows(a["tokens"], a["attn_mask"], texts, a["resp_start"]))
        rewards, prm_m = st.prm.add_reward(rewards, st.prm_out, [sc.get("family") for sc in scores])
        m.update(prm_m)
    if st.cur_state is not None:
        ks = a["ks"]
        corr = np.array([sc["solved"] > 0.5 for sc in scores], np.float64)
        n_corr = np.add.reduceat(corr, np.concatenate([[0], np.cumsum(ks)[:-1]]))
        cstate = cur.record(st.cur_state, a["ids"], n_corr, ks, s.curriculum.decay)
        st = dataclasses.replace(st, cur_state=cstate)
        m.update({f"curriculum/{k}": v for k, v in cur.bucket_counts(cstate).items()})
    return st, rewards, m


def sampled_kl(a: dict, kl_kind: str):
    """(per-token KL [N, T], its mean over sequences of the masked token mean) of the sampled batch against the
    reference, or (None, None) without one."""
    if "ref_logp" not in a:
        return None, None
    mask = a["loss_mask"].astype(np.float32)
    kl_tok = np.asarray(losses.kl_penalty(jnp.asarray(a["sample_logp"]), jnp.asarray(a["ref_logp"]), kl_kind))
    return kl_tok, float(losses.aggregate(kl_tok, mask, "seq-mean-token-mean"))


def batch_step_scores(st: State, a: dict, texts: list[str], final=None):
    """The batch's step scores: the PRM's with prm.steps, else the exact checker's (rl.advantages)."""
    if st.prm is not None and st.prm.steps:  # prm.steps: the PRM's step probabilities
        return st.prm.step_scores(st.prm_out, final, a["lengths"], a["resp_start"])
    return advm.step_scores(st.base.ctx.tok, texts, a["resp_start"], a["lengths"], final)


def stage_reward_terms(s, scores: list[dict]) -> np.ndarray:
    """The stage's own reward terms per answer: + process_weight x process + format_weight x format
    - language_weight x language (each a component rewards.combine.score always returns). The format term skips
    the families whose format is their outcome (rewards.task_score.FORMAT_IS_OUTCOME: an instruction row's `format`
    is its share of constraints met, already in the total), as reward.w_format does. `s`: the stage's IterationConfig
    (cfg.rl)."""
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


# -- update ---------------------------------------------------------------------------------------------------
def update(st: State, a: dict, extra: dict, keep_rows: np.ndarray, coef: float, u: int) -> tuple[State, dict]:
    """Train on the kept rows (corrected off-policy when asked): epochs of minibatches through rl.train_loop."""
    s = st.base.cfg
    batch = {k: a[k] for k in ("tokens", "attn_mask", "loss_mask", "temperature", "routes") if k in a}
    batch["old_logp"] = a["sample_logp"]  # the behaviour policy is the sampler's distribution
    if "ref_logp" in a:  # in the loss (kl_place "loss"), or only measured for kl/train (LossConfig.kl_in_loss)
        batch["ref_logp"] = a["ref_logp"]
    batch.update(extra)
    m = {}
    idx = np.nonzero(keep_rows)[0]
    if not len(idx):
        return st, {"skipped_iteration": 1.0}
    batch = {k: np.asarray(v)[idx] for k, v in batch.items()}
    if s.offpolicy.enabled:  # against the trainer's logprobs at the start of this update (rl/offpolicy.py)
        prox = _chunked(st, st.base.ctx.logprob_fn, common.policy_params(st), batch, None)
        batch, om = offpolicy.corrected_batch(batch, prox, s.offpolicy)
        m.update(om)
    layout = grouped_layout(st, a["ks"])
    st, tm = common.train(st, batch, epochs=s.rl.epochs, rng=st.base.ctx.rng("rl", st.base.index, u, 1),
                          max_rows=st.max_rows, unit=u, kl_coef=coef, grouped=layout,
                          resp_start=a["resp_start"][idx])
    st = dataclasses.replace(st, trained_units=st.trained_units + 1)
    m["train/grouped"] = float(layout is not None)
    m.update({"entropy": tm.get("entropy"), "loss": tm.get("loss/total"), "loss/policy": tm.get("loss/policy"),
              "loss/kl": tm.get("loss/kl"), "loss/value": tm.get("loss/value"), "kl/train": tm.get("kl"),
              "grad_norm": tm.get("grad_norm"), "train_tokens_per_s":
                  float(batch["attn_mask"].sum()) * s.rl.epochs / max(tm["time/train"], 1e-9),
              **step_stats(tm), **{k: v for k, v in tm.items() if k.startswith(("policy/", "value/"))},
              **router_metrics(tm), **{k: v for k, v in tm.items() if k == "router/replay_disagreement"}})
    return st, m


# -- checkpoint -----------------------------------------------------------------------------------------------
def tree(st: State) -> dict:
    t = common.tree(st)
    if st.ref_params is not None and (common.reference_is_adapters(st) or not common.uses_lora(st.base.ctx)):
        t["ref_params"] = st.ref_params  # LoRA: the stage-start adapters; the base itself is never checkpointed
    if st.kl_state is not None:
        t["kl_state"] = st.kl_state
    if st.cur_state is not None:
        t["curriculum"] = st.cur_state
    if st.pending:
        t["pending"] = rollout.pending_tree(list(st.pending))
    return t


def meta(st: State) -> dict:
    m = {**common.meta(st), "trained_units": st.trained_units}
    if common.reference_is_adapters(st):  # template: a resumed stage starts from fresh adapters, its reference the base
        m["reference"] = "adapters"
    if st.pending:
        m["pending"] = rollout.pending_meta(list(st.pending))
    return m


def template(st: State, meta: dict) -> dict:
    t = {k: v for k, v in tree(st).items() if k != "pending"}
    if meta.get("reference") == "adapters":
        t["ref_params"] = common.adapters_reference(st)
    if meta.get("pending"):
        t["pending"] = rollout.pending_template(meta["pending"])
    return t


def load(st: State, tree: dict, meta: dict) -> State:
    st = common.load(st, tree, meta)
    trained = int(meta.get("trained_units", 0))
    return dataclasses.replace(
        st, trained_units=trained,
        ref_params=jax.tree.map(jnp.asarray, tree["ref_params"]) if "ref_params" in tree else st.ref_params,
        kl_state={k: jnp.asarray(v, jnp.float32) for k, v in tree["kl_state"].items()} if "kl_state" in tree
        else st.kl_state,
        cur_state={k: np.asarray(v) for k, v in tree["curriculum"].items()} if "curriculum" in tree else st.cur_state,
        pending=tuple(rollout.pending_load(tree.get("pending"), meta.get("pending"),
                                           default_version=max(trained - 1, 0))))
