"""The process reward model wing (prm/): steps and labels, Math-Shepherd MC labels, token rows, the train step's
"prm" mode against a float64 NumPy reference, the optimizer loop, a tiny PRM that learns, checkpoints (orbax, and
the old .npz files), the trainer-side scorer (prm/reward.py) and its plug-in point (rl/reward_terms.py). Metric
functions are in tests/test_prm_metrics.py."""
import dataclasses
import importlib
import json
import os
import random
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import prm
from experiments import launch, train_prm
from experiments.configs.common import TINY_MODEL
from models import transformer
from models.config import ModelConfig
from models.tokenizer import ByteTokenizer
from prm import data as pd
from prm import metrics as pm
from prm import objective as prm_objective
from prm.calibration import evaluate, fit_calibrations, fit_threshold, scored_steps
from prm.checkpoint import FORMAT, convert, load, load_npz, save
from prm.config import PRMSection
from prm.model import PRM, encode, score_texts, step_logits, train_batch, utf8_safe
from prm.pipeline import deploy_source, reuse_checkpoint, store_calibrations
from prm.reward import PRMScorer, for_context, load_scorer
from prm.train import PRMConfig, step_fn, train
from rewards.combine import RewardConfig, score
from rewards.parse import step_spans
from rewards.steps import check_steps
from rl import config_validation as cv
from rl import compat, objectives, reward_terms, rollout, workdir_state
from rl.checkpoint import MANIFEST
from rl.context import cached
from rl.train_loop import optimizer_steps
from rl.advantages import step_scores
from rl.stages import parse_stage
from rl.stages.grpo import GRPOConfig
from rl.tasks import load_mix
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_loss_fn
from schema import FieldErrors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = ByteTokenizer()
TINY = ModelConfig(vocab_size=259, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64,
                   n_experts=0, moe_every=0, max_seq_len=96)


# ---- steps and labels -----------------------------------------------------------------------------------------------
def test_step_ends_read_step_lines_then_the_answer():
    text = "Step 1: 3+4=7\nStep 2: 7*2=15\nAnswer: 15"
    ends = pd.step_ends(text)
    assert [text[e - 3:e] for e in ends] == ["4=7", "=15", " 15"]
    assert pd.exact_labels(text, "15") == (1.0, 0.0, 1.0)  # 7*2=15 is wrong, the answer matches the gold
    assert pd.exact_labels(text, "14") == (1.0, 0.0, 0.0)
    zh = "步骤一：3+4=7\n答案：7"
    assert pd.step_ends(zh) == [9, 14] and pd.exact_labels(zh, "7") == (1.0, 1.0)
    assert pd.step_ends("Step 1: 2+2=4\nAnswer: 4  \n") == [13, 23]  # trailing space is not read
    assert pd.step_ends("Step 1: 1+1=2") == [13] and pd.exact_labels("Step 1: 1+1=2", "2") == (1.0,)
    assert pd.step_ends("Answer: 3\nStep 1: 1+2=3") == [23]  # an answer before the last step is not a step
    assert pd.step_ends("") == [] and pd.exact_labels("", "1") == ()
    assert pd.exact_labels("Step 1: we add\nAnswer: 5", "5") == (None, 1.0)  # nothing to check in step 1
    assert pd.first_error_index((1.0, None, 0.0, 1.0)) == 2 and pd.first_error_index((1.0, None)) == -1


@pytest.mark.parametrize("kind", pd.CORRUPTIONS)
def test_each_corruption_breaks_its_step(kind):
    steps = ("7+5=12", "2+3+1=6", "48+399=447")
    for seed in range(20):
        new, _, i = pd.corrupt_steps(steps, "447", kind, False, random.Random(seed))
        assert new[:i] == steps[:i] and new[i + 1:] == steps[i + 1:]
        assert check_steps("\n".join(f"Step {k + 1}: {s}" for k, s in enumerate(new)))[i] == 0.0


def test_propagation_carries_the_wrong_value_forward():
    steps, answer = ("Pens: 4*12=48 dollars", "Total: 48+399=447 dollars"), "447"
    for seed in range(10):
        new, new_answer, i = pd.corrupt_steps(steps, answer, "digit", True, random.Random(seed))
        old, wrong = steps[i].split("=")[1].split()[0], new[i].split("=")[1].split()[0]
        if i == 0:
            assert new[1].startswith(f"Total: {wrong}+399=")
        assert (old == answer) == (new_answer == wrong)


def test_gold_examples_are_labelled_exactly_and_deterministic():
    probs = load_mix("add:1.0,mul:1.0", 40, 0, "train", difficulty=2)
    ex = pd.gold_examples(probs, "en", seed=3, corrupt_prob=0.8)
    assert len(ex) == 40 and ex == pd.gold_examples(probs, "en", seed=3, corrupt_prob=0.8)
    assert ex != pd.gold_examples(probs, "en", seed=4, corrupt_prob=0.8)
    kinds = {e.kind for e in ex}
    assert "clean" in kinds and len(kinds & set(pd.CORRUPTIONS)) >= 2
    for e, p in zip(ex, probs):
        assert e.prompt.startswith("Question:") and e.labels == pd.exact_labels(e.solution, p.answer)
        assert len(e.labels) == len(pd.step_ends(e.solution)) == len(step_spans(e.solution)) + 1
        if e.kind == "clean":
            assert all(y == 1.0 for y in e.labels)
        else:
            assert 0.0 in e.labels


def test_mc_labels_hard_estimate_is_monotone_and_counts_rollouts():
    # gold 10: 3+4=7 then 7+3=10. A fake policy continues a prefix correctly iff the prefix so far is right
    # (it "recovers" from nothing), and writes a wrong answer otherwise.
    right = "Step 1: 3+4=7\nStep 2: 7+3=10\nAnswer: 10"
    late = "Step 1: 3+4=7\nStep 2: 7+3=11\nAnswer: 11"  # error in step 2
    early = "Step 1: 3+4=8\nStep 2: 8+3=11\nAnswer: 11"  # error in step 1
    bad_answer = "Step 1: 3+4=7\nStep 2: 7+3=10\nAnswer: 12"  # right steps, wrong answer
    calls = []

    def rollout(prefixes, n):
        calls.append(len(prefixes))
        out = []
        for pre in prefixes:
            sol = pre[len("Q\n"):]
            ok = all(y == 1.0 for y in check_steps(sol))
            rest = right[len(sol):] if ok and right.startswith(sol) else "\nAnswer: 99"
            out.append([rest] * n)
        return out

    res = pd.mc_labels(["Q\n"] * 4, [right, late, early, bad_answer], ["10"] * 4, rollout, n=3)
    assert res[0] == ((1.0, 1.0, 1.0), 0)  # correct: its own ending is the witness, no rollout
    assert res[1] == ((1.0, 0.0, 0.0), 6)  # step 2 fails (3 rollouts), step 1 succeeds (3 more)
    assert res[2] == ((0.0, 0.0, 0.0), 6)  # both steps fail; nothing earlier to try
    assert res[3] == ((1.0, 1.0, 0.0), 3)  # the last step succeeds at once: every earlier step is good
    assert calls == [3, 2]  # round 1: the last step of the three wrong ones; round 2: step 1 of two


# ---- rows, the train step's prm mode and a tiny PRM -----------------------------------------------------------------
def _gold(n=24, seed=0):
    return pd.gold_examples(load_mix("add:1.0", n, seed, "train", difficulty=2), "en", seed, corrupt_prob=0.8)


def test_encode_positions_point_at_the_last_byte_of_each_step():
    prompt, sol = "Question: 12+30\nSolution:\n", "步骤一：2+0=2\nStep 2: 1+3=4 \ud800\nAnswer: 42"
    labels = pd.exact_labels(sol, "42")
    assert labels == (1.0, None, 1.0)  # "1+3=4 ?" has no claim the checker can read
    enc = encode(TOK, [prompt], [sol], 96, [labels])
    ids = TOK.encode(utf8_safe(prompt + sol), add_bos=True)  # the lone surrogate reads as "?"
    for j, e in enumerate(pd.step_ends(sol)):
        prefix = (prompt + sol[:e]).encode("utf-8", errors="replace")
        assert enc.pos[0, j] == len(prefix) and enc.tokens[0, enc.pos[0, j]] == ids[len(prefix)] == prefix[-1] + 3
    assert enc.mask[0].tolist() == [1, 1, 1] and enc.label_mask[0].tolist() == [1, 0, 1]
    short = encode(TOK, [prompt], [sol], int(enc.pos[0, 2]), [labels])  # the answer step is cut off
    assert short.mask[0].tolist() == [1, 1] and short.label_mask[0].tolist() == [1, 0]
    assert enc.prev[0].tolist() == [len(prompt.encode()), *enc.pos[0, :2]]  # the prompt's last token (BOS + bytes)
    b = train_batch(enc, [0], likelihood=True)
    assert b["loss_mask"].sum() == 2 and b["loss_mask"][0, enc.pos[0]].tolist() == [1, 0, 1]
    assert b["step_labels"][0, enc.pos[0]].tolist() == [1.0, 0.0, 1.0]
    prev = b["step_prev"][0]
    assert prev[enc.pos[0]].tolist() == enc.prev[0].tolist()
    off = np.setdiff1d(np.arange(96), enc.pos[0])
    assert (prev[off] == off).all()  # elsewhere an empty span
    assert "step_prev" not in train_batch(enc, [0])


# The tiny PRM starts from random weights, whose LM likelihood is uninformative (about -5.5 nats a token): no
# likelihood term (the loss test covers it).
TRAIN_CFG = PRMConfig(steps=40, batch_size=16, lr=1e-2, warmup_steps=2, likelihood=False, sources="mix")


def _prm_step():
    """The step prm.train.train uses for TRAIN_CFG (cached: the tests share its compiles)."""
    return step_fn(TINY, LossConfig(mode="prm"), OptimConfig(weight_decay=0.0, grad_clip=1.0))


def _log_softmax64(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def test_prm_mode_loss_matches_a_float64_reference():
    ex = _gold(16)
    enc = encode(TOK, [e.prompt for e in ex], [e.solution for e in ex], 96, [e.labels for e in ex])
    params = transformer.init(TINY, jax.random.key(0))
    params["value_head"] = {"w": jax.random.normal(jax.random.key(1), (32,)) * 0.3, "b": jnp.float32(0.2)}
    batch = train_batch(enc, np.arange(len(ex)), likelihood=True)
    # reference: head on the hidden state + the step's log-likelihood, summed over (prev, end] in float64
    logits, aux = transformer.forward(params, batch["tokens"], TINY, attn_mask=batch["attn_mask"], return_hidden=True)
    h = np.asarray(aux["hidden"], np.float64)
    head = h @ np.asarray(params["value_head"]["w"], np.float64) + float(params["value_head"]["b"])
    lp = np.take_along_axis(_log_softmax64(logits)[:, :-1], np.asarray(batch["tokens"])[:, 1:, None], -1)[..., 0]
    lp = np.pad(lp, ((0, 0), (1, 0))) * batch["attn_mask"]
    m, y = batch["loss_mask"] > 0, batch["step_labels"].astype(np.float64)
    z = head.copy()
    for r, t in zip(*np.nonzero(m)):
        z[r, t] += lp[r, batch["step_prev"][r, t] + 1:t + 1].sum()
    ref = np.mean(np.log1p(np.exp(-np.abs(z[m]))) + np.maximum(z[m], 0) - y[m] * z[m])  # BCE, float64
    cfg = (LossConfig(mode="prm"), OptimConfig(weight_decay=0.0, grad_clip=1.0))
    state = init_train_state(TINY, *cfg, jax.random.key(0), params=jax.tree.map(jnp.array, params))
    assert set(state["params"]["value_head"]) == {"w", "b"}
    step = _prm_step()
    _, met = step(state, {k: jnp.asarray(v) for k, v in batch.items()}, {"lr": jnp.float32(0.0)})
    assert float(met["loss/prm"]) == pytest.approx(ref, rel=1e-5)
    assert float(met["prm/accuracy"]) == pytest.approx(np.mean((z[m] > 0) == (y[m] > 0.5)), abs=1e-6)
    assert int(met["skipped"]) == 0
    # scoring reads the same logits at the same positions, with and without the likelihood term
    sl = step_logits(params, TINY, enc, rows=16, likelihood=True)
    np.testing.assert_allclose(sl[enc.mask > 0], np.take_along_axis(z, enc.pos, 1)[enc.mask > 0], atol=1e-4)
    sl0 = step_logits(params, TINY, enc, rows=16)
    np.testing.assert_allclose(sl0[enc.mask > 0], np.take_along_axis(head, enc.pos, 1)[enc.mask > 0], atol=1e-4)
    # a non-finite label at a counted position skips the step; one at a masked position is ignored
    for where, skipped in ((batch["loss_mask"] > 0, 1), (batch["loss_mask"] == 0, 0)):
        bad = dict(batch, step_labels=np.where(where, np.nan, batch["step_labels"]).astype(np.float32))
        state = init_train_state(TINY, *cfg, jax.random.key(0), params=jax.tree.map(jnp.array, params))
        _, met = step(state, {k: jnp.asarray(v) for k, v in bad.items()}, {"lr": jnp.float32(1e-3)})
        assert int(met["skipped"]) == skipped


@pytest.fixture(scope="module")
def tiny_prm():
    ex = _gold(16)
    enc = encode(TOK, [e.prompt for e in ex], [e.solution for e in ex], 96, [e.labels for e in ex])
    params, log = train(enc, TINY, TRAIN_CFG, transformer.init(TINY, jax.random.key(0)), seed=0)
    return ex, enc, params, log


def test_tiny_prm_fits_its_training_steps(tiny_prm):
    """The train step, the head and the label placement work together: a small model memorises 16 solutions."""
    ex, enc, params, log = tiny_prm
    z, y = scored_steps(step_logits(params, TINY, enc, rows=16), enc, upto_first_error=False)
    assert 0.0 in y and 1.0 in y and log["skipped"] == 0 and len(log["loss"]) == 40
    assert pm.nll(z, y) < 0.6 * pm.nll(np.zeros_like(z), y)
    assert pm.auroc(z, y) > 0.9
    assert np.mean(log["loss"][-5:]) < np.mean(log["loss"][:5])
    again, _ = train(enc, TINY, TRAIN_CFG, transformer.init(TINY, jax.random.key(0)), seed=0)  # deterministic
    np.testing.assert_array_equal(step_logits(again, TINY, enc, rows=16), step_logits(params, TINY, enc, rows=16))


def test_calibrate_evaluate_save_load(tiny_prm, tmp_path):
    ex, enc, params, _ = tiny_prm
    z = step_logits(params, TINY, enc, rows=16, likelihood=True)
    calibs = fit_calibrations(*scored_steps(z, enc))
    assert set(calibs) == {"none", "temperature", "platt"}
    t = fit_threshold(z, enc, calibs["platt"])
    res = evaluate(z, enc, calibs, t)
    for key in ("auroc", "ece/none", "ece/temperature", "ece/platt", "first_error/f1", "first_error/acc_error"):
        assert np.isfinite(res[key])
    prm = PRM(TINY, params, calibs["platt"], t, "min", {"note": "test"}, likelihood=True, calibs=calibs)
    path = tmp_path / "prm"
    save(prm, path)
    back = load(path)
    assert back.model_cfg == TINY and back.calib == prm.calib and back.threshold == t and back.meta == prm.meta
    assert back.likelihood and back.calibs == calibs and back.agg == "min"
    _assert_same_tree(back.params, params)
    texts = [e.solution for e in ex[:3]]
    prompts = [e.prompt for e in ex[:3]]
    assert score_texts(back, TOK, prompts, texts) == score_texts(prm, TOK, prompts, texts)
    assert [len(r) for r in score_texts(prm, TOK, prompts, texts)] == [len(pd.step_ends(s)) for s in texts]
    # a step's score depends only on its prefix (causal model, read at the step's last token)
    a, b = score_texts(prm, TOK, ["Q\n", "Q\n"], ["Step 1: 3+4=7\nStep 2: 7*2=14", "Step 1: 3+4=7\nStep 2: 7*2=99"])
    assert a[0] == pytest.approx(b[0], abs=1e-6)
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="not a PRM file"):
        load(tmp_path / "other.npz")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="not a PRM checkpoint"):
        load(tmp_path / "folder")
    with pytest.raises(OSError, match="no PRM checkpoint"):
        load(tmp_path / "missing")


def _assert_same_tree(a, b):
    """Same nested dict structure, dtypes and bits."""
    fa, ta = jax.tree.flatten(a)
    fb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(fa, fb):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save_npz(prm, path, with_calibs: bool = True):
    """A PRM file in the old format (mathrl-prm-v2, written by the code before the orbax checkpoints): arrays under
    "params/a/b", JSON metadata under "__meta__"; files from before PRM.calibs have no "calibs"."""
    meta = {"format": "mathrl-prm-v2", "model_cfg": prm.model_cfg.to_dict(), "calib": prm.calib,
            "threshold": prm.threshold, "agg": prm.agg, "meta": prm.meta, "likelihood": prm.likelihood}
    if with_calibs:
        meta["calibs"] = prm.calibs
    flat = {}

    def walk(tree, prefix):
        for k, v in tree.items():
            walk(v, f"{prefix}{k}/") if isinstance(v, dict) else flat.__setitem__(f"params/{prefix}{k}", np.asarray(v))

    walk(prm.params, "")
    with open(path, "wb") as fh:
        np.savez(fh, __meta__=np.array(json.dumps(meta)), **flat)


def test_checkpoints_keep_dtypes_and_old_npz_files_load_for_one_release(tmp_path):
    """An orbax checkpoint restores every leaf with its own dtype and bits (a bfloat16 tree too); an old .npz file
    loads (with a FutureWarning) into the same PRM and converts once into a checkpoint; a damaged checkpoint is a
    ValueError naming it."""
    params = {**transformer.init(TINY, jax.random.key(5)),
              "value_head": {"w": jnp.linspace(-1.0, 1.0, TINY.d_model), "b": jnp.float32(0.25)}}
    prm = PRM(TINY, params, CALIBS["platt"], 0.4, "mean", {"source": "mix", "seed": 2}, likelihood=True,
              calibs=CALIBS)
    half = {**params, "embed": params["embed"].astype(jnp.bfloat16)}  # (the old .npz format could not hold it)
    save(PRM(TINY, half, CALIBS["platt"], 0.4, "mean", {"source": "mix", "seed": 2}, True, CALIBS), tmp_path / "ck")
    back = load(tmp_path / "ck")
    _assert_same_tree(back.params, half)
    assert back.params["embed"].dtype == jnp.bfloat16
    assert (back.calib, back.calibs, back.threshold, back.agg, back.meta) == (prm.calib, CALIBS, 0.4, "mean", prm.meta)
    with open(tmp_path / "ck" / "last" / "0" / "meta" / "metadata", encoding="utf-8") as f:
        assert json.load(f)["format"] == FORMAT
    old = tmp_path / "prm.npz"
    _save_npz(prm, old)
    with pytest.warns(FutureWarning, match="convert"):
        from_npz = load(old)
    _assert_same_tree(from_npz.params, params)
    assert (from_npz.calib, from_npz.calibs, from_npz.threshold, from_npz.agg) == (prm.calib, CALIBS, 0.4, "mean")
    convert(old, tmp_path / "converted")
    _assert_same_tree(load(tmp_path / "converted").params, load_npz(old).params)
    save(prm, tmp_path / "damaged")
    leaf = next(p for p in sorted((tmp_path / "damaged").rglob("*")) if p.is_file() and p.stat().st_size > 64
                and p.name != "checksums.json")
    leaf.write_bytes(leaf.read_bytes()[:-8])
    with pytest.raises(ValueError, match=str(tmp_path / "damaged")):
        load(tmp_path / "damaged")


def test_prm_config_errors_name_the_field():
    for fld, value in (("steps", -1), ("lr", 0.0), ("sources", "corrupted,gold"), ("agg", "max"), ("init", "hf"),
                       ("best_of_n", ())):
        with pytest.raises(FieldErrors, match=fld):
            PRMConfig(**{fld: value})
    with pytest.raises(FieldErrors, match="deploy"):
        PRMConfig(sources="mc", deploy="mix")


# ---- the trainer side (prm/reward.py) -------------------------------------------------------------------------------
def test_scorer_rows_match_the_trainers_step_positions(tiny_prm):
    _, _, params, _ = tiny_prm
    prm = PRM(TINY, params, {"kind": "platt", "a": 0.5, "b": 0.1}, 0.5, "min", likelihood=True)
    texts = ["Step 1: 1+2=3\nStep 2: 3*3=10\nAnswer: 10", "Step 1: 2+2=4\nAnswer: 4", "no steps"]
    prompts = ["Question: 1+2\nSolution:\n"] * 3
    ids = [TOK.encode(t, add_bos=False) + [TOK.EOS] for t in texts]
    smp = rollout.Samples(prompt_index=np.zeros(3, np.int64), tokens=np.array([x + [0] * (64 - len(x)) for x in ids]),
                          logprobs=np.zeros((3, 64), np.float32), lengths=np.array([len(x) for x in ids], np.int32),
                          texts=texts, group_sizes=np.array([3]))
    b = rollout.build_batch([TOK.encode(prompts[0], add_bos=True)], smp, 96, pad_id=TOK.PAD)
    sc = PRMScorer(prm, TOK, w=0.2, agg="min", steps=True, rows=4)
    out = sc.score_rows(b["tokens"], b["attn_mask"], texts, b["resp_start"])
    assert out["mask"].sum(1).tolist() == [3, 2, 0] and out["answer"].tolist() == [True, True, False]
    ref = score_texts(prm, TOK, prompts, texts)
    for r in range(3):
        np.testing.assert_allclose(out["probs"][r][out["mask"][r] > 0], ref[r], atol=1e-5)
    np.testing.assert_allclose(out["score"][:2], [min(ref[0]), min(ref[1])], atol=1e-6)
    assert out["score"][2] == 0.0  # no steps: the default
    # step lines only, at the positions the checker-based step_scores uses; the answer is the outcome's
    s_prm, p_prm, m_prm = sc.step_scores(out)
    s_chk, p_chk, m_chk = step_scores(TOK, texts, b["resp_start"], smp.lengths)
    np.testing.assert_array_equal(p_prm * m_prm, p_chk * m_chk)
    np.testing.assert_array_equal(m_prm, m_chk)
    np.testing.assert_allclose(s_prm[0, :2], ref[0][:2], atol=1e-5)
    final = np.array([1.0, 0.0, 0.5])
    s_f, p_f, m_f = sc.step_scores(out, final, smp.lengths, b["resp_start"])
    _, p_cf, m_cf = step_scores(TOK, texts, b["resp_start"], smp.lengths, final)
    np.testing.assert_array_equal(p_f * m_f, p_cf * m_cf)
    assert s_f[2, 0] == 0.5 and s_f[0, 2] == 1.0
    rewards, m = sc.add_reward(np.ones(3), out, ["math", "code", "math"])
    np.testing.assert_allclose(rewards, [1 + 0.2 * out["score"][0], 1.0, 1.0])
    assert m["prm/seconds_per_solution"] >= 0 and "prm/score" in m
    rr = sc.rerank(b, texts, [False, True, False], k=3)
    assert rr["prm@k"] == float([False, True, False][int(np.argmax(out["score"]))])


def test_prm_section_fields_are_checked():
    """prm/config.py: agg among prm.metrics' aggregates, a weight in range, and a weight or step scores without a
    path refused, naming the prm.* fields; the reward section no longer has the PRM's fields (the plain-Python score
    never had a PRM term)."""
    with pytest.raises(FieldErrors, match="path must name a PRM file when prm.weight > 0 or prm.steps is on"):
        PRMSection(weight=0.2)
    with pytest.raises(FieldErrors, match="path must name a PRM file"):
        PRMSection(steps=True)
    with pytest.raises(FieldErrors, match=r"agg must be one of min\|mean\|prod\|last, got 'max'"):
        PRMSection(path="x", agg="max")
    with pytest.raises(FieldErrors, match="weight must be >= 0.0"):
        PRMSection(path="x", weight=-1.0)
    assert PRMSection(path="x", weight=0.2, agg="last", steps=True).to_dict() == {
        "path": "x", "weight": 0.2, "agg": "last", "steps": True}
    assert set(pm.AGGREGATES) == {"min", "mean", "prod", "last"}
    assert not {"prm_path", "w_prm", "prm_agg", "prm_steps"} & {f.name for f in dataclasses.fields(RewardConfig)}
    c = cv.default_config()
    c.stages = [cv.stage("sft", "cold_start")]
    c.prm.weight = 0.2
    with pytest.raises(cv.ConfigError, match="prm.path must name a PRM file"):
        cv.validate(c)
    c.prm.path = "runs/prm/prm"
    assert cv.validate(c).prm == PRMSection(path="runs/prm/prm", weight=0.2)
    assert score("Step 1: 1+1=2\nAnswer: 2", "2", RewardConfig()) == score("Step 1: 1+1=2\nAnswer: 2", "2")


def test_the_prm_section_is_the_wings_registered_one(monkeypatch, capsys):
    """rl/config_validation.py knows the slot "prm", never the class: prm.install() registers PRMSection; without
    it a config with a prm section fails naming the field and the call, and default_config() / describe() have no
    prm; with it a config without one takes the defaults, and the launcher's --help_config lists prm.*."""
    monkeypatch.setattr(cv, "_REGISTERED", {})
    assert cv.validate(_runnable()).prm is None and "prm" not in cv.default_config()
    assert not [ln for ln in cv.describe().splitlines() if ln.startswith("prm.")]
    with pytest.raises(cv.ConfigError, match=r"prm is the section of a wing that is not installed: call prm\.install"):
        cv.validate({**_runnable(), "prm": {"path": "x"}})
    with pytest.raises(ValueError, match="no slot"):
        cv.register_section("value_model", PRMSection)
    prm.install()
    assert cv.sections()["prm"] is PRMSection and cv.default_config().prm.to_dict() == PRMSection().to_dict()
    cfg = cv.validate(_runnable())
    assert cfg.prm == PRMSection() and cfg.to_dict()["prm"] == PRMSection().to_dict()  # config.json's "prm"
    assert cv.validate(cfg.to_dict()) == cfg
    assert cv.section_defaults(cv.default_config(), ["prm"]) == PRMSection().to_dict()
    assert launch.main(["--help_config"]) == 0
    out = capsys.readouterr().out
    for f in ("path", "weight", "agg", "steps"):
        assert f"prm.{f} = " in out
    assert "reward.prm_path" not in out and "reward.w_prm" not in out


def test_the_reward_sections_old_prm_fields_are_read_as_the_prm_section(capsys):
    """An old config (or config.json) with reward.prm_path / w_prm / prm_agg / prm_steps validates with them moved
    to prm.path / weight / agg / steps and a deprecation note per field (rl/compat.py, prm_reward_fields); a field
    also set under its new name stays and is refused under its old one."""
    old = _runnable()
    old["reward"].update(prm_path="runs/prm/seed{seed}/prm", w_prm=0.2, prm_agg="mean", prm_steps=True)
    cfg = cv.validate(old)
    assert cfg.prm == PRMSection(path="runs/prm/seed{seed}/prm", weight=0.2, agg="mean", steps=True)
    err = capsys.readouterr().err
    for o, n in (("prm_path", "path"), ("w_prm", "weight"), ("prm_agg", "agg"), ("prm_steps", "steps")):
        assert f"config: reward.{o} is deprecated, read as prm.{n}" in err
    assert "prm_reward_fields" in compat.SHIMS and "prm_reward_fields" in err
    assert cv.upgrade(old, quiet=True)["prm"]["weight"] == 0.2 and old["reward"]["w_prm"] == 0.2  # a copy
    with pytest.raises(cv.ConfigError, match="reward.w_prm is not a known field"):
        cv.validate({**old, "prm": {"weight": 0.1}})


def test_an_old_run_directory_with_the_reward_sections_prm_fields_resumes(tmp_path):
    """rl/workdir_state.py reads a stored config.json from before the prm section (reward.prm_path and the rest,
    at their defaults or set) as validate() does: the run resumes under today's config with the same values, and
    a different PRM weight is still a conflict naming prm.weight."""
    for stored in (dict(prm_path="", w_prm=0.0, prm_agg="min", prm_steps=False),
                   dict(prm_path="runs/prm/prm", w_prm=0.2, prm_agg="min", prm_steps=True)):
        new = _runnable()
        new["prm"] = {"path": stored["prm_path"], "weight": stored["w_prm"], "steps": stored["prm_steps"]}
        cfg = cv.validate(new)
        old = cfg.to_dict()
        del old["prm"]
        old["reward"] = {**old["reward"], **stored}
        wd = tmp_path / f"run{stored['w_prm']}"
        (wd / "checkpoints" / "last" / "3").mkdir(parents=True)
        (wd / "checkpoints" / "last" / "3" / MANIFEST).write_text("{}")  # a written checkpoint pins the config
        (wd / "config.json").write_text(json.dumps(old))
        state, why = workdir_state.workdir_state(str(wd), cfg, may_differ=workdir_state.RESUMABLE)
        assert state == "resume", why
        workdir_state.check_resume(str(wd), cfg)
        other = cfg.replace(prm=cfg.prm.replace(weight=0.3, path="x"))
        state, why = workdir_state.workdir_state(str(wd), other, may_differ=workdir_state.RESUMABLE)
        assert state == "conflict" and "prm.weight" in why, why


def _runnable() -> dict:
    """A minimal runnable config as plain dicts (one SFT stage; no prm section)."""
    c = cv.to_dict(cv.default_config())
    c.pop("prm", None)
    c["stages"] = [cv.to_dict(cv.stage("sft", "cold_start"))]
    return c


# ---- the calibration chosen at use time (PRM.calibs, stages[i].prm_calibration) -------------------------------------
CALIBS = {"none": {"kind": "none"}, "temperature": {"kind": "temperature", "a": 0.5, "b": 0.0, "T": 2.0},
          "platt": {"kind": "platt", "a": 2.0, "b": -1.0}}
HAND = {"": (2.0, -1.0), "none": (1.0, 0.0), "temperature": (0.5, 0.0), "platt": (2.0, -1.0)}  # (a, b); "" = own


class _Ctx:
    """What prm.reward.for_context and rl.reward_terms read of a run context: the typed config (its prm section
    from the fields given), the tokenizer and the process cache."""

    def __init__(self, prm_section: dict, seed: int):
        self.cfg, self.tok, self.cached = cv.typed({"seed": seed, "prm": prm_section}), TOK, cached


def _tiny_head_prm(tmp_path, name: str):
    params = {**transformer.init(TINY, jax.random.key(3)),
              "value_head": {"w": jnp.linspace(-0.5, 0.5, TINY.d_model), "b": jnp.float32(0.2)}}
    path = tmp_path / name / "prm"
    path.parent.mkdir(parents=True)
    save(PRM(TINY, params, CALIBS["platt"], 0.5, "min", calibs=CALIBS), path)
    return params, path


def test_stage_calibration_choice_matches_hand_computed_maps(tmp_path):
    """Each choice of stages[i].prm_calibration scores the trainer's rows with sigmoid(a z + b) of the same raw step
    logits z: none (1, 0), temperature T = 2 (0.5, 0), platt (2, -1), "" the file's own (Platt); the stage's
    prm_weight adds to prm.weight; "{seed}" in the path picks the seed's file."""
    params, _ = _tiny_head_prm(tmp_path, "seed7")
    texts = ["Step 1: 1+2=3\nStep 2: 3*3=10\nAnswer: 10", "Step 1: 2+2=4\nAnswer: 4"]
    prompts = ["Question: 1+2\nSolution:\n"] * 2
    z = step_logits(params, TINY, encode(TOK, prompts, texts, 96))  # raw logits (the scorer's compiled shape)
    zs = [np.asarray(z[r][: len(pd.step_ends(t))], np.float64) for r, t in enumerate(texts)]
    ids = [TOK.encode(t, add_bos=False) + [TOK.EOS] for t in texts]
    smp = rollout.Samples(prompt_index=np.zeros(2, np.int64), tokens=np.array([x + [0] * (64 - len(x)) for x in ids]),
                          logprobs=np.zeros((2, 64), np.float32), lengths=np.array([len(x) for x in ids], np.int32),
                          texts=texts, group_sizes=np.array([2]))
    b = rollout.build_batch([TOK.encode(prompts[0], add_bos=True)], smp, 96, pad_id=TOK.PAD)
    section = {"path": str(tmp_path / "seed{seed}" / "prm"), "weight": 0.1, "agg": "min", "steps": True}
    seen = {}
    for name, (a, bias) in HAND.items():
        stage = parse_stage({"kind": "grpo", "prm_weight": 0.3, "prm_calibration": name})
        sc = for_context(_Ctx(section, seed=7), stage, "stages[1]")
        assert sc.w == pytest.approx(0.4) and sc.prm.calib == (CALIBS[name] if name else CALIBS["platt"])
        out = sc.score_rows(b["tokens"], b["attn_mask"], texts, b["resp_start"])
        for r in range(2):
            want = 1.0 / (1.0 + np.exp(-(a * zs[r] + bias)))
            np.testing.assert_allclose(out["probs"][r][out["mask"][r] > 0], want, rtol=1e-5, atol=1e-6)
        new, _ = sc.add_reward(np.ones(2), out, ["math", "math"])
        np.testing.assert_allclose(new, 1.0 + 0.4 * np.array([min(1.0 / (1.0 + np.exp(-(a * x + bias)))) for x in zs]),
                                   rtol=1e-5)
        seen[name] = out["probs"]
    assert not np.allclose(seen["none"], seen["temperature"]) and not np.allclose(seen["none"], seen["platt"])
    np.testing.assert_array_equal(seen[""], seen["platt"])


def test_older_prm_files_load_and_get_their_maps(tmp_path):
    """An old .npz file written before PRM.calibs existed still loads (its own map and none); asking it for another
    names the field; once converted into a checkpoint, prm.pipeline.store_calibrations adds the fitted maps once."""
    params, _ = _tiny_head_prm(tmp_path, "new")
    path = tmp_path / "old.npz"
    _save_npz(PRM(TINY, params, CALIBS["platt"], 0.5, "min"), path, with_calibs=False)
    with pytest.warns(FutureWarning):
        old = load(path)
    assert old.calibs == {} and set(old.stored_calibrations()) == {"none", "platt"}
    assert old.calibrated("none").calib == {"kind": "none"} and old.calibrated("") is old
    with pytest.raises(ValueError, match="temperature"):
        old.calibrated("temperature")
    section = {"path": str(path), "weight": 0.0, "agg": "min", "steps": False}
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=r"stages\[1\]\.prm_calibration 'temperature'"):
        for_context(_Ctx(section, seed=0), parse_stage({"kind": "grpo", "prm_calibration": "temperature"}), "stages[1]")
    ck = tmp_path / "converted"
    convert(path, ck)
    assert store_calibrations(str(ck), CALIBS) and not store_calibrations(str(ck), CALIBS)
    back = load(ck)
    assert back.calibs == CALIBS and back.calibrated("temperature").calib == CALIBS["temperature"]
    assert back.calib == old.calib and back.threshold == old.threshold and back.meta == old.meta


def test_a_workdir_from_before_the_orbax_format_is_converted_once(tmp_path):
    """A rerun of the pipeline reuses an already measured source: its old prms/SOURCE.npz becomes the checkpoint
    prms/SOURCE once, with the maps results.json kept; nothing there means the source is trained again."""
    params, _ = _tiny_head_prm(tmp_path, "src")
    prm_dir = tmp_path / "prms"
    prm_dir.mkdir()
    _save_npz(PRM(TINY, params, CALIBS["platt"], 0.5, "min"), prm_dir / "mix.npz", with_calibs=False)
    assert reuse_checkpoint(str(prm_dir), "mix", CALIBS)
    back = load(prm_dir / "mix")
    assert back.calibs == CALIBS
    _assert_same_tree(back.params, params)
    assert reuse_checkpoint(str(prm_dir), "mix", CALIBS)  # now the checkpoint itself
    assert not reuse_checkpoint(str(prm_dir), "mc", CALIBS)


def test_stage_prm_fields_are_checked():
    spec = os.path.join(ROOT, "experiments/configs/claim_prm_calibration.py") + ":variant=tiny"
    c = launch.get_config(spec)
    cv.validate(c)
    assert "{seed}" in c.prm.path and c.stages[1].prm_calibration == "platt"
    c.stages[1].prm_calibration = "hot"
    with pytest.raises(cv.ConfigError, match=r"stages\[1\]\.prm_calibration must be one of"):
        cv.validate(c)
    c = launch.get_config(spec)
    c.prm.update(dict(path="", steps=False))
    with pytest.raises(cv.ConfigError, match=r"stages\[1\]\.prm_weight needs prm.path"):
        cv.validate(c)
    c.stages[1].prm_weight = 0.0
    with pytest.raises(cv.ConfigError, match=r"stages\[1\]\.prm_calibration needs prm.path"):
        cv.validate(c)
    # evaluation without samples never reads the PRM file (a cold start runs before the file exists)
    missing = {"path": "does/not/exist", "weight": 0.0, "agg": "min", "steps": False}
    assert reward_terms.eval_metrics(_Ctx(missing, seed=0), [], None, None, 0) == {}


def test_the_prm_reaches_the_stages_through_its_registered_term(tmp_path, monkeypatch):
    """rl/reward_terms.py: prm.install() (tests/conftest.py, as every entry point) fills the "prm" slot; without a
    PRM path nothing is asked of it; with a path and no registered term the run fails naming the field, never running
    without its PRM."""
    assert "prm" in reward_terms.registered()
    params, path = _tiny_head_prm(tmp_path, "slot")
    section = {"path": str(path), "weight": 0.2, "agg": "min", "steps": True}
    sc = reward_terms.scorer(_Ctx(section, seed=0), parse_stage({"kind": "grpo", "prm_weight": 0.1}), "stages[1]")
    assert sc.w == pytest.approx(0.3) and sc.steps and sc.prm.calib == CALIBS["platt"]
    _assert_same_tree(sc.prm.params, params)
    off = {"path": "", "weight": 0.0, "agg": "min", "steps": False}
    assert reward_terms.scorer(_Ctx(off, seed=0), GRPOConfig(), "stages[1]") is None
    monkeypatch.setattr(reward_terms, "_TERMS", {})
    assert reward_terms.scorer(_Ctx(off, seed=0), GRPOConfig(), "stages[1]") is None
    with pytest.raises(ValueError, match="prm.path is set, but no 'prm' reward term is registered"):
        reward_terms.scorer(_Ctx(section, seed=0), GRPOConfig(), "stages[1]")
    with pytest.raises(ValueError, match=r"prm\.install\(\)"):
        reward_terms.eval_metrics(_Ctx(section, seed=0), ["q"], object(), [{}], 2)
    with pytest.raises(ValueError, match="no slot"):
        reward_terms.register("value_model", scorer=lambda *a: None, eval_rerank=lambda *a: {})


def test_the_prm_objective_is_the_wings_and_fills_its_slot_on_install(monkeypatch):
    """rl/objectives.py: prm.install() fills the "prm" slot with prm/objective.py's objective (value head, flat layout
    only); without it a "prm" train step fails naming the call; a slot outside LossConfig.mode's names is refused."""
    assert objectives.get("prm") is prm_objective.OBJECTIVE and prm_objective.OBJECTIVE.value_head
    monkeypatch.setattr(objectives, "_OBJECTIVES", {k: v for k, v in objectives._OBJECTIVES.items() if k != "prm"})
    assert objectives.registered() == ["grpo", "ppo", "sft"]
    for build in (lambda: make_loss_fn(TINY, LossConfig(mode="prm"), None, None),
                  lambda: init_train_state(TINY, LossConfig(mode="prm"), OptimConfig(), jax.random.key(0))):
        with pytest.raises(ValueError, match=r"LossConfig.mode 'prm' has no registered objective.*prm\.install\(\)"):
            build()
    prm.install()
    assert objectives.get("prm") is prm_objective.OBJECTIVE and "prm" in reward_terms.registered()
    with pytest.raises(ValueError, match="no slot"):
        objectives.register("dpo", objectives.Objective(lambda f: (0.0, {})))


@pytest.mark.parametrize("entry", ["launch", "sweep", "eval", "sample", "train_prm"])
def test_every_entry_point_installs_the_wing_first(entry, monkeypatch, capsys):
    """The launcher, sweeps, evaluation, sampling and the PRM pipeline call prm.install() first thing in main (here
    with --help, which exits before any work): every slot filled from empty registries."""
    module = importlib.import_module(f"experiments.{entry}")
    monkeypatch.setattr(reward_terms, "_TERMS", {})
    monkeypatch.setattr(cv, "_REGISTERED", {})
    monkeypatch.setattr(objectives, "_OBJECTIVES", {k: v for k, v in objectives._OBJECTIVES.items() if k != "prm"})
    with pytest.raises(SystemExit) as e:
        module.main(["--help"])
    assert e.value.code == 0 and "usage" in capsys.readouterr().out
    assert "prm" in reward_terms.registered() and objectives.get("prm") is prm_objective.OBJECTIVE
    assert cv.sections()["prm"] is PRMSection


def test_optimizer_steps_runs_one_step_per_minibatch_in_order():
    """rl/train_loop.py's optimizer_steps (the PRM's loop and every stage's) against a hand-written loop: the schedule's float32 hyper-parameters, the batches as device
    arrays, after_step after every step with the state so far, every step's metrics on the host in order."""
    def step(state, batch, hyper):  # plain SGD on a quadratic: w <- w - lr * (w - mean(x))
        g = state["w"] - jnp.mean(batch["x"])
        return {"w": state["w"] - hyper["lr"] * g}, {"g": g, "lr": hyper["lr"]}

    xs = [np.full((3,), v, np.float32) for v in (1.0, -2.0, 0.5, 4.0)]
    seen = []
    state, ms = optimizer_steps(step, {"w": jnp.float32(0.0)}, ({"x": x} for x in xs), lambda i: {"lr": 0.1 * (i + 1)},
                                lambda i, st, m: seen.append((i, float(st["w"]))))
    w, ref = 0.0, []
    for i, x in enumerate(xs):  # float64 reference
        lr = float(np.float32(0.1 * (i + 1)))
        g = w - float(np.mean(x.astype(np.float64)))
        w = w - lr * g
        ref.append((i + 1, w, g))
    assert [i for i, _ in seen] == [1, 2, 3, 4]
    np.testing.assert_allclose([v for _, v in seen], [r[1] for r in ref], rtol=1e-6)
    np.testing.assert_allclose([float(m["g"]) for m in ms], [r[2] for r in ref], rtol=1e-6)
    assert all(isinstance(m["g"], np.ndarray) and m["lr"].dtype == np.float32 for m in ms)
    assert float(state["w"]) == pytest.approx(ref[-1][1], rel=1e-6)


def test_plain_rewards_and_the_light_prm_modules_do_not_import_jax():
    """... and importing the wing or the experiments package registers nothing (prm.install() is the one call)."""
    code = ("import sys; import rewards.combine, rewards.task_score, rewards.pool, rewards.verify, rewards.format, "
            "prm, prm.metrics, prm.data, prm.config, experiments; from rl import reward_terms; "
            "print('jax' in sys.modules, reward_terms.registered())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False []"


@pytest.mark.slow
def test_grpo_with_a_prm_file_end_to_end(tmp_path):
    """The tiny prm_arith GRPO variant with a PRM file: the process reward and the PRM step rewards are scored on
    the trainer side (their cost logged every iteration) and evaluation reranks samples with it (prm@k)."""
    mcfg = ModelConfig(**{**TINY_MODEL, "max_seq_len": 96})
    params = {**transformer.init(mcfg, jax.random.key(0)),
              "value_head": {"w": jnp.full((mcfg.d_model,), 0.1), "b": jnp.float32(0.0)}}
    path = tmp_path / "prm"
    save(PRM(mcfg, params, {"kind": "platt", "a": 0.1, "b": 1.0}, 0.5, "min", likelihood=True), path)
    wd = tmp_path / "run"
    config = os.path.join(ROOT, "experiments/configs/prm_arith.py")
    rc = launch.main(["--config", config + ":variant=tiny_grpo_prm", "--workdir", str(wd),
                      f"--config.prm.path={path}"])
    assert rc == 0
    text = (wd / "metrics.jsonl").read_text()
    assert text.count("prm/seconds_per_solution") >= 3 and "prm/score" in text and "prm@k" in text
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros(1))
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="prm.path"):
        load_scorer(str(bad), TOK, PRMSection(path=str(bad), weight=0.2))


def test_deploy_source_is_the_best_calibration_auroc_unless_named():
    runs = {"prior": [{"calib_auroc": 0.80}], "mix": [{"calib_auroc": 0.91}, {"calib_auroc": 0.5}],
            "mc": [{"calib_auroc": 0.91}]}
    assert deploy_source(runs) == "mix"  # first seed decides; a tie goes to the source listed first
    assert deploy_source(runs, "prior") == "prior"


@pytest.mark.slow
def test_train_prm_pipeline_tiny(tmp_path, capsys):
    """experiments/train_prm.py end to end on the tiny variant: policy, samples, labels, every source, the table,
    the deployed file; a second call with the same settings reuses everything."""
    config = os.path.join(ROOT, "experiments/configs/prm_arith.py")
    wd = tmp_path / "prm"
    assert train_prm.main(["--config", config + ":variant=tiny", "--workdir", str(wd)]) == 0
    out = capsys.readouterr().out
    for source in ("prior", "corrupted", "mc", "mix", "exact", "majority vote", "oracle"):
        assert f"| {source}" in out
    deployed = json.loads((wd / "results.json").read_text())["deployed"]  # what the notebooks read
    assert f"deployed {deployed} ->" in out
    assert (wd / "prm").is_dir() and (wd / "table.md").exists()
    prm = load(wd / "prm")
    assert prm.likelihood and prm.calib["kind"] == "platt"
    assert train_prm.main(["--config", config + ":variant=tiny", "--workdir", str(wd)]) == 0
    assert "PRM prior seed" not in capsys.readouterr().out  # reused
    assert train_prm.main(["--config", config + ":variant=tiny", "--workdir", str(wd), "--set", "lr=-1"]) == 2
