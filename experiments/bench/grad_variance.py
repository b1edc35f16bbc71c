"""Gradient variance of GRPO's policy gradient: outcome-only vs step-level (segment) rewards, on the same samples.

    python -m experiments.bench.grad_variance --workdir runs/claims/step_rewards/_shared/seed0 [--ckpt last]
        [--batches 12] [--n_prompts 16] [--samples 8] [--temperature 1.0] [--json out.json]

For one policy (a run's checkpoint, loaded with rl.runs.load_policy) it draws `--batches` independent
batches of n_prompts x K answers from the run's training problems, scores them with the run's reward
(rewards.task_score), and computes each batch's on-policy policy gradient (rl.losses.policy_loss at ratio 1,
token-mean) twice on the same tokens: with GRPO's outcome advantages, and with the step-level rewards of
rl.stages.grpo added (exactly checked steps, +-0.5 x weight at each step's end, summed to the tokens before it).
Printed per estimator: the mean gradient's squared norm |E g|^2, the total variance tr Cov(g) = E|g - E g|^2
over batches, their ratio (noise-to-signal: lower means fewer samples for the same precision), the share of
rows with a non-zero advantage, and the cosine between the two mean gradients. Everything is a ratio inside
one run (claim 9 of REPRODUCING.md).
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from experiments.bench import common
from rewards.task_score import score_task, target_of
from rl import context, losses, rollout, runs, setup, stages
from rl.stages.grpo import grpo_token_advantages
from rl.advantages import step_scores
from rl.logprobs import compute_logprobs


def flat_grad(params, batch, adv, model_cfg, temperature):
    """The policy-loss gradient of one batch, flattened to one float64 vector (host)."""
    mask = jnp.asarray(batch["loss_mask"], jnp.float32)  # aligned with tokens, as the logprobs

    def loss(p):
        logp = compute_logprobs(p, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attn_mask"]), model_cfg,
                                temperature)
        old = jax.lax.stop_gradient(logp)
        value, _ = losses.policy_loss(logp, old, jnp.asarray(adv), mask, agg="token-mean")
        return value

    g = jax.grad(loss)(params)
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(g)])


def spread(grads):
    """(|mean|^2, total variance, ratio) of a list of gradient vectors."""
    G = np.stack(grads)
    mean = G.mean(0)
    signal = float(mean @ mean)
    var = float(((G - mean) ** 2).sum(1).mean())
    return signal, var, var / max(signal, 1e-30), mean


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.bench.grad_variance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--ckpt", default="last", help="best | last | a unit number (rl.runs.find_policy)")
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--n_prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--step_reward_weight", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    common.add_json_arg(ap)
    args = ap.parse_args(argv)

    cfg, model_cfg, params, tok = runs.load_policy(args.workdir, args.ckpt)
    cfg = cfg.replace(run=cfg.run.replace(reward_workers=0))
    ctx = context.build_context(cfg, tempfile.mkdtemp(prefix="gradvar-"), with_services=False)
    rcfg = setup.reward_config(cfg)
    base = {**stages.defaults("grpo"), "name": "g", "samples": args.samples, "filter_zero_variance": "off"}
    outcome_cfg = stages.parse_stage(base)
    step_cfg = stages.parse_stage({**base, "step_rewards": True, "step_reward_weight": args.step_reward_weight})
    rng = np.random.default_rng(args.seed)
    grads = {"outcome": [], "step": []}
    active = {"outcome": [], "step": []}
    accuracy = []
    for b in range(args.batches):
        probs = [ctx.train[i] for i in rng.choice(len(ctx.train), size=args.n_prompts, replace=False)]
        prompts = [ctx.prompt(p) for p in probs]
        smpl = ctx.sample(params, prompts, [args.samples] * len(probs), jax.random.key(args.seed * 1000 + b),
                          temperature=args.temperature)
        batch = rollout.build_batch([tok.encode(p, add_bos=True) for p in prompts], smpl, ctx.seq_len, pad_id=tok.PAD)
        scores = [score_task(t, target_of(probs[i].reward, probs[i].answer, probs[i].check), rcfg)
                  for t, i in zip(smpl.texts, smpl.prompt_index)]
        rewards = np.array([s["total"] for s in scores], np.float64)
        accuracy.append(float(np.mean([s["solved"] for s in scores])))
        steps = step_scores(tok, smpl.texts, batch["resp_start"], smpl.lengths)
        lmask = batch["loss_mask"].astype(np.float32)
        for name, scfg in (("outcome", outcome_cfg), ("step", step_cfg)):
            adv, _ = grpo_token_advantages(scfg, rewards, smpl.group_sizes, lmask, steps)
            active[name].append(float(np.mean(np.abs(adv).sum(1) > 0)))
            grads[name].append(flat_grad(params, batch, adv, model_cfg, args.temperature))
        print(f"batch {b + 1}/{args.batches}: sampled accuracy {accuracy[-1]:.3f}", flush=True)
    out = {"workdir": args.workdir, "ckpt": args.ckpt, "batches": args.batches, "rows_per_batch":
           args.n_prompts * args.samples, "temperature": args.temperature, "sampled_accuracy": float(np.mean(accuracy))}
    means = {}
    print(f"\n{'estimator':10s} {'|E g|^2':>12s} {'tr Cov g':>12s} {'noise/signal':>13s} {'rows with signal':>17s}")
    for name in ("outcome", "step"):
        signal, var, ratio, means[name] = spread(grads[name])
        out[name] = {"mean_sq_norm": signal, "total_variance": var, "noise_to_signal": ratio,
                     "rows_with_signal": float(np.mean(active[name]))}
        print(f"{name:10s} {signal:12.4e} {var:12.4e} {ratio:13.3f} {np.mean(active[name]):17.3f}")
    a, b_ = means["outcome"], means["step"]
    out["cosine_of_means"] = float(a @ b_ / max(np.linalg.norm(a) * np.linalg.norm(b_), 1e-30))
    out["noise_to_signal_ratio_step_over_outcome"] = out["step"]["noise_to_signal"] / out["outcome"]["noise_to_signal"]
    print(f"cosine(E g outcome, E g step) = {out['cosine_of_means']:.3f}; noise/signal step / outcome = "
          f"{out['noise_to_signal_ratio_step_over_outcome']:.3f}")
    common.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
