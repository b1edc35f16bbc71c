"""The one bounded renderer of chat templates: a checkpoint's Jinja program (a folder's chat_template.jinja or
tokenizer_config.json, a GGUF file's tokenizer.chat_template) is untrusted code, and every render goes through here.

    template = compile_template(source)                  # ValueError for a template past MAX_SOURCE_CHARS
    text = render(template, messages=[...], add_generation_prompt=True, ...)   # TemplateLimit past a bound
    text = bounded(lambda: ...)                           # any callable under the step / time limit

models/tokenizer.py's HFTokenizer.render_chat_template is the only caller of render (the pre-run checks, the run's
prompts, python_tool.chat_markers, `experiments.eval --model` all render through it). The environment is the one
transformers renders templates in (Jinja2's immutable sandbox, trim_blocks / lstrip_blocks, loop controls, tojson
keeping non-ASCII text, raise_exception, strftime_now) with these bounds, each a TemplateLimit (a ValueError) that
names what ran past it:

- steps, time and memory: a Python trace hook counts the template's own lines (MAX_STEPS) and checks the clock
  (MAX_SECONDS) every 64 of them, and the memory the process gained (MAX_RENDER_BYTES) once a render has run past
  MEMORY_CHECK_AFTER lines, so a loop is stopped;
- one operation cannot run for long or build something huge inside a single line, where the hook cannot stop it:
  `**` and `*` on integers are refused past MAX_INT_BITS (`3**40000000`, `9**9**9` were computed by the compiler's
  constant folding or in one C call), repetition (`'x' * 1500000000`, `[s] * n`), `+`, `~` and `%` past MAX_CHARS,
  a numeric argument past MAX_CHARS to any call or filter (widths: `center`, `ljust`, `indent`, ...), `tojson`'s
  indent past MAX_JSON_INDENT (`tojson(indent=1e8)` wrote 1.3 GB), and the filters and methods whose output can
  outgrow their input (join, replace, indent, format, wordwrap, pprint, tojson, expandtabs, translate, str.format)
  are held to MAX_CHARS before they run;
- output: every `{{ ... }}` value, every joined buffer (the render's output, `{% set %}` blocks, macros) at most
  MAX_CHARS characters.

A real chat template renders a conversation in a few hundred lines and a few KB; the bounds are far above that.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from datetime import datetime
from string import Formatter

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_STEPS = 200_000  # template lines per render; a real chat template runs a few hundred
MAX_SECONDS = 10.0
MAX_CHARS = 1_000_000  # any string or list a template builds, and its output
MAX_INT_BITS = 1 << 16  # integers a template computes (** and *)
MAX_JSON_INDENT = 16
MAX_SOURCE_CHARS = 1_000_000  # the template's own text
MAX_RENDER_BYTES = 1 << 30  # memory one render may gain (checked every 64 lines past MEMORY_CHECK_AFTER)
# Real chat templates render in a few hundred lines: the process's memory (which other threads change too, e.g. XLA
# running beside a prompt render) is only held against a render that has run longer than this.
MEMORY_CHECK_AFTER = 2048


class TemplateLimit(ValueError):
    """A chat template ran past one of the renderer's bounds (steps, time, size of what it builds)."""


def _limit(what: str):
    return TemplateLimit(f"the chat template {what}")


# ---- steps and time ---------------------------------------------------------------------------------------------------
def _resident_bytes() -> int:
    """This process's resident memory (Linux /proc; 0 where it cannot be read: the memory bound is then off)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def bounded(fn, max_steps: int = MAX_STEPS, seconds: float = MAX_SECONDS):
    """fn() with every Jinja template frame's lines counted: TemplateLimit past the budget (one render). Every 64
    lines the clock is checked too, and past MEMORY_CHECK_AFTER lines the memory the process gained since then
    (MAX_RENDER_BYTES: a loop keeping many bounded values alive)."""
    steps, deadline, max_bytes, after = [0], time.monotonic() + seconds, MAX_RENDER_BYTES, MEMORY_CHECK_AFTER
    start = [None]  # the resident memory when the render got long (read once it does: most renders never do)

    def local(frame, event, arg):
        if event == "line":
            steps[0] += 1
            if steps[0] > max_steps or (steps[0] % 64 == 0 and time.monotonic() > deadline):
                raise _limit(f"ran past {max_steps} steps / {seconds:g} s (a loop?)")
            if steps[0] % 64 == 0 and steps[0] > after:
                if start[0] is None:
                    start[0] = _resident_bytes()
                elif start[0] and _resident_bytes() - start[0] > max_bytes:
                    raise _limit(f"holds over {max_bytes >> 20} MiB of values")
        return local

    def trace(frame, event, arg):  # only the template's compiled code is traced line by line
        return local if frame.f_code.co_filename == "<template>" else None

    old = sys.gettrace()
    sys.settrace(trace)
    try:
        return fn()
    finally:
        sys.settrace(old)


# ---- sizes ------------------------------------------------------------------------------------------------------------
def _is_int(x) -> bool:
    return isinstance(x, int)  # bools too: small


def _is_number(x) -> bool:
    return isinstance(x, (int, float))


def _is_seq(x) -> bool:
    return isinstance(x, (str, list, tuple))


def _text_bound(x, limit: int = MAX_CHARS) -> tuple[int, int]:
    """(an upper bound of len(str(x)) and of json.dumps(x) without indent, the nesting depth), the walk stopping
    once past `limit`: str() of a list holding one long string many times is built in one C call."""
    total, depth, stack = 0, 0, [(x, 0)]
    while stack and total <= limit:
        v, d = stack.pop()
        depth = max(depth, d)
        if isinstance(v, str):
            total += len(v) if d == 0 else 6 * len(v) + 2  # quoted and escaped inside a container (\u0000)
        elif isinstance(v, (list, tuple)):
            total += 2 + 2 * len(v)
            stack.extend((i, d + 1) for i in v)
        elif isinstance(v, dict):
            total += 2 + 4 * len(v)
            stack.extend((i, d + 1) for kv in v.items() for i in kv)
        elif _is_int(v):
            total += v.bit_length() // 3 + 2
        else:
            total += 32  # floats, None, Undefined, a namespace or a cycler's repr
    return total, depth


def _check_size(n: int, what: str) -> None:
    if n > MAX_CHARS:
        raise _limit(f"builds {what} of over {MAX_CHARS} characters or items")


def _check_numbers(args, kwargs, where: str) -> None:
    """No numeric argument past MAX_CHARS: widths, counts, indents."""
    for v in (*args, *kwargs.values()):
        if _is_number(v) and not isinstance(v, bool) and abs(v) > MAX_CHARS:
            raise _limit(f"passes {v!r} to {where} (more than {MAX_CHARS})")


def _check_percent(fmt: str, args) -> None:
    """`fmt % args`: its text, each conversion's width and precision, each argument's text per conversion."""
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, tuple) else [args]
    _check_numbers(values, {}, "a % format")
    widths = sum(int(n) for n in re.findall(r"\d+", fmt))
    specs = fmt.count("%")
    longest = max((_text_bound(v)[0] for v in values), default=0)
    _check_size(len(fmt) + widths + specs * longest, "a %-formatted string")


def _check_str_format(fmt: str, args, kwargs) -> None:
    """`fmt.format(*args, **kwargs)`: its text, the widths in its fields' specs, each argument's text per field."""
    _check_numbers(args, kwargs, "str.format")
    try:
        fields = [spec or "" for _, name, spec, _ in Formatter().parse(fmt) if name is not None]
    except ValueError:
        return  # malformed: format() raises its own error
    widths = sum(int(n) for spec in fields for n in re.findall(r"\d+", spec))
    longest = max((_text_bound(v)[0] for v in (*args, *kwargs.values())), default=0)
    _check_size(len(fmt) + widths + len(fields) * longest, "a formatted string")


def _check_join(items, sep) -> None:
    items = list(items) if not isinstance(items, (list, tuple, str)) else items
    _check_size(sum(_text_bound(i)[0] for i in items) + len(str(sep)) * max(len(items) - 1, 0), "a joined string")


def _check_replace(s: str, old, new) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str) and len(new) > len(old):
        hits = len(s) + 1 if not old else s.count(old)
        _check_size(len(s) + hits * (len(new) - len(old)), "a replaced string")


# ---- filters and methods whose output can outgrow their input: checked before they run ------------------------------
def _filter_join(value, d="", attribute=None):
    _check_join(value if isinstance(value, (list, tuple, str)) else list(value), d)


def _filter_indent(s, width=4, first=False, blank=False):
    pad = len(width) if isinstance(width, str) else width if _is_int(width) else 0
    _check_size(len(str(s)) + (str(s).count("\n") + 1) * pad, "an indented string")


def _filter_replace(s, old, new, count=None):
    _check_replace(str(s), old, new)


def _filter_format(value, *args, **kwargs):
    if isinstance(value, str):
        _check_percent(value, kwargs or tuple(args))


def _filter_wordwrap(s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True):
    _check_size(len(str(s)) * (1 + len(wrapstring or "\n")), "a wrapped string")


def _filter_pprint(value):
    _check_size(2 * _text_bound(value)[0], "a pretty-printed value")


PRECHECKS = {"join": _filter_join, "indent": _filter_indent, "replace": _filter_replace, "format": _filter_format,
             "wordwrap": _filter_wordwrap, "pprint": _filter_pprint}


def _bounded_filter(name: str, fn):
    """A filter with its numeric arguments and its output size held to the bounds (and its precheck, if any)."""
    check = PRECHECKS.get(name)

    @functools.wraps(fn)  # keeps jinja's pass_context / pass_environment marker
    def wrapper(*args, **kwargs):
        values = [a for a in args if not isinstance(a, (jinja2.runtime.Context, jinja2.Environment,
                                                         jinja2.nodes.EvalContext))]
        _check_numbers(values[1:], kwargs, f"the {name} filter")
        if check is not None and values:
            check(*values, **kwargs)
        out = fn(*args, **kwargs)
        if isinstance(out, (str, list, tuple)):
            _check_size(len(out), f"with the {name} filter a value")
        return out

    return wrapper


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson (non-ASCII kept), its indent at most MAX_JSON_INDENT and its output bounded first."""
    width = len(indent) if isinstance(indent, str) else indent or 0
    if not (isinstance(indent, str) or indent is None or _is_int(indent)) or width > MAX_JSON_INDENT:
        raise _limit(f"calls tojson with indent {indent!r} (at most {MAX_JSON_INDENT})")
    size, depth = _text_bound(x)
    _check_size(size * (1 + width * depth), "a JSON text")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _check_method(obj, args, kwargs) -> None:
    """str methods whose output can outgrow their input (the width-taking ones are bounded by their argument)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return
    if name == "join" and args:
        _check_join(args[0], owner)
    elif name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1])
    elif name == "expandtabs":
        tab = (args or [kwargs.get("tabsize", 8)])[0]
        _check_size(len(owner) + owner.count("\t") * (tab if _is_int(tab) else 0), "an expanded string")
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        _check_size(len(owner) * max(longest, 1), "a translated string")


# ---- the environment --------------------------------------------------------------------------------------------------
class _CodeGenerator(CodeGenerator):
    def visit_Concat(self, node, frame) -> None:  # `a ~ b`: joined under the size bound (environment.join_text)
        self.write("environment.join_text((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Environment(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox with the module docstring's bounds."""

    intercepted_binops = frozenset({"**", "*", "+", "%"})  # also stops the compiler folding them as constants
    code_generator_class = _CodeGenerator

    def call_binop(self, context, operator, left, right):
        if operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1 \
                and right * abs(left).bit_length() > MAX_INT_BITS:
            raise _limit(f"computes {left} ** {right} (over {MAX_INT_BITS} bits)")
        if operator == "*":
            seq, n = (left, right) if _is_seq(left) else (right, left) if _is_seq(right) else (None, None)
            if seq is not None and _is_int(n):
                _check_size(len(seq) * max(n, 0), "by repetition a value")
            elif _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise _limit(f"multiplies integers of over {MAX_INT_BITS} bits")
        if operator == "+" and _is_seq(left) and _is_seq(right):
            _check_size(len(left) + len(right), "by + a value")
        if operator == "%" and isinstance(left, str):
            _check_percent(left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's own signature
        if __obj is not __self.globals.get("range"):  # safe_range bounds itself (MAX_RANGE items)
            _check_numbers(args, kwargs, getattr(__obj, "__name__", "a call"))
        _check_method(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value):
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        def bounded_format(*args, **kwargs):
            _check_str_format(fmt, () if is_map else args, args[0] if is_map and args else kwargs)
            return wrapped(*args, **kwargs)

        return bounded_format

    def concat(self, pieces) -> str:  # every buffer a template joins (its output, set blocks, macros)
        out, total = [], 0
        for p in pieces:
            total += len(p)
            _check_size(total, "output")
            out.append(p)
        return "".join(out)

    def join_text(self, values) -> str:
        return self.concat(map(_finalize, values))


def _finalize(value):
    """Every `{{ ... }}` value (and each part of `a ~ b`) as text, its size bounded before str() builds it."""
    _check_size(_text_bound(value)[0], "output")
    return value if isinstance(value, str) else str(value)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def environment() -> jinja2.Environment:
    """The environment chat templates are compiled in (see the module docstring)."""
    env = _Environment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols],
                       finalize=_finalize)
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
    env.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs: no chat template uses it
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def compile_template(source: str) -> jinja2.Template:
    """A chat template compiled in the bounded environment; ValueError for a source past MAX_SOURCE_CHARS."""
    if len(source) > MAX_SOURCE_CHARS:
        raise ValueError(f"the chat template has {len(source)} characters (at most {MAX_SOURCE_CHARS})")
    return environment().from_string(source)


def render(template: jinja2.Template, **variables) -> str:
    """template.render(**variables) under every bound; TemplateLimit names the one it ran past."""
    return bounded(lambda: template.render(**variables))


__all__ = ["TemplateLimit", "bounded", "compile_template", "render", "environment", "MAX_STEPS", "MAX_SECONDS",
           "MAX_CHARS", "MAX_INT_BITS", "MAX_JSON_INDENT", "MAX_RENDER_BYTES"]
