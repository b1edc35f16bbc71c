"""The process reward model (PRM) wing: the policy's transformer with a per-step scoring head, trained on the
project's train step (rl/train_step.py with this wing's objective, prm/objective.py: mode "prm"), calibrated, and
used as a process reward, as step rewards and as a best-of-N reranker. It sits above rl/ (it uses rl's train step,
tasks and rollout helpers); rewards/ and rl/ import nothing of it (tests/test_layering.py).

    config.py       PRMSection, the run config's `prm` section (path, weight, agg, steps); JAX-free
    data.py         which tokens are steps (step_ends), exact labels, corrupted gold solutions, Math-Shepherd labels
    metrics.py      AUROC, ECE, Brier, NLL, temperature / Platt scaling, ProcessBench first-error F1, best-of-N
    model.py        PRM (params + calibration + threshold), token rows, batched jitted scoring
    objective.py    the train step's "prm" objective (step-end binary cross-entropy), registered into rl/objectives.py
    checkpoint.py   save / load: an orbax directory like the policy's; old .npz files read until rl/compat.py's date
    loop.py         optimizer steps over minibatches (the PRM's one optimizer loop)
    train.py        PRMConfig, train (mode "prm", early stopping on a calibration split)
    calibration.py  calibration fits, the first-error threshold, evaluation (step metrics, first-error F1)
    pipeline.py     policy -> samples -> labels -> one PRM per label source -> table and deployed checkpoint
    reward.py       the trainer side: process reward, step rewards, prm@k reranking (PRMScorer)

The command line is experiments/train_prm.py (a thin CLI over pipeline.py):

    python -m experiments.train_prm --config experiments/configs/prm_arith.py --workdir runs/prm

The wing plugs into rl/ through registries, filled by one explicit call, `prm.install()`: its config section
(config.py, PRMSection: prm.path, prm.weight, prm.agg, prm.steps) into rl/config_validation.py, the PRM reward term
into rl/reward_terms.py (the RL stages and the evaluation score with a PRM through it) and the "prm" objective into
rl/objectives.py (what prm/train.py trains). Every entry point that may run with a PRM calls it:
experiments/launch.py, sweep.py, eval.py, sample.py, train_prm.py, and tests/conftest.py for the tests. Importing the
package registers nothing and stays light (no JAX), so that `import prm.metrics` / `prm.data` / `prm.config` load no
JAX.
"""


def install() -> None:
    """Plug the wing into rl/: the "prm" config section (rl/config_validation.py), the "prm" reward term
    (rl/reward_terms.py) and the "prm" train-step objective (rl/objectives.py). Idempotent; a config that has a prm
    section, or a run that asks for a PRM, without it fails naming the field and this call."""
    from prm import objective, reward  # deliberately here: `import prm` (prm.metrics, prm.data) stays JAX-free

    reward.register()
    objective.register()
