"""The run context: everything a stage needs besides its own train state, built once per run.

    ctx = build_context(prep, workdir)     # prep: rl.preflight.prepare(config) (a RunConfig is prepared here)
    ctx.train, ctx.val, ctx.test           # problems (rl.tasks): from tasks.mix by hash, or the explicit *_source
    ctx.tok, ctx.prompt(problem)           # ByteTokenizer, or the checkpoint's HFTokenizer + chat template
    params = ctx.init_params()             # the starting policy: the checkpoint's weights, else a random init
    smp = ctx.sample(params, prompts, ks, key, temperature=0.7)     # rl.rollout.Samples
    ctx.scorer.submit(texts, problems, lengths)                     # the reward pool (producer / consumer)
    ctx.key("rl", stage, unit), ctx.rng("sft", stage, unit)        # randomness derived from (seed, purpose, ...)
    ctx.close()

What it is built from (the model config, tokenizer, mesh, problems, reward pool, length checks: Prepared and its
builders) is rl/setup.py; the prompt text is rl/tasks/render.py (prompt_text, solution_text). This module holds the
context itself, the run's randomness (purpose_key) and the starting weights drawn from it (start_weights).

Randomness: every draw comes from `key(purpose, *parts)` / `rng(purpose, *parts)`, a pure function of the
seed, so a run is reproducible from (config, seed) and resumes exactly. Jitted functions are cached per
(configs, mesh) in the process: a second run in one process (tests, notebooks) reuses their compiles.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from models import hf, layer_stack, lora, sampling, slot_sampling, transformer, upcycle
from models.config import ModelConfig, num_params
from models.tokenizer import ByteTokenizer, HFTokenizer
from rl import checkpoint as ckpt_lib
from rl import config_validation as cv
from rl import metrics as mlib
from rl import rollout
from rl.logprobs import make_logprob_fn
from rl.setup import (Prepared, backend_kernels, build_mesh, checkpoint_path, dense_model_cfg, make_reward_pool,
                      prepare_inputs, reward_deadline)
from rl.tasks.base import Problem
from rl.tasks.render import prompt_text, solution_text

PURPOSES = {"init": 1, "sft": 2, "rejection": 3, "rl": 4, "eval": 5, "state": 6, "lora": 7, "upcycle": 8}
_FN_CACHE: dict = {}


def cached(key, build):
    """A jitted function per key, built once per process."""
    if key not in _FN_CACHE:
        _FN_CACHE[key] = build()
    return _FN_CACHE[key]


@dataclasses.dataclass
class RunContext:
    cfg: cv.RunConfig  # the validated, frozen config (rl.config_validation.validate)
    workdir: str
    model_cfg: ModelConfig  # the run's model: the model section's, or the checkpoint's with its run-time fields
    tok: ByteTokenizer | HFTokenizer
    mesh: jax.sharding.Mesh | None  # None: one device, no sharding
    rules: tuple | None  # logical axis -> mesh axes (run_rules); None without a mesh
    row_multiple: int  # every batch's rows are a multiple of this (the data x fsdp devices)
    train: list[Problem]
    val: list[Problem]
    test: list[Problem]
    scorer: rollout.Scorer | None = None
    writer: mlib.MetricsWriter | None = None
    ckpt: ckpt_lib.Checkpointer | None = None
    base: dict | None = None  # a LoRA run's frozen base weights, loaded once (frozen_base)

    cached = staticmethod(cached)

    # -- randomness ----------------------------------------------------------------------------
    def key(self, purpose: str, *parts: int) -> jax.Array:
        return purpose_key(self.cfg.seed, purpose, *parts)

    def rng(self, purpose: str, *parts: int) -> np.random.Generator:
        return np.random.default_rng([int(self.cfg.seed), PURPOSES[purpose], *[int(p) + 1 for p in parts]])

    # -- text ----------------------------------------------------------------------------------
    @property
    def lang(self) -> str:
        return self.cfg.tasks.lang

    @property
    def seq_len(self) -> int:
        """The fixed train-step length: every batch is padded to it, so each step function compiles once."""
        return int(self.cfg.tasks.max_prompt_len + self.cfg.sampling.max_new_tokens)

    def prompt(self, problem) -> str:
        return prompt_text(self.cfg, self.tok, problem)

    def solution(self, problem) -> str:
        return solution_text(self.tok, problem, self.lang)

    # -- model functions -----------------------------------------------------------------------
    def generate(self, params, mcfg, prompts, key, **kw):
        return sampling.generate(params, mcfg, prompts, key, mesh=self.mesh, rules=self.rules, **kw)

    def generate_slots(self, params, mcfg, prompts, key, **kw):
        return slot_sampling.generate_slots(params, mcfg, prompts, key, mesh=self.mesh, rules=self.rules, **kw)

    @property
    def sampler_cfg(self):
        """The model config every sampler call runs: the run's, at sampling.dtype when that is set."""
        dtype = self.cfg.sampling.dtype
        return self.model_cfg.replace(dtype=dtype) if dtype else self.model_cfg

    def sample(self, params, prompts: list[str], ks, key, *, temperature: float, model_cfg=None,
               return_routes: bool = False) -> rollout.Samples:
        """ks[i] answers per prompt at `temperature` with the config's max_new_tokens / top_p / top_k and batching;
        model_cfg overrides sampler_cfg (e.g. an RL stage's sampler_dtype), return_routes keeps the MoE experts
        (static batching). Continuous batching runs on one device (a larger mesh samples in static calls)."""
        smp = self.cfg.sampling
        slots = smp.batching == "continuous" and (self.mesh is None or self.mesh.size == 1)
        return rollout.sample(self.generate, params, model_cfg or self.sampler_cfg, self.tok, prompts, ks, key,
                              temperature=temperature, max_new_tokens=smp.max_new_tokens, top_p=smp.top_p,
                              top_k=smp.top_k, max_prompt_len=self.cfg.tasks.max_prompt_len,
                              rows_per_call=smp.batch_rows, return_routes=return_routes,
                              generate_slots=self.generate_slots if slots else None)

    @property
    def logprob_fn(self):
        return cached(("logp", self.model_cfg, self.mesh, self.rules),
                      lambda: make_logprob_fn(self.model_cfg, mesh=self.mesh, rules=self.rules))

    @property
    def value_fn(self):
        return cached(("value", self.model_cfg, self.mesh, self.rules),
                      lambda: make_logprob_fn(self.model_cfg, mesh=self.mesh, rules=self.rules, with_values=True))

    def init_params(self):
        """The starting policy: the checkpoint's weights (model.hf_path / model.pretrained, read sharded over the
        mesh) or a random init from key("init"); with model.upcycle those dense weights made an MoE
        (upcycle.upcycle_params, key("upcycle")); with model.lora the policy is {"lora": fresh adapters} on the
        frozen base (frozen_base, loaded once)."""
        if self.model_cfg.lora is not None:
            return {lora.ADAPTER_KEY: lora.init(self.frozen_base(), self.model_cfg, self.key("lora"))}
        return self.load_weights()

    def load_weights(self):
        """The model's weights at the start (start_weights)."""
        return start_weights(self.cfg, self.model_cfg, self.mesh, self.rules)

    def frozen_base(self):
        """A LoRA run's base weights (load_weights), loaded once and shared by every stage: the train step's frozen
        argument, the reference policy of the KL term, what the adapters merge into for sampling."""
        if self.base is None:
            self.base = self.load_weights()
        return self.base

    def policy_weights(self, policy: dict) -> dict:
        """Plain params of a policy tree for the forward / sampler: a LoRA tree {"lora": adapters[, "value_head"]}
        merged into the frozen base (lora.model_params), any other tree as it is."""
        if self.model_cfg.lora is None or lora.ADAPTER_KEY not in policy:
            return policy
        return lora.model_params(policy, self.frozen_base(), self.model_cfg)

    def adaptation_record(self) -> dict:
        """What config.json / summary.json record about model.upcycle and model.lora ({} for a plain run)."""
        out = {}
        if self.cfg.model.upcycle is not None:
            dense = dense_model_cfg(self.cfg)
            out["upcycled"] = {"from": checkpoint_path(self.cfg.model) or "random init (model section)",
                               **dataclasses.asdict(self.cfg.model.upcycle),
                               "dense_params": int(num_params(dense)), "moe_params": int(num_params(self.model_cfg))}
        if self.model_cfg.lora is not None:
            shapes = jax.eval_shape(lambda: lora.init(jax.eval_shape(lambda: transformer.init(
                self.model_cfg, jax.random.key(0))), self.model_cfg, jax.random.key(0)))
            out["lora"] = {"adapter_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(shapes))),
                           "base_params": int(num_params(self.model_cfg))}
        return out

    def close(self) -> None:
        for part in (self.scorer, self.writer, self.ckpt):
            if part is not None:
                part.close()


def purpose_key(seed: int, purpose: str, *parts: int) -> jax.Array:
    """The run's key for `purpose` (PURPOSES) and parts: a pure function of the seed."""
    k = jax.random.fold_in(jax.random.key(int(seed)), PURPOSES[purpose])
    for p in parts:
        k = jax.random.fold_in(k, int(p))
    return k


def start_weights(cfg: cv.RunConfig, model_cfg: ModelConfig, mesh=None, rules=None) -> dict:
    """The model's weights at the start of a run: the checkpoint's (model.hf_path / model.pretrained, read sharded
    over the mesh), or a random init from key("init"); with model.upcycle those dense weights made the MoE of
    model_cfg (upcycle.upcycle_params, key("upcycle")). A pure function of the config and its seed (it draws from
    the run's keys, purpose_key: so it lives here, not with the builders of rl/setup.py): a LoRA run's base and an
    upcycled start are rebuilt the same on resume and by rl.runs.load_policy."""
    path = checkpoint_path(cfg.model)
    up = cfg.model.upcycle is not None
    mcfg = dense_model_cfg(cfg) if up else model_cfg
    if not path:
        params = transformer.init(mcfg, purpose_key(cfg.seed, "init"))
    else:
        _, params = hf.load(path, dtype=mcfg.dtype, param_dtype=mcfg.param_dtype, mesh=None if up else mesh,
                            rules=rules)
    if not up:
        return params
    params = upcycle.upcycle_params(params, mcfg, purpose_key(cfg.seed, "upcycle"))
    if mesh is not None:
        params = jax.device_put(params, transformer.param_shardings(model_cfg, mesh, rules))
    return params


def build_context(prep: Prepared | cv.RunConfig, workdir: str, *, with_services: bool = True) -> RunContext:
    """The run context of a prepared config (rl.preflight.prepare; a validated config is prepared here by
    rl.setup.prepare_inputs) with the mesh and, with services, the reward pool and checkpointer (the run loop opens
    the metrics writer once it knows where it resumes)."""
    if not isinstance(prep, Prepared):
        prep = prepare_inputs(prep)
    cfg = prep.cfg
    backend_kernels()
    mesh, rules, row_multiple = build_mesh(cfg)
    ctx = RunContext(cfg=cfg, workdir=workdir, model_cfg=prep.model_cfg, tok=prep.tok, mesh=mesh, rules=rules,
                     row_multiple=row_multiple, train=list(prep.train), val=list(prep.val), test=list(prep.test))
    if with_services:
        os.makedirs(workdir, exist_ok=True)
        problems = ctx.train + ctx.val + ctx.test
        deadline = reward_deadline(cfg, problems)
        if deadline > cfg.run.reward_timeout and cfg.run.reward_workers:
            print(f"reward pool: {deadline:.0f} s per item (run.reward_timeout {cfg.run.reward_timeout} s, "
                  "raised to cover the code sandbox's limit)", flush=True)
        ctx.scorer = rollout.Scorer(make_reward_pool(cfg, problems))
        ctx.ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=cfg.checkpoint.keep,
                                         keep_best=cfg.checkpoint.keep_best,
                                         layers=layer_stack.layer_groups(ctx.model_cfg))
    return ctx
