"""The run context: everything a stage needs besides its own train state, built once per run.

    ctx = build_context(cfg, workdir)      # cfg: the validated config as plain dicts (rl.config_validation.to_dict)
    ctx.train, ctx.val, ctx.test           # problems (rl.tasks)
    smp = ctx.sample(params, prompts, ks, key, temperature=0.7)     # rl.rollout.Samples
    ctx.scorer.submit(texts, problems, lengths)                     # the reward pool (producer / consumer)
    ctx.key("rl", stage, unit), ctx.rng("sft", stage, unit)        # randomness derived from (seed, purpose, ...)
    ctx.close()

Randomness: every draw comes from `key(purpose, *parts)` / `rng(purpose, *parts)`, a pure function of the
seed, so a run is reproducible from (config, seed) and resumes exactly. Jitted functions are cached per
(configs, mesh) in the process: a second run in one process (tests, notebooks) reuses their compiles.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from rl import config_validation as cv
from rl import rollout

PURPOSES = {"init": 1, "sft": 2, "rejection": 3, "rl": 4, "eval": 5, "state": 6}
_FN_CACHE: dict = {}


def cached(key, build):
    """A jitted function per key, built once per process."""
    if key not in _FN_CACHE:
        _FN_CACHE[key] = build()
    return _FN_CACHE[key]


@dataclasses.dataclass
class RunContext:
    cfg: dict
    workdir: str
    model_cfg: object
    tok: object
    mesh: object
    rules: object
    row_multiple: int
    train: list
    val: list
    test: list
    scorer: rollout.Scorer | None = None
    writer: object = None
    ckpt: object = None

    cached = staticmethod(cached)

    # -- randomness ----------------------------------------------------------------------------
    def key(self, purpose: str, *parts: int) -> jax.Array:
        k = jax.random.fold_in(jax.random.key(int(self.cfg["seed"])), PURPOSES[purpose])
        for p in parts:
            k = jax.random.fold_in(k, int(p))
        return k

    def rng(self, purpose: str, *parts: int) -> np.random.Generator:
        return np.random.default_rng([int(self.cfg["seed"]), PURPOSES[purpose], *[int(p) + 1 for p in parts]])

    # -- text ----------------------------------------------------------------------------------
    @property
    def lang(self) -> str:
        return self.cfg["tasks"]["lang"]

    @property
    def seq_len(self) -> int:
        """The fixed train-step length: every batch is padded to it, so each step function compiles once."""
        return int(self.cfg["tasks"]["max_prompt_len"] + self.cfg["sampling"]["max_new_tokens"])

    def prompt(self, problem) -> str:
        from rl.tasks.render import render_prompt

        return render_prompt(problem, self.lang)

    def solution(self, problem) -> str:
        from rl.tasks.render import render_solution

        return render_solution(problem, self.lang)

    # -- model functions -----------------------------------------------------------------------
    def generate(self, params, mcfg, prompts, key, **kw):
        from models import sampling

        return sampling.generate(params, mcfg, prompts, key, mesh=self.mesh, rules=self.rules, **kw)

    def sample(self, params, prompts: list[str], ks, key, *, temperature: float) -> rollout.Samples:
        """ks[i] answers per prompt at `temperature` with the config's max_new_tokens / top_p / top_k."""
        smp = self.cfg["sampling"]
        return rollout.sample(self.generate, params, self.model_cfg, self.tok, prompts, ks, key, temperature=temperature,
                              max_new_tokens=smp["max_new_tokens"], top_p=smp["top_p"], top_k=smp["top_k"],
                              max_prompt_len=self.cfg["tasks"]["max_prompt_len"], rows_per_call=smp["batch_rows"])

    @property
    def logprob_fn(self):
        from rl.train_step import make_logprob_fn

        return cached(("logp", self.model_cfg, self.mesh, self.rules),
                      lambda: make_logprob_fn(self.model_cfg, mesh=self.mesh, rules=self.rules))

    @property
    def value_fn(self):
        from rl.train_step import make_logprob_fn

        return cached(("value", self.model_cfg, self.mesh, self.rules),
                      lambda: make_logprob_fn(self.model_cfg, mesh=self.mesh, rules=self.rules, with_values=True))

    def close(self) -> None:
        for part in (self.scorer, self.writer, self.ckpt):
            if part is not None:
                part.close()


# ----------------------------------------------------------------------------------------- builders
def build_model_cfg(cfg: dict):
    from models.config import ModelConfig

    return ModelConfig(**cfg["model"])


def build_mesh(cfg: dict):
    """(mesh, rules, row_multiple): None for a single-device run (no sharding overhead), else
    models.sharding.make_mesh over the first devices."""
    from rl import config_validation as cv

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
    levels = cv.parse_source_levels(t.get("source_difficulty", ""))
    if levels:  # per source: the listed levels (0 = drawn uniformly), the others at tasks.difficulty
        names = [name for name, _ in tasks.parse_mix(t["mix"])]
        kw["difficulty"] = {n: (levels[n] or None) if n in levels else t["difficulty"] for n in names}
    return tuple(tasks.load_mix(t["mix"], t[f"n_{s}"], cfg["seed"], split, **kw)
                 for s, split in (("train", "train"), ("val", "validation"), ("test", "test")))


def reward_config(cfg: dict):
    """The RewardConfig of a run; an empty reward.lang follows tasks.lang (one language setting drives both)."""
    from rewards.combine import RewardConfig

    kw = dict(cfg["reward"])
    if not kw.get("lang"):
        kw["lang"] = cfg["tasks"]["lang"]
    return RewardConfig(**kw)


def make_reward_pool(cfg: dict):
    """The reward worker pool scoring (text, problem target) pairs with the config's RewardConfig, each problem by
    its own family's reward (rewards.task_score)."""
    from rewards.pool import RewardPool
    from rewards.task_score import score_task

    return RewardPool(n_workers=int(cfg["run"]["reward_workers"]), timeout=float(cfg["run"]["reward_timeout"]),
                      cfg=reward_config(cfg), score_fn=score_task)


def check_fit(cfg: dict, tok, problems, sft_problems: int = 0) -> None:
    """Before any compute: every prompt fits tasks.max_prompt_len and the first `sft_problems` worked solutions
    (+EOS) fit sampling.max_new_tokens."""
    from rl import config_validation as cv
    from rl.tasks.render import render_prompt, render_solution

    lang = cfg["tasks"]["lang"]
    P, N = cfg["tasks"]["max_prompt_len"], cfg["sampling"]["max_new_tokens"]
    for i, p in enumerate(problems):
        n_p = len(tok.encode(render_prompt(p, lang), add_bos=True))
        if n_p > P:
            raise cv.ConfigError(f"tasks.max_prompt_len ({P}) is too small: the prompt of {p.question[:80]!r} has "
                                 f"{n_p} tokens")
        if i < sft_problems:
            n_a = len(tok.encode(render_solution(p, lang), add_bos=False, add_eos=True))
            if n_a > N:
                raise cv.ConfigError(f"sampling.max_new_tokens ({N}) is too small for the worked solutions: "
                                     f"{p.question[:80]!r} needs {n_a} tokens with EOS")


def build_context(cfg: dict, workdir: str, *, with_services: bool = True) -> RunContext:
    """Model config, mesh, tokenizer, problems (checked against the length limits) and, with services, the
    reward pool and checkpointer (the run loop opens the metrics writer once it knows where it resumes)."""
    from models.tokenizer import ByteTokenizer
    from rl.stages import sft_problem_count

    model_cfg = build_model_cfg(cfg)
    mesh, rules, row_multiple = build_mesh(cfg)
    tok = ByteTokenizer()
    train, val, test = load_problems(cfg)
    check_fit(cfg, tok, train, sft_problems=sft_problem_count(cfg))
    check_fit(cfg, tok, val + test)
    ctx = RunContext(cfg=cfg, workdir=workdir, model_cfg=model_cfg, tok=tok, mesh=mesh, rules=rules,
                     row_multiple=row_multiple, train=list(train), val=list(val), test=list(test))
    if with_services:
        from rl import checkpoint as ckpt_lib

        os.makedirs(workdir, exist_ok=True)
        ctx.scorer = rollout.Scorer(make_reward_pool(cfg))
        ctx.ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), keep=cfg["checkpoint"]["keep"],
                                         keep_best=cfg["checkpoint"]["keep_best"])
    return ctx
