"""Algorithms: jitted RL kernels, the functional train step, tasks and the trainer loop."""
