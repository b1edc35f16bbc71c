"""The R1 pipeline over three task families: per-stage families, per-family rewards and evaluation, post-RL
rejection sampling with gold replay, the all-scenario stage's language reward, and the config checks around them."""
import json
import os

import pytest

from experiments import launch
from experiments.configs import r1_pipeline
from rl import config_validation as cv
from rl import preflight, tasks
from rl.metrics import read_jsonl
from rl.stages.common import stage_problems

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("code", "instructions", "math")


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_tiny_pipeline_runs_every_stage_with_per_family_results(tmp_path):
    wd = tmp_path / "r1"
    cfg = os.path.join(ROOT, "experiments/configs/r1_pipeline.py") + ":variant=tiny"
    assert launch.main(["--config", cfg, "--workdir", str(wd)]) == 0
    summary = json.loads((wd / "summary.json").read_text())
    # eval.initial is off (the random policy scores 0 everywhere): one entry per stage
    assert list(summary["eval"]) == ["cold_start", "reasoning_rl", "rejection", "all_scenario_rl"]
    for entry in summary["eval"].values():
        for f in FAMILIES:
            assert 0.0 <= entry[f"pass@1/{f}"] <= 1.0 and entry[f"n_problems/{f}"] > 0
            assert 0.0 <= entry[f"language_consistency/{f}"] <= 1.0 and len(entry[f"pass@1_ci95/{f}"]) == 2
        assert sum(entry[f"n_problems/{f}"] for f in FAMILIES) == 12
    recs = [r for r in read_jsonl(wd / "metrics.jsonl") if r["phase"] == "train"]
    reasoning = [r for r in recs if r["stage"] == "reasoning_rl"]
    scenario = [r for r in recs if r["stage"] == "all_scenario_rl"]
    # reasoning RL samples math and code only; the all-scenario stage all three families
    assert reasoning and all("family_share/instructions" not in r for r in reasoning)
    assert all(r["family_share/code"] + r["family_share/math"] == pytest.approx(1.0) for r in reasoning)
    assert any("family_share/instructions" in r for r in scenario)
    for stage_recs in (reasoning, scenario):  # both RL stages take real optimizer steps
        assert any(r.get("optimizer_steps") and r["grad_norm"] > 0 for r in stage_recs), stage_recs
    rejection = [r for r in recs if r["stage"] == "rejection"]
    assert rejection and all("sample_accuracy" in r for r in rejection)


def test_stage_families_select_problems_and_are_validated():
    probs = tasks.load_mix("add:0.5,code:0.25,instructions:0.25", 40, 0, "train", difficulty={"code": 1})
    assert {p.reward for p in stage_problems(probs, "math, code")} == {"math", "code"}
    assert stage_problems(probs, "") == probs
    c = r1_pipeline.get_config("variant=tiny")
    c.stages[1].families = "math,poetry"
    with pytest.raises(cv.ConfigError, match=r"stages\[1\].families.*poetry"):
        cv.validate(c)


def test_preflight_refuses_a_stage_without_problems_of_its_families():
    c = r1_pipeline.get_config("variant=tiny")
    c.tasks.update(dict(mix="add:1.0", difficulty=2))
    c.stages[1].families = "code"
    cv.validate(c)
    cfg = cv.to_dict(c)
    with pytest.raises(cv.ConfigError, match=r"stages\[1\].families"):
        preflight.check_environment(cfg)


def test_source_difficulty_sets_levels_per_source():
    assert cv.parse_source_levels("code=1, add=2") == {"code": 1, "add": 2}
    with pytest.raises(ValueError, match="source=level"):
        cv.parse_source_levels("code:1")
    a = tasks.load_mix("add:0.5,code:0.5", 20, 0, "train", difficulty={"add": 2, "code": 1})
    assert {p.difficulty for p in a if p.reward == "math"} == {2} and {p.difficulty for p in a if p.reward == "code"} == {1}
    c = r1_pipeline.get_config()
    c.tasks.source_difficulty = "code=9"
    with pytest.raises(cv.ConfigError, match="tasks.source_difficulty"):
        cv.validate(c)


def test_gym_families_join_the_pipeline_and_the_all_scenario_stage():
    c = r1_pipeline.get_config("variant=tiny,gym=chain_sum+countdown")
    assert c.tasks.mix == r1_pipeline.MIX + ",gym@chain_sum:0.125,gym@countdown:0.125"
    cv.validate(c)  # the mix is checked without importing reasoning-gym
    with pytest.raises(cv.ConfigError, match="unknown reasoning-gym family 'sudoku'; supported: basic_arithmetic"):
        r1_pipeline.get_config("gym=sudoku")
    pytest.importorskip("reasoning_gym", reason="optional extra not installed: pip install -e '.[gym]'")
    from rl import setup

    train, _, test = setup.load_problems(cv.validate(c))  # tasks.difficulty is not passed to the gym sources
    assert {p.family for p in train} >= {"gym/chain_sum", "gym/countdown", "math"}
    assert not any(p.reward == "gym" for p in stage_problems(train, c.stages[1].families))  # reasoning RL: math, code
    assert any(p.reward == "gym" for p in stage_problems(train, c.stages[3].families))      # all-scenario: every family
    preflight.check_environment(cv.to_dict(c))  # prompts fit, every stage has problems
