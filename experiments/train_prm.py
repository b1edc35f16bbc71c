"""Build, calibrate and measure the process reward model (issue 15) from a config file: the command line of the
PRM wing's pipeline (prm/pipeline.py, whose docstring lists the steps and the files it writes).

    python -m experiments.train_prm --config experiments/configs/prm_arith.py --workdir runs/prm

The config file gives two things: get_config(arg), a launcher config whose stages make the policy (a cold start),
and get_prm_config(arg), the PRM pipeline's fields (prm.train.PRMConfig). The deployed PRM is the checkpoint
workdir/prm (prm.path of a GRPO run).
"""
from __future__ import annotations

import argparse
import sys

import prm
from experiments import launch
from prm import pipeline
from prm.train import with_overrides
from rl import config_validation as cv
from schema import FieldErrors


def load(spec: str, overrides=()):
    """(validated launcher config, PRMConfig) of a config file, with FIELD=VALUE overrides of the PRM fields."""
    module, arg = launch.load_config_file(spec)
    if not callable(getattr(module, "get_prm_config", None)):
        raise cv.ConfigError(f"--config: {spec} has no get_prm_config(arg=None)")
    policy_cfg = module.get_config(arg)
    cv.validate(policy_cfg)
    return policy_cfg, with_overrides(cv.to_dict(module.get_prm_config(arg)), overrides)


def main(argv=None) -> int:
    prm.install()  # the PRM wing's objective (mode "prm", what pipeline.run trains), reward term and config section
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="experiments/configs/FILE.py[:arg]")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="PRM config overrides, values as Python literals (e.g. lr=3e-4 sources=prior,mix)")
    ap.add_argument("--tag", default="", help="a second experiment on the same samples: results_TAG.json, "
                                               "table_TAG.md and prms_TAG/ (nothing deployed)")
    args = ap.parse_args(argv)
    try:
        policy_cfg, cfg = load(args.config, args.set)
    except (cv.ConfigError, FieldErrors, ValueError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    pipeline.run(policy_cfg, cfg, args.workdir, tag=args.tag, config_path=args.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
