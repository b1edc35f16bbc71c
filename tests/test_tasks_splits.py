"""Explicit train / validation / test sources next to the hash split (rl.tasks.load_splits, base.Split,
tasks.*_source in the config): a user's own test file is the test set as given, the other splits are drawn from
the mix by hash among themselves, and no split ever shares a question with another."""
import hashlib
import json
import os

import pytest

from experiments import launch
from rl import config_validation as cv
from rl import setup
from rl.tasks import SPLITS, Split, SplitSourceError, load_mix, load_splits, split_of
from rl.tasks.base import normalise_question, question_hash

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments/configs/quickstart.py")


def _u(question: str) -> float:
    """The question's position in the hash range, computed here from SHA-256 directly."""
    return int(hashlib.sha256(normalise_question(question).encode()).hexdigest()[:16], 16) / 2.0**64


def _jsonl(tmp_path, name, questions, difficulty=1):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"question": q, "answer": str(i), "difficulty": difficulty}) + "\n"
                            for i, q in enumerate(questions)), encoding="utf-8")
    return str(path)


QUESTIONS = [f"What is {a} plus {b} apples?" for a in range(10) for b in range(10)]


def test_split_of_among_fewer_splits_renormalises_the_fractions():
    for q in QUESTIONS:
        u = _u(q)
        assert split_of(q) == ("train" if u < 0.8 else "validation" if u < 0.9 else "test")
        assert split_of(q, ("train", "validation")) == ("train" if u < 0.8 / 0.9 else "validation")
        assert split_of(q, ("validation", "test")) == ("validation" if u < 0.5 else "test")
        assert split_of(q, ("test",)) == "test"


def test_split_objects():
    q = QUESTIONS[0]
    assert str(Split("test")) == "test" and Split("test").contains(q) == (split_of(q) == "test")
    assert Split("test", among=()).contains(q)  # an explicit source serves every question
    assert not Split("test", among=(), exclude=frozenset({question_hash(q)})).contains(q)
    with pytest.raises(ValueError, match="among"):
        Split("test", among=("train", "validation"))
    with pytest.raises(ValueError, match="split must be one of"):
        Split("dev")


def test_without_sources_the_splits_are_unchanged():
    n = {"train": 12, "validation": 5, "test": 5}
    got = load_splits("add:1,sub:1", n, 3, difficulty=2)
    assert got == {s: load_mix("add:1,sub:1", n[s], 3, s, 2) for s in SPLITS}


def test_own_test_file_is_the_test_set_and_never_leaks(tmp_path):
    """The issue-12 case: a JSONL test file used to give '0 problems in split test' after the re-split."""
    test_qs = QUESTIONS[:10]
    test_file = _jsonl(tmp_path, "test.jsonl", test_qs)
    pool = _jsonl(tmp_path, "pool.jsonl", QUESTIONS)  # the mix holds the test questions too
    out = load_splits(f"jsonl@{pool}", {"train": 200, "validation": 8, "test": 10}, 0, {"test": f"jsonl@{test_file}"})
    assert sorted(p.question for p in out["test"]) == sorted(test_qs)
    assert any(split_of(q) != "test" for q in test_qs)  # the hash alone would have dropped some of them
    held = {question_hash(q) for q in test_qs}
    assert not held & {question_hash(p.question) for p in out["train"] + out["validation"]}
    assert not {p.question for p in out["train"]} & {p.question for p in out["validation"]}
    # train and validation share the mix by hash among the two of them: the test third of the hash range is used
    assert any(_u(p.question) >= 0.9 for p in out["train"] + out["validation"])


def test_explicit_splits_must_be_disjoint_and_big_enough(tmp_path):
    a = _jsonl(tmp_path, "a.jsonl", QUESTIONS[:10])
    b = _jsonl(tmp_path, "b.jsonl", QUESTIONS[5:15])
    with pytest.raises(SplitSourceError, match="share 5 question") as e:
        load_splits("arith:1", {"train": 4, "validation": 10, "test": 10}, 0, {"test": f"jsonl@{a}", "validation": f"jsonl@{b}"})
    assert e.value.split == "validation" and e.value.explicit
    with pytest.raises(SplitSourceError, match=r"has 10 problems in split 'test' \(asked for 11\)") as e:
        load_splits("arith:1", {"train": 4, "validation": 4, "test": 11}, 0, {"test": f"jsonl@{a}"})
    assert e.value.split == "test"
    # an explicit training source: i.i.d. draws (repeats allowed), used as given
    out = load_splits("arith:1", {"train": 30, "validation": 4, "test": 4}, 0, {"train": f"jsonl@{a}"})
    assert len(out["train"]) == 30 and {p.question for p in out["train"]} <= set(QUESTIONS[:10])


# ---- the config fields ---------------------------------------------------------------------------------------------
def _tiny(**tasks):
    cfg = launch.get_config(QUICKSTART + ":variant=tiny")
    cfg.tasks.update(tasks)
    return cfg


@pytest.mark.parametrize("tasks,message", [
    ({"test_source": "nosuch@x"}, "tasks.test_source is not a valid mix spec: mix spec 'nosuch@x': unknown source"),
    ({"val_source": 3}, "tasks.val_source must be a string"),
    ({"train_source": "add", "val_source": "sub", "test_source": "mul"}, "tasks.mix ('arith:1.0') is not used"),
    ({"val_source": "mul", "test_source": "mul"}, "tasks.test_source names the same source as tasks.val_source"),
])
def test_bad_split_sources_are_named(tasks, message):
    d = cv.to_dict(_tiny())
    d["tasks"].update(tasks)
    with pytest.raises(cv.ConfigError) as e:
        cv.validate(d)
    assert message in str(e.value)


def test_config_with_every_split_explicit_and_fixed_levels_kept(tmp_path):
    test_file = _jsonl(tmp_path, "t.jsonl", QUESTIONS[:8], difficulty=3)  # tasks.difficulty is 1: levels are kept
    cfg = _tiny(mix="", train_source="add", val_source="sub", test_source=f"jsonl@{test_file}")
    cv.validate(cfg)
    train, val, test = setup.load_problems(cv.validate(cfg))
    assert sorted(p.question for p in test) == sorted(QUESTIONS[:8]) and {p.difficulty for p in test} == {3}
    assert {p.source for p in train} == {"add"} and {p.source for p in val} == {"sub"}
    d = cv.to_dict(_tiny(test_source=f"jsonl@{test_file}"))
    d["tasks"]["n_test"] = 9
    with pytest.raises(cv.ConfigError, match=r"tasks.n_test = 9: tasks.test_source \('jsonl@.*'\) supplies 8 distinct "
                                              r"test problems; set tasks.n_test=8"):
        setup.load_problems(cv.validate(d))


def test_dry_run_keeps_a_users_test_file(tmp_path, capsys):
    test_file = _jsonl(tmp_path, "mine.jsonl", [f"{a}+{b}" for a in range(3) for b in range(3)])
    rc = launch.main(["--config", QUICKSTART + ":variant=tiny", "--dry_run", f"--config.tasks.test_source=jsonl@{test_file}"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "memory plan per device" in out and "config OK" in out
    rc = launch.main(["--config", QUICKSTART + ":variant=tiny", "--dry_run",
                      f"--config.tasks.test_source=jsonl@{tmp_path / 'missing.jsonl'}"])
    assert rc == 2 and "tasks.test_source" in capsys.readouterr().err
