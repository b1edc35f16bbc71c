"""Launcher, sweeps, experiment configs and benchmark scripts.

Each entry point here that may run with a process reward model (launch, sweep, eval, sample, train_prm) installs
the PRM wing explicitly, `prm.install()` first thing in its main(): the wing's reward term and train-step objective
go into rl/'s registries (rl/reward_terms.py, rl/objectives.py), which rl/ cannot fill by importing the wing above
it. Importing this package imports nothing, so the reward pool's workers, which import the launcher's module, stay
light.
"""
