"""What every stage kind shares: flat config keys over composed sections, and the train state a stage owns.

Config. A stage config is a frozen dataclass of sections (rl.losses.LossConfig, rl.kl_control.KLConfig,
rl.offpolicy.OffPolicyConfig, rl.train_loop.LoopConfig, ...) plus its own fields; each field has its one default,
doc and check in the section that owns it. A config file writes the stage flat (`stages[i].clip_high`), so the
config reads and writes flat dicts: `from_flat(cls, d)` routes each key to its section (unknown keys are errors
naming the field; `curriculum` stays a nested section) and `cfg.to_dict()` writes them back. Code reads a field
where it lives, in its section (`cfg.loss.clip_high`, `cfg.stage.name`); `flat_value(cfg, key)` reads one by its
flat key, for code that handles flat keys by name (the algorithm names, to_dict). `LEGACY` lists keys a kind no
longer has but old config.json files hold (they never changed what that kind computed): accepted and dropped.

    cfg = from_flat(GRPOConfig, {"kind": "grpo", "name": "grpo", "clip_high": 0.28})   # FieldErrors names fields
    cfg.loss.clip_high == flat_value(cfg, "clip_high") == 0.28 ; cfg.to_dict()["clip_high"] == 0.28

Runtime. `Base` is the part of a stage's state every kind has (its context, config, problems, the optimizer loop
and its carry); each kind's state is a small frozen dataclass holding it as `base` beside its own fields.
`init_base` builds it; `train(st, batch, ...)` runs rl.train_loop.train_on on a state, and tree / meta / template /
load are the base's checkpoint (the tree {"train_state": ...} and meta {"opt_steps", "consecutive_skips"} of every
checkpoint since the start, unchanged).

LoRA (model.lora, models/lora.py; docs/lora_upcycling.md): the train state's params are the trainable tree
{"lora": adapters[, "value_head"]} and the optimizer holds only them; the base weights are the context's
(ctx.frozen_base(), loaded once) and reach the jitted step as its non-donated fourth argument. `policy_params` is
then the merged model (what the sampler and evaluation run), `carried_params` the adapters (what the next stage and
the best-policy checkpoint take), and a checkpoint holds the adapters and their optimizer state with the lora
section in its meta (checked on load by lora.restore_item), never the base.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp

from models import lora

from rl.losses import LossConfig
from rl.train_loop import Carry, LoopConfig, Trainer, train_on
from rl.train_step import init_train_state, make_train_step, state_shardings
from schema import Checked, FieldErrors, construct, field, from_dict, name, plain, unknown_field

KINDS = ("sft", "rejection", "grpo", "ppo")
FAMILIES = ("math", "code", "instructions", "gym")  # rewards; gym problems report as gym/<generator>
ANY = object()  # a LEGACY key accepted with any value


def parse_families(v: str) -> tuple[str, ...]:
    """'' -> () (all families); "math, code" -> ("math", "code")."""
    return tuple(f.strip() for f in str(v).split(",") if f.strip())


def families_check(v) -> str | None:
    if not isinstance(v, str):
        return f"must be a string like 'math,code', got {v!r}"
    bad = [f for f in parse_families(v) if f not in FAMILIES]
    if bad:
        return f"unknown task family {bad[0]!r}; choose from {', '.join(FAMILIES)}"
    return None


def stage_problems(problems, families: str):
    """The problems of the given families ('' = all), in their original order."""
    fams = parse_families(families)
    return list(problems) if not fams else [p for p in problems if p.reward in fams]


# -- config ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, kw_only=True)
class StageInfo(Checked):
    """The name and the problems of a stage (every kind)."""

    name: str = field("stage", "stage name (summary.json key; must be unique)", name)
    families: str = field("", "task families this stage draws from: '' = every problem of tasks.mix, else a comma "
                              "list of math, code, instructions, gym", families_check)


def section(cls, doc: str, keys: tuple[str, ...] | None = None, factory=None, nested: bool = False):
    """A config section: its fields are flat keys of the stage (all, or `keys`), or with nested=True one
    sub-dict (`curriculum`). `factory` gives the kind's defaults (e.g. PPO's kl_kind k1)."""
    return dataclasses.field(default_factory=factory or cls,
                             metadata={"doc": doc, "section": cls, "keys": keys, "nested": nested})


@functools.cache
def owners(cls) -> dict[str, str | None]:
    """Flat key -> the section field that owns it (None: a field of the stage config itself)."""
    out: dict[str, str | None] = {}
    for f in dataclasses.fields(cls):
        sec = f.metadata.get("section")
        if sec is None or f.metadata.get("nested"):
            out[f.name] = None
        else:
            for k in f.metadata.get("keys") or [g.name for g in dataclasses.fields(sec)]:
                out[k] = f.name
    return out


class Flat(Checked):
    """Mixin of the stage config dataclasses (fields of its own: none): flat keys over their sections."""

    KIND: ClassVar[str] = ""
    UNIT_FIELD: ClassVar[str] = ""  # the flat key counting the stage's units
    LEGACY: ClassVar[dict[str, Any]] = {}  # flat key -> the value old files may hold (ANY: any value)
    # own flat key -> a function from any value it accepts (an older release's spelling included) to today's spelling;
    # applied before the checks, and by rl.stages.current_values to flat entries (names, old config.json files)
    SPELLINGS: ClassVar[dict[str, Callable]] = {}

    def __post_init__(self):
        for k, spell in self.SPELLINGS.items():
            object.__setattr__(self, k, spell(getattr(self, k)))
        super().__post_init__()

    @property
    def kind(self) -> str:
        return self.KIND

    @property
    def units(self) -> int:
        """Units in the stage (SFT epochs, rejection rounds, RL iterations)."""
        return int(flat_value(self, self.UNIT_FIELD))

    def to_dict(self) -> dict:
        """The flat config entry (plain containers), as a config file writes it."""
        return {"kind": self.KIND, **{k: plain(flat_value(self, k)) for k in owners(type(self))}}


_REQUIRED = object()


def flat_value(cfg, key: str, default=_REQUIRED):
    """The value of flat key `key` (as a config file writes it) of a stage config, read from the section that owns
    it; `default` for a key its kind does not have (else AttributeError)."""
    own = owners(type(cfg))
    if key not in own:
        if default is _REQUIRED:
            raise AttributeError(f"{type(cfg).__name__} has no field {key!r}")
        return default
    return getattr(getattr(cfg, own[key]), key) if own[key] else getattr(cfg, key)


def flat_fields(cls) -> list[tuple[str, Any, str]]:
    """(flat key, this kind's default, doc) of every key of a stage config class, `kind` and `curriculum` aside."""
    default, out = cls(), []
    for k, sec in owners(cls).items():
        holder = type(getattr(default, sec)) if sec else cls
        f = next(g for g in dataclasses.fields(holder) if g.name == k)
        if f.metadata.get("nested"):
            continue
        out.append((k, plain(flat_value(default, k)), f.metadata.get("doc", "")))
    return out


def from_flat(cls, d: dict):
    """Build a stage config from its flat dict: each key to its section, the kind's defaults for the rest."""
    if not isinstance(d, dict):
        raise FieldErrors([("", f"must be a section (a dict of fields), got {d!r}")])
    base, own = cls(), owners(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    errors: list[tuple[str, str]] = []
    given: dict[str, dict] = {}
    kwargs: dict[str, Any] = {}
    for k, v in d.items():
        if k == "kind":
            if v != cls.KIND:
                errors.append(("kind", f"must be {cls.KIND!r} for {cls.__name__}, got {v!r}"))
            continue
        if k in cls.LEGACY and k not in own:
            if cls.LEGACY[k] is not ANY and v != cls.LEGACY[k]:
                errors.append((k, f"is not a {cls.KIND} setting (it must stay {cls.LEGACY[k]!r}), got {v!r}"))
            continue
        if k not in own:
            errors.append((k, unknown_field(k, [*own, "kind"])))
            continue
        sec = own[k]
        f = fields[k] if sec is None else fields[sec]
        if sec is None and f.metadata.get("nested"):
            try:
                v = from_dict(f.metadata["section"], v)
            except FieldErrors as e:
                errors += [(f"{k}.{p}" if p else k, m) for p, m in e.errors]
                continue
        elif isinstance(v, list) and isinstance(flat_value(base, k), tuple):
            v = tuple(v)
        if sec is None:
            kwargs[k] = v
        else:
            given.setdefault(sec, {})[k] = v
    for sec, vals in given.items():
        try:
            kwargs[sec] = dataclasses.replace(getattr(base, sec), **vals)
        except FieldErrors as e:
            errors += e.errors
    return construct(cls, kwargs, errors)


# -- what a kind without an RL iteration answers the run's planners (rl.stages.Kind's defaults) -----------------
def flat_steps(cfg, rows: int, row_multiple: int, prompt_len: int, new_tokens: int) -> None:
    """The grouped layout of the kind's optimizer steps: none, every step is flat rows of prompt + answer."""
    del cfg, rows, row_multiple, prompt_len, new_tokens
    return None


def no_reference(cfg) -> bool:
    """Whether the kind holds a KL reference policy: it does not."""
    del cfg
    return False


def untracked(st) -> None:
    """Units that updated the policy: None, the kind does not count them (the RL iteration does, so that a stage whose
    every update was skipped is reported)."""
    del st
    return None


def no_tools(cfg) -> None:
    """The stage's tool setting when its tool is on: never, the kind samples no tool calls."""
    del cfg
    return None


def no_warnings(cfg) -> list[str]:
    """Warnings on the kind's values (rl/config_warnings.py): none."""
    del cfg
    return []


def no_checks(cfg, section: dict) -> tuple:
    """(field, reason) pairs of the rules between the kind's fields and a run section: none."""
    del cfg, section
    return ()


# -- runtime -----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Base:
    """What every stage's state holds: its context, config and problems, the optimizer loop and what it changes."""

    ctx: Any  # rl.context.RunContext
    index: int  # the stage's position in the config (rng streams, keys)
    cfg: Any  # the stage's config (SFTConfig, RejectionConfig, GRPOConfig, PPOConfig)
    problems: list  # what this stage samples or fine-tunes on (its families of the run's training problems)
    loss_cfg: LossConfig
    trainer: Trainer
    carry: Carry


def init_base(ctx, index: int, cfg, params, loss_cfg: LossConfig) -> Base:
    """A stage's train state from `params` (its optimizer state fresh) and its step function (cached per run)."""
    problems = stage_problems(ctx.train, cfg.stage.families)
    if not problems:
        raise ValueError(f"stage {cfg.stage.name!r}: no training problem of families {cfg.stage.families!r} in "
                         "tasks.mix")
    loop: LoopConfig = cfg.loop
    optim = loop.optim()
    state = init_train_state(ctx.model_cfg, loss_cfg, optim, ctx.key("state", index), mesh=ctx.mesh, rules=ctx.rules,
                             params=params)
    step_fn = ctx.cached(("step", ctx.model_cfg, loss_cfg, optim, ctx.mesh, ctx.rules),
                         lambda: make_train_step(ctx.model_cfg, loss_cfg, optim, mesh=ctx.mesh, rules=ctx.rules))
    if uses_lora(ctx):  # the frozen base is the step's fourth argument (not donated: the same arrays every step)
        step_fn = functools.partial(_lora_step, step_fn, ctx.frozen_base())
    trainer = Trainer(step_fn=step_fn, loop=loop, units=cfg.units, agg=loss_cfg.agg, max_len_norm=loss_cfg.max_len_norm,
                      max_consecutive_skips=ctx.cfg.run.max_consecutive_skips, name=cfg.stage.name)
    return Base(ctx=ctx, index=index, cfg=cfg, problems=problems, loss_cfg=loss_cfg, trainer=trainer,
                carry=Carry(state=state))


def _lora_step(step_fn, frozen, state, batch, hparams):
    return step_fn(state, batch, hparams, frozen)


def uses_lora(ctx) -> bool:
    return ctx.model_cfg.lora is not None


def with_carry(st, carry: Carry):
    """A stage state (any kind's: it holds `base`) with a new carry."""
    return dataclasses.replace(st, base=dataclasses.replace(st.base, carry=carry))


def train(st, batch: dict, **kw):
    """rl.train_loop.train_on over a stage state's train state: (new state, metrics); kw as train_on's."""
    carry, m = train_on(st.base.trainer, st.base.carry, batch, **kw)
    return with_carry(st, carry), m


def carried_params(st) -> dict:
    """The policy as the train state holds it (PPO's value head left out): the model's params, or with LoRA the
    adapters {"lora": ...}. What the next stage starts from and the best-policy checkpoint holds."""
    return {k: v for k, v in st.base.carry.state["params"].items() if k != "value_head"}


def policy_params(st) -> dict:
    """The policy's plain parameters (PPO's value head left out), what the sampler and evaluation run: with LoRA
    the adapters merged into the frozen base (one merge per call)."""
    return st.base.ctx.policy_weights(carried_params(st))


def reference_params(st) -> dict:
    """The KL reference policy of an RL stage: the policy the stage starts from. Without LoRA a copy of its params.
    With LoRA, when the stage starts from fresh adapters (no earlier stage trained them), the frozen base itself (the
    same arrays: no second copy of the weights); after a LoRA cold start, a copy of the stage's starting adapters
    {"lora": ...} (small), which ctx.policy_weights merges into the base for each reference pass."""
    ctx = st.base.ctx
    if not uses_lora(ctx):
        return jax.tree.map(jnp.copy, policy_params(st))
    adapters = carried_params(st)[lora.ADAPTER_KEY]
    if lora.is_identity(adapters):
        return ctx.frozen_base()
    return jax.tree.map(jnp.copy, adapters_reference(st))  # a copy: the train step donates the state's


def adapters_reference(st) -> dict:
    """A LoRA stage's adapters as a reference tree {"lora": ...} (the same arrays: a checkpoint template)."""
    return {lora.ADAPTER_KEY: carried_params(st)[lora.ADAPTER_KEY]}


def reference_is_adapters(st) -> bool:
    """True when a LoRA stage's reference is its starting adapters (reference_params), which checkpoints hold; the
    frozen base never is."""
    ref = getattr(st, "ref_params", None)
    return ref is not None and uses_lora(st.base.ctx) and lora.ADAPTER_KEY in ref


def model_params(st) -> dict:
    """The train state's params as the forward takes them (PPO's value head kept): LoRA's merged."""
    return st.base.ctx.policy_weights(st.base.carry.state["params"])


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def tree(st) -> dict:
    return {"train_state": st.base.carry.state}


def meta(st) -> dict:
    c = st.base.carry
    m = {"opt_steps": c.opt_steps, "consecutive_skips": c.consecutive_skips}
    if uses_lora(st.base.ctx):  # the lora section the adapters were made with, checked on load
        m.update(lora.checkpoint_item(c.state["params"], st.base.ctx.model_cfg)[1])
    return m


def template(st, meta: dict) -> dict:
    """The tree structure `load` expects for a checkpoint written with `meta`."""
    del meta
    return tree(st)


def load(st, tree: dict, meta: dict):
    """`st` with the checkpoint's train state and counters."""
    def restore(t, x):
        return jax.random.wrap_key_data(jnp.asarray(x)) if _is_key(t) else jnp.asarray(x, dtype=t.dtype)

    b = st.base
    if uses_lora(b.ctx):  # adapters of another rank / targets / model are refused, naming the difference
        try:
            lora.restore_item(tree["train_state"]["params"], meta, b.ctx.frozen_base(), b.ctx.model_cfg)
        except ValueError as e:
            raise ValueError(f"stage {b.cfg.stage.name!r}: {e}") from None
    state = jax.tree.map(restore, b.carry.state, tree["train_state"])
    if b.ctx.mesh is not None:
        state = jax.device_put(state, state_shardings(b.ctx.model_cfg, b.loss_cfg, b.cfg.loop.optim(), b.ctx.mesh,
                                                      b.ctx.rules))
    return with_carry(st, Carry(state=state, opt_steps=int(meta.get("opt_steps", 0)),
                                consecutive_skips=int(meta.get("consecutive_skips", 0))))
