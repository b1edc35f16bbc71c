"""Every experiment config loads and validates (all variants); bad configs fail before compute, naming the field."""
import glob
import json
import os
import subprocess
import sys

import pytest

from experiments import launch
from rl import config_validation as cv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(p for p in glob.glob(os.path.join(ROOT, "experiments/configs/*.py"))
                 if os.path.basename(p) not in ("__init__.py", "common.py", "fixtures.py"))
VARIANTS = {"quickstart": ["full", "tiny"], "grpo_arith": ["full", "tiny"], "grpo_process": ["full", "step_rewards", "tiny"],
            "ppo_arith": ["full", "tiny"], "r1_zero": ["full", "tiny"], "r1_pipeline": ["full", "tiny"],
            "mismatch_moe": ["full", "tiny"], "prm_arith": ["full", "grpo_prm", "tiny", "tiny_grpo_prm"],
            "qwen_gsm8k": ["full", "moe", "tiny"], "gym_mix": ["full", "tiny"], "tool_arith": ["full", "tiny"],
            "smollm2_grpo": ["full", "tiny"], "smollm2_tools": ["full", "tiny"], "smollm2_upcycle": ["full", "tiny"],
            **{f"claim_{n}": ["full", "tiny"] for n in ("cold_start", "process_reward", "format_reward", "curriculum",
                                                        "kl_control", "temperature", "rejection", "step_rewards",
                                                        "prm_calibration")}}


def test_every_config_file_is_covered():
    names = {os.path.splitext(os.path.basename(p))[0] for p in CONFIGS}
    assert names == set(VARIANTS), f"add the new config to VARIANTS: {names ^ set(VARIANTS)}"


@pytest.mark.parametrize("name,variant", [(n, v) for n, vs in VARIANTS.items() for v in vs])
def test_config_loads_and_validates(name, variant):
    path = os.path.join(ROOT, "experiments/configs", name + ".py")
    module, _ = launch.load_config_file(path)
    assert "python -m experiments.launch --config experiments/configs/" + name + ".py" in module.__doc__
    cfg = module.get_config(f"variant={variant},seed=3")
    assert cfg.seed == 3
    typed = cv.validate(cfg)
    # config.json is the typed tree's dict: every key of the config file, with its value
    assert json.loads(json.dumps(typed.to_dict())) == json.loads(json.dumps(cv.to_dict(cfg)))
    if hasattr(module, "get_sweep"):
        sweep = module.get_sweep()
        for path_ in sweep["axes"]:
            launch.apply_override(cfg, path_, str(sweep["axes"][path_][0]))
        cv.validate(cfg)


def _tiny():
    module, _ = launch.load_config_file(os.path.join(ROOT, "experiments/configs/quickstart.py"))
    return module.get_config("variant=tiny")


@pytest.mark.parametrize("path,value,message", [
    ("stages[2].clip_high", "-1", "stages[2].clip_high must be >= 0.0, got -1"),
    ("stages[2].dual_clip", "0.5", "stages[2].dual_clip must be 0 (off) or > 1, got 0.5"),
    ("stages[2].agg", "'mean'", "stages[2].agg must be one of"),
    ("stages[0].epochs", "0", "stages[0].epochs must be >= 1, got 0"),
    ("stages[1].temperature", "0", "stages[1].temperature must be > 0.0, got 0"),
    ("stages[2].curriculum.samples", "(8, 0, 4)", "stages[2].curriculum.samples must be 3 ints in [1, 4096]"),
    ("stages[2].samples", "1", "stages[2].samples must be >= 2 for GRPO"),
    ("stages[2].kl_place", "reward", "stages[2].kl_place 'reward' needs kind ppo"),
    ("eval.n_val", "100", "eval.n_val (100) must be <= tasks.n_val (8)"),
    ("tasks.lang", "fr", "tasks.lang must be one of en|zh, got 'fr'"),
    ("model.n_kv_heads", "3", "model.n_heads (2) must be divisible by n_kv_heads (3)"),
    ("sampling.max_new_tokens", "1000", "must be <= model.max_seq_len"),
    ("mesh.data", "0", "mesh: axis sizes must be >= 1 or -1"),
    ("sharding_rules", "embed=gpu", "sharding_rules: rule 'embed=gpu'"),
    # ranges, not just types: finite numbers, sane sizes, known sources
    ("stages[2].lr", "1e999", "stages[2].lr must be a finite number, got inf"),
    ("stages[2].kl_coef", "1e999", "stages[2].kl_coef must be a finite number"),
    ("stages[0].lr", "100", "stages[0].lr must be <= 10.0"),
    ("seed", str(10**30), "seed must be <= 4294967295"),
    ("tasks.n_train", "1e12", "tasks.n_train must be an int"),
    ("tasks.n_train", str(10**12), "tasks.n_train must be <= 10000000"),
    ("tasks.mix", "", "tasks.mix: mix spec must be a non-empty string"),
    ("tasks.mix", "nosuch:1", "tasks.mix: mix spec 'nosuch:1': unknown source 'nosuch'"),
    ("tasks.mix", "add:-1", "tasks.mix: mix spec 'add:-1': weight of 'add' must be a positive finite number"),
    ("stages[1].name", "", "stages[1].name must be a non-empty string"),
    ("stages[2].kl_kind", "k1", "stages[2].kl_kind 'k1' cannot be used in the loss"),
    ("stages[2].warmup_steps", "-1", "stages[2].warmup_steps must be >= 0"),
    ("reward.lang", "fr", "reward.lang must be '' (= tasks.lang), en or zh"),
    ("run.max_consecutive_skips", "-1", "run.max_consecutive_skips must be >= 0"),
])
def test_bad_field_is_named(path, value, message):
    cfg = _tiny()
    launch.apply_override(cfg, path, value)
    with pytest.raises(cv.ConfigError) as e:
        cv.validate(cfg)
    assert message in str(e.value)


def test_truncated_sampling_is_refused_with_an_rl_stage():
    """The sampler draws from the top_p / top_k-truncated distribution but stores, and the trainer trains on, the full
    distribution's logprobs: refused with a grpo / ppo stage, naming the field; fine without one (SFT, rejection)."""
    for path, value, message in (("sampling.top_p", "0.9", "sampling.top_p must be 1.0 (off) with a grpo/ppo stage "
                                                           "(stages[2])"),
                                 ("sampling.top_k", "5", "sampling.top_k must be 0 (off) with a grpo/ppo stage")):
        cfg = _tiny()
        launch.apply_override(cfg, path, value)
        with pytest.raises(cv.ConfigError) as e:
            cv.validate(cfg)
        assert message in str(e.value) and f"got {value}" in str(e.value)
        cfg.stages = cfg.stages[:2]  # cold start + rejection only: truncated sampling is allowed
        cv.validate(cfg)


def test_unknown_and_missing_fields_and_duplicate_names():
    cfg = _tiny()
    with cfg.stages[0].unlocked():
        cfg.stages[0].epocs = 2
    cfg.stages[1].name = "cold_start"
    with pytest.raises(cv.ConfigError) as e:
        cv.validate(cfg)
    assert "stages[0].epocs is not a known field" in str(e.value)
    assert "stages[1].name 'cold_start' is used twice" in str(e.value)
    with pytest.raises(cv.ConfigError, match="has no field 'itrations'"):
        cv.stage("grpo", "g", itrations=3)


def test_override_parsing():
    cfg = _tiny()
    launch.apply_overrides(cfg, [("stages.2.iterations", "7"), ("stages[2].curriculum.enabled", "true"),
                                 ("stages[2].lr", "1"), ("tasks.mix", "add:1,sub:1"), ("stages[2].curriculum.samples", "[2,4,8]")])
    assert cfg.stages[2].iterations == 7 and cfg.stages[2].curriculum.enabled is True
    assert isinstance(cfg.stages[2].lr, float) and cfg.tasks.mix == "add:1,sub:1"
    assert tuple(cfg.stages[2].curriculum.samples) == (2, 4, 8)
    with pytest.raises(cv.ConfigError, match="does not exist"):
        launch.apply_override(cfg, "stages[9].lr", "1")
    with pytest.raises(cv.ConfigError, match="no field 'nope'"):
        launch.apply_override(cfg, "eval.nope", "1")


def test_launch_rejects_bad_config_before_compute(tmp_path):
    cmd = [sys.executable, "-m", "experiments.launch", "--config", "experiments/configs/quickstart.py:variant=tiny",
           "--workdir", str(tmp_path / "run"), "--config.stages[2].clip_high=-1"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "stages[2].clip_high must be >= 0.0, got -1" in p.stderr
    assert not os.path.exists(tmp_path / "run" / "config.json")  # nothing written, nothing trained


def test_documented_off_values_are_accepted_and_mean_off():
    """'0 = off' means off in every stage: grad_clip, value_clip, dual_clip; warmup longer than the stage is fine."""
    from rl import stages

    cfg = _tiny()
    for path, value in (("stages[2].grad_clip", "0"), ("stages[2].warmup_steps", "150"), ("stages[0].grad_clip", "0"),
                        ("stages[2].dual_clip", "0")):
        launch.apply_override(cfg, path, value)
    cv.validate(cfg)
    loss, optim, ctl = stages.components(stages.parse_stage(cv.to_dict(cfg)["stages"][2]), max_new_tokens=32)
    assert optim.grad_clip is None and loss.dual_clip == 0  # LossConfig's 0 = off: the step passes None on
    ppo = stages.parse_stage({**stages.defaults("ppo"), "value_clip": 0.0})
    loss, _, _ = stages.components(ppo, max_new_tokens=32)
    assert loss.value_clip == 0  # off (rl.train_step passes None to the value loss)


def test_kl_defaults_and_dr_grpo_constant():
    from rl import stages

    ppo = stages.parse_stage(stages.defaults("ppo"))
    loss, _, ctl = stages.components(ppo, max_new_tokens=48)
    assert ppo.loss.kl_kind == "k1" and ppo.kl.kl_place == "reward" and not loss.kl_in_loss  # k1 in the reward
    grpo = stages.parse_stage({**stages.defaults("grpo"), "agg": "seq-mean-token-sum-norm"})
    loss, _, _ = stages.components(grpo, max_new_tokens=48)
    assert loss.max_len_norm == 48  # Dr. GRPO divides by the response budget, not prompt + response length
    adaptive = stages.parse_stage({**stages.defaults("grpo"), "kl_adaptive": True})
    assert stages.components(adaptive, 48)[2].init_coef == 0.04


def test_launch_dry_run_and_help(capsys):
    spec = os.path.join(ROOT, "experiments/configs/quickstart.py") + ":variant=tiny"
    assert launch.main(["--config", spec, "--dry_run"]) == 0
    assert "config OK" in capsys.readouterr().out
    assert launch.main(["--help_config"]) == 0
    out = capsys.readouterr().out
    assert "stages[i].clip_high = 0.2" in out and "eval.k = 8" in out


def test_sweep_grid_table_and_csv(tmp_path):
    from experiments import sweep

    pts = sweep.grid({"axes": {"stages[2].clip_high": [0.2, 0.28], "stages[2].lr": [1e-3]}})
    assert pts == [{"stages[2].clip_high": 0.2, "stages[2].lr": 1e-3}, {"stages[2].clip_high": 0.28, "stages[2].lr": 1e-3}]
    assert sweep.grid({"axes": {}}) == [{}] and sweep.point_name({}) == "base"
    runs = []
    for i, (ch, seed) in enumerate([(0.2, 0), (0.2, 1), (0.28, 0)]):
        wd = tmp_path / f"r{i}"
        wd.mkdir()
        (wd / "summary.json").write_text(json.dumps({"eval": {"grpo": {"pass@1": 0.1 * (i + 1)}}, "wall_seconds": 1.0}))
        runs.append({"stages[2].clip_high": ch, "seed": seed, "workdir": str(wd)})
    rows, stages = sweep.collect(runs)
    assert stages == ["grpo"] and rows[2]["grpo/pass@1"] == pytest.approx(0.3)
    text = sweep.table(rows, ["stages[2].clip_high"], stages, "pass@1")
    # mean +- the sample std (ddof=1) with n and every seed's value
    assert "| 0.2 | 0.150 ± 0.071 (n=2: 0.100, 0.200) |" in text and "| 0.28 | 0.300 (n=1: 0.300) |" in text
    sweep.write_csv(str(tmp_path / "results.csv"), rows)
    assert (tmp_path / "results.csv").read_text().splitlines()[0].startswith("stages[2].clip_high,seed")
    sweep.plot(str(tmp_path / "p.png"), rows, ["stages[2].clip_high"], stages, "pass@1")
    assert (tmp_path / "p.png").stat().st_size > 0


def _launch(tmp_path, *argv, config=None):
    spec = config or os.path.join(ROOT, "experiments/configs/quickstart.py") + ":variant=tiny"
    return launch.main(["--config", spec, *argv])


@pytest.mark.parametrize("extra,message", [
    (["--config.stages[2].grad_clip=0", "--config.stages[2].warmup_steps=150"], None),
    (["--config.stages[2].clip_high=-1"], "stages[2].clip_high must be >= 0.0, got -1"),
    (["--config.mesh.data=16"], "needs 16 devices, this machine has 8"),
    (["--config.tasks.n_test=100000", "--config.eval.n_test=8"], "supplies 11 distinct test problems; set tasks.n_test=11"),
    (["--config.tasks.max_prompt_len=4"], "the longest has 25 tokens; set tasks.max_prompt_len=25"),
    (["--config.model.d_model=100000", "--config.model.d_ff=1000000"], "GiB needed to train this model"),
    (["--config.model=3"], "model is missing or not a section"),
])
def test_dry_run_checks_everything_before_compute(tmp_path, capsys, extra, message):
    rc = _launch(tmp_path, "--dry_run", *extra)
    err = capsys.readouterr().err
    if message is None:
        assert rc == 0, err
    else:
        assert rc == 2 and message in err, err


def test_bad_config_files_and_workdirs_exit_2(tmp_path, capsys):
    bad = {"syntax.py": "def get_config(arg=None:\n", "raises.py": "def get_config(arg=None):\n    raise RuntimeError('boom')\n",
           "none.py": "def get_config(arg=None):\n    return None\n", "noget.py": "x = 1\n"}
    for name, src in bad.items():
        (tmp_path / name).write_text(src)
        assert _launch(tmp_path, "--dry_run", config=str(tmp_path / name)) == 2, name
        assert "config error: --config" in capsys.readouterr().err
    assert _launch(tmp_path, "--dry_run", config=str(tmp_path)) == 2  # a directory
    assert "is not a file" in capsys.readouterr().err
    qs = os.path.join(ROOT, "experiments/configs/quickstart.py")
    assert _launch(tmp_path, "--dry_run", config=qs + ":variant=tiny,seed=abc") == 2
    assert "seed" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert _launch(tmp_path, "--workdir", str(afile)) == 2
    assert "is not a directory" in capsys.readouterr().err
    wd = tmp_path / "corrupt"
    wd.mkdir()
    (wd / "config.json").write_text("{not json")
    assert _launch(tmp_path, "--workdir", str(wd)) == 2
    assert "is unreadable" in capsys.readouterr().err
