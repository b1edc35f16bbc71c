"""Checks and estimates that need the data and the machine, run before any compute (also by --dry_run).

    plan = check_environment(cfg) # ConfigError listing every problem, each naming the field to change and the value
                                  # that works: mesh vs devices, the checkpoint folder (model.hf_path: config.json,
                                  # weights, tokenizer files, chat template; models/hf_checks.py), the memory plan per
                                  # device (printed; rl/memory_plan.py), problems the splits can supply (the count
                                  # that fits), prompt / solution lengths in the run's tokenizer and prompt format
                                  # (the length the longest needs), prompt + answer against the model's context
    cfg, notes = port_to_checkpoint(cfg)   # a byte-tokenizer recipe on model.hf_path: lengths in its tokens
    text, totals = compute_estimate(cfg)   # generated tokens, verifier calls, train tokens per stage and in total

Every check runs even when an earlier one failed (when it can: no memory plan without a mesh and a model), so one
dry run reports every problem. `cfg` is a validated config as plain dicts (rl.config_validation.to_dict).
"""
from __future__ import annotations

import numpy as np

from rl import config_validation as cv


def resolved_mesh(cfg: dict, n_dev: int) -> dict:
    """The mesh axis sizes with a -1 axis resolved against n_dev devices (ConfigError naming mesh.* when they do
    not fit this machine)."""
    sizes = dict(cfg["mesh"])
    fixed = int(np.prod([v for v in sizes.values() if v != -1]))
    if -1 in sizes.values():
        if n_dev % fixed:
            raise cv.ConfigError(f"mesh {sizes}: the fixed axes ({fixed} devices) do not divide the {n_dev} devices here")
        return {k: (n_dev // fixed if v == -1 else v) for k, v in sizes.items()}
    if fixed > n_dev:
        import jax

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


def _context_error(cfg: dict, model_cfg, longest: int | None) -> str | None:
    """tasks.max_prompt_len + sampling.max_new_tokens against the model's length (the checkpoint's context when
    model.hf_path), with the values that fit."""
    P, N = cfg["tasks"]["max_prompt_len"], cfg["sampling"]["max_new_tokens"]
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
    from models import hf, hf_checks
    from rl import context

    path = context.checkpoint_path(cfg["model"])
    if path and hf.is_gguf(path):
        if hf.load_config(path).max_seq_len == limit:
            what = f"the checkpoint's context ({limit}, context_length in {path})"
    elif path and hf_checks.read_config(path).get("max_position_embeddings") == limit:
        what = f"the checkpoint's context ({limit}, max_position_embeddings in {path}/config.json)"
    head = (f"tasks.max_prompt_len + sampling.max_new_tokens ({P} + {N} = {P + N})" if L <= P else
            f"the longest prompt + sampling.max_new_tokens ({L} + {N} = {L + N})")
    return f"{head} exceed {what}: {fix}"


def _checkpoint_errors(cfg: dict, model_cfg) -> list[str]:
    """The checkpoint folder's files (models.hf_checks): weights complete and finite, shapes as config.json says. A
    GGUF file is checked by its own reader (models/gguf_file.py) when its metadata is read."""
    from models import hf, hf_checks
    from rl import context

    path = context.checkpoint_path(cfg["model"])
    if hf.is_gguf(path):
        return []
    model_type = hf_checks.read_config(path)["model_type"]
    return [f"model.hf_path: {p}" for p in hf_checks.check_folder(path, model_cfg, model_type)]


def _load_splits(cfg: dict, errors: list):
    """(train, val, test) or None; a split its source cannot fill is reported with the count that fits, and the
    other splits are still checked with that count."""
    from rl import context

    cfg = {**cfg, "tasks": dict(cfg["tasks"])}
    for _ in range(len(cv.SPLIT_SOURCES) + 1):
        try:
            return context.load_problems(cfg)
        except cv.ConfigError as e:
            errors.append(str(e))
            if getattr(e, "count_field", None) is None or e.fits < 1:
                return None
            cfg["tasks"][e.count_field] = e.fits
        except (ValueError, OSError) as e:  # a source that cannot be built (bad file, unknown module)
            errors.append(f"tasks.mix: {e}")
            return None
    return None


def check_environment(cfg: dict, verbose: bool = True):
    """Raise ConfigError listing every problem this machine or the data has with `cfg` (see the module docstring),
    each naming the field to change and, where one exists, the value that works; returns the memory plan (printed
    when verbose), None when the mesh or the model could not be built."""
    import jax

    from models import hf_checks
    from rl import context, memory_plan
    from rl.stages import sft_problem_count
    from rl.stages.common import stage_problems

    errors, notes = [], []
    sizes = _collect(errors, lambda: resolved_mesh(cfg, len(jax.devices())))
    model_cfg = _collect(errors, lambda: context.build_model_cfg(cfg, notes))
    field = context.checkpoint_field(cfg["model"])  # "hf_path" / "pretrained" / "" (from scratch)
    hf_path = _collect(errors, lambda: context.checkpoint_path(cfg["model"])) if field else ""
    if hf_path and model_cfg is not None:
        errors += _checkpoint_errors(cfg, model_cfg)
    if notes and verbose:
        import textwrap

        print(f"model.{field} ({hf_path}) sets the architecture; the model section's values that differ:\n"
              + textwrap.fill(", ".join(notes), width=116, initial_indent="  ", subsequent_indent="  "), flush=True)
    tok = _collect(errors, lambda: context.build_tokenizer(cfg))
    render = None
    if tok is not None and hf_path and cfg["model"].get("chat_template", True):
        render = hf_checks.bounded  # every prompt below is rendered under the template's step / time limit
        _collect(errors, lambda: _raise_config(lambda: hf_checks.check_template(tok, f"model.{field}: {hf_path}")))
    if tok is not None and model_cfg is not None and tok.vocab_size > model_cfg.vocab_size:
        errors.append(f"model.vocab_size: the tokenizer has {tok.vocab_size} ids, the model's embedding only "
                      f"{model_cfg.vocab_size} rows")
    plan = None
    if sizes is not None and model_cfg is not None:
        plan = memory_plan.plan_for_config(cfg, model_cfg, sizes, context.run_rules(cfg))
        if verbose:
            print(plan.text(), flush=True)
        _collect(errors, plan.check)
    splits = _load_splits(cfg, errors)
    longest = None
    if splits is not None:
        train, val, test = splits
        for i, st in enumerate(cfg["stages"]):  # a stage restricted to some task families draws from fewer problems
            pool = len(stage_problems(train, st.get("families", "")))
            need = max(int(st.get("n_problems") or 0),
                       int(st.get("n_prompts") or 0) if st.get("kind") in ("grpo", "ppo") else 0)
            if st.get("kind") != "sft" and need > pool or pool == 0:
                errors.append(f"stages[{i}].families: {st.get('families')!r} leaves {pool} training problems in "
                              f"tasks.mix, the stage needs {max(need, 1)}")
        if tok is not None:
            try:
                lengths = context.prompt_lengths(cfg, tok, train + val + test, render)
                errors += context.fit_errors(cfg, tok, train, sft_problems=sft_problem_count(cfg), lengths=lengths)
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
    return plan


def _raise_config(fn):
    try:
        return fn()
    except ValueError as e:
        raise cv.ConfigError(str(e)) from None


def port_to_checkpoint(cfg: dict) -> tuple[dict, list[str]]:
    """(cfg, notes) for a recipe written for the byte tokenizer run on model.hf_path: its prompt length measured in
    the checkpoint's tokenizer and chat template (rl.pretrained.port_lengths). When the folder or the data cannot be
    read the config comes back unchanged: check_environment then reports why."""
    from models import hf_checks
    from rl import context, pretrained

    try:
        context_len = context.hf_checkpoint_cfg(context.checkpoint_path(cfg["model"]), cfg["model"]).max_seq_len
        tok = context.build_tokenizer(cfg)
        train, val, test = context.load_problems(cfg)
        longest = max(context.prompt_lengths(cfg, tok, train + val + test, hf_checks.bounded), default=0)
    except Exception:  # noqa: BLE001  (any failure here is check_environment's to report, with its field)
        return cfg, []
    return pretrained.port_lengths(cfg, longest, context_len)


def compute_estimate(cfg: dict) -> tuple[str, dict]:
    """Tokens to generate, verifier calls and train tokens per unit and in total, per stage (upper bounds)."""
    N = cfg["sampling"]["max_new_tokens"]
    P = cfg["tasks"]["max_prompt_len"]
    e = cfg["eval"]
    rows, tot, evals = [], {"gen_tokens": 0, "verifier_calls": 0, "train_tokens": 0}, 0
    for s in cv.parse_stages(cfg):
        if s.kind == "sft":
            n = s.n_problems or cfg["tasks"]["n_train"]
            per = {"gen_tokens": 0, "verifier_calls": 0, "train_tokens": n * (P + N)}
        elif s.kind == "rejection":
            g = s.n_problems * s.samples
            per = {"gen_tokens": g * N, "verifier_calls": g, "train_tokens": s.epochs * g * (P + N)}
        else:
            k = float(np.mean(s.curriculum.samples)) if s.curriculum.enabled else s.samples
            g = int(s.n_prompts * k)
            per = {"gen_tokens": g * N, "verifier_calls": g, "train_tokens": s.epochs * g * (P + N)}
        units = s.units
        n_val_evals = (units - 1) // e["every"] if e["every"] else 0  # mid-stage validation evals
        evals += 1
        for kk in tot:
            tot[kk] += per[kk] * units
        rows.append((s.name, s.kind, units, per, n_val_evals))
    per_val, per_test = e["n_val"] * (1 + e["k"]), e["n_test"] * (1 + e["k"])
    n_answers = (per_val + per_test) * (evals + 1) + per_test + per_val * sum(r[4] for r in rows)
    tot["gen_tokens"] += n_answers * N
    tot["verifier_calls"] += n_answers
    lines = ["compute estimate (upper bounds: every answer runs to max_new_tokens):",
             f"  {'stage':<16}{'kind':<10}{'units':>6}{'gen tok/unit':>14}{'verifier/unit':>15}{'train tok/unit':>16}"]
    for name, kind, units, per, _ in rows:
        lines.append(f"  {name:<16}{kind:<10}{units:>6}{per['gen_tokens']:>14,}{per['verifier_calls']:>15,}"
                     f"{per['train_tokens']:>16,}")
    lines.append(f"  evals: {n_answers:,} answers (initial, stage ends, every {e['every']} units, best policy)")
    lines.append(f"  total: {tot['gen_tokens']:,} generated tokens, {tot['verifier_calls']:,} verifier calls, "
                 f"{tot['train_tokens']:,} train tokens")
    return "\n".join(lines), tot
