"""The project's one config schema mechanism, the bottom layer every package builds on: typed config fields, each
with a default, a one-line doc and a range check.

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class MyStage(Checked):
        lr: float = field(1e-3, "peak learning rate", num(0.0, 10.0, lo_open=True))

    MyStage(lr=-1)   # FieldErrors: "lr must be > 0.0, got -1"
    from_dict(MyStage, {"lr": 1e-3, "lrr": 2})   # FieldErrors naming "lrr" ("did you mean 'lr'?")
    describe(MyStage, "stages[i]")   # ["stages[i].lr = 0.001  # peak learning rate"] (the launcher's --help_config)

Every check returns the reason (without the field name) or None. Numbers must be finite and booleans are not
numbers; sizes have upper bounds, so a typo such as 1e12 problems fails before any compute, with the field named.
`FieldErrors` carries every problem at once (the launcher prints them all and exits 2).

It sits below models/ so that every section imports it by this one name: models/config.py (ModelConfig) and
models/adaptation.py (model.lora, model.upcycle), rewards/combine.py (the reward section), rl/config_validation.py
(run, tasks, sampling, eval, ...), the stage configs (rl/stages/) and the PRM wing's sections. A Checked dataclass is
frozen and read by attribute (`section.lr`); `to_dict()` gives plain containers (what config.json stores).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Callable

Check = Callable[[Any], "str | None"]


class FieldErrors(ValueError):
    """One or more invalid fields; `errors` holds (field path, reason) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = list(errors)
        super().__init__("; ".join(f"{p} {m}" if p else m for p, m in self.errors))

    def prefixed(self, prefix: str) -> list[str]:
        """The errors as lines with `prefix` before each field path (e.g. 'stages[2].')."""
        return [f"{prefix}{p} {m}" if p else f"{prefix.rstrip('.')}: {m}" for p, m in self.errors]


def field(default, doc: str, check: Check | None = None, section: type | None = None):
    """A dataclass field with its doc and range check in the metadata; `section`: the dataclass of the optional
    section the field holds (None = off), which section_type reports (the command line creates it with its defaults)."""
    meta = {"doc": doc, "check": check, **({"section": section} if section is not None else {})}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def doc_of(cls, name: str) -> str:
    return next(f.metadata.get("doc", "") for f in dataclasses.fields(cls) if f.name == name)


def default_of(f: dataclasses.Field):
    """A field's default value (its factory called when it has one)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def section_type(f: dataclasses.Field) -> type | None:
    """The section dataclass a field holds, None for a plain field: the metadata's (an optional section such as
    model.lora, a stage's nested section such as tools) or its default's type (a run section such as eval)."""
    sec = f.metadata.get("section")
    if sec is None:
        d = default_of(f)
        sec = type(d) if dataclasses.is_dataclass(d) and not isinstance(d, type) else None
    return sec


def describe(cls, prefix: str) -> list[str]:
    """'prefix.name = default  # doc' for every field of a dataclass, each optional section's fields (a field made
    with `section=`: model.lora, model.upcycle) after its own line."""
    lines = []
    for f in dataclasses.fields(cls):
        lines.append(f"{prefix}.{f.name} = {default_of(f)!r}  # {f.metadata.get('doc', '')}")
        if f.metadata.get("section") is not None and f.metadata.get("nested", True):  # not a stage's flat keys
            lines += describe(f.metadata["section"], f"{prefix}.{f.name}")
    return lines


def suggest(name: str, known) -> str:
    """"did you mean 'epochs'?" for a misspelled field, else the list of known fields."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=2, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(repr(c) for c in close)}?"
    return f"known: {', '.join(sorted(str(k) for k in known))}"


def unknown_field(name: str, known) -> str:
    return f"is not a known field; {suggest(name, known)}"


# -- checks ---------------------------------------------------------------------------------------------
def key_values(text: str, what: str = "item", form: str = "key=value") -> list[tuple[str, str]]:
    """'a=1, b=x' -> [("a", "1"), ("b", "x")]: the one reader of a comma-separated key=value list (a config file's
    arg, gym settings, source levels, sharding rules), keys and values stripped, empty items skipped. Each caller
    reads its values its own way. ValueError names the item (`what`: its kind, e.g. "gym setting") that has no '='
    or no key, with `form` (what an item must look like), and a key given twice."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        key, eq, value = (x.strip() for x in part.partition("="))
        if not eq or not key:
            raise ValueError(f"{what} {part!r} must be {form}")
        if key in out:
            raise ValueError(f"{what} {key!r} is given twice in {text!r}")
        out[key] = value
    return list(out.items())


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    def c(v):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be an int, got {v!r}"
        if lo is not None and v < lo:
            return f"must be >= {lo}, got {v}"
        if hi is not None and v > hi:
            return f"must be <= {hi}, got {v}"
        return None

    return c


def num(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> Check:
    def c(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"must be a number, got {v!r}"
        if not math.isfinite(v):
            return f"must be a finite number, got {v!r}"
        if lo is not None and (v < lo or (lo_open and v == lo)):
            return f"must be {'>' if lo_open else '>='} {lo}, got {v}"
        if hi is not None and (v > hi or (hi_open and v == hi)):
            return f"must be {'<' if hi_open else '<='} {hi}, got {v}"
        return None

    return c


def optional(check: Check, meaning: str) -> Check:
    """None (meaning `meaning`) or a value `check` accepts."""
    def c(v):
        msg = None if v is None else check(v)
        return msg and msg.replace("must be", f"must be None ({meaning}) or", 1)

    return c


def boolean(v) -> str | None:
    return None if isinstance(v, bool) else f"must be true/false, got {v!r}"


def choice(*opts) -> Check:
    def c(v):
        return None if v in opts else f"must be one of {'|'.join(map(str, opts))}, got {v!r}"

    return c


def text(v) -> str | None:
    return None if isinstance(v, str) else f"must be a string, got {v!r}"


def name(v) -> str | None:
    if not isinstance(v, str) or not v.strip():
        return f"must be a non-empty string, got {v!r}"
    if any(ch in v for ch in "/\\\n"):
        return f"must not contain '/', '\\' or newlines, got {v!r}"
    return None


# -- dataclasses with checked fields ----------------------------------------------------------------------
class Checked:
    """Mixin for frozen keyword-only dataclasses: `__post_init__` reads each optional section's value (a field made
    with `section=`: a dict or ConfigDict becomes the section, its errors named `lora.rank`, ...), runs every field's
    check, then `cross_checks`."""

    def __post_init__(self):
        errors = []
        for f in dataclasses.fields(self):
            sec, v = f.metadata.get("section"), getattr(self, f.name)
            if sec is not None and v is not None and not isinstance(v, sec):
                try:
                    object.__setattr__(self, f.name, section_value(sec, v))
                except FieldErrors as e:
                    errors += [(f"{f.name}.{p}" if p else f.name, m) for p, m in e.errors]
                    continue
            check = f.metadata.get("check")
            if check is not None:
                msg = check(getattr(self, f.name))
                if msg:
                    errors.append((f.name, msg))
        if not errors:  # cross-field rules assume each field is well-formed
            errors += list(self.cross_checks())
        if errors:
            raise FieldErrors(errors)

    def cross_checks(self):
        """(field, reason) pairs for rules between fields; none by default."""
        return ()

    def to_dict(self) -> dict:
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self, **changes):
        """A copy with `changes` (checked like a new instance)."""
        return dataclasses.replace(self, **changes)


def plain(v):
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return v.to_dict() if hasattr(v, "to_dict") else dataclasses.asdict(v)
    if isinstance(v, (tuple, list)):
        return [plain(x) for x in v]
    return v


def from_dict(cls, d: dict):
    """Build `cls` from a plain dict: unknown keys are errors, missing keys take their defaults, lists become
    tuples where the default is a tuple (an optional section's sub-dict is read by Checked.__post_init__)."""
    if not isinstance(d, dict):
        raise FieldErrors([("", f"must be a section (a dict of fields), got {d!r}")])
    fields = {f.name: f for f in dataclasses.fields(cls)}
    errors = [(k, unknown_field(k, fields)) for k in d if k not in fields]
    kwargs = {}
    for k, v in d.items():
        if k not in fields:
            continue
        if isinstance(v, list) and isinstance(fields[k].default, tuple):
            v = tuple(v)
        kwargs[k] = v
    return construct(cls, kwargs, errors)


def section_value(cls, value):
    """`cls` from itself, a dict or a ConfigDict (anything with to_dict()): how an optional section's value is read
    (model.lora, model.upcycle, a checkpoint's stored lora); FieldErrors naming the section's own fields."""
    if isinstance(value, cls):
        return value
    return from_dict(cls, value.to_dict() if hasattr(value, "to_dict") else value)


def construct(cls, kwargs: dict, errors: list):
    """cls(**kwargs), raising one FieldErrors with `errors` (the caller's, found while reading the fields) plus the
    constructor's own checks: every problem of a section in one pass."""
    try:
        obj = cls(**kwargs)
    except FieldErrors as e:
        raise FieldErrors(errors + e.errors) from None
    if errors:
        raise FieldErrors(errors)
    return obj
