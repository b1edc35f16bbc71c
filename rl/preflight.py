"""Prepare a run once, before any compute: validate, load the problems, build what the checks need, check.

    prep = prepare(config)        # rl.setup.Prepared: the frozen RunConfig (validated once; a RunConfig passes as
                                  # is), the run's ModelConfig, tokenizer, problems per split and the memory plan;
                                  # ConfigError listing every problem otherwise, each naming the field to change and
                                  # the value that works: mesh vs devices, the checkpoint folder (model.hf_path:
                                  # config.json, weights, tokenizer files, chat template; models/hf_checks.py), the
                                  # memory plan per device (printed; rl/memory_plan.py), problems the splits can
                                  # supply (the count that fits), prompt / solution lengths in the run's tokenizer and
                                  # prompt format (the length the longest needs), prompt + answer against the model's
                                  # context, and with `workdir` whether a run there can resume with this config
    prep = prepare(config, port=True)        # a byte-tokenizer recipe on model.hf_path: lengths in its tokens
    prep = prepare(config, environment=False)   # no machine checks (rl.setup.prepare_inputs): what train() does
                                                # when given a config rather than a Prepared
    text, totals = compute_estimate(cfg)   # generated tokens, verifier calls, train tokens per stage and in total

The launcher's dry run and its run share one prepare(): the launcher prepares, then hands the Prepared to
rl.run.train, which validates and loads nothing again. Every check runs even when an earlier one failed (when it
can: no memory plan without a mesh and a model), so one dry run reports every problem.
"""
from __future__ import annotations

import textwrap

import jax
import numpy as np

from models import hf, hf_checks, lora, transformer
from rewards.python_tool import chat_markers
from rl import config_validation as cv
from rl import calibration, config_warnings, memory_plan, pretrained, setup
from rl import time_estimate as time_est
from rl.setup import Prepared
from rl.stages import KINDS, algorithms, run_tools, sft_problem_count
from rl.stages.common import stage_problems
from rl.workdir_state import check_resume


def resolved_mesh(cfg: cv.RunConfig, n_dev: int) -> dict:
    """The mesh axis sizes with a -1 axis resolved against n_dev devices (ConfigError naming mesh.* when they do
    not fit this machine)."""
    sizes = cfg.mesh.sizes()
    fixed = int(np.prod([v for v in sizes.values() if v != -1]))
    if -1 in sizes.values():
        if n_dev % fixed:
            raise cv.ConfigError(f"mesh {sizes}: the fixed axes ({fixed} devices) do not divide the {n_dev} devices here")
        return {k: (n_dev // fixed if v == -1 else v) for k, v in sizes.items()}
    if fixed > n_dev:
        fit = dict(sizes)
        while int(np.prod(list(fit.values()))) > n_dev:  # halve the largest axis until the mesh fits
            k = max(fit, key=fit.get)
            fit[k] = max(1, fit[k] // 2)
        change = ", ".join(f"mesh.{k}={v}" for k, v in fit.items() if v != sizes[k])
        raise cv.ConfigError(f"mesh {sizes} needs {fixed} devices, this machine has {n_dev} "
                             f"({jax.devices()[0].platform}); set {change}")
    return sizes


def _collect(errors: list, fn):
    """fn() or None, with its ConfigError added to `errors` (every check runs; the launcher prints them together)."""
    try:
        return fn()
    except cv.ConfigError as e:
        errors += e.problems or [str(e)]
        return None


def _context_error(cfg: cv.RunConfig, model_cfg, longest: int | None) -> str | None:
    """tasks.max_prompt_len + sampling.max_new_tokens against the model's length (the checkpoint's context when
    model.hf_path), with the values that fit."""
    P, N = cfg.tasks.max_prompt_len, cfg.sampling.max_new_tokens
    limit = model_cfg.max_seq_len
    if P + N <= limit and (longest or 0) <= P:
        return None
    L = P if longest is None else longest  # the prompt length the run needs
    if L + N <= limit:
        if P + N <= limit:
            return None  # the prompt error (fit_errors) says what to set
        fix = f"set tasks.max_prompt_len <= {limit - N} (the longest prompt has {L} tokens)"
    elif limit - L >= 1:
        fix = (f"set sampling.max_new_tokens={limit - L}" if L == P else
               f"set tasks.max_prompt_len={L} (the longest prompt) and sampling.max_new_tokens={limit - L}")
    else:
        fix = f"the longest prompt ({L} tokens) leaves no room for an answer"
    what = f"model.max_seq_len ({limit})"
    path = setup.checkpoint_path(cfg.model)
    if path and hf.is_gguf(path):
        if hf.load_config(path).max_seq_len == limit:
            what = f"the checkpoint's context ({limit}, context_length in {path})"
    elif path and hf_checks.read_config(path).get("max_position_embeddings") == limit:
        what = f"the checkpoint's context ({limit}, max_position_embeddings in {path}/config.json)"
    head = (f"tasks.max_prompt_len + sampling.max_new_tokens ({P} + {N} = {P + N})" if L <= P else
            f"the longest prompt + sampling.max_new_tokens ({L} + {N} = {L + N})")
    return f"{head} exceed {what}: {fix}"


def _checkpoint_errors(cfg: cv.RunConfig) -> list[str]:
    """The checkpoint's files (models.hf_checks): weights complete and finite, shapes as config.json or the GGUF
    metadata says (the dense model the checkpoint holds, also when model.upcycle turns it into an MoE after
    loading). A GGUF file's metadata itself is checked by its reader (models/gguf_file.py) when it is read."""
    path = setup.checkpoint_path(cfg.model)
    if hf.is_gguf(path):
        field = cfg.model.checkpoint_field
        return [f"model.{field}: {p}" for p in hf_checks.check_gguf(path, setup.dense_model_cfg(cfg))]
    model_type = hf_checks.read_config(path)["model_type"]
    return [f"model.hf_path: {p}" for p in hf_checks.check_folder(path, setup.dense_model_cfg(cfg), model_type)]


def _load_splits(cfg: cv.RunConfig, errors: list):
    """(train, val, test) or None; a split its source cannot fill is reported with the count that fits, and the
    other splits are still checked with that count."""
    for _ in range(len(cv.SPLIT_SOURCES) + 1):
        try:
            return setup.load_problems(cfg)
        except cv.ConfigError as e:
            errors.append(str(e))
            if getattr(e, "count_field", None) is None or e.fits < 1:
                return None
            cfg = cfg.replace(tasks=cfg.tasks.replace(**{e.count_field: e.fits}))
        except (ValueError, OSError) as e:  # a source that cannot be built (bad file, unknown module)
            errors.append(f"tasks.mix: {e}")
            return None
    return None


def check_environment(config, verbose: bool = True):
    """The memory plan of prepare(config) (printed when verbose; None when the mesh or the model could not be
    built); ConfigError listing every problem this machine or the data has with the config."""
    return prepare(config, verbose=verbose).plan


def prepare(config, *, environment: bool = True, port: bool = False, workdir: str | None = None,
            verbose: bool = True) -> Prepared:
    """Everything a run needs before any compute, built once (see the module docstring); ConfigError listing every
    problem. `environment`: the machine and data checks (else rl.setup.prepare_inputs); `port`: a byte-tokenizer
    recipe on a checkpoint gets its lengths in the checkpoint's tokens (rl.pretrained.port_lengths; the notes are
    printed when verbose); `workdir`: whether a run there resumes with this config (rl.workdir_state.check_resume)."""
    cfg = cv.typed(config)
    if not environment:
        return setup.prepare_inputs(cfg)
    for line in choices(cfg) if verbose else ():
        print(line, flush=True)
    errors, notes = [], []
    field = cfg.model.checkpoint_field  # "hf_path" / "pretrained" / "" (from scratch)
    hf_path = _collect(errors, lambda: setup.checkpoint_path(cfg.model)) if field else ""
    tok = _collect(errors, lambda: setup.build_tokenizer(cfg))
    splits = _load_splits(cfg, errors)
    ported = []
    if port and hf_path:
        cfg, ported = port_to_checkpoint(cfg, tok, splits)
        if ported and verbose:  # lengths only: the checks below hold them against the checkpoint's context
            print("lengths in the checkpoint's tokens:\n  " + "\n  ".join(ported), flush=True)
    if workdir:
        _collect(errors, lambda: check_resume(workdir, cfg))
    sizes = _collect(errors, lambda: resolved_mesh(cfg, len(jax.devices())))
    model_cfg = _collect(errors, lambda: setup.build_model_cfg(cfg, notes))
    if hf_path and model_cfg is not None:
        errors += _checkpoint_errors(cfg)
    if notes and verbose:
        print(f"model.{field} ({hf_path}) sets the architecture; the model section's values that differ:\n"
              + textwrap.fill(", ".join(notes), width=116, initial_indent="  ", subsequent_indent="  "), flush=True)
    render = None
    if tok is not None and hf_path and cfg.model.chat_template:
        render = hf_checks.bounded  # every prompt below is rendered under the template's step / time limit
        _collect(errors, lambda: _raise_config(lambda: hf_checks.check_template(tok, f"model.{field}: {hf_path}")))
        if run_tools(cfg.stages) is not None:  # the tool turn renders too
            _collect(errors, lambda: _raise_config(lambda: _tool_markers(tok, f"model.{field}: {hf_path}")))
    if tok is not None and model_cfg is not None and tok.vocab_size > model_cfg.vocab_size:
        errors.append(f"model.vocab_size: the tokenizer has {tok.vocab_size} ids, the model's embedding only "
                      f"{model_cfg.vocab_size} rows")
    lora_msg = _lora_error(model_cfg) if model_cfg is not None else None
    if lora_msg:
        errors.append(lora_msg)
    elif model_cfg is not None and verbose and (frozen := lora_frozen_note(cfg, model_cfg)):
        print(frozen, flush=True)
    plan = None
    if sizes is not None and model_cfg is not None and not lora_msg:  # the plan builds the adapters
        plan = memory_plan.plan_for_config(cfg, model_cfg, sizes, setup.run_rules(cfg))
        if verbose:
            print(plan.text(), flush=True)
        _collect(errors, plan.check)
    longest = None
    if splits is not None:
        train, val, test = splits
        for i, st in enumerate(cfg.stages):  # a stage restricted to some task families draws from fewer problems
            kind = KINDS[st.kind]
            pool = len(stage_problems(train, st.stage.families))
            _, need = kind.problems(st)
            if kind.draws and need > pool or pool == 0:
                errors.append(f"stages[{i}].families: {st.stage.families!r} leaves {pool} training problems "
                              f"in tasks.mix, the stage needs {max(need, 1)}")
        if tok is not None:
            try:
                lengths = setup.prompt_lengths(cfg, tok, train + val + test, render)
                errors += setup.fit_errors(cfg, tok, train, sft_problems=sft_problem_count(cfg), lengths=lengths)
                longest = max(lengths, default=0)
            except hf_checks.TemplateLimit as e:
                errors.append(f"model.{field}: {hf_path}: {e}")
            except Exception as e:  # the folder's template failing on a problem's text: its own error
                if not hf_path:
                    raise
                errors.append(f"model.{field}: {hf_path}: the chat template fails on a prompt "
                              f"({type(e).__name__}: {str(e)[:200]})")
    if model_cfg is not None and (msg := _context_error(cfg, model_cfg, longest)):
        errors.append(msg)
    if errors:
        raise cv.problems_error("problems found before any compute", errors)
    train, val, test = splits
    return Prepared(cfg=cfg, model_cfg=model_cfg, tok=tok, train=tuple(train), val=tuple(val), test=tuple(test),
                    plan=plan, notes=tuple(ported))


def choices(cfg: cv.RunConfig) -> list[str]:
    """What each stage's algorithm name set and what the config overrode (rl/stages/algorithms.py), then every
    warning on a value chosen for another setting (rl/config_warnings.py): the lines the dry run and the launch print
    before the checks. Warnings never stop a run."""
    lines = [f"stages[{i}]: {line}" for i, st in enumerate(cfg.stages) for line in algorithms.describe(st)]
    return lines + [f"warning: {w}" for w in config_warnings.warnings(cfg)]


def _tool_markers(tok, where: str) -> None:
    """A tools stage's chat markers render (python_tool.chat_markers: a tool or user turn after an assistant turn),
    bounded like every render: a template that loops only for role 'tool' once passed the dry run and hung the
    tool recipe at its first stage."""
    try:
        chat_markers(tok)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _lora_error(model_cfg) -> str | None:
    """model.lora.targets that name no weight of the run's model (an MoE target on a dense model, mlp/* where every
    block is MoE), checked on its abstract params (models/lora.py's own rule): the memory plan and the run would
    otherwise fail on them with a traceback."""
    if model_cfg.lora is None:
        return None
    try:
        lora.targeted_weights(jax.eval_shape(lambda k: transformer.init(model_cfg, k), jax.random.key(0)), model_cfg)
    except ValueError as e:
        return f"model.lora.targets: {e}"
    return None


EXPERT_TARGETS = ("moe/w_gate", "moe/w_up", "moe/w_down")


def lora_frozen_note(cfg: cv.RunConfig, model_cfg) -> str | None:
    """What LoRA leaves frozen on an MoE policy, said before the run: the routers always (LoRA adapts no router;
    after model.upcycle they keep their random init) and the routed experts unless model.lora.targets names
    moe/*. None without LoRA or experts."""
    if model_cfg.lora is None or not model_cfg.is_moe_model:
        return None
    missing = [t for t in EXPERT_TARGETS if t not in model_cfg.lora.targets]
    upcycled, n = cfg.model.upcycle is not None, len(model_cfg.moe_layers)
    what = "the upcycled model" if upcycled else "an MoE model"
    router = "stay at their random init" if upcycled else "stay frozen"
    experts = (f"; its routed experts stay frozen too ({', '.join(missing)} not in model.lora.targets: add them for "
               "one adapter per expert)") if missing else ""
    return (f"note: model.lora on {what}: the routers of its {n} MoE block{'s' * (n != 1)} {router} (LoRA "
            f"adapts no router; model.lora=None trains them in full){experts}")


def _raise_config(fn):
    try:
        return fn()
    except ValueError as e:
        raise cv.ConfigError(str(e)) from None


def port_to_checkpoint(cfg: cv.RunConfig, tok=None, splits=None) -> tuple[cv.RunConfig, list[str]]:
    """(cfg, notes) for a recipe written for the byte tokenizer run on model.hf_path: its prompt length measured in
    the checkpoint's tokenizer and chat template (rl.pretrained.port_lengths); `tok` / `splits`: the ones already
    built, else built here. When the folder or the data cannot be read the config comes back unchanged: prepare()
    then reports why."""
    try:
        context_len = setup.hf_checkpoint_cfg(setup.checkpoint_path(cfg.model), cfg.model).max_seq_len
        tok = setup.build_tokenizer(cfg) if tok is None else tok
        train, val, test = setup.load_problems(cfg) if splits is None else splits
        longest = max(setup.prompt_lengths(cfg, tok, train + val + test, hf_checks.bounded), default=0)
    except Exception:  # noqa: BLE001  (any failure here is prepare()'s to report, with its field)
        return cfg, []
    return pretrained.port_lengths(cfg, longest, context_len)


def time_estimate(cfg: cv.RunConfig, model_cfg, log=None) -> tuple[str, dict]:
    """(text, estimate): rl/time_estimate.py's seconds per phase at this machine's calibration (rl/calibration.py,
    measured once per machine and code, a few seconds; `log` hears when it measures)."""
    cal = calibration.load(log=log)
    est = time_est.estimate(cfg, model_cfg, cal)
    return time_est.text(est, cal), est


def compute_estimate(cfg: cv.RunConfig) -> tuple[str, dict]:
    """Tokens to generate, verifier calls and train tokens per unit and in total, per stage (upper bounds)."""
    N = cfg.sampling.max_new_tokens
    P = cfg.tasks.max_prompt_len
    e = cfg.eval
    rows, tot = [], {"gen_tokens": 0, "verifier_calls": 0, "train_tokens": 0}
    for s in cfg.stages:
        kind = KINDS[s.kind]
        g, trained = kind.answers(s), kind.trained_rows(s, cfg.tasks.n_train)
        per = {"gen_tokens": g * N, "verifier_calls": g, "train_tokens": trained * (P + N)}
        for kk in tot:
            tot[kk] += per[kk] * s.units
        rows.append((s.stage.name, s.kind, s.units, per))
    n_answers = sum(a for a, _ in time_est.evaluations(cfg))  # initial, stage ends, mid-stage, best policy
    tot["gen_tokens"] += n_answers * N
    tot["verifier_calls"] += n_answers
    lines = ["compute estimate (upper bounds: every answer runs to max_new_tokens):",
             f"  {'stage':<16}{'kind':<10}{'units':>6}{'gen tok/unit':>14}{'verifier/unit':>15}{'train tok/unit':>16}"]
    for name, kind, units, per in rows:
        lines.append(f"  {name:<16}{kind:<10}{units:>6}{per['gen_tokens']:>14,}{per['verifier_calls']:>15,}"
                     f"{per['train_tokens']:>16,}")
    parts = ["initial"] * int(e.initial) + ["stage ends", f"every {e.every} units"] + \
        ["best policy"] * bool(cfg.checkpoint.keep_best)
    lines.append(f"  evals: {n_answers:,} answers ({', '.join(parts)})")
    lines.append(f"  total: {tot['gen_tokens']:,} generated tokens, {tot['verifier_calls']:,} verifier calls, "
                 f"{tot['train_tokens']:,} train tokens")
    return "\n".join(lines), tot
