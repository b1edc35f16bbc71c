"""The process reward model's train-step objective: LossConfig.mode "prm", registered into rl/objectives.py.

prm/train.py trains the PRM with rl's train step (rl/train_step.py: state, accumulation, the non-finite skip);
what the step optimises in mode "prm" is this wing's, so it lives here and fills the "prm" slot of the objectives
registry when the wing is installed (prm.install() calls register()). rl/ imports nothing of it.

Batch (flat layout only): tokens, attn_mask, loss_mask = 1 at each labelled step end and step_labels [B, T] in
[0, 1] there. The loss is the binary cross-entropy of the value head's logit at token t (not shifted: it reads the
prefix up to and including t), aggregated like a policy loss (LossConfig.agg); prm/accuracy is the share of steps
on the right side of 0. With step_prev [B, T] (int: at a step end, the previous step's end) the logit also adds the
step's log-likelihood under the model's own LM head, sum of log p(token) over (step_prev[t], t]. The step adds the
router terms, counts and the non-finite input count as for every objective.

    prm.install()                                       # or objective.register()
    step = make_train_step(model_cfg, LossConfig(mode="prm"), optim_cfg)   # params carry "value_head"
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rl import logprobs, losses, objectives

__all__ = ["prm_loss", "OBJECTIVE", "register"]


def prm_loss(f: objectives.Forward) -> tuple[jax.Array, dict]:
    """(binary cross-entropy of the step logits against step_labels at the loss-mask positions, its metrics)."""
    z = logprobs.head(f.params, f.aux["hidden"])
    if "step_prev" in f.batch:  # + each step's log-likelihood under the model's own LM head
        lp = f.token_logprobs(1.0)
        cum = jnp.cumsum(lp * f.batch["attn_mask"], axis=1)
        z = z + cum - jnp.take_along_axis(cum, f.batch["step_prev"].astype(jnp.int32), axis=1)
    labels = f.inputs["step_labels"]
    bce = f.aggregate(jnp.logaddexp(0.0, z) - labels * z)
    hit = ((z > 0) == (labels > 0.5)).astype(jnp.float32)
    return bce, {"loss/prm": bce, "prm/accuracy": losses.aggregate(hit, f.mask, "token-mean") * f.tok_w}


# The value head is the PRM's scoring head; the grouped layout is the policy objectives' only.
OBJECTIVE = objectives.Objective(prm_loss, value_head=True, grouped=False, inputs=("step_labels",))


def register() -> None:
    """Fill the "prm" slot of rl/objectives.py (prm.install() calls it)."""
    objectives.register("prm", OBJECTIVE)
