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


def _gsm8k_files(folder, n_train=40, n_test=12, long_items=20):
    """A user's small GSM8K-format dataset: short word problems, one long one, a 12-problem test file."""
    import json

    folder.mkdir()

    def rec(i):
        a, b = 2 + (7 * i) % 97, 3 + (13 * i) % 89
        return {"question": f"Tom has {a} apples and buys {b} more. How many apples does he have now? (case {i})",
                "answer": f"He has {a}+{b}=<<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"}

    long_q = "A long one: " + " ".join(f"item {k} costs {k} dollars;" for k in range(long_items)) + " the total?"
    train = [rec(i) for i in range(n_train)] + [{"question": long_q, "answer": f"#### {sum(range(long_items))}"}]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (folder / "test.jsonl").write_text("".join(json.dumps(rec(1000 + i)) + "\n" for i in range(n_test)))
    return folder


def _launch_one_device(*argv):
    import os
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-m", "experiments.launch", *argv], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_qwen_gsm8k_on_a_small_user_dataset_reports_every_problem_in_one_pass(tmp_path):
    """The issue's seven tries in one: the dry run on one CPU device names every field to change with a value that
    works (mesh, the test and validation counts with their eval counterparts, the prompt length the longest prompt
    needs, the answer length the checkpoint's context leaves) and a misspelled override gets "did you mean"; the
    values it names, applied, make the same dry run pass."""
    import re

    from tests.hf_folders import run_ready_folder

    data = _gsm8k_files(tmp_path / "gsm8k")
    ckpt = run_ready_folder(tmp_path, context=1024)
    argv = ["--config", f"experiments/configs/qwen_gsm8k.py:data={data}", "--dry_run", f"--config.model.hf_path={ckpt}"]
    p = _launch_one_device(*argv, "--config.tasks.n_tset=5")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    err = p.stderr
    for fragment in ["no field 'n_tset' there; did you mean 'n_test'?",
                     "needs 8 devices, this machine has 1 (cpu); set mesh.fsdp=1",
                     "tasks.n_test = 1319: tasks.test_source", "supplies 12 distinct test problems; set tasks.n_test=12 "
                     "(and eval.n_test=12)", "tasks.n_val = 256: tasks.mix",
                     "tasks.max_prompt_len = 512 is too small: 1 of ",
                     "exceed the checkpoint's context (1024, max_position_embeddings in"]:
        assert fragment in err, (fragment, err)
    assert "unique=False" not in err and "model.max_seq_len = 1536 -> 1024 (clipped" in p.stdout
    fixes = re.findall(r"\b((?:mesh|tasks|eval|sampling)\.\w+)=(\d+)", err)
    assert {k for k, _ in fixes} == {"mesh.fsdp", "tasks.n_test", "eval.n_test", "tasks.n_val", "eval.n_val",
                                     "tasks.max_prompt_len", "sampling.max_new_tokens"}, fixes
    assert launch.main(argv + [f"--config.{k}={v}" for k, v in dict(fixes).items()]) == 0  # in this process
