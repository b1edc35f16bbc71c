"""A hand-made claims directory in the layout experiments/sweep.py writes (point/seedK/ with config.json,
summary.json, metrics.jsonl), holding every arm the claim notebooks read, for the fast notebook test.

    write_claims_dir(tmp_path)   # then CLAIMS_DIR=tmp_path jupyter-execute notebooks/claims_*.ipynb

The numbers are made up (a slow rise per iteration, arm- and seed-dependent offsets); only the structure is real.
"""
import json
import pathlib

ITERS, EVERY = 6, 2

ARMS = {  # point directory -> stages after the cold start
    "process_reward/process_weight_0.0": ("grpo",), "process_reward/process_weight_0.2": ("grpo",),
    "process_reward/process_weight_0.5": ("grpo",), "format_reward/format_weight_0.1": ("grpo",),
    "step_rewards/step_rewards_False": ("grpo",), "step_rewards/step_rewards_True": ("grpo",),
    "cold_start_zero/base": ("grpo",), "rejection_only/base": ("rejection",),
    "rejection_both/base": ("rejection", "grpo"), "curriculum/enabled_False": ("grpo",),
    "curriculum/enabled_True": ("grpo",), "kl_control/kl_adaptive_True,temperature_end_1.0": ("grpo",),
    "kl_control/kl_adaptive_True,temperature_end_0.7": ("grpo",),
    "temperature/temperature_start_1.0,temperature_end_1.0": ("grpo",),
    "prm_calibration/grpo_base/base": ("grpo",), "prm_calibration/grpo/prm_calibration_platt": ("grpo",),
}


def _write_run(d: pathlib.Path, seed: int, stages: tuple[str, ...], offset: float) -> None:
    d.mkdir(parents=True)
    cfg_stages = [{"name": "cold_start", "kind": "sft"}]
    cfg_stages += [{"name": s, "kind": s, "rounds": 2, "n_problems": 8, "samples": 4} for s in stages]
    (d / "config.json").write_text(json.dumps({"seed": seed, "tasks": {"n_train": 16}, "stages": cfg_stages}))
    recs, step, acc = [{"step": 0, "phase": "eval", "stage": "initial", "validation/pass@1": 0.0}], 0, 0.1 + offset
    evals = {"initial": 0.0, "cold_start": acc}
    for s in stages:
        for u in range(ITERS if s == "grpo" else 2):
            step += 1
            acc = min(acc + 0.02 + 0.01 * seed, 1.0)
            rec = {"step": step, "phase": "train", "stage": s, "unit": str(u), "optimizer_steps": 2}
            if s == "grpo":
                rec.update({"n_samples": 32 + 8 * (u % 2), "accuracy": acc, "reward/process": acc + 0.1,
                            "format_rate": min(0.5 + 0.1 * u, 1.0), "kl": 0.001 * u * (seed + 1), "kl_coef": 0.02,
                            "entropy": 0.5 - 0.02 * u})
            recs.append(rec)
            if s == "grpo" and (u + 1) % EVERY == 0:
                recs.append({"step": step, "phase": "eval", "stage": s, "unit": str(u), "validation/pass@1": acc,
                             "test/n_problems": 16})
        evals[s] = acc
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "summary.json").write_text(json.dumps({
        "eval": {k: {"pass@1": v, "pass@1_se": 0.05, "format_rate": 0.9} for k, v in evals.items()},
        "hacking": {"grpo": {"flagged": []}} if "grpo" in stages else {}}))


def write_claims_dir(root: pathlib.Path) -> pathlib.Path:
    for i, (point, stages) in enumerate(ARMS.items()):
        for seed in (0, 1):
            _write_run(root / point / f"seed{seed}", seed, stages, 0.01 * i)
    (root / "grad_variance_seed0.json").write_text(json.dumps({
        "outcome": {"noise_to_signal": 8.0, "rows_with_signal": 0.8},
        "step": {"noise_to_signal": 7.5, "rows_with_signal": 0.9},
        "noise_to_signal_ratio_step_over_outcome": 7.5 / 8.0, "cosine_of_means": 0.99}))
    prm = root / "prm_calibration" / "prm" / "seed0"
    prm.mkdir(parents=True)
    (prm / "results.json").write_text(json.dumps({"runs": {"mix": [
        {"ece/none": 0.2, "ece/temperature": 0.15, "ece/platt": 0.08}]}}))
    return root
