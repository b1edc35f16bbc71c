"""The training loop over a config's stages: cold-start SFT -> rejection sampling -> GRPO | PPO.

    summary = train(config, workdir, config_path="experiments/configs/quickstart.py")

`train` validates the config, loads the problems, builds the policy, prints a compute estimate
and runs the stages in order. Every stage is a sequence of *units* (an SFT epoch, a rejection
round, an RL iteration); after each unit the trainer logs metrics (workdir/metrics.jsonl and
TensorBoard) and saves a checkpoint (workdir/checkpoints), so a run started again on the same
workdir resumes exactly where it stopped: params, optimizer, KL controller, RNG, curriculum,
stage and unit (all randomness is derived from (seed, stage, unit), and a batch sampled ahead for
the producer / consumer overlap is checkpointed with the rest).

Stage kinds (see rl/config_validation.py for every field):
  sft        worked solutions from the tasks, loss on solution tokens only
  rejection  sample K per problem, keep answers that verify and pass the format check, dedupe,
             fine-tune on them; the kept share per round is logged
  grpo/ppo   curriculum picks problems and K -> sampler (temperature schedule) -> reward pool
             -> advantages (GRPO group-relative / PPO value head + GAE with the KL in the reward)
             -> epochs over token-budgeted minibatches -> KL controller update. The reference
             policy is the policy at the start of the RL stage.

Evaluation (validation split every `eval.every` RL iterations; validation + test at each stage
end; test before training as "initial") feeds the best-checkpoint choice and summary.json:
{"eval": {stage: {"pass@1", "pass@k", "maj@k", "format_rate", "mean_length"}}, "wall_seconds", "config"}.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from rl import checkpoint as ckpt_lib
from rl import config_validation as cv
from rl import curriculum as cur
from rl import evaluation as ev
from rl import metrics as mlib
from rl import rollout, schedules

SUMMARY_KEYS = ("pass@1", "pass@k", "maj@k", "format_rate", "mean_length")


# ----------------------------------------------------------------------------------------- randomness
def _key(seed: int, *parts: int) -> jax.Array:
    k = jax.random.key(int(seed))
    for p in parts:
        k = jax.random.fold_in(k, int(p))
    return k


def _rng(seed: int, *parts: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), *[int(p) for p in parts]])


# Purposes, so two uses of randomness in one unit never share a stream.
P_INIT, P_SFT, P_REJ, P_RL, P_EVAL, P_STATE = 1, 2, 3, 4, 5, 6


# ----------------------------------------------------------------------------------------- components
@dataclass
class Env:
    """Everything a stage needs besides the params: built once per run."""

    cfg: dict
    workdir: str
    model_cfg: object
    tok: object
    mesh: object
    rules: object
    train: list
    val: list
    test: list
    scorer: rollout.Scorer
    writer: mlib.MetricsWriter
    ckpt: ckpt_lib.Checkpointer
    logprob_fn: object = None
    value_fn: object = None
    generate: object = None
    row_multiple: int = 1
    progress: bool = True


def build_model_cfg(cfg: dict):
    from models.config import ModelConfig

    return ModelConfig(**cfg["model"])


def build_mesh(cfg: dict):
    """None for a single-device run (no sharding overhead), else models.sharding.make_mesh."""
    sizes = dict(cfg["mesh"])
    n = int(np.prod([v for v in sizes.values() if v != -1]))
    if -1 not in sizes.values() and n == 1:
        return None, None, 1
    from models import sharding

    if -1 in sizes.values():
        devices = jax.devices()
    else:
        devices = jax.devices()[:n]
        if len(devices) < n:
            raise cv.ConfigError(f"mesh needs {n} devices ({sizes}), only {len(jax.devices())} present")
    mesh = sharding.make_mesh(sizes, devices=devices)
    rules = tuple(sharding.DEFAULT_RULES)
    if cfg["sharding_rules"]:
        over = cv.parse_rules(cfg["sharding_rules"])
        rules = tuple((k, over.get(k, v)) for k, v in rules) + tuple((k, v) for k, v in over.items() if k not in dict(rules))
    row_multiple = int(mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))
    return mesh, rules, row_multiple


def load_problems(cfg: dict):
    """(train, validation, test) problem lists from the task mix."""
    from rl import tasks

    t = cfg["tasks"]
    kw = {"difficulty": t["difficulty"]}
    train = tasks.load_mix(t["mix"], t["n_train"], cfg["seed"], "train", **kw)
    val = tasks.load_mix(t["mix"], t["n_val"], cfg["seed"], "validation", **kw)
    test = tasks.load_mix(t["mix"], t["n_test"], cfg["seed"], "test", **kw)
    return train, val, test


def make_reward_pool(cfg: dict):
    """The reward worker pool scoring (text, gold) pairs with the config's RewardConfig."""
    from rewards.combine import RewardConfig
    from rewards.pool import RewardPool

    return RewardPool(n_workers=int(cfg["run"]["reward_workers"]), timeout=float(cfg["run"]["reward_timeout"]),
                      cfg=RewardConfig(**cfg["reward"]))


def prompt_text(problem, lang: str) -> str:
    from rl.tasks.render import render_prompt

    return render_prompt(problem, lang)


def solution_text(problem, lang: str) -> str:
    from rl.tasks.render import render_solution

    return render_solution(problem, lang)


# ----------------------------------------------------------------------------------------- batches
def _fixed_row_minibatches(batch: dict, rows: int, order: np.ndarray):
    """Split rows (in `order`) into blocks of exactly `rows` rows; the last is padded with empty rows."""
    n = len(order)
    for s in range(0, n, rows):
        idx = order[s : s + rows]
        mb = {k: np.asarray(v)[idx] for k, v in batch.items()}
        extra = rows - len(idx)
        if extra:
            mb = {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)]) for k, v in mb.items()}
            mb["attn_mask"][len(idx) :, 0] = 1  # one attended pad token keeps the softmax finite; masks stay 0
        yield mb


def seq_len(cfg: dict) -> int:
    """The fixed train-step length: every batch is padded to it, so each step function compiles once."""
    return int(cfg["tasks"]["max_prompt_len"] + cfg["sampling"]["max_new_tokens"])


def _chunked(fn, params, b: dict, temp: float, rows: int):
    """fn(params, tokens, attn_mask, temp) over fixed-size row chunks (one compile); host float32 results."""
    n = b["tokens"].shape[0]
    outs = []
    for s in range(0, n, rows):
        t, m = b["tokens"][s : s + rows], b["attn_mask"][s : s + rows]
        real = t.shape[0]
        if real < rows:
            t = np.concatenate([t, np.zeros((rows - real,) + t.shape[1:], t.dtype)])
            m = np.concatenate([m, np.zeros((rows - real,) + m.shape[1:], m.dtype)])
            m[real:, 0] = 1
        o = fn(params, jnp.asarray(t), jnp.asarray(m), temp)
        o = o if isinstance(o, tuple) else (o,)
        outs.append([np.asarray(x, np.float32)[:real] for x in o])
    res = [np.concatenate([o[i] for o in outs], 0) for i in range(len(outs[0]))]
    return tuple(res) if len(res) > 1 else res[0]


def check_fit(cfg: dict, tok, problems) -> None:
    """Before any compute: every prompt fits tasks.max_prompt_len and, when a stage trains on worked
    solutions, every solution (+EOS) fits sampling.max_new_tokens."""
    lang = cfg["tasks"]["lang"]
    P, N = cfg["tasks"]["max_prompt_len"], cfg["sampling"]["max_new_tokens"]
    sft = [s for s in cfg["stages"] if s["kind"] == "sft"]
    n_sft = max([s["n_problems"] or len(problems) for s in sft], default=0)
    for i, p in enumerate(problems):
        n_p = len(tok.encode(prompt_text(p, lang)))
        if n_p > P:
            raise cv.ConfigError(f"tasks.max_prompt_len ({P}) is too small: the prompt of {p.question!r} has {n_p} tokens")
        if i < n_sft:
            n_a = len(solution_text(p, lang).encode("utf-8")) + 1
            if n_a > N:
                raise cv.ConfigError(f"sampling.max_new_tokens ({N}) is too small for the worked solutions: "
                                     f"{p.question!r} needs {n_a} tokens with EOS")


def _rows_for_budget(token_budget: int, T: int, multiple: int) -> int:
    r = max(1, token_budget // T)
    return max(multiple, (r // multiple) * multiple)


def _mean_metrics(ms: list[dict]) -> dict:
    """Average a list of step-metric dicts (host values)."""
    if not ms:
        return {}
    out = {}
    for k in ms[0]:
        vals = [np.asarray(m[k], np.float64) for m in ms if k in m]
        out[k] = np.mean(np.stack(vals), axis=0)
    return out


def _to_host(tree):
    return jax.tree.map(lambda x: np.asarray(x), jax.device_get(tree))


# ----------------------------------------------------------------------------------------- evaluation
def evaluate(env: Env, params, problems, key, k: int, temperature: float) -> dict:
    """Greedy pass@1 / format / length plus k-sample pass@k, maj@k, diversity on `problems`."""
    from rewards.parse import extract_answer

    lang, smp = env.cfg["tasks"]["lang"], env.cfg["sampling"]
    prompts = [prompt_text(p, lang) for p in problems]
    golds = [p.answer for p in problems]
    n = len(problems)
    greedy = rollout.sample(env.generate, params, env.model_cfg, env.tok, prompts, [1] * n, jax.random.fold_in(key, 0),
                            temperature=0.0, max_new_tokens=smp["max_new_tokens"], max_prompt_len=env.cfg["tasks"]["max_prompt_len"],
                            rows_per_call=smp["batch_rows"])
    fut_g = env.scorer.submit(greedy.texts, golds, greedy.lengths)
    samples = None
    if k > 0:
        samples = rollout.sample(env.generate, params, env.model_cfg, env.tok, prompts, [k] * n, jax.random.fold_in(key, 1),
                                 temperature=temperature, max_new_tokens=smp["max_new_tokens"], top_p=smp["top_p"],
                                 top_k=smp["top_k"], max_prompt_len=env.cfg["tasks"]["max_prompt_len"],
                                 rows_per_call=smp["batch_rows"])
        s_scores = env.scorer.result(env.scorer.submit(samples.texts, [g for g in golds for _ in range(k)], samples.lengths))
    g_scores = env.scorer.result(fut_g)
    recs = []
    for i in range(n):
        r = ev.ProblemSamples(greedy_correct=bool(g_scores[i]["outcome"] > 0.5), greedy_format=float(g_scores[i]["format"]),
                              greedy_text=greedy.texts[i])
        if samples is not None:
            sl = slice(i * k, (i + 1) * k)
            r.texts = samples.texts[sl]
            r.correct = [bool(s["outcome"] > 0.5) for s in s_scores[sl]]
            r.formats = [float(s["format"]) for s in s_scores[sl]]
            r.answers = [extract_answer(t) for t in r.texts]
        recs.append(r)
    return ev.summarize(recs, k)


def eval_key(env: Env, stage_idx: int, unit: int) -> jax.Array:
    return _key(env.cfg["seed"], P_EVAL, stage_idx + 1, unit)  # stage -1 = the initial eval


# ----------------------------------------------------------------------------------------- compute estimate
def compute_estimate(cfg: dict) -> tuple[str, dict]:
    """Tokens to generate, verifier calls and train tokens per unit and in total, per stage."""
    N = cfg["sampling"]["max_new_tokens"]
    P = cfg["tasks"]["max_prompt_len"]
    rows = []
    tot = {"gen_tokens": 0, "verifier_calls": 0, "train_tokens": 0}
    e = cfg["eval"]
    evals = 0
    for s in cfg["stages"]:
        kind = s["kind"]
        if kind == "sft":
            n = s["n_problems"] or cfg["tasks"]["n_train"]
            per = {"gen_tokens": 0, "verifier_calls": 0, "train_tokens": n * (P + N)}
            units = s["epochs"]
        elif kind == "rejection":
            g = s["n_problems"] * s["samples"]
            per = {"gen_tokens": g * N, "verifier_calls": g, "train_tokens": s["epochs"] * g * (P + N)}  # upper bound
            units = s["rounds"]
        else:
            cs = s["curriculum"]
            k = float(np.mean(cs["samples"])) if cs["enabled"] else s["samples"]
            g = int(s["n_prompts"] * k)
            per = {"gen_tokens": g * N, "verifier_calls": g, "train_tokens": s["epochs"] * g * (P + N)}
            units = s["iterations"]
            evals += (s["iterations"] // e["every"]) if e["every"] else 0
        evals += 1
        for kk in tot:
            tot[kk] += per[kk] * units
        rows.append((s["name"], kind, units, per))
    per_eval = (e["n_val"] + e["n_test"]) * (1 + e["k"])
    tot["gen_tokens"] += per_eval * N * (evals + 1)
    tot["verifier_calls"] += per_eval * (evals + 1)
    lines = ["compute estimate (upper bounds: every answer runs to max_new_tokens):",
             f"  {'stage':<16}{'kind':<10}{'units':>6}{'gen tok/unit':>14}{'verifier/unit':>15}{'train tok/unit':>16}"]
    for name, kind, units, per in rows:
        lines.append(f"  {name:<16}{kind:<10}{units:>6}{per['gen_tokens']:>14,}{per['verifier_calls']:>15,}{per['train_tokens']:>16,}")
    lines.append(f"  evals: {evals + 1} x {per_eval:,} answers")
    lines.append(f"  total: {tot['gen_tokens']:,} generated tokens, {tot['verifier_calls']:,} verifier calls, "
                 f"{tot['train_tokens']:,} train tokens")
    return "\n".join(lines), tot


# ----------------------------------------------------------------------------------------- train-state helpers
def _loss_optim(stage: dict, total_steps: int, temperature: float = 1.0):
    from rl.train_step import LossConfig, OptimConfig

    lk = cv.loss_kwargs(stage, temperature)
    ok = cv.optim_kwargs(stage, total_steps)
    ok["warmup_steps"] = min(ok["warmup_steps"], ok["total_steps"])
    if ok["grad_clip"] == 0:
        ok["grad_clip"] = None
    if lk.get("value_clip") == 0:
        lk["value_clip"] = None
    return LossConfig(**lk), OptimConfig(**ok)


def _kl_controller(stage: dict):
    from rl.kl_control import AdaptiveKL, FixedKL

    if stage["kind"] not in ("grpo", "ppo"):
        return None
    if stage["kl_adaptive"]:
        return AdaptiveKL(init_coef=float(stage["kl_coef"]), target=float(stage["kl_target"]), horizon=float(stage["kl_horizon"]))
    return FixedKL(float(stage["kl_coef"]))


UNIT_FIELD = {"sft": "epochs", "rejection": "rounds", "grpo": "iterations", "ppo": "iterations"}


def stage_units(stage: dict) -> int:
    """Units in a stage: SFT epochs, rejection rounds or RL iterations."""
    return int(stage[UNIT_FIELD[stage["kind"]]])


def _sft_rows(batch_size: int, multiple: int) -> int:
    """Rows per SFT step: the batch size (a short last batch is padded: one compiled shape)."""
    return max(multiple, int(math.ceil(batch_size / multiple)) * multiple)


def stage_total_steps(cfg: dict, stage: dict) -> int:
    """Optimizer updates the stage's learning-rate schedule spans (an estimate for rejection rounds)."""
    kind = stage["kind"]
    if kind == "sft":
        n = stage["n_problems"] or cfg["tasks"]["n_train"]
        return stage["epochs"] * int(math.ceil(n / stage["batch_size"]))
    if kind == "rejection":
        kept = stage["n_problems"] * min(stage["samples"], stage["max_keep_per_problem"])
        return stage["rounds"] * stage["epochs"] * int(math.ceil(kept / stage["batch_size"]))
    cs = stage["curriculum"]
    k = float(np.mean(cs["samples"])) if cs["enabled"] else stage["samples"]
    T = cfg["tasks"]["max_prompt_len"] + cfg["sampling"]["max_new_tokens"]
    rows = max(1, stage["token_budget"] // T)
    return stage["iterations"] * stage["epochs"] * int(math.ceil(stage["n_prompts"] * k / rows))


class StageRunner:
    """Holds one stage's train state and step functions; `run_unit(u)` does one unit and returns metrics."""

    def __init__(self, env: Env, si: int, stage: dict, params):
        from rl.train_step import init_train_state, make_train_step

        self.env, self.si, self.stage, self.kind = env, si, stage, stage["kind"]
        self.units = stage_units(stage)
        self.temp0 = stage.get("temperature_start", 1.0)
        # Logprobs (old, ref, and in the loss) are those of the policy itself (temperature 1): the ratio starts
        # at exactly 1 whatever the sampling temperature, and the step compiles once for the whole schedule.
        self.loss_cfg, self.optim_cfg = _loss_optim(stage, stage_total_steps(env.cfg, stage))
        self.ctl = _kl_controller(stage)
        key = _key(env.cfg["seed"], P_STATE, si)
        self.state = init_train_state(env.model_cfg, self.loss_cfg, self.optim_cfg, key, mesh=env.mesh, rules=env.rules,
                                      params=params, kl_controller=self.ctl)
        self.step_fn = _cached(("step", env.model_cfg, self.loss_cfg, self.optim_cfg, self.ctl, env.mesh, env.rules),
                               lambda: make_train_step(env.model_cfg, self.loss_cfg, self.optim_cfg, self.ctl, mesh=env.mesh,
                                                       rules=env.rules, update_kl_in_step=False))
        self.ref_params = None
        self.rows = _rows_for_budget(stage.get("token_budget", 4096), seq_len(env.cfg), env.row_multiple)
        self.cur_state = None
        self.pending = None  # a sampled, not yet trained batch (producer / consumer overlap)
        if self.kind in ("grpo", "ppo"):
            if stage["kl_coef"] > 0 or stage["kl_adaptive"]:
                self.ref_params = jax.tree.map(jnp.copy, {k: v for k, v in self.state["params"].items() if k != "value_head"})
            if stage["curriculum"]["enabled"]:
                self.cur_cfg = cur.CurriculumConfig(
                    easy_above=stage["curriculum"]["easy_above"], hard_below=stage["curriculum"]["hard_below"],
                    samples=tuple(stage["curriculum"]["samples"]), weights=tuple(stage["curriculum"]["weights"]),
                    refresh_every=stage["curriculum"]["refresh_every"], decay=stage["curriculum"]["decay"])
                self.cur_state = cur.init_state(len(env.train))
        if self.kind == "sft":
            self._sft_data()

    # -- checkpoint tree ----------------------------------------------------------------------
    def tree(self) -> dict:
        t = {"train_state": self.state}
        if self.ref_params is not None:
            t["ref_params"] = self.ref_params
        if self.cur_state is not None:
            t["curriculum"] = self.cur_state
        if self.pending is not None:
            t["pending"] = self.pending["arrays"]
        return t

    def pending_meta(self):
        if self.pending is None:
            return None
        return {"shapes": {k: [list(v.shape), str(v.dtype)] for k, v in self.pending["arrays"].items()},
                "unit": self.pending["unit"], "temperature": self.pending["temperature"]}

    def load_tree(self, tree: dict, pending_meta) -> None:
        st = tree["train_state"]
        self.state = jax.tree.map(lambda t, x: jnp.asarray(x, dtype=t.dtype) if not _is_key(t) else jax.random.wrap_key_data(jnp.asarray(x)),
                                  self.state, st)
        if self.env.mesh is not None:
            from rl.train_step import state_shardings

            self.state = jax.device_put(self.state, state_shardings(self.env.model_cfg, self.loss_cfg, self.optim_cfg,
                                                                    self.env.mesh, self.env.rules))
        if "ref_params" in tree:
            self.ref_params = jax.tree.map(jnp.asarray, tree["ref_params"])
        if "curriculum" in tree:
            self.cur_state = {k: np.asarray(v) for k, v in tree["curriculum"].items()}
        if "pending" in tree and pending_meta:
            self.pending = {"arrays": {k: np.asarray(v) for k, v in tree["pending"].items()},
                            "unit": pending_meta["unit"], "temperature": pending_meta["temperature"]}

    def template(self, pending_meta) -> dict:
        t = self.tree()
        if pending_meta:
            t["pending"] = {k: np.zeros(s, d) for k, (s, d) in pending_meta["shapes"].items()}
        return t

    def policy_params(self):
        return {k: v for k, v in self.state["params"].items() if k != "value_head"}

    # -- training on a batch ----------------------------------------------------------------------
    def _train_on(self, batch: dict, epochs: int, rng: np.random.Generator, rows: int) -> tuple[list[dict], float]:
        ms, t0 = [], time.time()
        n = batch["tokens"].shape[0]
        for _ in range(epochs):
            order = rng.permutation(n)
            for mb in _fixed_row_minibatches(batch, rows, order):
                self.state, m = self.step_fn(self.state, {k: jnp.asarray(v) for k, v in mb.items()})
                ms.append(m)
        ms = [_to_host(m) for m in ms]  # fetched once at the end: dispatch stays asynchronous
        return ms, time.time() - t0

    # -- SFT ----------------------------------------------------------------------------------
    def _sft_data(self):
        env, s = self.env, self.stage
        lang = env.cfg["tasks"]["lang"]
        probs = env.train[: (s["n_problems"] or len(env.train))]
        self.sft_prompts = [prompt_text(p, lang) for p in probs]
        self.sft_answers = [solution_text(p, lang) for p in probs]

    def _sft_batch(self, prompts, answers):
        from rl.sft import build_sft_batch

        T = seq_len(self.env.cfg)
        return build_sft_batch(prompts, answers, self.env.tok, T)

    def _unit_sft(self, u: int) -> dict:
        batch = self._sft_batch(self.sft_prompts, self.sft_answers)
        rows = _sft_rows(self.stage["batch_size"], self.env.row_multiple)
        ms, dt = self._train_on(batch, 1, _rng(self.env.cfg["seed"], P_SFT, self.si, u), rows)
        m = _mean_metrics(ms)
        n_tok = float(batch["loss_mask"].sum())
        return {"loss": m.get("loss/total"), "grad_norm": m.get("grad_norm"), "lr": m.get("lr"),
                "train_tokens_per_s": n_tok / max(dt, 1e-9), "time/train": dt, "n_examples": len(self.sft_prompts),
                **_router_metrics(m)}

    # -- rejection sampling -------------------------------------------------------------------
    def _unit_rejection(self, u: int) -> dict:
        env, s = self.env, self.stage
        lang, smp = env.cfg["tasks"]["lang"], env.cfg["sampling"]
        rng = _rng(env.cfg["seed"], P_REJ, self.si, u)
        ids = rng.choice(len(env.train), size=s["n_problems"], replace=False)
        probs = [env.train[i] for i in ids]
        prompts = [prompt_text(p, lang) for p in probs]
        t0 = time.time()
        smpl = rollout.sample(env.generate, self.policy_params(), env.model_cfg, env.tok, prompts, [s["samples"]] * len(probs),
                              _key(env.cfg["seed"], P_REJ, self.si, u), temperature=s["temperature"],
                              max_new_tokens=smp["max_new_tokens"], top_p=smp["top_p"], top_k=smp["top_k"],
                              max_prompt_len=env.cfg["tasks"]["max_prompt_len"], rows_per_call=smp["batch_rows"])
        t_sample = time.time() - t0
        golds = [probs[i].answer for i in smpl.prompt_index]
        t0 = time.time()
        scores = env.scorer.result(env.scorer.submit(smpl.texts, golds, smpl.lengths))
        t_score = time.time() - t0
        kept_p, kept_a, per_problem, seen = [], [], {}, set()
        n_correct = 0
        for r, (text, sc) in enumerate(zip(smpl.texts, scores)):
            ok = sc["outcome"] > 0.5
            n_correct += ok
            if not ok or sc["format"] < s["min_format"]:
                continue
            pi = int(smpl.prompt_index[r])
            key = (pi, " ".join(text.split()))
            if key in seen or per_problem.get(pi, 0) >= s["max_keep_per_problem"]:
                continue
            seen.add(key)
            per_problem[pi] = per_problem.get(pi, 0) + 1
            kept_p.append(prompts[pi])
            kept_a.append(text)
        out = {"kept_share": len(kept_a) / len(smpl.texts), "problems_with_kept": len(per_problem) / len(probs),
               "sample_accuracy": n_correct / len(smpl.texts), "n_kept": len(kept_a),
               "format_rate": float(np.mean([sc["format"] for sc in scores])),
               "reward/mean": float(np.mean([sc["total"] for sc in scores])),
               "response_length": float(np.mean(smpl.lengths)),
               "sample_tokens_per_s": float(smpl.lengths.sum()) / max(t_sample, 1e-9),
               "time/sample": t_sample, "time/score": t_score}
        if kept_a:
            batch = self._sft_batch(kept_p, kept_a)
            rows = _sft_rows(s["batch_size"], env.row_multiple)
            ms, dt = self._train_on(batch, s["epochs"], rng, rows)
            m = _mean_metrics(ms)
            out.update({"loss": m.get("loss/total"), "grad_norm": m.get("grad_norm"), "lr": m.get("lr"), "time/train": dt,
                        "train_tokens_per_s": float(batch["loss_mask"].sum()) * s["epochs"] / max(dt, 1e-9),
                        **_router_metrics(m)})
        return out

    # -- RL -------------------------------------------------------------------------------------
    def _pick(self, u: int):
        env, s = self.env, self.stage
        if self.cur_state is not None:
            if cur.due_refresh(self.cur_state, u, self.cur_cfg.refresh_every):
                self.cur_state = cur.refresh(self.cur_state, u, self.cur_cfg)
            return cur.pick(self.cur_state, self.cur_cfg, s["n_prompts"], env.cfg["seed"] * 1000003 + self.si, u)
        ids = _rng(env.cfg["seed"], P_RL, self.si, u).choice(len(env.train), size=s["n_prompts"], replace=False)
        return np.sort(ids), np.full((len(ids),), s["samples"], np.int64)

    def _temperature(self, u: int) -> float:
        s = self.stage
        return schedules.temperature_at(u, s["iterations"], s["temperature_start"], s["temperature_end"], s["temperature_kind"])

    def _produce(self, u: int) -> dict:
        """Sample unit u's batch with the current params; old / ref logprobs (and PPO values) computed now."""
        env = self.env
        lang, smp = env.cfg["tasks"]["lang"], env.cfg["sampling"]
        ids, ks = self._pick(u)
        temp = self._temperature(u)
        prompts = [prompt_text(env.train[i], lang) for i in ids]
        t0 = time.time()
        params = self.policy_params()
        smpl = rollout.sample(env.generate, params, env.model_cfg, env.tok, prompts, ks, _key(env.cfg["seed"], P_RL, self.si, u),
                              temperature=temp, max_new_tokens=smp["max_new_tokens"], top_p=smp["top_p"], top_k=smp["top_k"],
                              max_prompt_len=env.cfg["tasks"]["max_prompt_len"], rows_per_call=smp["batch_rows"])
        t_sample = time.time() - t0
        p_ids = [env.tok.encode(p, add_bos=True) for p in prompts]
        b = rollout.build_batch(p_ids, smpl, seq_len(env.cfg), pad_id=env.tok.PAD)
        t0 = time.time()
        rows = self.rows
        if self.kind == "ppo":
            old, values = _chunked(env.value_fn, self.state["params"], b, 1.0, rows)
            b["old_values"] = values * b["loss_mask"]
        else:
            old = _chunked(env.logprob_fn, params, b, 1.0, rows)
        b["old_logp"] = old * b["loss_mask"]
        if self.ref_params is not None:
            b["ref_logp"] = _chunked(env.logprob_fn, self.ref_params, b, 1.0, rows) * b["loss_mask"]
        t_logp = time.time() - t0
        arrays = {**b, "ids": ids.astype(np.int64), "ks": ks.astype(np.int64), "lengths": smpl.lengths,
                  "prompt_index": smpl.prompt_index.astype(np.int64),
                  "times": np.array([t_sample, t_logp, float(smpl.lengths.sum())], np.float64)}
        return {"arrays": arrays, "unit": u, "temperature": temp}

    def _texts(self, arrays: dict) -> list[str]:
        toks, start, lens = arrays["tokens"], arrays["resp_start"], arrays["lengths"]
        return [self.env.tok.decode(toks[r, start[r] : start[r] + lens[r]]) for r in range(toks.shape[0])]

    def _unit_rl(self, u: int) -> dict:
        env, s = self.env, self.stage
        if self.pending is None or self.pending["unit"] != u:
            self.pending = self._produce(u)
        cur_b = self.pending
        a = cur_b["arrays"]
        texts = self._texts(a)
        golds = [env.train[int(a["ids"][p])].answer for p in a["prompt_index"]]
        fut = env.scorer.submit(texts, golds, a["lengths"])
        # Producer / consumer: while the reward pool scores this batch, sample the next one.
        self.pending = None
        t0 = time.time()
        nxt = self._produce(u + 1) if (env.cfg["run"]["overlap"] and u + 1 < self.units) else None
        t_overlap = time.time() - t0
        t0 = time.time()
        scores = env.scorer.result(fut)
        t_wait = time.time() - t0
        metrics = self._update(a, texts, scores, cur_b["temperature"], u)
        metrics.update({"time/sample": float(a["times"][0]), "time/logprobs": float(a["times"][1]),
                        "time/score_wait": t_wait, "time/overlap_sample": t_overlap,
                        "sample_tokens_per_s": float(a["times"][2]) / max(float(a["times"][0]), 1e-9)})
        self.pending = nxt
        return metrics

    def _rewards(self, a: dict, texts: list[str], scores: list[dict]) -> tuple[np.ndarray, dict]:
        tot = np.array([sc["total"] for sc in scores], np.float64)
        m = {"reward/mean": float(tot.mean()), "reward/std": float(tot.std())}
        for k in scores[0]:
            vals = [sc[k] for sc in scores if isinstance(sc.get(k), (int, float, bool, np.floating))]
            if len(vals) == len(scores):
                m[f"reward/{k}"] = float(np.mean(vals))
        m["accuracy"] = float(np.mean([sc["outcome"] > 0.5 for sc in scores]))
        m["format_rate"] = float(np.mean([sc["format"] for sc in scores]))
        return tot, m

    def _step_scores(self, a: dict, texts: list[str]):
        """[N, S] step scores (sympy-checked: 1 right, 0 wrong / unchecked), their token end positions, mask."""
        from rewards.parse import step_spans
        from rewards.steps import check_steps

        rows = []
        for r, t in enumerate(texts):
            spans = step_spans(t)
            checks = check_steps(t)
            row = []
            for (st, en), c in zip(spans, checks):
                if c is None:
                    continue
                tok_end = int(a["resp_start"][r]) + len(t[:en].encode("utf-8")) - 1
                row.append((float(c), tok_end))
            rows.append(row)
        S = max(1, max(len(r) for r in rows))
        sc = np.zeros((len(texts), S), np.float32)
        pos = np.zeros((len(texts), S), np.int32)
        msk = np.zeros((len(texts), S), np.int32)
        for i, row in enumerate(rows):
            for j, (c, p) in enumerate(row):
                sc[i, j], pos[i, j], msk[i, j] = c, p, 1
        return sc, pos, msk

    def _advantages(self, a: dict, texts: list[str], rewards: np.ndarray) -> np.ndarray:
        """Token advantages [N, T] for GRPO (group-relative; optional step rewards / process GRPO)."""
        from rl import advantages as advm

        s = self.stage
        ks, T = a["ks"], a["tokens"].shape[1]
        est = advm.get_estimator("rloo" if s["advantage"] == "rloo" else ("grpo" if s["scale_by_std"] else "dr_grpo"))
        seq_adv = np.zeros_like(rewards, dtype=np.float32)
        tok_adv = None
        if s["process_grpo"] or s["step_rewards"]:
            sc, pos, msk = self._step_scores(a, texts)
        start = 0
        # groups with the same K are contiguous (the curriculum sorts by bucket); one call per run of equal K
        gi = 0
        while gi < len(ks):
            k = int(ks[gi])
            gj = gi
            while gj < len(ks) and ks[gj] == k:
                gj += 1
            rows = slice(start, start + (gj - gi) * k)
            seq_adv[rows] = np.asarray(est(jnp.asarray(rewards[rows], jnp.float32), k))
            if s["process_grpo"]:
                pa = np.asarray(advm.process_grpo(sc[rows], pos[rows], msk[rows], k, T))
                tok_adv = np.zeros((len(rewards), T), np.float32) if tok_adv is None else tok_adv
                tok_adv[rows] = pa
            start = rows.stop
            gi = gj
        if s["process_grpo"]:
            return tok_adv
        out = np.broadcast_to(seq_adv[:, None], (len(rewards), T)).astype(np.float32)
        if s["step_rewards"]:
            placed = np.asarray(advm.place_step_rewards(sc - 0.5, pos, T, msk))  # +-0.5 for a right / wrong step
            rtg = np.flip(np.cumsum(np.flip(placed, 1), 1), 1)  # each token gets the step rewards ahead of it
            out = out + s["step_reward_weight"] * rtg
        return out

    def _update(self, a: dict, texts: list[str], scores: list[dict], temp: float, u: int) -> dict:
        from rl import advantages as advm
        from rl import losses

        env, s = self.env, self.stage
        rewards, m = self._rewards(a, texts, scores)
        ks = a["ks"]
        if self.cur_state is not None:
            corr = np.array([sc["outcome"] > 0.5 for sc in scores], np.float64)
            n_corr = np.add.reduceat(corr, np.concatenate([[0], np.cumsum(ks)[:-1]]))
            self.cur_state = cur.record(self.cur_state, a["ids"], n_corr, ks, self.cur_cfg.decay)
            m.update({f"curriculum/{k}": v for k, v in cur.bucket_counts(self.cur_state).items()})
        batch = {k: a[k] for k in ("tokens", "attn_mask", "loss_mask", "old_logp")}
        if "ref_logp" in a:
            batch["ref_logp"] = a["ref_logp"]
        mask = a["loss_mask"].astype(np.float32)
        if self.kind == "grpo":
            batch["advantages"] = self._advantages(a, texts, rewards)
        else:  # PPO: outcome at the last response token, KL penalty per token (kl_place reward), GAE
            T = a["tokens"].shape[1]
            last = np.clip(a["resp_start"] + a["lengths"] - 1, 0, T - 1)
            tr = np.zeros((len(rewards), T), np.float32)
            tr[np.arange(len(rewards)), last] = rewards
            coef = float(self.state["kl_state"]["coef"]) * (
                schedules.kl_coef_at(u, 1.0, s["kl_ramp_steps"]) if not s["kl_adaptive"] else 1.0)
            if "ref_logp" in a and s["kl_place"] == "reward":
                kl_tok = np.asarray(losses.kl_penalty(jnp.asarray(a["old_logp"]), jnp.asarray(a["ref_logp"]), s["kl_kind"]))
                tr = tr - coef * kl_tok * mask
            if s["step_rewards"]:
                sc, pos, msk = self._step_scores(a, texts)
                tr = tr + s["step_reward_weight"] * np.asarray(advm.place_step_rewards(sc - 0.5, pos, T, msk))
            adv, ret = advm.gae(jnp.asarray(tr), jnp.asarray(a["old_values"]), jnp.asarray(mask), s["gamma"], s["lam"])
            adv = np.asarray(advm.whiten(adv, jnp.asarray(mask)))
            batch["advantages"], batch["returns"], batch["old_values"] = adv * mask, np.asarray(ret) * mask, a["old_values"]
        keep_rows = np.ones(len(rewards), bool)
        if s["filter_zero_variance"] and self.kind == "grpo":
            start = 0
            for k in ks:
                if s["process_grpo"]:  # step scores can differ when outcomes do not: keep groups with any signal
                    keep_rows[start : start + k] = bool(np.any(batch["advantages"][start : start + k] != 0))
                else:
                    g = rewards[start : start + k]
                    keep_rows[start : start + k] = g.max() != g.min()
                start += k
        m["kept_groups"] = float(np.mean([keep_rows[st] for st in np.concatenate([[0], np.cumsum(ks)[:-1]])]))
        m["response_length"] = float(np.mean(a["lengths"]))
        m["temperature"] = temp
        m["kl_coef"] = float(self.state["kl_state"]["coef"])
        if not s["kl_adaptive"] and s["kl_ramp_steps"] and self.kind == "grpo":
            ramp = schedules.kl_coef_at(u, float(s["kl_coef"]), s["kl_ramp_steps"])
            self.state = {**self.state, "kl_state": {"coef": jnp.asarray(ramp, jnp.float32)}}
            m["kl_coef"] = ramp
        idx = np.nonzero(keep_rows)[0]
        if len(idx) == 0:
            m["skipped_iteration"] = 1.0
            return m
        batch = {k: np.asarray(v)[idx] for k, v in batch.items()}
        ms, dt = self._train_on(batch, s["epochs"], _rng(env.cfg["seed"], P_RL, self.si, u, 1), self.rows)
        tm = _mean_metrics(ms)
        kl_measured = float(tm.get("kl", 0.0))
        if self.ctl is not None and "ref_logp" in batch:
            from rl.train_step import update_kl

            self.state = update_kl(self.state, self.ctl, jnp.asarray(kl_measured), int(len(idx)))
        m.update({"kl": kl_measured, "entropy": tm.get("entropy"), "loss": tm.get("loss/total"),
                  "loss/policy": tm.get("loss/policy"), "loss/value": tm.get("loss/value"), "grad_norm": tm.get("grad_norm"),
                  "lr": tm.get("lr"), "skipped_steps": float(tm.get("skipped", 0.0)) * len(ms),
                  "time/train": dt, "train_tokens_per_s": float(batch["attn_mask"].sum()) * s["epochs"] / max(dt, 1e-9),
                  **{k: v for k, v in tm.items() if k.startswith("policy/") or k.startswith("value/")},
                  **_router_metrics(tm)})
        return m

    def run_unit(self, u: int) -> dict:
        if self.kind == "sft":
            return self._unit_sft(u)
        if self.kind == "rejection":
            return self._unit_rejection(u)
        return self._unit_rl(u)


_FN_CACHE: dict = {}


def _cached(key, build):
    """Jitted step / logprob functions are kept per (configs, mesh): a second run in the same process
    (a test, a sweep in one process) reuses their compiled code instead of compiling again."""
    if key not in _FN_CACHE:
        _FN_CACHE[key] = build()
    return _FN_CACHE[key]


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _router_metrics(m: dict) -> dict:
    out = {}
    if "router/expert_load" in m:
        load = np.asarray(m["router/expert_load"])  # [n_moe_layers, n_experts]
        if load.ndim == 2 and load.size:
            # balance per layer: max load over the uniform share (1.0 = perfectly balanced)
            out["router/max_load_ratio"] = load.max(axis=1) * load.shape[1]
    if "router/dropped_fraction" in m:
        out["router/dropped_fraction"] = np.asarray(m["router/dropped_fraction"])
    if "loss/router_aux" in m:
        out["router/aux_loss"] = m["loss/router_aux"]
    if "loss/router_z" in m:
        out["router/z_loss"] = m["loss/router_z"]
    return out


# ----------------------------------------------------------------------------------------- the run
def _summary_entry(test_metrics: dict) -> dict:
    return {k: float(test_metrics[k]) for k in SUMMARY_KEYS}


def _write_summary(env: Env, summary: dict) -> None:
    with open(os.path.join(env.workdir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)


def _eval_full(env: Env, params, si: int, unit: int, splits=("validation", "test")) -> dict:
    e = env.cfg["eval"]
    out = {}
    for j, split in enumerate(splits):
        probs = env.val[: e["n_val"]] if split == "validation" else env.test[: e["n_test"]]
        out[split] = evaluate(env, params, probs, jax.random.fold_in(eval_key(env, si, unit), j), e["k"], e["temperature"])
    return out


def train(config, workdir: str, config_path: str = "") -> dict:
    """Run (or resume) every stage of `config` in `workdir`; returns the summary dict."""
    from models import sampling
    from models.tokenizer import ByteTokenizer
    from rl.train_step import make_logprob_fn

    cv.validate(config)
    cfg = cv.to_dict(config)
    t_start = time.time()
    if cfg["run"]["distributed"]:
        jax.distributed.initialize()  # coordinator / process ids from the cluster environment
    os.makedirs(workdir, exist_ok=True)
    model_cfg = build_model_cfg(cfg)
    mesh, rules, row_multiple = build_mesh(cfg)
    train_p, val_p, test_p = load_problems(cfg)
    check_fit(cfg, ByteTokenizer(), train_p)
    check_fit({**cfg, "stages": []}, ByteTokenizer(), val_p + test_p)
    pool = make_reward_pool(cfg)
    ck = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=cfg["checkpoint"]["keep"],
                               keep_best=cfg["checkpoint"]["keep_best"])
    latest = ck.latest_step()
    meta = ck.restore_meta(latest) if latest is not None else None
    writer = mlib.MetricsWriter(workdir, tensorboard=cfg["log"]["tensorboard"],
                                truncate_after_step=(meta["global_unit"] if meta else -1))
    env = Env(cfg=cfg, workdir=workdir, model_cfg=model_cfg, tok=ByteTokenizer(), mesh=mesh, rules=rules, train=train_p,
              val=val_p, test=test_p, scorer=rollout.Scorer(pool), writer=writer, ckpt=ck,
              row_multiple=row_multiple, progress=cfg["log"]["progress"])
    env.logprob_fn = _cached(("logp", model_cfg, mesh, rules), lambda: make_logprob_fn(model_cfg, mesh=mesh, rules=rules))
    env.value_fn = _cached(("value", model_cfg, mesh, rules),
                           lambda: make_logprob_fn(model_cfg, mesh=mesh, rules=rules, with_values=True))
    env.generate = lambda params, mcfg, prompts, key, **kw: sampling.generate(params, mcfg, prompts, key, mesh=mesh, rules=rules, **kw)

    est_text, _ = compute_estimate(cfg)
    print(est_text, flush=True)
    try:
        summary = _run_stages(env, cfg, meta, latest, config_path, t_start)
    finally:
        env.scorer.close()
        writer.close()
        ck.close()
    return summary


def _run_stages(env: Env, cfg: dict, meta, latest, config_path: str, t_start: float) -> dict:
    from tqdm import tqdm

    stop_after = cfg["run"]["stop_after"]
    ran = 0
    stages = cfg["stages"]
    if meta is None:
        params = None
        si, u0 = 0, 0
        summary = {"eval": {}, "wall_seconds": 0.0, "config": config_path}
        history: list[dict] = []
        wall_before = 0.0
        gunit = 0
    else:
        si, u0 = meta["stage"], meta["unit"]
        summary, history = meta["summary"], meta["history"]
        wall_before, gunit = meta["wall_seconds"], meta["global_unit"]
        params = None
        print(f"resuming from checkpoint {latest}: stage {si} ({stages[si]['name']}), unit {u0}", flush=True)

    if params is None:
        from models import transformer

        params = transformer.init(env.model_cfg, _key(cfg["seed"], P_INIT))
    runner = None
    if meta is not None:
        runner = StageRunner(env, si, stages[si], params)
        tree = env.ckpt.restore(latest, runner.template(meta.get("pending")))
        runner.load_tree(tree, meta.get("pending"))
        params = runner.policy_params()
    elif cfg["eval"]["initial"]:
        res = _eval_full(env, params, -1, 0, splits=("validation", "test"))
        summary["eval"]["initial"] = _summary_entry(res["test"])
        history.append({"stage": "initial", **res})
        env.writer.write(0, {"validation": res["validation"], "test": res["test"]}, stage="initial", phase="eval")

    while si < len(stages):
        stage = stages[si]
        if runner is None:
            runner = StageRunner(env, si, stage, params)
        n_units = runner.units
        bar = tqdm(total=n_units, initial=u0, desc=f"{stage['name']} ({stage['kind']})", disable=not env.progress,
                   dynamic_ncols=True)
        for u in range(u0, n_units):
            t0 = time.time()
            m = runner.run_unit(u)
            m["time/unit"] = time.time() - t0
            gunit += 1
            last = u == n_units - 1
            val_pass1 = None
            e = cfg["eval"]
            if stage["kind"] in ("grpo", "ppo") and e["every"] and (u + 1) % e["every"] == 0 and not last:
                vr = evaluate(env, runner.policy_params(), env.val[: e["n_val"]], eval_key(env, si, u), e["k"], e["temperature"])
                val_pass1 = vr["pass@1"]
                hist_first = next((h for h in history if "validation" in h), None)
                if hist_first:
                    vr.update({f"hacking/{k}": v for k, v in ev.hacking_signs(hist_first["validation"], vr).items()})
                env.writer.write(gunit, {"validation": vr}, stage=stage["name"], phase="eval")
            if last:
                res = _eval_full(env, runner.policy_params(), si, u)
                val_pass1 = res["validation"]["pass@1"]
                summary["eval"][stage["name"]] = _summary_entry(res["test"])
                hist_first = next((h for h in history if "validation" in h), None)
                if hist_first:
                    res["hacking"] = ev.hacking_signs(hist_first["validation"], res["validation"])
                history.append({"stage": stage["name"], **res})
                env.writer.write(gunit, res, stage=stage["name"], phase="eval")
                summary["wall_seconds"] = wall_before + (time.time() - t_start)
                _write_summary(env, summary)  # one entry per finished stage, also while the run goes on
            if gunit % cfg["log"]["every"] == 0 or last:
                env.writer.write(gunit, m, stage=stage["name"], phase="train", unit=str(u))
            bar.update(1)
            bar.set_postfix({k: f"{v:.3f}" for k, v in m.items() if k in ("loss", "reward/mean", "accuracy", "kept_share", "kl")
                             and isinstance(v, (float, np.floating))})
            ran += 1
            stop = stop_after and ran >= stop_after
            if last or stop or (u + 1) % cfg["checkpoint"]["every"] == 0:
                wall = wall_before + (time.time() - t_start)
                summary["wall_seconds"] = wall
                nxt_si, nxt_u = (si + 1, 0) if last else (si, u + 1)
                save_meta = {"stage": si, "unit": u + 1, "next": [nxt_si, nxt_u], "global_unit": gunit,
                             "summary": summary, "history": history, "wall_seconds": wall,
                             "pending": runner.pending_meta()}
                env.ckpt.save(gunit, runner.tree(), save_meta, val_pass1=val_pass1)
            if stop and not last:
                bar.close()
                print(f"stopping after {ran} units (run.stop_after); rerun the same command to resume", flush=True)
                summary["wall_seconds"] = wall_before + (time.time() - t_start)
                return summary
            if stop and last:
                bar.close()
                summary["wall_seconds"] = wall_before + (time.time() - t_start)
                if si + 1 < len(stages):
                    print(f"stopping after {ran} units (run.stop_after); rerun the same command to resume", flush=True)
                    return summary
                _finish(env, summary, history)
                return summary
        bar.close()
        params = runner.policy_params()
        runner = None
        si, u0 = si + 1, 0
    summary["wall_seconds"] = wall_before + (time.time() - t_start)
    _finish(env, summary, history)
    return summary


def _finish(env: Env, summary: dict, history: list[dict]) -> None:
    _write_summary(env, summary)
    cols = list(SUMMARY_KEYS)
    print("\nheld-out test set after each stage:")
    print(mlib.format_table(summary["eval"], cols))
    print(f"wall time {summary['wall_seconds']:.1f} s; summary in {os.path.join(env.workdir, 'summary.json')}", flush=True)
