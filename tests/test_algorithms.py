"""Algorithms by name (rl/stages/algorithms.py) and the warnings on values chosen for another setting
(rl/config_warnings.py): config-level, no training.

PAPERS below is written from the papers, not from the code's table: each name must give these stage fields."""
import json
import os

import pytest

from experiments import launch
from rl import config_validation as cv
from rl import config_warnings, preflight, prefix, stages
from rl.config_validation import stage, to_dict
from rl.stages import algorithms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (kind, the fields its paper uses), from the papers
PAPERS = {
    # DeepSeekMath: (r - mean) / std, 1/|o_i| per response then mean over the group, eps 0.2, k3 KL in the loss, 0.04
    "grpo": ("grpo", dict(advantage="grpo", scale_by_std=True, agg="seq-mean-token-mean", policy_loss="ppo",
                          clip_low=0.2, clip_high=0.2, kl_place="loss", kl_coef=0.04, kl_kind="k3",
                          filter_zero_variance="off")),
    # Dr. GRPO: no std, no length normaliser (a constant instead), PPO's clip, no KL
    "dr_grpo": ("grpo", dict(advantage="grpo", scale_by_std=False, agg="seq-mean-token-sum-norm", policy_loss="ppo",
                             clip_low=0.2, clip_high=0.2, kl_coef=0.0, filter_zero_variance="off")),
    # DAPO: clip-higher 0.2 / 0.28, token-level loss, dynamic sampling (groups with equal rewards out, more drawn
    # until the batch is full), no KL
    "dapo": ("grpo", dict(advantage="grpo", scale_by_std=True, agg="token-mean", policy_loss="ppo", clip_low=0.2,
                          clip_high=0.28, kl_coef=0.0, filter_zero_variance="refill")),
    # GSPO: sequence ratio clipped at 3e-4 / 4e-4, mean over sequences, group-normalised advantage, no KL
    "gspo": ("grpo", dict(advantage="grpo", scale_by_std=True, policy_loss="gspo", agg="seq-mean-token-mean",
                          clip_low=3e-4, clip_high=4e-4, kl_coef=0.0)),
    # CISPO (MiniMax-M1): stop-gradient IS weight clipped from above only, token-level normaliser, no KL
    "cispo": ("grpo", dict(advantage="grpo", scale_by_std=True, policy_loss="cispo", cispo_floor=False,
                           agg="token-mean", kl_coef=0.0)),
    # RLOO (Back to Basics): leave-one-out baseline, REINFORCE on the whole sequence (a sum of token logprobs)
    "rloo": ("grpo", dict(advantage="rloo", scale_by_std=False, policy_loss="reinforce", agg="seq-mean-token-sum",
                          filter_zero_variance="off")),
    # REINFORCE++: rewards normalised over the batch (no group baseline), PPO's clipped loss, token-level
    "reinforce_pp": ("grpo", dict(advantage="reinforce_pp", scale_by_std=False, policy_loss="ppo", clip_low=0.2,
                                  clip_high=0.2, agg="token-mean", filter_zero_variance="off")),
    # PPO for language models: value head + GAE (gamma 1, lambda 0.95), k1 KL in the per-token reward, eps 0.2
    "ppo": ("ppo", dict(policy_loss="ppo", clip_low=0.2, clip_high=0.2, agg="token-mean", kl_place="reward",
                        kl_kind="k1", gamma=1.0, lam=0.95, value_clip=0.2)),
}


def parse(entry):
    return stages.parse_stage(to_dict(entry))


def qs_config():
    return launch.get_config("experiments/configs/quickstart.py:variant=tiny")


def smollm2(spec=""):
    return launch.get_config("experiments/configs/smollm2_grpo.py" + spec)


def test_every_name_is_in_the_papers_table():
    assert set(algorithms.NAMES) == set(PAPERS)


@pytest.mark.parametrize("name", list(PAPERS))
def test_each_name_sets_the_fields_its_paper_uses(name):
    kind, fields = PAPERS[name]
    cfg = parse(stage(kind, algorithm=name))
    assert {k: stages.flat_value(cfg, k) for k in fields} == fields  # the name's flat keys, read in their sections
    assert cfg.rl.algorithm == name
    # the same from the command line, on a stage written without a name
    c = qs_config()
    c.stages[2] = stage(kind, "rl", iterations=2)
    launch.apply_overrides(c, [("stages[2].algorithm", name)])
    typed = cv.validate(c).stages[2]
    assert {k: stages.flat_value(typed, k) for k in fields} == fields


def test_a_name_runs_only_in_its_kind():
    with pytest.raises(stages.FieldErrors, match="algorithm 'dapo' .*runs in a grpo stage.*set kind='grpo'"):
        parse(stage("ppo", algorithm="dapo"))
    with pytest.raises(stages.FieldErrors, match="algorithm must be one of"):
        parse(stage("grpo", algorithm="grpo_plus"))
    entry = to_dict(stage("grpo", algorithm="dapo"))
    entry["applied_algorithm"] = "ppo"  # a hand-edited record the fields cannot be moved from
    with pytest.raises(stages.FieldErrors, match="applied_algorithm 'ppo' is not a grpo algorithm"):
        stages.parse_stage(entry)


@pytest.mark.parametrize("written", [True, "drop"])
def test_dapo_refills_a_stage_that_drops_by_default(written):
    """quickstart writes filter_zero_variance (True before "refill" existed, "drop" now): the kind's default, so
    algorithm=dapo moves it to DAPO's refill, in either spelling (rl.stages.current_values)."""
    c = qs_config()
    c.stages[2] = stage("grpo", "grpo", iterations=2, filter_zero_variance=written)
    launch.apply_overrides(c, [("stages[2].algorithm", "dapo")])
    assert cv.validate(c).stages[2].filter_zero_variance == "refill"
    launch.apply_overrides(c, [("stages[2].algorithm", "grpo")])
    assert cv.validate(c).stages[2].filter_zero_variance == "off"


def test_explicit_fields_override_the_name():
    # in a config file: the kind's own default (kl_coef 0.04) as much as any other value
    cfg = parse(stage("grpo", algorithm="dapo", kl_coef=0.04, clip_high=0.3))
    assert (cfg.kl.kl_coef, cfg.loss.clip_high, cfg.loss.clip_low, cfg.loss.agg) == (0.04, 0.3, 0.2, "token-mean")
    # on the command line, before or after the name
    for order in ([("stages[2].algorithm", "gspo"), ("stages[2].clip_high", "0.001")],
                  [("stages[2].clip_high", "0.001"), ("stages[2].algorithm", "gspo")]):
        c = qs_config()
        launch.apply_overrides(c, order)
        st = cv.validate(c).stages[2]
        assert (st.loss.policy_loss, st.loss.clip_low, st.loss.clip_high) == ("gspo", 3e-4, 0.001)
        assert st.kl.kl_coef == 0.02  # quickstart's own KL, set by the recipe: an override too


def test_switching_a_named_recipe_moves_only_the_fields_the_name_set():
    """The SmolLM2 recipe is DAPO with a KL to the base and its zero-variance groups dropped (not refilled): one
    override switches the group, the KL and the filter stay (the recipe sets them)."""
    c = smollm2()
    assert (c.stages[0].algorithm, c.stages[0].clip_high) == ("dapo", 0.28)  # the config file shows the values
    assert cv.validate(c).stages[0].filter_zero_variance == "drop"  # the measured runs' setting, not dapo's refill
    launch.apply_overrides(c, [("stages[0].algorithm", "gspo")])
    st = cv.validate(c).stages[0]
    assert (st.loss.policy_loss, st.loss.clip_low, st.loss.clip_high, st.loss.agg, st.kl.kl_coef) == \
        ("gspo", 3e-4, 4e-4, "seq-mean-token-mean", 0.01)
    c = smollm2()
    launch.apply_overrides(c, [("stages[0].algorithm", "cispo")])
    st = cv.validate(c).stages[0]
    assert (st.loss.policy_loss, st.loss.clip_high, st.kl.kl_coef) == ("cispo", 0.2, 0.01)  # dapo's 0.28 went with dapo
    c = smollm2()
    launch.apply_overrides(c, [("stages[0].algorithm", "dr_grpo")])
    st = cv.validate(c).stages[0]
    assert (st.scale_by_std, st.loss.agg, st.loss.clip_high, st.filter_zero_variance) == \
        (False, "seq-mean-token-sum-norm", 0.2, "drop")
    assert config_warnings.warnings(cv.validate(c)) == []


@pytest.mark.parametrize("path,values", [("stages[0].kl_coef", ["0.0", "0.01", "0.04"]),
                                         ("stages[0].clip_high", ["0.2", "0.28"])])
def test_a_sweep_over_a_named_field_keeps_every_value(path, values):
    got = []
    for v in values:
        c = smollm2()
        launch.apply_overrides(c, [(path, v)])
        got.append(stages.flat_value(cv.validate(c).stages[0], path.split(".")[-1]))
    assert got == [float(v) for v in values]


def test_config_json_round_trips_and_old_runs_still_match():
    for name, (kind, _) in PAPERS.items():
        cfg = parse(stage(kind, algorithm=name, kl_coef=0.04 if kind == "grpo" else 0.05))
        again = stages.parse_stage(json.loads(json.dumps(cfg.to_dict())))
        assert again == cfg
    # a config.json written before names existed (no algorithm keys) compares equal to the named recipe's
    new = cv.validate(smollm2()).to_dict()
    old = json.loads(json.dumps(new))
    for st in old["stages"]:
        st.pop("algorithm"), st.pop("applied_algorithm")
    assert prefix.differing_fields(prefix.with_added_defaults(old, new), json.loads(json.dumps(new))) == []


def test_advantage_dr_grpo_points_to_the_name():
    c = qs_config()
    launch.apply_overrides(c, [("stages[2].advantage", "dr_grpo")])
    with pytest.raises(cv.ConfigError) as e:
        cv.validate(c)
    msg = str(e.value)
    assert "stages[2].advantage must be one of grpo|rloo|reinforce_pp, got 'dr_grpo'" in msg
    assert "set algorithm='dr_grpo' instead" in msg and "scale_by_std=False" in msg
    assert "agg='seq-mean-token-sum-norm'" in msg


def test_dry_run_prints_what_the_name_set_and_the_warnings(tmp_path, monkeypatch):
    """docs/training.md's dry run ("Algorithms by name") prints its documented lines; warnings never stop a run."""
    from tests.test_docs import blocks, check_output, commands, run_command

    monkeypatch.chdir(ROOT)
    marked = blocks(open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8").read())
    i = next(i for i, (_, _, code) in enumerate(marked) if "--config.stages[2].algorithm=dr_grpo" in code)
    (mode, _, code), (out_mode, _, expected) = marked[i], marked[i + 1]
    assert (mode, out_mode) == ("dry_run", "output")
    out = "".join(run_command(c, str(tmp_path), dry_run=True) for c in commands(code))  # asserts exit status 0
    check_output(expected, out, str(tmp_path))
    lines = out.splitlines()
    said = next(line for line in lines if line.startswith("stages[2]: algorithm dr_grpo"))
    assert "arXiv:2503.20783" in said and "scale_by_std=False" in said and "agg='seq-mean-token-sum-norm'" in said
    assert "stages[2]: the config overrides clip_high=0.001 (the name's 0.2), kl_coef=0.02 (the name's 0.0)" in lines
    assert any(line.startswith("warning: stages[2].clip_high=0.001 was chosen for policy_loss gspo") for line in lines)
    assert "config OK" in lines


def test_no_name_prints_nothing():
    cfg = cv.validate(qs_config())
    assert preflight.choices(cfg) == []


# -- warnings: each in its case, not otherwise ---------------------------------------------------------------
def warns(c, overrides=()):
    launch.apply_overrides(c, list(overrides))
    return config_warnings.warnings(cv.validate(c))


def test_clip_ranges_of_another_loss():
    w = warns(qs_config(), [("stages[2].policy_loss", "gspo"), ("stages[2].agg", "seq-mean-token-mean")])
    assert len(w) == 1 and w[0].startswith("stages[2].clip_low=0.2, clip_high=0.28 were chosen for a token-ratio loss")
    assert "algorithm='gspo'" in w[0]
    w = warns(qs_config(), [("stages[2].algorithm", "gspo")])  # quickstart's own clip_high=0.28 stays: warned
    assert len(w) == 1 and w[0].startswith("stages[2].clip_high=0.28 was chosen for a token-ratio loss")
    c = qs_config()
    c.stages[2] = stage("grpo", "grpo", iterations=2)
    assert warns(c, [("stages[2].algorithm", "gspo")]) == []
    w = warns(qs_config(), [("stages[2].clip_low", "0.0003"), ("stages[2].clip_high", "0.0004")])
    assert len(w) == 1 and "were chosen for policy_loss gspo" in w[0]
    w = warns(qs_config(), [("stages[2].algorithm", "cispo"), ("stages[2].clip_high", "0.0004")])
    assert len(w) == 1 and w[0].startswith("stages[2].clip_high=0.0004 was chosen for policy_loss gspo")
    assert warns(qs_config()) == []


def test_dr_grpo_half_set():
    w = warns(qs_config(), [("stages[2].scale_by_std", "false")])
    assert len(w) == 1 and w[0].startswith("stages[2].scale_by_std=False is Dr. GRPO's advantage, but agg='token-mean'")
    assert "algorithm='dr_grpo' sets both" in w[0]
    w = warns(qs_config(), [("stages[2].agg", "seq-mean-token-sum-norm")])
    assert len(w) == 1 and "chosen for scale_by_std=False" in w[0]
    assert warns(qs_config(), [("stages[2].algorithm", "dr_grpo")]) == []
    assert warns(qs_config(), [("stages[2].algorithm", "rloo")]) == []  # rloo has no std by itself


def test_learning_rate_of_lora_without_lora():
    w = warns(smollm2(), [("model.lora", "None")])
    assert len(w) == 1 and w[0].startswith("stages[0].lr=0.0002 was chosen for LoRA adapters (model.lora")
    assert "set lr=1e-05" in w[0]
    assert warns(smollm2()) == []
    assert warns(smollm2(":lora=0")) == []
    w = warns(smollm2(), [("stages[0].lr", "1e-5")])
    assert len(w) == 1 and "was chosen for full fine-tuning" in w[0]
    c = qs_config()  # a model from scratch: its lr is its own
    c.stages[2].lr = config_warnings.LORA_LR
    assert warns(c) == []


def test_tools_on_a_prompt_without_the_markers():
    w = warns(smollm2(), [("stages[0].tools.kind", "python")])
    assert len(w) == 1 and w[0].startswith("stages[0].tools.kind='python', but the prompt never shows the tool's call "
                                           "marker '<py>' (model.system_prompt, written for answers without the tool)")
    assert warns(launch.get_config("experiments/configs/smollm2_tools.py")) == []
    tool_arith = launch.get_config("experiments/configs/tool_arith.py")
    assert warns(tool_arith) == []  # its cold start teaches the markers
    tool_arith = launch.get_config("experiments/configs/tool_arith.py")
    tool_arith.stages = [st for st in tool_arith.stages if st.kind != "sft"]
    w = warns(tool_arith)
    assert len(w) == 1 and "(no model.system_prompt" in w[0]
