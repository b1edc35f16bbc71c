"""The process reward model (PRM) wing: the policy's transformer with a per-step scoring head, trained on the
project's train step (rl/train_step.py, mode "prm"), calibrated, and used as a process reward, as step rewards
and as a best-of-N reranker. It sits above rl/ (it uses rl's train step, tasks and rollout helpers); rewards/ and
rl/ import nothing of it (tests/test_layering.py).

    data.py         which tokens are steps (step_ends), exact labels, corrupted gold solutions, Math-Shepherd labels
    metrics.py      AUROC, ECE, Brier, NLL, temperature / Platt scaling, ProcessBench first-error F1, best-of-N
    model.py        PRM (params + calibration + threshold), token rows, batched jitted scoring
    checkpoint.py   save / load: an orbax directory like the policy's; old .npz files read until its date in rl/compat.py (prm_npz)
    loop.py         optimizer steps over minibatches (the PRM's one optimizer loop)
    train.py        PRMConfig, train (mode "prm", early stopping on a calibration split)
    calibration.py  calibration fits, the first-error threshold, evaluation (step metrics, first-error F1)
    pipeline.py     policy -> samples -> labels -> one PRM per label source -> table and deployed checkpoint
    reward.py       the trainer side: process reward, step rewards, prm@k reranking (PRMScorer)

The command line is experiments/train_prm.py (a thin CLI over pipeline.py):

    python -m experiments.train_prm --config experiments/configs/prm_arith.py --workdir runs/prm

`import prm` registers the PRM reward term into rl/reward_terms.py, the plug-in point through which the RL stages
and the evaluation score with a PRM (reward.prm_path, reward.w_prm, reward.prm_agg, reward.prm_steps); the
experiments package imports it. This file stays light (no JAX): reward.py, and with it the model code, is imported
when a run first asks for its PRM, so that `import prm.metrics` / `prm.data` and the reward pool's workers (which
import the launcher's package) load no JAX.
"""
from rl import reward_terms


def _scorer(ctx, stage=None, where: str = "stages[i]"):
    from prm import reward  # deliberately lazy: the model code (JAX) loads when a run uses its PRM

    return reward.for_context(ctx, stage, where)


def _eval_rerank(ctx, prompts, samples, scores, k: int) -> dict:
    from prm import reward  # deliberately lazy, as in _scorer

    return reward.eval_rerank(ctx, prompts, samples, scores, k)


reward_terms.register("prm", scorer=_scorer, eval_rerank=_eval_rerank)
