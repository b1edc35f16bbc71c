"""DAPO's dynamic sampling (filter_zero_variance "refill", rl/stages/iteration.py refill): more groups are drawn until
n_prompts carry reward variance or max_refill_rounds is reached, the first n_prompts kept groups train, and
refill/* says what happened; "drop" and "off" keep their meaning, and True / False of older configs read as them.

The refill tests run the iteration's own pick / score / advantages / merge on a fake sampler (a batch of token-free
rows per picked problem) and a fake scorer (a problem's group has variance when the test says so); the last one is a
real tiny run (rl.run.train) whose scorer is told which problems vary."""
import dataclasses
import json
import os
import zlib
from types import SimpleNamespace

import numpy as np
import pytest

from experiments.configs import quickstart
from rl import config_validation as cv
from rl import config_warnings
from rl import prefix, rollout, stages
from rl.metrics import read_jsonl
from rl.stages import grpo, iteration

N_PROBLEMS, K = 40, 2


class Ctx:
    """What refill reads of the run context: the rng streams (rl.context.RunContext.rng's) and the scorer."""

    tok = None  # the fake rows' texts are made from their problem ids

    def __init__(self, varied):
        self.scorer = SimpleNamespace(submit=lambda texts, problems, lengths: problems,
                                      result=lambda problems: [score(p, j, varied) for p, j in _rows(problems)])

    @staticmethod
    def rng(purpose, *parts):
        return np.random.default_rng([0, 4, *[int(p) + 1 for p in parts]])


def _rows(problems):
    """(problem, index of the answer in its group) per row (the fake batch's rows: K per problem, contiguous)."""
    return [(p, i % K) for i, p in enumerate(problems)]


def score(problem, j, varied):
    """A reward dict as the pool returns it: the group of a `varied` problem holds one right answer."""
    r = float(problem in varied and j == 0)
    return {"total": r, "solved": r, "format": 1.0, "family": "math"}


def fake_produce(st, u, draw=0, drawn=()):
    """The iteration's own pick (rng streams, problems not drawn yet), then K token-free rows per problem."""
    st, (ids, ks) = iteration.pick(st, u, draw, drawn)
    n = int(ks.sum())
    a = {"ids": ids, "ks": ks, "prompt_index": np.repeat(np.arange(len(ids)), ks), "lengths": np.full(n, 3),
         "loss_mask": np.ones((n, 4), np.int32), "tokens": np.repeat(ids, ks)[:, None] * np.ones((1, 4), np.int64),
         "stats": np.array([float(draw)] * 6)}
    return st, {"arrays": a, "unit": u, "temperature": 1.0, "version": 0}


def state(varied, **cfg):
    c = stages.parse_stage({**stages.defaults("grpo"), "n_prompts": 4, "samples": K, "filter_zero_variance": "refill",
                            **cfg})
    base = SimpleNamespace(ctx=Ctx(varied), cfg=c, index=0, problems=list(range(N_PROBLEMS)))
    return iteration.State(base=base, advantages=grpo.advantages, value_head=False, kl_ctl=None, max_rows=8,
                           sample_cfg=None, prm=None, refill_rounds=c.refill_rounds)


def run_refill(monkeypatch, varied, u=0, **cfg):
    """Iteration u's first draw judged, then refill: (the merged draw, the draws' problem ids in order)."""
    monkeypatch.setattr(iteration, "produce", fake_produce)
    monkeypatch.setattr(iteration, "_texts", lambda tok, a: [f"p{int(a['ids'][g])}" for g in a["prompt_index"]])
    st = state(varied, **cfg)
    st, b = iteration.produce(st, u)
    a = b["arrays"]
    first_draw = st.base.ctx.scorer.result(iteration._problems(st, a))
    st, first = iteration.judge(st, a, iteration._texts(None, a), first_draw, 0.0)
    return iteration.refill(st, u, first, 0.0)[1]


def group_rewards(d):
    starts = iteration.group_starts(d["a"]["ks"])
    return [d["rewards"][s : s + k] for s, k in zip(starts, d["a"]["ks"])]


def test_refill_draws_until_n_prompts_groups_carry_variance(monkeypatch):
    varied = set(range(0, N_PROBLEMS, 4))  # a quarter of the problems: the first draw rarely fills the batch
    d = run_refill(monkeypatch, varied, max_refill_rounds=10)
    m, ids, ks = d["m"], d["a"]["ids"], d["a"]["ks"]
    assert m["refill/groups_kept"] == 4 and m["refill/rounds"] >= 1
    assert m["refill/groups_drawn"] == len(ids) == 4 * (m["refill/rounds"] + 1)
    assert len(set(ids.tolist())) == len(ids)  # each round draws problems not drawn yet this iteration
    kept = d["keep"][iteration.group_starts(ks)]
    assert d["keep"].sum() == 4 * K and np.array_equal(d["keep"], np.repeat(kept, ks))  # whole groups
    # the kept groups are the first four with variance, in draw order, and only those
    has_var = np.array([g.max() != g.min() for g in group_rewards(d)])
    assert np.array_equal(np.flatnonzero(kept), np.flatnonzero(has_var)[:4])
    assert np.array_equal(has_var, np.isin(ids, list(varied)))
    # the merged batch: rows and advantages of every draw, prompt_index counting groups across the draws
    assert np.array_equal(d["a"]["prompt_index"], np.repeat(np.arange(len(ids)), ks))
    assert d["extra"]["advantages"].shape == (len(ids) * K, 4) and m["reward/mean"] == pytest.approx(
        np.mean(d["rewards"]))
    assert d["a"]["stats"][0] == 0.0  # the first draw's produce statistics


def test_the_cap_stops_the_refill_with_fewer_groups(monkeypatch):
    d = run_refill(monkeypatch, varied={0, 1, 2}, max_refill_rounds=2)
    m = d["m"]
    assert (m["refill/rounds"], m["refill/groups_drawn"]) == (2, 12)
    assert m["refill/groups_kept"] == len(set(d["a"]["ids"].tolist()) & {0, 1, 2}) < 4
    none = run_refill(monkeypatch, varied=set(), max_refill_rounds=3)["m"]
    assert (none["refill/rounds"], none["refill/groups_drawn"], none["refill/groups_kept"]) == (3, 16, 0)


def test_no_refill_when_the_first_draw_is_full_and_the_batch_is_drops(monkeypatch):
    """Every group varies: no round is drawn and the batch trains as "drop" would train it."""
    d = run_refill(monkeypatch, varied=set(range(N_PROBLEMS)))
    assert (d["m"]["refill/rounds"], d["m"]["refill/groups_drawn"], d["m"]["refill/groups_kept"]) == (0, 4, 4)
    assert d["keep"].all()
    drop = dataclasses.replace(state(set()).base.cfg, filter_zero_variance="drop")
    adv, keep = grpo.grpo_token_advantages(drop, d["rewards"], d["a"]["ks"], d["a"]["loss_mask"].astype(np.float32))
    np.testing.assert_array_equal(adv, d["extra"]["advantages"])
    np.testing.assert_array_equal(keep, d["keep"])


def test_refill_draws_are_deterministic_and_their_streams_distinct(monkeypatch):
    varied = set(range(0, N_PROBLEMS, 5))
    a, b = (run_refill(monkeypatch, varied, max_refill_rounds=10) for _ in range(2))
    np.testing.assert_array_equal(a["a"]["ids"], b["a"]["ids"])
    np.testing.assert_array_equal(a["keep"], b["keep"])
    # the first draw is iteration u's batch as without refill; rounds use their own stream, not the next iteration's
    st = state(varied)
    _, (first, _) = iteration.pick(st, 0)
    np.testing.assert_array_equal(a["a"]["ids"][:4], first)
    assert iteration.draw_parts(0, 1) != iteration.draw_parts(1, 0)
    _, (next_iteration, _) = iteration.pick(st, 1)
    assert not np.array_equal(a["a"]["ids"][4:8], next_iteration)


@pytest.mark.parametrize("mode, kept", [("drop", [False, False, True]), (True, [False, False, True]),
                                        ("off", [True, True, True]), (False, [True, True, True]),
                                        ("refill", [False, False, True])])
def test_which_groups_train(mode, kept):
    """The one zero-variance filter (grpo_token_advantages): drop and refill keep the groups whose rewards differ,
    off keeps every group; True / False read as drop / off."""
    cfg = stages.parse_stage({**stages.defaults("grpo"), "filter_zero_variance": mode})
    r = np.array([1.0, 1, 1, 0, 0, 0, 0.5, 0.5, 1.0])
    _, keep = grpo.grpo_token_advantages(cfg, r, [3, 3, 3], np.ones((9, 2), np.float32))
    assert keep.tolist() == np.repeat(kept, 3).tolist()


def test_first_kept_keeps_whole_groups_in_order():
    keep = np.array([0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1], bool)  # groups of 2, 3, 2, 4: the 2nd and the 4th kept
    ks = [2, 3, 2, 4]
    assert iteration.first_kept(keep, ks, 1).tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert iteration.first_kept(keep, ks, 5).tolist() == keep.tolist()


@pytest.mark.parametrize("old, new", [(True, "drop"), (False, "off")])
def test_old_bool_values_load_and_resume(old, new):
    """True / False (every config and config.json written before "refill") mean drop / off; an old run's
    config.json compares equal to today's config of the same run (rl.prefix.with_added_defaults), so it resumes."""
    assert stages.parse_stage({**stages.defaults("grpo"), "filter_zero_variance": old}).filter_zero_variance == new
    c = quickstart.get_config("variant=tiny")
    c.stages[2].filter_zero_variance = new
    today = cv.validate(c).to_dict()
    stored = json.loads(json.dumps(today))
    stored["stages"][2]["filter_zero_variance"] = old
    del stored["stages"][2]["max_refill_rounds"]  # a field added since, at its default
    assert prefix.differing_fields(prefix.with_added_defaults(stored, today), json.loads(json.dumps(today))) == []
    with pytest.raises(stages.FieldErrors, match="filter_zero_variance must be one of off|drop|refill"):
        stages.parse_stage({**stages.defaults("grpo"), "filter_zero_variance": 1})


def test_refill_with_a_curriculum_is_refused():
    with pytest.raises(stages.FieldErrors, match="filter_zero_variance 'refill' draws its extra problems uniformly"):
        stages.parse_stage({**stages.defaults("grpo"), "filter_zero_variance": "refill",
                            "curriculum": {**stages.defaults("grpo")["curriculum"], "enabled": True}})


def test_a_tiny_run_with_refill_takes_real_updates(tmp_path, monkeypatch):
    """The tiny quickstart's GRPO stage from a random policy, 2 iterations: the scorer pays one answer in the group of
    a third of the problems, so the first draw rarely fills the batch; every iteration refills, trains (no skipped
    step) and logs refill/* in metrics.jsonl."""
    real_submit, real_result = rollout.Scorer.submit, rollout.Scorer.result

    def submit(self, texts, problems, n_tokens=None):
        return real_submit(self, texts, problems, n_tokens), [p.answer for p in problems]

    def result(handle):
        answers = handle[1]
        first = [i == 0 or answers[i] != answers[i - 1] for i in range(len(answers))]  # a group's first answer
        return [{**sc, "total": float(f and zlib.crc32(str(g).encode()) % 3 == 0)}
                for sc, f, g in zip(real_result(handle[0]), first, answers)]

    monkeypatch.setattr(rollout.Scorer, "submit", submit)
    monkeypatch.setattr(rollout.Scorer, "result", staticmethod(result))
    c = quickstart.get_config("variant=tiny")
    c.stages = [c.stages[2]]
    c.stages[0].update(dict(iterations=2, n_prompts=4, samples=2, filter_zero_variance="refill", entropy_coef=0.01))
    c.eval.update(dict(initial=False, every=0, n_val=2, n_test=2, k=0))
    c.run.reward_workers = 0
    from rl import run

    run.train(c, str(tmp_path))
    recs = [r for r in read_jsonl(os.path.join(tmp_path, "metrics.jsonl")) if r.get("phase") == "train"]
    assert len(recs) == 2
    for r in recs:
        assert r["refill/groups_drawn"] == 4 * (r["refill/rounds"] + 1) and 1 <= r["refill/groups_kept"] <= 4
        assert r["optimizer_steps"] > 0 and r["skipped_steps"] == 0 and r["grad_norm"] > 0
    assert any(r["refill/rounds"] >= 1 for r in recs)


def test_a_refill_cap_without_the_refill_is_warned():
    c = quickstart.get_config("variant=tiny")
    c.stages[2].max_refill_rounds = 5
    w = config_warnings.warnings(cv.validate(c))
    assert w == ["stages[2].max_refill_rounds=5 was chosen for filter_zero_variance='refill' (DAPO's dynamic "
                 "sampling); this stage has 'drop', which draws one batch per iteration"]
    c.stages[2].filter_zero_variance = "refill"
    assert config_warnings.warnings(cv.validate(c)) == []
