"""Process reward model (PRM): the policy's transformer with a per-step scoring head, trained on the project's
train step (rl/train_step.py, mode "prm"), calibrated, and used as a process reward, as step rewards and as a
best-of-N reranker. This subpackage imports JAX; the rest of rewards/ stays plain Python.

    data.py     which tokens are steps (step_ends), exact labels, corrupted gold solutions, Math-Shepherd labels
    model.py    PRM (params + calibration + threshold), token rows, batched jitted scoring, save / load (.npz)
    train.py    PRMConfig, train (mode "prm"), calibration fits, evaluation (step metrics, first-error F1)
    metrics.py  AUROC, ECE, Brier, NLL, temperature / Platt scaling, ProcessBench first-error F1, best-of-N

The pipeline that builds one from a config is experiments/train_prm.py:

    python -m experiments.train_prm --config experiments/configs/prm_arith.py --workdir runs/prm

The trainer reads a PRM through rl/prm_reward.py (reward.prm_path, reward.w_prm, reward.prm_agg, reward.prm_steps).
This file imports nothing, so rewards.combine can read rewards.prm.metrics (NumPy only) without loading JAX.
"""
