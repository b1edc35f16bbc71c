"""The PRM pipeline (issue 15): from a launcher config to calibrated, measured PRMs and a deployed checkpoint.

    ctx, params = policy(policy_cfg, workdir)        # 1. the cold-start policy (rl.run.train in workdir/policy)
    out = run(policy_cfg, cfg, workdir, tag="")      # 1-5 below; cfg is a prm.train.PRMConfig

The command line is experiments/train_prm.py (argument parsing and config loading only). Steps, each cached in the
workdir so that a rerun continues where the last one stopped:

  1. policy   the launcher stages through rl.run.train in workdir/policy (resumes; a finished run is reused);
              the PRM reads the best policy's tokens and starts from its weights (init=policy)
  2. samples  the policy's solutions at cfg.temperature: `samples` per training problem, `calib_samples` per
              validation problem, max(best_of_n) per test problem; each labelled exactly (prm/data.py)
  3. labels   (a) corrupted gold solutions of n_gold training problems, labelled by the checker;
              (b) Math-Shepherd MC labels on the training samples (mc_rollouts policy rollouts per step);
              (c) mix = (a) + (b); exact = the checker on the training samples (the exact-label reference)
  4. PRMs     per label source and seed: train (prm/train.py, rl.train_step mode "prm"), fit temperature and Platt
              scaling and the first-error threshold on the calibration samples (prm/calibration.py), evaluate on
              the held-out test samples
  5. report   workdir/results.json, workdir/table.md and the checkpoint workdir/prm (the deploy source, first seed;
              prm/checkpoint.py); each PRM checkpoint stores every fitted map (none, temperature, platt; it applies
              Platt's unless the user picks another: stages[i].prm_calibration), and a rerun adds them to checkpoints
              written before they were stored. A workdir from before the orbax format (prms/SOURCE.npz) has its
              files converted once on a rerun.

Calibration and threshold use exact labels on the validation split's samples (a small labelled set, two
parameters and a threshold); every reported metric is on the test split's samples.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np

from models import layer_stack, transformer
from prm import checkpoint, metrics
from prm.calibration import evaluate, fit_calibrations, fit_threshold, scored_steps
from prm.checkpoint import load, save
from prm.data import exact_labels, first_error_index, gold_examples, mc_labels
from prm.metrics import auroc
from prm.model import PRM, encode, step_logits
from prm.train import PRMConfig, train
from rewards.combine import score
from rewards.parse import extract_answer
from rl import checkpoint as ck
from rl import config_validation as cv
from rl import rollout
from rl.context import build_context
from rl.evaluation import answer_clusters
from rl.run import train as run_train

__all__ = ["policy", "build_data", "label_stats", "run_source", "store_calibrations", "reuse_checkpoint",
           "best_of_n_table", "summarize", "table", "deploy_source", "run"]


def policy(policy_cfg, workdir: str):
    """(context, best policy params) of the launcher run in workdir/policy (trained or resumed first)."""
    pdir = os.path.join(workdir, "policy")
    summary = os.path.join(pdir, "summary.json")
    done = False
    if os.path.exists(summary):
        with open(summary, encoding="utf-8") as f:
            done = "best" in json.load(f)  # written at the end of a finished run
    if not done:
        run_train(policy_cfg, pdir, config_path="prm policy")
    ctx = build_context(cv.validate(policy_cfg), pdir, with_services=False)
    best = ck.Checkpointer(os.path.join(pdir, "checkpoints", "best_policy"), keep=1, keep_best=False,
                           layers=layer_stack.layer_groups(ctx.model_cfg))
    template = {"policy": jax.tree.map(np.asarray, transformer.init(ctx.model_cfg, jax.random.key(0)))}
    params = jax.tree.map(jnp.asarray, best.restore(best.latest_step(), template)["policy"])
    best.close()
    return ctx, params


def _sample(ctx, params, problems, k: int, temperature: float, key) -> list[dict]:
    smp = ctx.sample(params, [ctx.prompt(p) for p in problems], [k] * len(problems), key, temperature=temperature)
    out = []
    for r, text in enumerate(smp.texts):
        p = problems[int(smp.prompt_index[r])]
        out.append({"problem": int(smp.prompt_index[r]), "prompt": ctx.prompt(p), "solution": text, "gold": p.answer,
                    "exact": list(exact_labels(text, p.answer))})
    return out


def _rollout_fn(ctx, params, temperature: float, key):
    """rollout(prefixes, n): n policy continuations of each prompt + partial solution (one compiled shape)."""
    calls = [0]
    smp = ctx.cfg.sampling

    def fn(prefixes, n):
        calls[0] += 1
        s = rollout.sample(ctx.generate, params, ctx.model_cfg, ctx.tok, prefixes, [n] * len(prefixes),
                           jax.random.fold_in(key, calls[0]), temperature=temperature,
                           max_new_tokens=smp.max_new_tokens, max_prompt_len=ctx.seq_len,
                           rows_per_call=smp.batch_rows)
        return [s.texts[i * n:(i + 1) * n] for i in range(len(prefixes))]

    return fn


def _cached(path: str, build, use_cache: bool) -> dict:
    """The JSON in `path` when use_cache and it exists, else build() written there (atomically)."""
    if use_cache and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    value = build()
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)
    return value


def build_data(ctx, params, cfg, workdir: str) -> dict:
    """The samples and labels of steps 2-3 (cached in workdir/data.json)."""
    def build():
        t0 = time.time()
        train_p = ctx.train[:cfg.n_problems]
        data = {"train": _sample(ctx, params, train_p, cfg.samples, cfg.temperature, ctx.key("eval", 101)),
                "calib": _sample(ctx, params, ctx.val[:cfg.n_calib], cfg.calib_samples, cfg.temperature,
                                 ctx.key("eval", 102)),
                "test": _sample(ctx, params, ctx.test[:cfg.n_test], max(cfg.best_of_n), cfg.temperature,
                                ctx.key("eval", 103))}
        t_sample = time.time() - t0
        t0 = time.time()
        need_mc = any(s in cfg.source_list() for s in ("mc", "mix"))
        if need_mc:
            tr = data["train"]
            res = mc_labels([x["prompt"] for x in tr], [x["solution"] for x in tr], [x["gold"] for x in tr],
                            _rollout_fn(ctx, params, cfg.temperature, ctx.key("eval", 104)), cfg.mc_rollouts)
            for x, (lab, n) in zip(tr, res):
                x["mc"], x["rollouts"] = list(lab), n
        t_mc = time.time() - t0
        gold = gold_examples(ctx.train[:cfg.n_gold], ctx.lang, int(ctx.cfg.seed), corrupt_prob=cfg.corrupt_prob,
                             propagate_prob=cfg.propagate_prob)
        data["gold"] = [{"prompt": e.prompt, "solution": e.solution, "labels": list(e.labels), "kind": e.kind}
                        for e in gold]
        data["seconds"] = {"sample": t_sample, "mc": t_mc}
        return data

    return _cached(os.path.join(workdir, "data.json"), build, cfg.cache)


def _examples(data: dict, source: str):
    """(prompts, solutions, labels) of the training set of one label source."""
    gold = [(x["prompt"], x["solution"], x["labels"]) for x in data["gold"]]
    train = data["train"]
    if source == "corrupted":
        rows = gold
    elif source == "mc":
        rows = [(x["prompt"], x["solution"], x["mc"]) for x in train]
    elif source == "exact":
        rows = [(x["prompt"], x["solution"], x["exact"]) for x in train]
    else:  # mix
        rows = gold + [(x["prompt"], x["solution"], x["mc"]) for x in train]
    return [r[0] for r in rows], [r[1] for r in rows], [tuple(r[2]) for r in rows]


def label_stats(data: dict) -> dict:
    """How the MC labels compare with the exact ones on the training samples, on the steps up to the first
    exact error (where "right so far" is what both mean), and label counts."""
    agree, n, good = 0, 0, 0
    for x in data["train"]:
        if "mc" not in x:
            continue
        stop = first_error_index(x["exact"])
        for j, (e, m) in enumerate(zip(x["exact"], x["mc"])):
            if stop >= 0 and j > stop:
                break
            if e is None or m is None:
                continue
            agree += (e > 0.5) == (m > 0.5)
            good += e > 0.5
            n += 1
    rollouts = sum(x.get("rollouts", 0) for x in data["train"])
    return {"mc_agreement": agree / max(n, 1), "mc_compared_steps": n, "mc_rollouts": rollouts,
            "train_solutions": len(data["train"]), "gold_solutions": len(data["gold"]),
            "train_sample_accuracy": float(np.mean([x["exact"][-1] == 1.0 if x["exact"] else False
                                                    for x in data["train"]]))}


def run_source(ctx, params, data: dict, cfg, source: str, seed: int, prm_dir: str) -> dict:
    """Train, calibrate and evaluate one PRM; returns its results (and writes the checkpoint prm_dir/SOURCE, first
    seed)."""
    L, lik = ctx.seq_len, cfg.likelihood
    init = params if cfg.init == "policy" else transformer.init(ctx.model_cfg, jax.random.key(1000 + seed))
    if source == "prior":  # no training: the policy's step likelihood (zero head), calibrated like the others
        enc = encode(ctx.tok, [], [], L)
        trained = {**init, "value_head": {"w": jnp.zeros((ctx.model_cfg.d_model,), jnp.float32),
                                          "b": jnp.zeros((), jnp.float32)}}
        log = {"seconds": 0.0, "loss": [float("nan")], "skipped": 0}
    cal = data["calib"]
    enc_c = encode(ctx.tok, [x["prompt"] for x in cal], [x["solution"] for x in cal], L, [x["exact"] for x in cal])
    if source != "prior":
        def select(p):  # early stopping on the calibration split's step AUROC (steps up to the first error)
            return auroc(*scored_steps(step_logits(p, ctx.model_cfg, enc_c, cfg.score_rows, lik), enc_c))

        prompts, solutions, labels = _examples(data, source)
        enc = encode(ctx.tok, prompts, solutions, L, labels)
        trained, log = train(enc, ctx.model_cfg, cfg, init, seed, select if cfg.select_every else None)
    z_c = step_logits(trained, ctx.model_cfg, enc_c, cfg.score_rows, lik)
    calib_auroc = auroc(*scored_steps(z_c, enc_c))
    calibs = fit_calibrations(*scored_steps(z_c, enc_c))
    threshold = fit_threshold(z_c, enc_c, calibs["platt"])
    test = data["test"]
    k = max(cfg.best_of_n)
    enc_t = encode(ctx.tok, [x["prompt"] for x in test], [x["solution"] for x in test], L, [x["exact"] for x in test])
    t0 = time.time()
    z_t = step_logits(trained, ctx.model_cfg, enc_t, cfg.score_rows, lik)
    score_s = time.time() - t0
    first = np.array([i % k < min(cfg.eval_samples, k) for i in range(len(test))])  # first eval_samples per problem
    res = evaluate(z_t[first], enc_t.rows(first), calibs, threshold)
    prm = PRM(ctx.model_cfg, trained, calibs["platt"], threshold, cfg.agg,
              {"source": source, "seed": seed, "metrics": res}, lik, calibs)
    res["bon"] = best_of_n_table(prm, z_t, enc_t, test, k, cfg)
    n_lab = int(enc.label_mask.sum())
    res.update({"train_seconds": log["seconds"], "train_loss_last": float(np.mean(log["loss"][-20:])),
                "train_rows": int((enc.label_mask.sum(1) > 0).sum()), "train_labels": n_lab,
                "train_good_share": float(enc.labels[enc.label_mask > 0].mean()) if n_lab else float("nan"),
                "score_seconds_per_solution": score_s / max(len(test), 1), "skipped_steps": log["skipped"],
                "calib": calibs, "calib_auroc": calib_auroc, "best_step": log.get("best_step", cfg.steps),
                "selection": log.get("selection", [])})
    if seed == cfg.seeds[0]:
        os.makedirs(prm_dir, exist_ok=True)
        save(prm, os.path.join(prm_dir, source))
    return res


def store_calibrations(path: str, calibs: dict) -> bool:
    """Give a PRM checkpoint written before PRM.calibs existed every map fitted for it (results.json keeps them), so
    stages[i].prm_calibration can choose among them; True when the checkpoint was rewritten."""
    prm = load(path)
    if prm.calibs == calibs:
        return False
    save(dataclasses.replace(prm, calibs=calibs), path)
    return True


def best_of_n_table(prm, z, enc, test: list[dict], k: int, cfg) -> dict:
    """Best-of-N selection accuracy on the test samples: PRM (aggregated calibrated step scores) vs majority
    vote (answers clustered by equivalence) vs the oracle."""
    p = prm.probs(z)
    n_prob = len(test) // k
    scores, correct, clusters = [], [], []
    for q in range(n_prob):
        rows = range(q * k, (q + 1) * k)
        scores.append([metrics.aggregate([p[r, j] for j in np.flatnonzero(enc.mask[r])], cfg.agg) for r in rows])
        correct.append([bool(score(test[r]["solution"], test[r]["gold"])["correct"]) for r in rows])
        clusters.append(answer_clusters([extract_answer(test[r]["solution"]) for r in rows]))
    return {str(n): v for n, v in metrics.best_of_n(scores, correct, clusters, cfg.best_of_n).items()}


def summarize(results: dict, cfg) -> dict:
    """Means over seeds (with the per-seed values) of the headline metrics, per source."""
    keys = ["auroc", "auroc_all_steps", "ece/none", "ece/temperature", "ece/platt", "first_error/f1",
            "first_error/f1@0.5", "first_error/acc_error", "first_error/acc_correct", "train_seconds",
            "score_seconds_per_solution"]
    out = {}
    for source, runs in results.items():
        row = {}
        for key in keys:
            vals = [r[key] for r in runs]
            row[key] = {"mean": float(np.mean(vals)), "per_seed": vals}
        for n in cfg.best_of_n:
            vals = [r["bon"][str(n)]["prm"] for r in runs]
            row[f"bon@{n}"] = {"mean": float(np.mean(vals)), "per_seed": vals}
        row["train_labels"] = runs[0]["train_labels"]
        row["best_step"] = runs[0]["best_step"] if source != "prior" else 0
        row["n_test_steps"] = runs[0]["n"]
        out[source] = row
    first = next(iter(results.values()))[0]["bon"]
    out["_baselines"] = {f"bon@{n}": {"majority": first[str(n)]["majority"], "oracle": first[str(n)]["oracle"],
                                      "groups": first[str(n)]["groups"]} for n in cfg.best_of_n}
    return out


def table(summary: dict, stats: dict, cfg) -> str:
    """The results as a Markdown table (means over seeds) and a line on the MC labels."""
    ns = list(cfg.best_of_n)
    head = ["label source", "train labels", "kept step", "AUROC", "ECE raw", "ECE temp", "ECE Platt",
            "first-error F1", "acc err / corr", *[f"BoN@{n}" for n in ns], "train s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for source, r in summary.items():
        if source.startswith("_"):
            continue
        m = {k: v["mean"] if isinstance(v, dict) else v for k, v in r.items()}
        lines.append("| " + " | ".join([
            source, str(r["train_labels"]), str(r["best_step"]), f"{m['auroc']:.3f}", f"{m['ece/none']:.3f}",
            f"{m['ece/temperature']:.3f}", f"{m['ece/platt']:.3f}", f"{m['first_error/f1']:.3f}",
            f"{m['first_error/acc_error']:.2f} / {m['first_error/acc_correct']:.2f}",
            *[f"{m[f'bon@{n}']:.3f}" for n in ns], f"{m['train_seconds']:.0f}"]) + " |")
    b, pad = summary["_baselines"], "| " * 9
    for name, key in (("majority vote", "majority"), ("oracle (pass@N)", "oracle")):
        lines.append(f"| {name} {pad}" + " | ".join(f"{b[f'bon@{n}'][key]:.3f}" for n in ns) + " | |")
    lines.append("")
    lines.append(f"MC labels vs exact on the training samples (steps up to the first exact error): agreement "
                 f"{stats.get('mc_agreement', float('nan')):.3f} over {stats.get('mc_compared_steps', 0)} steps, "
                 f"{stats.get('mc_rollouts', 0)} rollouts; training sample accuracy "
                 f"{stats['train_sample_accuracy']:.3f}.")
    return "\n".join(lines)


def deploy_source(runs: dict, deploy: str = "auto") -> str:
    """The label source whose PRM becomes the checkpoint workdir/prm: `deploy`, or for "auto" the best
    calibration-split AUROC of its first seed (ties go to the source listed first). `runs` is results.json's "runs" (source -> per-seed
    results); results.json also stores the answer as "deployed"."""
    if deploy != "auto":
        return deploy
    return max(runs, key=lambda s: runs[s][0]["calib_auroc"])


def reuse_checkpoint(prm_dir: str, source: str, calibs: dict) -> bool:
    """Whether the checkpoint of an already measured source is there (a workdir's old .npz converted once), its
    fitted maps stored."""
    path = os.path.join(prm_dir, source)
    if not checkpoint.is_checkpoint(path) and os.path.isfile(path + ".npz"):
        # compat: prm_npz
        checkpoint.convert(path + ".npz", path)  # written before the orbax format: read until its date in rl/compat.py (prm_npz)
    if not checkpoint.is_checkpoint(path):
        return False
    store_calibrations(path, calibs)
    return True


def _deploy(src: str, dest: str) -> None:
    """Copy the checkpoint directory src to dest (replacing it; the copy's checksums are relative, so they hold)."""
    tmp = dest + ".tmp-deploy"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def run(policy_cfg, cfg: PRMConfig, workdir: str, *, tag: str = "", config_path: str = "") -> dict:
    """Steps 1-5 (module docstring) in `workdir`; with `tag`, a second experiment on the same samples
    (results_TAG.json, table_TAG.md, prms_TAG/, nothing deployed). Returns what results.json holds."""
    os.makedirs(workdir, exist_ok=True)
    t_start = time.time()
    ctx, params = policy(policy_cfg, workdir)
    data = build_data(ctx, params, cfg, workdir)
    stats = {**label_stats(data), "data_seconds": data["seconds"]}
    print(json.dumps(stats), flush=True)
    suffix = f"_{tag}" if tag else ""
    res_path = os.path.join(workdir, f"results{suffix}.json")
    prm_dir = os.path.join(workdir, f"prms{suffix}")
    done = {}
    if cfg.cache and os.path.exists(res_path):  # runs of the same PRM config are reused: a rerun only reports
        with open(res_path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("prm_config") == json.loads(json.dumps(cfg.to_dict())):
            done = old["runs"]
    results = {}
    for source in cfg.source_list():
        if source in done and reuse_checkpoint(prm_dir, source, done[source][0]["calib"]):
            results[source] = done[source]
            continue
        results[source] = []
        for seed in cfg.seeds:
            print(f"PRM {source} seed {seed} ...", flush=True)
            results[source].append(run_source(ctx, params, data, cfg, source, seed, prm_dir))
            r = results[source][-1]
            print(f"  auroc {r['auroc']:.3f} f1 {r['first_error/f1']:.3f} ece {r['ece/none']:.3f}->"
                  f"{r['ece/platt']:.3f} ({r['train_seconds']:.0f} s)", flush=True)
    summary = summarize(results, cfg)
    deploy = deploy_source(results, cfg.deploy)
    out = {"config": config_path, "prm_config": cfg.to_dict(), "stats": stats, "summary": summary,
           "runs": results, "deployed": deploy, "wall_seconds": time.time() - t_start}
    with open(res_path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, default=float)
    text = table(summary, stats, cfg)
    with open(os.path.join(workdir, f"table{suffix}.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    if not tag:
        _deploy(os.path.join(prm_dir, deploy), os.path.join(workdir, "prm"))
        print(f"deployed {deploy} -> {os.path.join(workdir, 'prm')}", flush=True)
    print(f"wall {time.time() - t_start:.0f} s")
    return out
