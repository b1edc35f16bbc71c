"""What the train step optimises, by LossConfig.mode: a registry mode -> Objective, each a small pure function.

rl/train_step.py runs the policy forward once per (micro)batch, then hands what it computed to the mode's objective
and adds what every mode shares (the MoE router terms, token and row counts, the non-finite input count):

    objective = objectives.get(loss_cfg.mode)        # ValueError naming the mode when no objective fills its slot
    total, metrics = objective.loss(forward)          # forward: a Forward (params, batch, logits / hidden, weights)
    # the step then adds router_aux_coef * load-balancing + router_z_coef * z-loss to total

The objectives here:
  sft   masked cross-entropy of the response tokens (- entropy_coef * entropy)
  grpo  the policy loss (rl.losses.get_policy_loss(loss_cfg.policy_loss): clipped ratio, REINFORCE, GSPO, CISPO) on
        the batch's advantages against the behaviour logprobs (old_logp; absent = on-policy), at each row's sampling
        temperature, - entropy_coef * entropy, + kl_coef * KL(policy || ref) when the batch has ref_logp and
        loss_cfg.kl_in_loss (else the KL is only measured: `kl`)
  ppo   grpo's terms + value_coef * the clipped value loss of the linear value head (params["value_head"])
The "prm" slot (the process reward model's step-end binary cross-entropy) is the PRM wing's: prm/objective.py fills
it when the wing is installed (prm.install()); rl/ imports nothing of the wing (docs/layout.md, Layers).

Slots are rl.losses.MODES, the names LossConfig.mode accepts; `register` fills one, so a wing adds its objective
without a branch here. Each metric an objective reports is the whole batch's when summed over microbatches: means
are scaled by `tok_w` (share of loss tokens) or `row_w` (share of rows), losses use the whole batch's denominator;
the metrics in MAX_METRICS are combined by max instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rl import logprobs, losses

__all__ = ["Objective", "Forward", "register", "registered", "get", "MAX_METRICS", "sft", "grpo", "ppo"]

# Metrics combined across microbatches by max; all others are pre-scaled so that they add up.
MAX_METRICS = ("policy/ratio_max",)


@dataclasses.dataclass(frozen=True)
class Forward:
    """One forward pass of the policy over a (micro)batch, with what an objective reads.

    `inputs` are the batch's float inputs (old_logp, ref_logp, advantages, old_values, returns, step_labels) with
    masked positions zeroed by selection; `mask` the float loss mask; `logits` None on the chunked path (hidden
    states in aux["hidden"] then); `denom` the whole batch's aggregation denominator (None: this batch's own),
    `tok_w` / `row_w` this batch's share of the loss tokens / rows with loss tokens (1.0 for a whole batch).
    """

    params: dict
    batch: dict
    inputs: dict
    tokens: jax.Array
    mask: jax.Array
    logits: Any
    aux: dict
    grouped: bool
    kl_coef: jax.Array
    denom: Any
    tok_w: Any
    row_w: Any
    model_cfg: Any
    loss_cfg: losses.LossConfig
    mesh: Any
    rules: Any

    def aggregate(self, x: jax.Array) -> jax.Array:
        """x [B, T] aggregated over the loss mask as the loss config says (loss_cfg.agg, over `denom`)."""
        return losses.aggregate(x, self.mask, self.loss_cfg.agg, self.loss_cfg.max_len_norm, self.denom)

    def logprobs_entropy(self, temperature: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(logp, entropy) [B, T] of the batch's tokens at one temperature per row (rl.logprobs)."""
        return logprobs.logprobs_entropy(self.params, self.logits, self.aux, self.tokens, temperature, self.model_cfg,
                                         self.mesh, self.rules, self.grouped)

    def token_logprobs(self, temperature) -> jax.Array:
        """Per-token logprobs [B, T] of the batch's tokens, flat layout (rl.logprobs.token_logprobs)."""
        return logprobs.token_logprobs(self.params, self.logits, self.aux, self.tokens, temperature, self.model_cfg,
                                       self.mesh, self.rules)


@dataclasses.dataclass(frozen=True)
class Objective:
    """A mode's objective: `loss(forward) -> (total, metrics)`, total before the router terms the step adds.

    value_head: the params carry params["value_head"] = {"w": [d_model], "b": []} (init_train_state adds it, the
    forward returns hidden states); grouped: it accepts the grouped batch layout (prompt_tokens / prompt_mask);
    inputs: its own float batch keys besides the policy objectives' (old_logp, ref_logp, advantages, old_values,
    returns), masked and checked for non-finite values like them (Forward.inputs).
    """

    loss: Callable[[Forward], tuple[jax.Array, dict]]
    value_head: bool = False
    grouped: bool = True
    inputs: tuple[str, ...] = ()


_OBJECTIVES: dict[str, Objective] = {}


def register(mode: str, objective: Objective) -> None:
    """Fill slot `mode` (one of rl.losses.MODES) with an objective; a later call replaces it."""
    if mode not in losses.MODES:
        raise ValueError(f"objective {mode!r} has no slot (LossConfig.mode: {', '.join(losses.MODES)})")
    _OBJECTIVES[mode] = objective


def registered() -> list[str]:
    return sorted(_OBJECTIVES)


def get(mode: str) -> Objective:
    """The objective of LossConfig.mode `mode`; ValueError when no objective fills its slot."""
    if mode not in _OBJECTIVES:
        wing = " (the PRM wing's: call prm.install() first)" if mode == "prm" else ""
        raise ValueError(f"LossConfig.mode {mode!r} has no registered objective{wing}; registered: "
                         f"{', '.join(registered())}")
    return _OBJECTIVES[mode]


def _row_temperature(batch: dict, rows: int) -> jax.Array:
    t = batch.get("temperature")
    if t is None:
        return jnp.ones((rows,), jnp.float32)
    return jnp.broadcast_to(jnp.asarray(t, jnp.float32), (rows,))


def sft(f: Forward) -> tuple[jax.Array, dict]:
    """Masked cross-entropy of the response tokens at temperature 1, - entropy_coef * entropy."""
    logp, ent_tok = f.logprobs_entropy(jnp.ones((f.tokens.shape[0],), jnp.float32))
    entropy = f.aggregate(ent_tok)
    policy = f.aggregate(-logp)
    total = policy - f.loss_cfg.entropy_coef * entropy
    kl = jnp.zeros((), jnp.float32)
    return total, {"entropy": entropy, "loss/policy": policy, "loss/kl": kl, "kl": kl,
                   "loss/value": jnp.zeros((), jnp.float32)}


def _policy_terms(f: Forward) -> tuple[jax.Array, dict]:
    """The policy loss - entropy_coef * entropy (+ kl_coef * KL with ref_logp and kl_in_loss), and its metrics."""
    cfg = f.loss_cfg
    logp, ent_tok = f.logprobs_entropy(_row_temperature(f.batch, f.tokens.shape[0]))
    entropy = f.aggregate(ent_tok)
    metrics: dict[str, Any] = {"entropy": entropy}
    adv = f.inputs["advantages"]
    if adv.ndim == 1:
        adv = adv[:, None]
    adv = jnp.broadcast_to(adv, f.mask.shape)
    old = f.inputs["old_logp"] if "old_logp" in f.inputs else jax.lax.stop_gradient(logp)
    policy, pmet = losses.get_policy_loss(cfg.policy_loss)(logp, old, adv, f.mask, cfg.ratio_clip_low, cfg.clip_high,
                                                           cfg.dual_clip or None, cfg.agg, cfg.max_len_norm, f.denom)
    metrics.update({f"policy/{k}": v if f"policy/{k}" in MAX_METRICS else v * f.tok_w for k, v in pmet.items()})
    total = policy - cfg.entropy_coef * entropy

    kl_loss = kl_seq = jnp.zeros((), jnp.float32)
    if "ref_logp" in f.inputs:
        kl_tok = losses.kl_penalty(logp, f.inputs["ref_logp"], cfg.kl_kind)
        kl_loss = f.aggregate(kl_tok)
        kl_seq = losses.aggregate(kl_tok, f.mask, "seq-mean-token-mean") * f.row_w
        if cfg.kl_in_loss:
            total = total + f.kl_coef * kl_loss
        else:  # only measured (`kl`): the KL is in the rewards, so the loss has no KL term to report
            kl_loss = jnp.zeros((), jnp.float32)
    return total, {**metrics, "loss/policy": policy, "loss/kl": kl_loss, "kl": kl_seq}


def grpo(f: Forward) -> tuple[jax.Array, dict]:
    """The policy-gradient objective of GRPO and its variants (the policy loss, entropy and KL terms)."""
    total, metrics = _policy_terms(f)
    return total, {**metrics, "loss/value": jnp.zeros((), jnp.float32)}


def ppo(f: Forward) -> tuple[jax.Array, dict]:
    """grpo's terms + value_coef * the clipped value loss of the value head (values aligned like logprobs)."""
    total, metrics = _policy_terms(f)
    hidden = f.aux["hidden"]
    values = logprobs.head(f.params, hidden) if f.grouped else logprobs.shifted_values(f.params, hidden)
    vloss, vmet = losses.value_loss(values, f.inputs["old_values"], f.inputs["returns"], f.mask,
                                    f.loss_cfg.value_clip or None, f.loss_cfg.agg, f.loss_cfg.max_len_norm, f.denom)
    total = total + f.loss_cfg.value_coef * vloss
    return total, {**metrics, "loss/value": vloss, **{f"value/{k}": v * f.tok_w for k, v in vmet.items()}}


register("sft", Objective(sft))
register("grpo", Objective(grpo))
register("ppo", Objective(ppo, value_head=True))
