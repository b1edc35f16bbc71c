"""Launcher, sweeps, experiment configs and benchmark scripts."""
