"""Experiment config schema (defaults + one-line docs) and validation before any compute.

An experiment config is an `ml_collections.ConfigDict` with these sections:

    seed, model, mesh, sharding_rules, tasks, reward, sampling, stages (a list), eval,
    checkpoint, log, run

`default_config()` builds one with every field at its default; config files in
experiments/configs/ start from it and override what they need, and `stage(kind, name, **kw)`
builds one entry of `stages` from the per-kind defaults below. `describe()` prints every
field with its doc (the launcher's --help_config).

`validate(config)` checks everything — unknown keys (typos), types, ranges, cross-field
rules, and the model / loss / optimizer / reward dataclasses of the components — and raises
`ConfigError` naming the field path, e.g. "stages[2].clip_high must be >= 0, got -1".
It runs before the trainer touches JAX or data.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import ml_collections


class ConfigError(ValueError):
    """A config field is missing, misspelled, of the wrong type or out of range."""


@dataclass(frozen=True)
class F:
    """One config field: default value, doc string and a checker returning an error text or None."""

    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None


# -- small checkers (return the reason, the caller adds the path) -------------------------------------
def _int(lo=None, hi=None):
    def c(v):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be an int, got {v!r}"
        if lo is not None and v < lo:
            return f"must be >= {lo}, got {v}"
        if hi is not None and v > hi:
            return f"must be <= {hi}, got {v}"
        return None

    return c


def _num(lo=None, hi=None, lo_open=False):
    def c(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"must be a number, got {v!r}"
        if lo is not None and (v < lo or (lo_open and v == lo)):
            return f"must be {'>' if lo_open else '>='} {lo}, got {v}"
        if hi is not None and v > hi:
            return f"must be <= {hi}, got {v}"
        return None

    return c


def _bool(v):
    return None if isinstance(v, bool) else f"must be true/false, got {v!r}"


def _choice(*opts):
    def c(v):
        return None if v in opts else f"must be one of {'|'.join(map(str, opts))}, got {v!r}"

    return c


def _str(v):
    return None if isinstance(v, str) else f"must be a string, got {v!r}"


def _ints3(v):
    if not isinstance(v, (tuple, list)) or len(v) != 3 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
        return f"must be 3 positive ints (easy, medium, hard), got {v!r}"
    return None


def _nums3(v):
    if not isinstance(v, (tuple, list)) or len(v) != 3 or any(not isinstance(x, (int, float)) or x < 0 for x in v):
        return f"must be 3 non-negative numbers (easy, medium, hard), got {v!r}"
    if sum(v) <= 0:
        return f"must have a positive sum, got {v!r}"
    return None


# -- sections ----------------------------------------------------------------------------------------
TOP = {
    "seed": F(0, "master seed: parameter init, data order, sampling (a run is reproducible from config + seed)", _int(0)),
    "sharding_rules": F("", "overrides of models.sharding.DEFAULT_RULES, 'logical=axis[+axis],...' ('' = defaults; 'embed=' = replicated)", _str),
}

MESH = {
    "data": F(1, "data-parallel axis size (-1 = all remaining devices)", _int(-1)),
    "fsdp": F(1, "fully-sharded parameter axis size", _int(-1)),
    "expert": F(1, "expert-parallel axis size (MoE experts split over it)", _int(-1)),
    "tensor": F(1, "tensor-parallel axis size (heads / mlp / vocab)", _int(-1)),
}

TASKS = {
    "mix": F("arith:1.0", "problem sources and weights, e.g. 'arith:0.5,linear:0.5' (rl.tasks.load_mix)", _str),
    "lang": F("en", "prompt/solution language: en (Step 1: / Answer:) or zh (步骤一： / 答案：)", _choice("en", "zh")),
    "n_train": F(512, "training problems", _int(1)),
    "n_val": F(64, "validation problems (eval during training, best checkpoint)", _int(1)),
    "n_test": F(64, "test problems (held-out numbers in summary.json)", _int(1)),
    "difficulty": F(1, "difficulty level passed to generated sources that take one (1 = easiest)", _int(1)),
    "max_prompt_len": F(64, "prompt tokens (bytes + BOS); longer prompts are rejected at load time", _int(4)),
}

SAMPLING = {
    "max_new_tokens": F(32, "tokens generated per answer (training rollouts and eval)", _int(1)),
    "top_p": F(1.0, "nucleus sampling (1.0 = off)", _num(0.0, 1.0, lo_open=True)),
    "top_k": F(0, "top-k sampling (0 = off)", _int(0)),
    "batch_rows": F(128, "rows (answers) per sampler call; every call has this shape, so the sampler compiles once", _int(1)),
}

EVAL = {
    "every": F(10, "evaluate on the validation split every N RL iterations (0 = only at stage ends)", _int(0)),
    "k": F(8, "samples per problem for pass@k / maj@k / diversity (0 = greedy only)", _int(0)),
    "n_val": F(64, "validation problems per eval (<= tasks.n_val)", _int(1)),
    "n_test": F(64, "test problems per end-of-stage eval (<= tasks.n_test)", _int(1)),
    "temperature": F(1.0, "temperature of the k eval samples", _num(0.0, lo_open=True)),
    "initial": F(True, "evaluate the initial policy before training (summary 'initial')", _bool),
}

CHECKPOINT = {
    "keep": F(2, "keep the last N checkpoints (workdir/checkpoints/last)", _int(1)),
    "every": F(1, "save every N units (SFT epochs, rejection rounds, RL iterations)", _int(1)),
    "keep_best": F(True, "also keep the best by validation pass@1 (workdir/checkpoints/best)", _bool),
}

LOG = {
    "every": F(1, "write step metrics every N units", _int(1)),
    "tensorboard": F(True, "also write TensorBoard event files in workdir/tb", _bool),
    "progress": F(True, "tqdm progress bars", _bool),
}

RUN = {
    "stop_after": F(0, "stop (after checkpointing) once this many units ran in this process, 0 = never; used to test resume", _int(0)),
    "reward_workers": F(2, "reward worker processes (0 = score in the main process)", _int(0)),
    "reward_timeout": F(2.0, "seconds per reward call before it counts as an error", _num(0.0, lo_open=True)),
    "overlap": F(True, "sample batch i+1 while the reward pool scores batch i", _bool),
    "distributed": F(False, "multi-host run: call jax.distributed.initialize() before building the mesh", _bool),
}

COMMON_STAGE = {
    "name": F("stage", "stage name (summary.json key; must be unique)", _str),
    "kind": F("grpo", "sft | rejection | grpo | ppo", _choice("sft", "rejection", "grpo", "ppo")),
    "lr": F(1e-3, "peak learning rate", _num(0.0, lo_open=True)),
    "warmup_steps": F(0, "linear warmup optimizer steps", _int(0)),
    "end_lr_fraction": F(0.1, "learning rate decays linearly to this fraction of lr", _num(0.0, 1.0)),
    "weight_decay": F(0.0, "AdamW weight decay", _num(0.0)),
    "grad_clip": F(1.0, "global-norm gradient clip (0 = off)", _num(0.0)),
}

SFT_STAGE = {
    "epochs": F(3, "passes over the worked solutions", _int(1)),
    "batch_size": F(32, "sequences per optimizer step", _int(1)),
    "n_problems": F(0, "training problems used (0 = all); a small number gives a deliberately partial cold start", _int(0)),
}

REJECTION_STAGE = {
    "rounds": F(3, "STaR / RFT rounds (sample, filter, fine-tune)", _int(1)),
    "n_problems": F(64, "problems sampled per round", _int(1)),
    "samples": F(8, "answers sampled per problem (K)", _int(1)),
    "temperature": F(0.7, "sampling temperature", _num(0.0, lo_open=True)),
    "epochs": F(1, "fine-tuning passes over the kept answers each round", _int(1)),
    "batch_size": F(32, "sequences per optimizer step", _int(1)),
    "min_format": F(1.0, "keep an answer only if its format reward is >= this", _num(0.0, 1.0)),
    "max_keep_per_problem": F(4, "at most this many distinct kept answers per problem", _int(1)),
}

CURRICULUM = {
    "enabled": F(False, "difficulty-stratified sampling (else uniform problems, `samples` each)", _bool),
    "easy_above": F(0.7, "pass rate >= this -> easy bucket", _num(0.0, 1.0)),
    "hard_below": F(0.3, "pass rate <= this -> hard bucket", _num(0.0, 1.0)),
    "samples": F((8, 16, 32), "samples per problem for easy / medium / hard", _ints3),
    "weights": F((1.0, 1.0, 1.0), "relative pick probability of a problem in each bucket", _nums3),
    "refresh_every": F(5, "re-bucket every N iterations", _int(1)),
    "decay": F(0.5, "EMA weight of the old pass-rate estimate", _num(0.0, 0.999)),
}

RL_STAGE = {
    "iterations": F(50, "RL iterations (sample -> score -> update)", _int(1)),
    "n_prompts": F(16, "problems per iteration", _int(1)),
    "samples": F(8, "answers per problem (GRPO group size K) when the curriculum is off", _int(1)),
    "temperature_start": F(1.0, "sampling temperature at the first iteration", _num(0.0, lo_open=True)),
    "temperature_end": F(0.7, "sampling temperature at the last iteration", _num(0.0, lo_open=True)),
    "temperature_kind": F("linear", "temperature schedule: linear | cosine | constant", _choice("linear", "cosine", "constant")),
    "epochs": F(1, "passes over each iteration's batch", _int(1)),
    "token_budget": F(4096, "tokens (rows x padded length) per minibatch", _int(1)),
    "advantage": F("grpo", "grpo (group mean/std) | rloo (leave-one-out); GRPO kind only", _choice("grpo", "rloo")),
    "scale_by_std": F(True, "GRPO: divide by the group std (False = Dr. GRPO)", _bool),
    "clip_low": F(0.2, "PPO ratio clip below 1 - clip_low", _num(0.0)),
    "clip_high": F(0.2, "PPO ratio clip above 1 + clip_high (clip-higher: > clip_low)", _num(0.0)),
    "dual_clip": F(0.0, "dual-clip constant c > 1 for negative advantages (0 = off)", _num(0.0)),
    "agg": F("token-mean", "loss aggregation: token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm",
             _choice("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")),
    "kl_kind": F("k3", "KL estimator: k1 | k2 | k3", _choice("k1", "k2", "k3")),
    "kl_place": F("loss", "where the KL goes: loss (GRPO style) | reward (PPO style, per-token penalty)", _choice("loss", "reward")),
    "kl_coef": F(0.04, "initial / fixed KL coefficient (0 = no reference policy)", _num(0.0)),
    "kl_adaptive": F(False, "adaptive KL controller towards kl_target", _bool),
    "kl_target": F(0.01, "adaptive KL target", _num(0.0, lo_open=True)),
    "kl_horizon": F(10000, "adaptive KL horizon (in samples)", _int(1)),
    "kl_ramp_steps": F(0, "ramp the fixed KL coefficient from 0 over N iterations (0 = off)", _int(0)),
    "entropy_coef": F(0.0, "entropy bonus coefficient", _num(0.0)),
    "filter_zero_variance": F(True, "drop groups whose rewards are all equal (zero advantage)", _bool),
    "step_rewards": F(False, "add step-level rewards (sympy-checked steps) at step ends", _bool),
    "process_grpo": F(False, "process-supervised GRPO: advantages from normalised step rewards", _bool),
    "step_reward_weight": F(0.1, "weight of the step-level rewards", _num(0.0)),
    "gamma": F(1.0, "PPO: discount", _num(0.0, 1.0)),
    "lam": F(0.95, "PPO: GAE lambda", _num(0.0, 1.0)),
    "value_coef": F(0.5, "PPO: value loss coefficient", _num(0.0)),
    "value_clip": F(0.2, "PPO: value clip range (0 = off)", _num(0.0)),
}

STAGE_FIELDS = {
    "sft": {**COMMON_STAGE, **SFT_STAGE},
    "rejection": {**COMMON_STAGE, **REJECTION_STAGE},
    "grpo": {**COMMON_STAGE, **RL_STAGE},
    "ppo": {**COMMON_STAGE, **RL_STAGE},
}

SECTIONS = {"mesh": MESH, "tasks": TASKS, "sampling": SAMPLING, "eval": EVAL, "checkpoint": CHECKPOINT, "log": LOG, "run": RUN}


def _model_defaults() -> dict:
    """ModelConfig fields and defaults, read from the dataclass so the config always matches it."""
    import dataclasses

    from models.config import ModelConfig

    return {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory()) for f in dataclasses.fields(ModelConfig)}


def _reward_defaults() -> dict:
    """RewardConfig fields and defaults (rewards.combine)."""
    import dataclasses

    from rewards.combine import RewardConfig

    out = {}
    for f in dataclasses.fields(RewardConfig):
        v = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out[f.name] = v
    return out


def _defaults(fields: dict[str, F]) -> dict:
    return {k: copy.deepcopy(f.default) for k, f in fields.items()}


def stage(kind: str, name: str | None = None, **overrides) -> ml_collections.ConfigDict:
    """One `stages` entry of the given kind with every field at its default plus `overrides`."""
    if kind not in STAGE_FIELDS:
        raise ConfigError(f"stage kind must be one of {'|'.join(STAGE_FIELDS)}, got {kind!r}")
    d = _defaults(STAGE_FIELDS[kind])
    d["kind"] = kind
    d["name"] = name or kind
    if kind in ("grpo", "ppo"):
        d["curriculum"] = _defaults(CURRICULUM)
        cur = overrides.pop("curriculum", None)
        if cur:
            d["curriculum"].update(cur)
        if kind == "ppo":  # PPO puts the KL into the reward by default (per-token penalty)
            d["kl_place"] = "reward"
    for k, v in overrides.items():
        if k not in d:
            raise ConfigError(f"stage {d['name']!r} ({kind}) has no field {k!r}; known: {', '.join(sorted(d))}")
        d[k] = v
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
    """Every field with its default and doc, one per line (for --help_config and the README)."""
    lines = []
    for k, f in TOP.items():
        lines.append(f"{k} = {f.default!r}  # {f.doc}")
    for k, v in _model_defaults().items():
        lines.append(f"model.{k} = {v!r}  # models.config.ModelConfig field (documented there)")
    for k, v in _reward_defaults().items():
        lines.append(f"reward.{k} = {v!r}  # rewards.combine.RewardConfig field (documented there)")
    for name, fields in SECTIONS.items():
        for k, f in fields.items():
            lines.append(f"{name}.{k} = {f.default!r}  # {f.doc}")
    for k, f in COMMON_STAGE.items():
        lines.append(f"stages[i].{k} = {f.default!r}  # (every kind) {f.doc}")
    for kind, label in (("sft", "sft"), ("rejection", "rejection"), ("grpo", "grpo/ppo")):
        for k, f in STAGE_FIELDS[kind].items():
            if k not in COMMON_STAGE:
                lines.append(f"stages[i].{k} = {f.default!r}  # ({label}) {f.doc}")
    for k, f in CURRICULUM.items():
        lines.append(f"stages[i].curriculum.{k} = {f.default!r}  # (grpo/ppo) {f.doc}")
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
def _check_fields(d: dict, fields: dict[str, F], path: str, errors: list[str], allow_extra=()) -> None:
    for k in d:
        if k not in fields and k not in allow_extra:
            errors.append(f"{path}.{k} is not a known field (known: {', '.join(sorted(fields))})")
    for k, f in fields.items():
        if k not in d:
            errors.append(f"{path}.{k} is missing")
            continue
        if f.check is not None:
            msg = f.check(d[k])
            if msg:
                errors.append(f"{path}.{k} {msg}")


def _dataclass_error(cls, kwargs: dict, path: str) -> str | None:
    """Construct a component dataclass; turn its complaint into an error naming the config path."""
    try:
        cls(**kwargs)
    except TypeError as e:
        return f"{path}: {e}"
    except ValueError as e:
        return f"{path}: {e}"
    return None


def validate(config) -> None:
    """Raise ConfigError listing every problem in `config` (field paths in the messages)."""
    c = to_dict(config)
    errors: list[str] = []
    known_top = set(TOP) | set(SECTIONS) | {"model", "reward", "stages"}
    for k in c:
        if k not in known_top:
            errors.append(f"{k} is not a known top-level field (known: {', '.join(sorted(known_top))})")
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

    # model / reward: the component dataclasses validate themselves
    if isinstance(c.get("model"), dict):
        from models.config import ModelConfig

        msg = _dataclass_error(ModelConfig, c["model"], "model")
        if msg:
            errors.append(msg)
    else:
        errors.append("model is missing or not a section")
    if isinstance(c.get("reward"), dict):
        from rewards.combine import RewardConfig

        msg = _dataclass_error(RewardConfig, c["reward"], "reward")
        if msg:
            errors.append(msg)
    else:
        errors.append("reward is missing or not a section")

    # mesh: at most one -1
    mesh = c.get("mesh") or {}
    if isinstance(mesh, dict):
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
    tasks, ev = c.get("tasks") or {}, c.get("eval") or {}
    if isinstance(tasks, dict) and isinstance(ev, dict):
        if isinstance(ev.get("n_val"), int) and isinstance(tasks.get("n_val"), int) and ev["n_val"] > tasks["n_val"]:
            errors.append(f"eval.n_val ({ev['n_val']}) must be <= tasks.n_val ({tasks['n_val']})")
        if isinstance(ev.get("n_test"), int) and isinstance(tasks.get("n_test"), int) and ev["n_test"] > tasks["n_test"]:
            errors.append(f"eval.n_test ({ev['n_test']}) must be <= tasks.n_test ({tasks['n_test']})")
    rew = c.get("reward") or {}
    if isinstance(rew, dict) and isinstance(tasks, dict) and "lang" in rew and rew.get("lang") != tasks.get("lang"):
        errors.append(f"reward.lang ({rew.get('lang')!r}) must match tasks.lang ({tasks.get('lang')!r})")
    model = c.get("model") or {}
    smp = c.get("sampling") or {}
    if all(isinstance(x, int) for x in (model.get("max_seq_len"), tasks.get("max_prompt_len"), smp.get("max_new_tokens"))):
        if tasks["max_prompt_len"] + smp["max_new_tokens"] > model["max_seq_len"]:
            errors.append(
                f"tasks.max_prompt_len + sampling.max_new_tokens ({tasks['max_prompt_len']} + {smp['max_new_tokens']}) "
                f"must be <= model.max_seq_len ({model['max_seq_len']})"
            )

    stages = c.get("stages")
    if not isinstance(stages, list) or not stages:
        errors.append("stages must be a non-empty list of stage sections")
        stages = []
    names = set()
    for i, s in enumerate(stages):
        p = f"stages[{i}]"
        if not isinstance(s, dict):
            errors.append(f"{p} must be a section, got {s!r}")
            continue
        kind = s.get("kind")
        if kind not in STAGE_FIELDS:
            errors.append(f"{p}.kind must be one of sft|rejection|grpo|ppo, got {kind!r}")
            continue
        extra = ("curriculum",) if kind in ("grpo", "ppo") else ()
        _check_fields(s, STAGE_FIELDS[kind], p, errors, allow_extra=extra)
        if s.get("name") in names or s.get("name") == "initial":
            errors.append(f"{p}.name {s.get('name')!r} is used twice (or is the reserved 'initial')")
        names.add(s.get("name"))
        if kind in ("grpo", "ppo"):
            cur = s.get("curriculum")
            if not isinstance(cur, dict):
                errors.append(f"{p}.curriculum is missing or not a section")
            else:
                _check_fields(cur, CURRICULUM, f"{p}.curriculum", errors)
                if isinstance(cur.get("easy_above"), (int, float)) and isinstance(cur.get("hard_below"), (int, float)):
                    if cur["hard_below"] > cur["easy_above"]:
                        errors.append(f"{p}.curriculum.hard_below ({cur['hard_below']}) must be <= easy_above ({cur['easy_above']})")
            _check_rl_stage(s, p, errors, c)
        if kind == "sft" and isinstance(s.get("n_problems"), int) and isinstance(tasks.get("n_train"), int):
            if s["n_problems"] > tasks["n_train"]:
                errors.append(f"{p}.n_problems ({s['n_problems']}) must be <= tasks.n_train ({tasks['n_train']})")
        if kind == "rejection" and isinstance(s.get("n_problems"), int) and isinstance(tasks.get("n_train"), int):
            if s["n_problems"] > tasks["n_train"]:
                errors.append(f"{p}.n_problems ({s['n_problems']}) must be <= tasks.n_train ({tasks['n_train']})")
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))


def _check_rl_stage(s: dict, p: str, errors: list[str], c: dict) -> None:
    """Cross-field rules of a GRPO / PPO stage."""
    dc = s.get("dual_clip")
    if isinstance(dc, (int, float)) and dc != 0 and dc <= 1:
        errors.append(f"{p}.dual_clip must be 0 (off) or > 1, got {dc}")
    tasks = c.get("tasks") or {}
    if isinstance(s.get("n_prompts"), int) and isinstance(tasks.get("n_train"), int) and s["n_prompts"] > tasks["n_train"]:
        errors.append(f"{p}.n_prompts ({s['n_prompts']}) must be <= tasks.n_train ({tasks['n_train']})")
    if s.get("kind") == "grpo":
        cur = s.get("curriculum") or {}
        ks = list(cur.get("samples", ())) if cur.get("enabled") else [s.get("samples")]
        if any(isinstance(k, int) and k < 2 for k in ks):
            errors.append(f"{p}.samples must be >= 2 for GRPO (group-relative advantages need a group), got {ks}")
    if s.get("process_grpo") and s.get("kind") != "grpo":
        errors.append(f"{p}.process_grpo needs kind grpo, got {s.get('kind')!r}")
    if s.get("process_grpo") and s.get("step_rewards"):
        errors.append(f"{p}: step_rewards and process_grpo are alternatives; set only one")
    if s.get("kl_place") == "reward" and s.get("kind") == "grpo":
        errors.append(f"{p}.kl_place 'reward' needs kind ppo (GRPO's sequence advantages have no per-token reward)")
    try:
        from rl.train_step import LossConfig, OptimConfig
    except ImportError:  # the kernels are validated again by the trainer when it builds them
        return
    msg = _dataclass_error(LossConfig, loss_kwargs(s), f"{p} (loss)")
    if msg:
        errors.append(msg)
    msg = _dataclass_error(OptimConfig, optim_kwargs(s, total_steps=100), f"{p} (optimizer)")
    if msg:
        errors.append(msg)


def loss_kwargs(s: dict, temperature: float = 1.0) -> dict:
    """LossConfig keyword arguments for a stage (the mapping the trainer uses too)."""
    kind = s["kind"]
    if kind in ("sft", "rejection"):
        return {"mode": "sft"}
    kw = dict(
        mode=kind,
        clip_low=float(s["clip_low"]),
        clip_high=float(s["clip_high"]),
        dual_clip=(float(s["dual_clip"]) if s["dual_clip"] else None),
        agg=s["agg"],
        kl_kind=s["kl_kind"],
        kl_in_loss=(s["kl_place"] == "loss"),
        kl_coef_init=float(s["kl_coef"]),
        entropy_coef=float(s["entropy_coef"]),
        temperature=float(temperature),
    )
    if kind == "ppo":
        kw.update(value_coef=float(s["value_coef"]), value_clip=float(s["value_clip"]))
    return kw


def optim_kwargs(s: dict, total_steps: int) -> dict:
    """OptimConfig keyword arguments for a stage."""
    return dict(
        learning_rate=float(s["lr"]),
        warmup_steps=int(s["warmup_steps"]),
        total_steps=max(int(total_steps), 1),
        end_lr_fraction=float(s["end_lr_fraction"]),
        weight_decay=float(s["weight_decay"]),
        grad_clip=float(s["grad_clip"]),
    )


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
