"""Config errors as a user meets them: every numeric field has a finite range (booleans are not numbers), every
problem of a config is reported in one pass with the field to change and a value that works, and a misspelled
field gets "did you mean"."""
import copy
import math

import pytest

from experiments import launch
from rl import config_validation as cv

QUICKSTART = "experiments/configs/quickstart.py"


def _numeric_paths(d, pre=""):
    """Every field of a config dict holding a number (or None, for the optional numbers), with its path."""
    for k, v in d.items():
        p = f"{pre}.{k}" if pre else k
        if isinstance(v, dict):
            yield from _numeric_paths(v, p)
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for i, s in enumerate(v):
                yield from _numeric_paths(s, f"{p}[{i}]")
        elif v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            yield p


def _set(d, path, value):
    node = d
    parts = launch.split_path(path)
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e300, True])
def test_every_numeric_field_is_range_checked(bad):
    """model.rope_theta / norm_eps / router_aux_coef / capacity_factor and every other number refuse inf, nan, a
    huge value and a boolean, naming the field (the quickstart has every section and every stage kind but ppo)."""
    base = cv.to_dict(launch.get_config(QUICKSTART + ":variant=tiny"))
    cv.validate(base)
    paths = list(_numeric_paths(base))
    assert {"model.rope_theta", "model.norm_eps", "model.router_aux_coef", "model.capacity_factor",
            "stages[2].lr", "reward.w_format"} <= set(paths)
    accepted = []
    for path in paths:
        d = copy.deepcopy(base)
        _set(d, path, bad)
        try:
            cv.validate(d)
            accepted.append(path)
        except cv.ConfigError as e:
            assert path.rsplit(".", 1)[-1] in str(e), (path, str(e))
    assert not accepted, f"{bad!r} accepted by {accepted}"


@pytest.mark.parametrize("field,value", [("model.rope_theta", "1e999"), ("model.norm_eps", "1e999"),
                                         ("model.router_aux_coef", "1e999"), ("model.capacity_factor", "1e999"),
                                         ("stages[2].lr", "True"), ("model.n_layers", str(10**9))])
def test_launcher_refuses_overflowing_or_boolean_values(field, value, capsys):
    assert launch.main(["--config", QUICKSTART + ":variant=tiny", "--dry_run", f"--config.{field}={value}"]) == 2
    err = capsys.readouterr().err
    assert field.rsplit(".", 1)[-1] in err and "Traceback" not in err
