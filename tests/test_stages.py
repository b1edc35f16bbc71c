"""Stage kinds through their public pieces: GRPO advantages (mixed group sizes, step rewards, process supervision
crediting the answer, REINFORCE++ by name), rejection keep rules, the flat config keys over composed sections (one
owner per field, old config.json entries), and each config's tiny variant training for real."""
import ast
import json
import os

import numpy as np
import pytest

from experiments import launch
from models.tokenizer import ByteTokenizer
from rl import prefix, stages
from rl.advantages import step_scores
from rl.metrics import read_jsonl
from rl.stages.grpo import grpo_token_advantages
from rl.stages.rejection import keep_verified
from schema import FieldErrors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def grpo_cfg(**kw):
    return stages.parse_stage({**stages.defaults("grpo"), **kw})


def test_grpo_advantages_per_group_with_mixed_group_sizes():
    """Curriculum batches mix K per problem; each contiguous group is normalised on its own (float64 reference)."""
    rewards = np.array([1, 0, 1, 1, 0, 1, 1, 0], np.float64)
    mask = np.ones((8, 5), np.float32)
    adv, keep = grpo_token_advantages(grpo_cfg(), rewards, [2, 2, 4], mask)
    want = np.zeros(8)
    for s, k in ((0, 2), (2, 2), (4, 4)):
        g = rewards[s : s + k]
        if g.max() != g.min():
            want[s : s + k] = (g - g.mean()) / (g.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(adv[:, 0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv[:, 4], want, rtol=1e-5, atol=1e-6)  # sequence advantage on every token
    assert keep.tolist() == [True, True, False, False, True, True, True, True]  # the all-right group carries nothing


def test_process_grpo_credits_the_answer_line_and_eos():
    """Two answers with identical, correct steps differing only in the final answer: the answer step (scored by the
    verifier) must give the answer line and the EOS token opposite advantages."""
    tok = ByteTokenizer()
    texts = ["Step 1: 2+3=5\nAnswer: 5", "Step 1: 2+3=5\nAnswer: 6"]
    P = 4
    lengths = np.array([len(tok.encode(t, add_bos=False)) + 1 for t in texts])  # + EOS
    T = P + int(lengths.max()) + 2
    mask = np.zeros((2, T), np.float32)
    for r, n in enumerate(lengths):
        mask[r, P : P + n] = 1
    steps = step_scores(tok, texts, np.array([P, P]), lengths, final=[1.0, 0.0])
    sc, pos, msk = steps
    assert msk.sum(1).tolist() == [2, 2] and sc[:, 0].tolist() == [1.0, 1.0] and sc[:, 1].tolist() == [1.0, 0.0]
    adv, keep = grpo_token_advantages(grpo_cfg(process_grpo=True), np.array([1.0, 0.0]), [2], mask, steps)
    answer_start = P + len(tok.encode("Step 1: 2+3=5\n", add_bos=False))
    eos = P + lengths - 1
    assert adv[0, answer_start] > 0 > adv[1, answer_start]
    assert adv[0, eos[0]] > 0 > adv[1, eos[1]]
    assert keep.all()
    # without the answer step (the old behaviour) both rows had equal steps and zero advantage everywhere
    no_answer = step_scores(tok, texts, np.array([P, P]), lengths)
    adv0, _ = grpo_token_advantages(grpo_cfg(process_grpo=True), np.array([1.0, 0.0]), [2], mask, no_answer)
    assert np.all(adv0 == 0)


def test_rejection_keeps_verified_distinct_answers():
    texts = ["a  b", "a b", "c", "d", "e", "f"]
    idx = [0, 0, 0, 0, 1, 1]
    scores = [{"solved": 1, "format": 1.0}, {"solved": 1, "format": 1.0}, {"solved": 1, "format": 1.0},
              {"solved": 1, "format": 1.0}, {"solved": 0, "format": 1.0}, {"solved": 1, "format": 0.5}]
    assert keep_verified(texts, idx, scores, min_format=1.0, max_keep=2) == [0, 2]  # dedupe, cap, wrong, ill-formed


@pytest.mark.parametrize("name", [pytest.param("ppo_arith", marks=pytest.mark.slow), "grpo_arith",
                                  pytest.param("grpo_process", marks=pytest.mark.slow)])
def test_tiny_variant_trains_every_stage(name, tmp_path):
    """The tiny variants exist for tests: their RL stages must take real optimizer steps."""
    wd = tmp_path / name
    cfg = os.path.join(ROOT, "experiments/configs", name + ".py") + ":variant=tiny"
    assert launch.main(["--config", cfg, "--workdir", str(wd)]) == 0
    recs = [r for r in read_jsonl(wd / "metrics.jsonl") if r["phase"] == "train"]
    conf = json.loads((wd / "config.json").read_text())
    rl_name = next(s["name"] for s in conf["stages"] if s["kind"] in ("grpo", "ppo"))
    rl_recs = [r for r in recs if r["stage"] == rl_name]
    trained = [r for r in rl_recs if r.get("optimizer_steps")]
    assert trained and all(r["grad_norm"] > 0 for r in trained), rl_recs
    assert all(r["mismatch/logp_max_abs"] <= 1e-4 for r in rl_recs)
    if name == "ppo_arith":  # the KL is in the reward, and still reported as measured by the train step
        assert any(abs(r["kl/train"]) > 0 for r in trained), rl_recs
    if name == "grpo_arith":  # curriculum: no sample-ahead, the next pick sees this iteration's pass rates
        assert all(r["time/overlap_sample"] == 0 for r in rl_recs)


def test_stage_reward_terms_add_process_and_format_and_subtract_language():
    from rl.stages.iteration import stage_reward_terms

    scores = [{"process": 1.0, "format": 0.5, "language": 0.0}, {"process": 0.25, "format": 1.0, "language": 0.5}]
    off = grpo_cfg(name="g")
    np.testing.assert_array_equal(stage_reward_terms(off.rl, scores), [0.0, 0.0])
    on = grpo_cfg(name="g", process_weight=0.2, format_weight=0.1, language_weight=1.0)
    np.testing.assert_allclose(stage_reward_terms(on.rl, scores), [0.2 + 0.05, 0.05 + 0.1 - 0.5])


def test_stage_format_weight_does_not_add_an_instruction_rows_outcome_again():
    """An instruction row's `format` is its share of constraints met, already its outcome in the total: the stage's
    format_weight skips it, as reward.w_format does (rewards/task_score.py), and still weights the other families."""
    import json

    from rewards.combine import RewardConfig
    from rewards.task_score import score_task, target_of
    from rl.stages.iteration import stage_reward_terms

    check = json.dumps({"lang": "en", "constraints": [{"type": "max_chars", "k": 100}]})
    text = "Step 1: 2+2=4\nAnswer: 4"
    cfg = RewardConfig(lang="en", w_format=0.3)
    inst, math = score_task(text, target_of("instructions", "", check), cfg), score_task(text, "4", cfg)
    assert inst["family"] == "instructions" and inst["format"] == inst["outcome"] == 1.0
    assert inst["total"] == pytest.approx(1.0)  # w_format adds nothing to an instruction row
    assert math["family"] == "math" and math["format"] > 0
    on = grpo_cfg(name="g", format_weight=0.5)
    np.testing.assert_allclose(stage_reward_terms(on.rl, [inst, math]), [0.0, 0.5 * math["format"]])


def test_rl_fields_that_would_be_ignored_are_refused():
    """Nothing silently ignored: each of these names its field at validation."""
    from schema import FieldErrors

    for kind, kw, fld in (("ppo", dict(filter_zero_variance=True), "filter_zero_variance"),
                          ("grpo", dict(advantage="rloo"), "scale_by_std"),
                          ("grpo", dict(policy_loss="reinforce", dual_clip=3.0), "dual_clip")):
        with pytest.raises(FieldErrors, match=fld):
            stages.parse_stage({**stages.defaults(kind), **kw})
    stages.parse_stage({**stages.defaults("grpo"), "advantage": "rloo", "scale_by_std": False})  # RLOO itself is fine


def test_reinforce_pp_is_named_by_the_config():
    """advantage "reinforce_pp" (rl.advantages.ESTIMATORS) is reachable from a stage entry: every row's advantage is
    its reward whitened over the whole batch (no group baseline; float64 reference), broadcast to its tokens."""
    rewards = np.array([1.0, 0.0, 0.5, 0.5, 1.0, 0.0], np.float64)
    cfg = grpo_cfg(advantage="reinforce_pp", scale_by_std=False, filter_zero_variance=False)
    adv, keep = grpo_token_advantages(cfg, rewards, [2, 2, 2], np.ones((6, 3), np.float32))
    want = (rewards - rewards.mean()) / np.sqrt(rewards.var() + 1e-8)
    np.testing.assert_allclose(adv[:, 0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv[:, 2], want, rtol=1e-5, atol=1e-6)
    assert keep.all()
    with pytest.raises(FieldErrors, match="scale_by_std"):
        grpo_cfg(advantage="reinforce_pp")


def test_every_stage_field_has_one_owner():
    """Each flat key of each kind is one dataclass field (its default, doc and check in one place): flat reads go
    through to it, the dict round-trips, GRPO and PPO share the loss / KL / off-policy sections' fields (PPO's
    value-head and GAE fields are PPO's only), and clip_high is declared once in the whole of rl/ (rl/losses.py)."""
    for kind, cls in stages.CONFIGS.items():
        d = stages.defaults(kind)
        cfg = stages.parse_stage(d)
        assert cfg.to_dict() == d
        keys = [k for k, _, _ in stages.flat_fields(cls)]
        assert len(keys) == len(set(keys)) and set(keys) | {"kind", "curriculum", "tools"} >= set(d)
    grpo, ppo = stages.parse_stage(stages.defaults("grpo")), stages.parse_stage(stages.defaults("ppo"))
    assert stages.flat_value(grpo, "clip_high") == grpo.loss.clip_high == 0.2 and grpo.to_dict()["clip_high"] == 0.2
    assert ppo.kl.kl_place == "reward" and ppo.loss.kl_kind == "k1"
    assert not hasattr(grpo, "clip_high")  # a field is read in its section, never through the flat key
    for k in ("gamma", "lam", "value_coef", "value_clip"):
        assert k in stages.defaults("ppo") and k not in stages.defaults("grpo")
    for k in ("advantage", "scale_by_std", "filter_zero_variance", "process_grpo"):
        assert k in stages.defaults("grpo") and k not in stages.defaults("ppo")
    where = []
    paths = [p for p in os.listdir(os.path.join(ROOT, "rl")) if p.endswith(".py")]
    paths += [os.path.join("stages", p) for p in os.listdir(os.path.join(ROOT, "rl", "stages")) if p.endswith(".py")]
    for path in sorted(paths):
        tree = ast.parse(open(os.path.join(ROOT, "rl", path), encoding="utf-8").read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where += [(path, node.name) for a in node.body
                          if isinstance(a, ast.AnnAssign) and getattr(a.target, "id", None) == "clip_high"]
    assert where == [("losses.py", "LossConfig")]


def test_stage_entries_of_an_old_config_json_keep_their_meaning():
    """Stage entries as config.json stored them at 55d2267 (tests/data/stages_55d2267.json: every field of the old
    47-field RL config, GRPO entries with PPO's keys and PPO entries with GRPO's): each parses to the config of the
    same entry without the keys its kind no longer has (filter_zero_variance's true / false read as "drop" / "off"),
    and resuming such a run compares equal to today's config (rl.prefix.with_added_defaults drops them). A value the
    old code refused still is refused, naming the field."""
    with open(os.path.join(ROOT, "tests", "data", "stages_55d2267.json"), encoding="utf-8") as f:
        old = json.load(f)
    for name, entries in old.items():
        new = []
        for e in entries:
            legacy = stages.legacy_keys(e["kind"])
            cfg = stages.parse_stage(e)
            names = {"algorithm", "applied_algorithm"}
            added = {"tools", *names} if e["kind"] in ("grpo", "ppo") else set()  # added since, off by default
            added |= {"max_refill_rounds"} if e["kind"] == "grpo" else set()  # read only by filter "refill"
            assert {k: v for k, v in cfg.to_dict().items() if k not in added} == \
                stages.current_values(e["kind"], {k: v for k, v in e.items() if k not in legacy}), (name, e["kind"])
            assert not cfg.tools.on if "tools" in added else True
            assert e["kind"] != "grpo" or (cfg.refill_rounds == 0 and cfg.filter_zero_variance in ("off", "drop"))
            assert all(cfg.to_dict()[k] == "" for k in added & names)
            new.append(cfg.to_dict())
        assert prefix.with_added_defaults({"stages": entries}, {"stages": new})["stages"] == new
    ppo = next(e for e in old["ppo_arith"] if e["kind"] == "ppo")
    assert ppo["filter_zero_variance"] is False and "gamma" in next(e for e in old["grpo_arith"] if e["kind"] == "grpo")
    with pytest.raises(FieldErrors, match="filter_zero_variance"):
        stages.parse_stage({**ppo, "filter_zero_variance": True})


@pytest.mark.parametrize("kind, key, value", [("ppo", "scale_by_std", False), ("grpo", "gamma", 0.9),
                                              ("grpo", "value_clip", 0.0), ("ppo", "filter_zero_variance", True)])
def test_a_key_the_kind_never_read_is_refused_at_any_but_its_old_default(kind, key, value):
    """Old config.json entries keep loading (their legacy keys hold the old defaults), but a setting the kind would
    silently ignore (PPO never divided by a group std; GRPO has no value head) is refused, naming the field."""
    assert stages.parse_stage({"kind": kind, key: stages.legacy_keys(kind)[key]}).kind == kind
    with pytest.raises(ValueError, match=f"{key} is not a {kind} setting"):
        stages.parse_stage({"kind": kind, key: value})
