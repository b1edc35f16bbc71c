"""The PRM wing's run-wide config section, `prm`: which process reward model a run scores with and how.

    prm.path    a PRM checkpoint written by prm/pipeline.py (python -m experiments.train_prm; "" = off); "{seed}" is
                replaced by the run's seed (one PRM per seed in a sweep)
    prm.weight  total reward += weight x the response's PRM score (math rows only; 0.1-0.3 when on)
    prm.agg     the response's PRM score from its calibrated step probabilities: min | mean | prod | last
    prm.steps   step_rewards / process_grpo take their step scores from the PRM instead of the exact checker

The section is the wing's, not rl/'s: prm.install() registers it (rl.config_validation.register_section), and from
then on a config's "prm" section validates into RunConfig.prm (its defaults when the config has none), the command
line takes --config.prm.weight=0.1, --help_config lists prm.* and config.json stores a top-level "prm". The RL stages'
own PRM terms stay in the stage config (stages[i].prm_weight, stages[i].prm_calibration: rl/stages/iteration.py),
so a sweep over them shares its cold start. These fields sat in the reward section before (reward.prm_path, w_prm,
prm_agg, prm_steps); an old config or config.json is read with them moved here (rl/config_validation.py, rl/compat.py
"prm_reward_fields"). JAX-free, like prm/metrics.py, so that validation loads no model code.
"""
from __future__ import annotations

import dataclasses

from prm.metrics import AGGREGATES
from schema import Checked, boolean, choice, field, num, text

__all__ = ["PRMSection"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PRMSection(Checked):
    """A run config's `prm` section (the process reward model the trainer scores with; prm/reward.py)."""

    path: str = field("", "process reward model checkpoint (experiments/train_prm.py); \"\" = off; \"{seed}\" = the "
                          "run's seed; scored by the trainer", text)
    weight: float = field(0.0, "weight of the PRM score of each (math) response, added by the trainer; 0.1-0.3 when on",
                          num(0.0, 100.0))
    agg: str = field("min", "PRM response score from its calibrated step probabilities: min | mean | prod | last",
                     choice(*AGGREGATES))
    steps: bool = field(False, "step_rewards / process_grpo take their step scores from the PRM, not the checker",
                        boolean)

    def cross_checks(self):
        if (self.weight > 0 or self.steps) and not self.path:
            yield "path", "must name a PRM file when prm.weight > 0 or prm.steps is on"
