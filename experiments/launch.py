"""Launch one experiment from a config file.

    python -m experiments.launch --config experiments/configs/quickstart.py[:variant=tiny,seed=3] \
        --workdir runs/quickstart [--config.stages[2].iterations=40 --config.seed=1 ...]

Steps: load the config file and call its get_config(arg); apply the --config.* overrides
(the value is parsed as a Python literal when the field holds a number / bool / tuple / section, else kept
as text; a boolean is not a number; list entries are addressed as stages[2] or stages.2; a section takes
dict(a=1, b=2) or {'a': 1, 'b': 2} as in a config file, read as a literal, never evaluated; a field of a section
that is off, --config.model.upcycle.n_experts=4, turns the section on with its other fields at their defaults); validate
everything, including what needs the data and the machine (rl/preflight.py: mesh vs devices, a
checkpoint folder's files, problems the splits can supply, prompt and solution lengths, memory);
every problem is printed together, each naming the field and a value that works, and the launcher
exits with status 2 before any compute; write workdir/config.json (plus "kernels": the backend kernels
this process uses, rl.setup.backend_kernels); run the stages (rl/run.py, which
resumes if the workdir already holds a checkpoint). A recipe written for the byte tokenizer run with
--config.model.hf_path gets its lengths in the checkpoint's tokens (rl/pretrained.py). Other flags:

    --dry_run       run every check, do not train
    --verbose       print the resolved config
    --help_config   print every config field with its default and meaning (every section's fields: model.lora.*,
                    model.upcycle.*, stages[i].tools.*, stages[i].curriculum.*, ...)
    --init_from W   start from the end of what run W ran of the stages this config shares with it (e.g. a
                    sweep's shared cold start; rl/prefix.py): same numbers as running those stages here
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import sys

import ml_collections

import prm
from rl import config_validation as cv
from rl import prefix, preflight, workdir_lock
from rl.checkpoint import CheckpointError
from rl.setup import Prepared, backend_kernels
from rl.workdir_state import check_resume, has_checkpoint
from schema import suggest


def load_config_file(spec: str):
    """'path/to/file.py[:arg]' -> (module, arg or None); ConfigError for a missing, unreadable or broken file."""
    path, _, arg = spec.partition(":")
    if not os.path.isfile(path):
        raise cv.ConfigError(f"--config: {path!r} is not a file" + (" (it is a directory)" if os.path.isdir(path) else ""))
    name = "expcfg_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    try:
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    except Exception as e:  # a syntax error or an exception at import: the user's file, reported as such
        raise cv.ConfigError(f"--config: {path} failed to load: {type(e).__name__}: {e}") from None
    if not callable(getattr(module, "get_config", None)):
        raise cv.ConfigError(f"--config: {path} has no get_config(arg=None)")
    return module, (arg or None)


def get_config(spec: str) -> ml_collections.ConfigDict:
    module, arg = load_config_file(spec)
    try:
        config = module.get_config(arg)
    except cv.ConfigError:
        raise
    except Exception as e:
        raise cv.ConfigError(f"--config: get_config({arg!r}) of {spec.partition(':')[0]} raised "
                             f"{type(e).__name__}: {e}") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise cv.ConfigError(f"--config: get_config() must return an ml_collections.ConfigDict, got "
                             f"{type(config).__name__}")
    return config


_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def split_path(path: str) -> list:
    """'stages[2].curriculum.enabled' or 'stages.2.curriculum.enabled' -> ['stages', 2, 'curriculum', 'enabled']."""
    parts = []
    for m in _PART.finditer(path):
        name, idx = m.group(1), m.group(2)
        if idx is not None:
            parts.append(int(idx))
        elif name.isdigit():
            parts.append(int(name))
        else:
            parts.append(name)
    if not parts:
        raise cv.ConfigError(f"empty override path {path!r}")
    return parts


class _DictCalls(ast.NodeTransformer):
    """dict(a=1, b=2) -> {'a': 1, 'b': 2} in a parsed expression (keyword arguments only; any other call stays a
    call, which ast.literal_eval refuses)."""

    def visit_Call(self, node):
        self.generic_visit(node)  # inner dict(...) first
        if (isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args
                and all(kw.arg is not None for kw in node.keywords)):
            return ast.Dict(keys=[ast.Constant(kw.arg) for kw in node.keywords],
                            values=[kw.value for kw in node.keywords])
        return node


def literal(text: str):
    """A Python literal from command-line text, as a config file writes it: numbers, strings, booleans, None,
    tuples, lists, {...} and dict(key=value, ...) (read as the dict literal it spells, nested ones too). Nothing is
    evaluated (ast.literal_eval of the parsed tree); ValueError for anything else."""
    try:
        return ast.literal_eval(_DictCalls().visit(ast.parse(text.strip(), mode="eval")).body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
        raise ValueError(f"not a literal: {text!r} ({type(e).__name__})") from None


def parse_value(text: str, current):
    """Parse an override value like the field it replaces: bool, a string kept as text, else a literal (number,
    tuple, None, or a section as dict(...) / {...}; text that is no literal is kept for the validator to name)."""
    if isinstance(current, bool):
        low = text.strip().lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise cv.ConfigError(f"expected true/false, got {text!r}")
    if isinstance(current, str):
        return text
    try:
        v = literal(text)  # user-supplied config text, a literal only (never model output)
    except ValueError:
        return text  # the validator will say what the field expects
    if isinstance(v, bool) and isinstance(current, (int, float)):  # ConfigDict would store True as 1.0
        raise cv.ConfigError(f"expected a number, got {text!r} (a boolean is not a number)")
    if isinstance(current, float) and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if isinstance(current, tuple) and isinstance(v, list):
        v = tuple(v)
    return v


_MISSING = object()


def _child(node, key):
    try:
        return node[key]
    except (KeyError, IndexError, TypeError, AttributeError):
        return _MISSING


def _store(node, key, value) -> None:
    if isinstance(node, ml_collections.ConfigDict):
        with node.ignore_type():
            node[key] = value
    else:
        node[key] = value


def set_override(config, path: str, text: str):
    """Set config[path] = text parsed like the field it replaces (parse_value) and return the value set. A section
    on the way that is off (None) or absent is created with its defaults first (rl.config_validation
    .section_defaults: model.upcycle.n_experts=4 turns upcycling on). ConfigError naming the part of the path that
    does not exist."""
    parts = split_path(path)
    node, shown = config, ""
    for k, p in enumerate(parts[:-1]):
        shown += f"[{p}]" if isinstance(p, int) else (f".{p}" if shown else p)
        child = _child(node, p)
        if child is None or child is _MISSING:
            defaults = cv.section_defaults(config, parts[:k + 1])
            if defaults is None:
                raise cv.ConfigError(f"{shown} does not exist" if child is _MISSING else
                                     f"{shown} is None and not a section")
            _store(node, p, ml_collections.ConfigDict(defaults))
            child = node[p]
        node = child
    if not isinstance(node, (ml_collections.ConfigDict, dict, list)):
        raise cv.ConfigError(f"{shown} is {node!r}, not a section")
    last = parts[-1]
    current = _child(node, last)
    if current is _MISSING:
        known = list(node.keys()) if hasattr(node, "keys") else []
        raise cv.ConfigError(f"no field {last!r} there" + (f"; {suggest(last, known)}" if known else ""))
    value = parse_value(text, current)
    _store(node, last, value)
    return node[last]


def apply_override(config, path: str, text: str) -> None:
    """Set config[path] = parsed text (set_override); ConfigError naming the flag."""
    try:
        set_override(config, path, text)
    except cv.ConfigError as e:
        raise cv.ConfigError(f"--config.{path}: {e}") from None


def apply_overrides(config, overrides: list[tuple[str, str]]) -> None:
    """Apply every override; ConfigError listing all that failed (the others are applied)."""
    errors = []
    for path, text in overrides:
        try:
            apply_override(config, path, text)
        except cv.ConfigError as e:
            errors.append(str(e))
    if len(errors) == 1:
        raise cv.ConfigError(errors[0])
    if errors:
        raise cv.problems_error("overrides that cannot be applied", errors)


def parse_args(argv: list[str]):
    ap = argparse.ArgumentParser(prog="python -m experiments.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="experiments/configs/NAME.py[:arg]")
    ap.add_argument("--workdir", help="output directory (resumes if it holds a checkpoint)")
    ap.add_argument("--dry_run", action="store_true", help="validate and print the config, do not train")
    ap.add_argument("--help_config", action="store_true", help="list every config field")
    ap.add_argument("--verbose", action="store_true", help="print the resolved config")
    ap.add_argument("--init_from", default="", help="a run's workdir whose leading stages this config shares: start "
                                                    "from its checkpoint inside them")
    args, rest = ap.parse_known_args(argv)
    overrides = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if not a.startswith("--config."):
            ap.error(f"unknown argument {a!r} (overrides look like --config.a.b=value)")
        body = a[len("--config.") :]
        if "=" in body:
            path, _, val = body.partition("=")
        else:
            if i + 1 >= len(rest):
                ap.error(f"{a} needs a value")
            path, val = body, rest[i + 1]
            i += 1
        overrides.append((path, val))
        i += 1
    if not args.help_config and not args.config:
        ap.error("--config is required")
    if not args.help_config and not args.dry_run and not args.workdir:
        ap.error("--workdir is required (or pass --dry_run)")
    return args, overrides


def on_checkpoint(cfg, recipe_hf: bool) -> tuple[dict, list[str]]:
    """(the config the run uses as plain dicts, notes): a recipe written for the byte tokenizer (`recipe_hf`: its
    get_config set model.hf_path) run on model.hf_path gets its lengths in the checkpoint's tokens
    (rl.preflight.port_to_checkpoint; experiments/sweep.py records what the launcher will)."""
    cfg = cv.typed(cfg)
    if (cfg.model.hf_path or cfg.model.pretrained) and not recipe_hf:
        cfg, notes = preflight.port_to_checkpoint(cfg)
        return cfg.to_dict(), notes
    return cfg.to_dict(), []


PROMPT_FIELDS = {"tasks.mix", "tasks.lang", "tasks.difficulty", "model.system_prompt", "model.chat_template"}


def checked_config(args, overrides) -> tuple[Prepared, bool]:
    """(the prepared run, whether it starts from --init_from): every check before any compute, in one pass. The
    override and field errors are reported together; once the config is valid, the workdir, the machine and the
    data are checked and their problems reported together (rl.preflight.prepare, which the run then uses as is)."""
    config = get_config(args.config)
    recipe_hf = bool(config.model.get("hf_path") or config.model.get("pretrained"))
    # a checkpoint recipe's prompt length was measured on its own prompts: other prompts (another task mix, language,
    # system turn) get theirs measured again, as a byte-tokenizer recipe's are (rl.pretrained.port_lengths)
    paths = {p for p, _ in overrides}
    new_prompts = bool(paths & PROMPT_FIELDS or any(p.endswith("_source") for p in paths if p.startswith("tasks."))) \
        and "tasks.max_prompt_len" not in paths  # a length the user sets is the user's
    errors = []
    try:
        apply_overrides(config, overrides)
    except cv.ConfigError as e:
        errors.extend(e.problems or [str(e)])
    try:
        cfg = cv.validate(config)
    except cv.ConfigError as e:  # the checks below need a valid config
        raise cv.problems_error("invalid config", errors + (e.problems or [str(e)])) from None
    prep = None
    try:  # a misspelled override is reported with the machine's and the data's problems
        prep = preflight.prepare(cfg, port=not recipe_hf or new_prompts, workdir=args.workdir or None)
    except cv.ConfigError as e:
        errors.extend(e.problems or [str(e)])
    if prep is not None and args.verbose:
        print("resolved config:\n" + json.dumps(prep.cfg.to_dict(), indent=2, default=str))
    seed = bool(args.init_from) and not has_checkpoint(args.workdir)  # a workdir with its own run resumes it
    if seed and not errors:
        prefix.plan(args.init_from, prep.cfg.to_dict())
    if errors:
        raise (cv.problems_error(f"{len(errors)} problems, each with the field to change", errors) if len(errors) > 1
               else cv.ConfigError(errors[0]))
    return prep, seed


def main(argv: list[str] | None = None) -> int:
    prm.install()  # the PRM wing's config section, reward term and objective (a run may ask for a PRM: prm.path)
    locks: list = []  # the workdir lock, once taken: released on every way out (the OS releases it on a kill)
    try:
        return _main(sys.argv[1:] if argv is None else argv, locks)
    finally:
        for lock in locks:
            lock.release()


def _main(argv: list[str], locks: list) -> int:
    args, overrides = parse_args(argv)
    if args.help_config:
        print(cv.describe())
        return 0
    try:
        prep, seed = checked_config(args, overrides)
        cfg_dict = prep.cfg.to_dict()
        if args.workdir and not args.dry_run:
            locks.append(workdir_lock.lock_workdir(args.workdir, "launch"))  # one process per workdir
            check_resume(args.workdir, cfg_dict)  # again under the lock: no other launch changed it since
    except cv.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except workdir_lock.WorkdirError as e:
        print(f"workdir error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(preflight.compute_estimate(prep.cfg)[0])  # what the run prints as it starts
        print(preflight.time_estimate(prep.cfg, prep.model_cfg, log=print)[0])
        print("config OK")
        return 0
    write_config_json(args.workdir, {**cfg_dict, prefix.RECORD_KEY: backend_kernels()})  # the kernels this process uses
    print(f"config: {args.config} -> {os.path.join(args.workdir, 'config.json')} (--verbose prints it)", flush=True)
    if seed:
        info = prefix.seed_from(args.workdir, args.init_from, cfg_dict)
        print(f"init_from: starting from {info['source']} checkpoint {info['step']} (after {info['stage']} unit "
              f"{info['unit']})", flush=True)
    from rl import run  # deliberate lazy import: the training stack loads only once a config passed every check

    try:
        run.train(prep, args.workdir, config_path=args.config)
    except cv.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except (CheckpointError, workdir_lock.WorkdirError) as e:  # the workdir's state, not a bug: a message, exit 2
        print(f"workdir error: {e}", file=sys.stderr)
        return 2
    except run.NonFiniteError as e:  # the run failed (a stage's steps not finite): its message, not a traceback
        print(f"training failed: {e}", file=sys.stderr)
        return 1
    return 0


def write_config_json(workdir: str, cfg_dict: dict) -> None:
    """workdir/config.json, replaced atomically (a reader never sees half a file)."""
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "config.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(cfg_dict, f, indent=2, default=str)
    os.replace(path + ".tmp", path)


DIE_WITH_PARENT = "MATHRL_DIE_WITH_PARENT"  # set to 1 by experiments/sweep.py: the launcher dies with the sweep


if __name__ == "__main__":
    if os.environ.pop(DIE_WITH_PARENT, "") == "1":  # popped: nothing this launcher starts inherits it
        from rewards._lifeline import die_with_parent

        die_with_parent()  # the kernel SIGKILLs this launcher when its sweep exits, however (kept across the re-exec)
    from models.cpu import allocator  # CPU process set-up; harmless elsewhere (it only tunes glibc's malloc)

    allocator.reexec_if_untuned()  # huge-page malloc for XLA's CPU buffers (models/cpu/allocator.py)
    allocator.trim_after_compiles()  # the compiler's freed heap back to the OS before each program runs
    sys.exit(main())
