"""Optimizer steps over minibatches: the loop the PRM trains with (prm/train.py), in the shape of the stages'
optimizer loop (rl/train_loop.py, train_on), so the PRM can run on one shared loop once that loop is a
plain function.

    state, metrics = optimizer_steps(step_fn, state, batches, schedule, after_step=None)

    step_fn     jitted (state, batch, hyper) -> (state, metrics): rl.train_step.make_train_step (it donates state)
    state       the train state {params, opt_state, step, rng, n_skipped} of rl.train_step.init_train_state
    batches     an iterable of host minibatches (dicts of NumPy arrays, each padded to one shape: one compile); drawn
                lazily, one per step, so the caller's data order (its own NumPy generator) stays its own
    schedule    schedule(i) -> the hyper-parameters of step i as host floats ({"lr": ...}), sent as float32 scalars
    after_step  after_step(i + 1, state, metrics) after each step, metrics still on the device (early stopping
                reads the parameters there; a progress line reads the metrics)

Returns the final state and every step's metrics, fetched to the host once at the end (dispatch stays
asynchronous), in step order.
"""
from __future__ import annotations

from typing import Callable, Iterable

import jax
import jax.numpy as jnp

__all__ = ["optimizer_steps"]


def optimizer_steps(step_fn: Callable, state: dict, batches: Iterable[dict], schedule: Callable[[int], dict],
                    after_step: Callable | None = None) -> tuple[dict, list[dict]]:
    """One optimizer step per minibatch of `batches` (see the module docstring)."""
    ms = []
    for i, batch in enumerate(batches):
        hyper = {k: jnp.float32(v) for k, v in schedule(i).items()}
        state, m = step_fn(state, {k: jnp.asarray(v) for k, v in batch.items()}, hyper)
        ms.append(m)
        if after_step is not None:
            after_step(i + 1, state, m)
    return state, jax.device_get(ms)
