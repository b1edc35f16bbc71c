"""Checks and estimates that need the data and the machine, run before any compute (also by --dry_run).

    plan = check_environment(cfg) # ConfigError naming the field: mesh vs devices, the checkpoint folder and its
                                  # tokenizer (model.hf_path), the memory plan per device (printed; rl/memory_plan.py),
                                  # problems the splits can supply (tasks.mix / tasks.*_source), prompt / solution
                                  # lengths in the run's tokenizer and prompt format
    text, totals = compute_estimate(cfg)   # generated tokens, verifier calls, train tokens per stage and in total

`cfg` is a validated config as plain dicts (rl.config_validation.to_dict).
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

        raise cv.ConfigError(f"mesh {sizes} needs {fixed} devices, this machine has {n_dev} "
                             f"({jax.devices()[0].platform}); set mesh.* so their product is at most {n_dev}")
    return sizes


def check_environment(cfg: dict, verbose: bool = True):
    """Raise ConfigError if this machine or the data cannot run `cfg` (see the module docstring); returns the
    memory plan (printed when verbose)."""
    import jax

    from rl import context, memory_plan
    from rl.stages import sft_problem_count
    from rl.stages.base import stage_problems

    sizes = resolved_mesh(cfg, len(jax.devices()))
    model_cfg = context.build_model_cfg(cfg)
    tok = context.build_tokenizer(cfg)
    if tok.vocab_size > model_cfg.vocab_size:
        raise cv.ConfigError(f"model.vocab_size: the tokenizer has {tok.vocab_size} ids, the model's embedding only "
                             f"{model_cfg.vocab_size} rows")
    plan = memory_plan.plan_for_config(cfg, model_cfg, sizes, context.run_rules(cfg))
    if verbose:
        print(plan.text(), flush=True)
    plan.check()
    try:
        train, val, test = context.load_problems(cfg)
    except cv.ConfigError:
        raise
    except (ValueError, OSError) as e:  # a source that cannot be built (bad file, unknown module)
        raise cv.ConfigError(f"tasks.mix: {e}") from None
    for name, probs in (("n_train", train), ("n_val", val), ("n_test", test)):
        if len(probs) < cfg["tasks"][name]:
            raise cv.ConfigError(f"tasks.{name}: asked for {cfg['tasks'][name]} problems, the mix supplies {len(probs)}")
    for i, st in enumerate(cfg["stages"]):  # a stage restricted to some task families draws from fewer problems
        pool = len(stage_problems(train, st.get("families", "")))
        need = max(int(st.get("n_problems") or 0), int(st.get("n_prompts") or 0) if st.get("kind") in ("grpo", "ppo") else 0)
        if st.get("kind") != "sft" and need > pool or pool == 0:
            raise cv.ConfigError(f"stages[{i}].families: {st.get('families')!r} leaves {pool} training problems in "
                                 f"tasks.mix, the stage needs {max(need, 1)}")
    context.check_fit(cfg, tok, train, sft_problems=sft_problem_count(cfg))
    context.check_fit(cfg, tok, val + test)
    return plan


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
