"""Launcher, sweeps, experiment configs and benchmark scripts.

Importing this package activates the wings a run may ask for: `import prm` registers the process reward model's
reward term into rl/reward_terms.py (the RL stages and the evaluation call it when reward.prm_path is set), so
every entry point here (launch, sweep, eval, sample, train_prm) has it. The import is light (no JAX; the PRM's
model code loads when a run first uses it), so the launcher stays quick to import and so do the reward pool's
workers, which import the launcher's module.
"""
import prm  # noqa: F401  (registers the PRM reward term; rl/ cannot import the wing above it)
