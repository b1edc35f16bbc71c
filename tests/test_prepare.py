"""One typed config, prepared once: validate() returns a frozen tree (defaults, docs and checks from the section
dataclasses' field metadata); prepare() validates and loads the problems once for the launcher's dry run, its run
and a direct rl.run.train; renamed fields (ALIASES) and an old run's config.json still work."""
import collections
import dataclasses
import json
import os
import typing

import pytest

from experiments import launch
from rl import config_validation as cv
from rl import context, setup
from rl import workdir_state as wstate
from rl import run as run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments/configs/quickstart.py") + ":variant=tiny"


class _Stop(Exception):
    """Raised where the run would start computing: everything before it is what the test counts."""


@pytest.fixture
def counts(monkeypatch):
    """Calls of cv.validate and rl.setup.load_problems (the problem loader) in this test."""
    n = collections.Counter()
    validate, load = cv.validate, setup.load_problems
    monkeypatch.setattr(cv, "validate", lambda c, **kw: n.update(["validate"]) or validate(c, **kw))
    monkeypatch.setattr(setup, "load_problems", lambda c: n.update(["load"]) or load(c))
    return n


@pytest.fixture
def stop_at_build(monkeypatch):
    """rl.run.train stops where it builds the context (mesh, reward pool); returns what it was given."""
    seen = {}

    def build_context(prep, workdir, **kw):
        seen["prep"] = prep
        raise _Stop

    monkeypatch.setattr(run_lib, "build_context", build_context)
    return seen


def test_dry_run_validates_and_loads_once(counts, capsys):
    assert launch.main(["--config", QUICKSTART, "--dry_run"]) == 0
    assert "config OK" in capsys.readouterr().out
    assert counts == {"validate": 1, "load": 1}


def test_launch_hands_its_prepared_run_to_train(counts, stop_at_build, tmp_path):
    with pytest.raises(_Stop):
        launch.main(["--config", QUICKSTART, "--workdir", str(tmp_path / "w")])
    assert counts == {"validate": 1, "load": 1}  # the launcher's checks; train neither validates nor loads again
    prep = stop_at_build["prep"]
    assert isinstance(prep, setup.Prepared) and isinstance(prep.cfg, cv.RunConfig)
    assert len(prep.train) == prep.cfg.tasks.n_train and len(prep.test) == prep.cfg.tasks.n_test
    assert prep.plan is not None  # the memory plan the launcher printed
    with open(tmp_path / "w" / "config.json", encoding="utf-8") as f:
        written = json.load(f)
    assert {k: v for k, v in written.items() if k != "kernels"} == json.loads(json.dumps(prep.cfg.to_dict()))


def test_train_on_a_config_prepares_it_once(counts, stop_at_build, tmp_path):
    with pytest.raises(_Stop):
        run_lib.train(launch.get_config(QUICKSTART), str(tmp_path / "w"))
    assert counts == {"validate": 1, "load": 1}
    assert isinstance(stop_at_build["prep"], setup.Prepared)


def test_the_tree_is_typed_and_frozen():
    cfg = cv.validate(launch.get_config(QUICKSTART))
    assert isinstance(cfg.model, cv.ModelSection) and isinstance(cfg.tasks, cv.TasksSection)
    assert cfg.stages[2].kind == "grpo" and not hasattr(cfg, "__getitem__")  # read by attribute, never as a mapping
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.tasks.n_train = 3
    with pytest.raises(TypeError):
        cfg["tasks"]  # no mapping view: code written against plain dicts fails here, not by reading another value
    assert cv.typed(cfg) is cfg  # a RunConfig is not validated again
    hints = typing.get_type_hints(context.RunContext)
    assert object not in hints.values() and hints["cfg"] is cv.RunConfig


def test_every_field_has_a_doc_and_a_check_in_its_dataclass():
    """One schema mechanism: each section's default, doc and check are its dataclass field's; describe() lists
    them (the launcher's --help_config)."""
    listing = cv.describe()
    for name, cls in cv.SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.metadata.get("doc"), f"{name}.{f.name} has no doc"
            assert f.metadata.get("check") is not None, f"{name}.{f.name} has no check"
            assert f"{name}.{f.name} = " in listing and f.metadata["doc"] in listing
    for f in dataclasses.fields(cv.RunConfig):
        assert f.metadata.get("doc"), f.name


@pytest.mark.parametrize("section,field,value", [("sampling", "top_p", True), ("eval", "temperature", float("inf")),
                                                 ("reward", "w_format", 1e300), ("model", "rope_theta", float("nan")),
                                                 ("run", "reward_timeout", False), ("tasks", "n_train", 1.5)])
def test_numbers_are_finite_and_in_range_and_booleans_are_not_numbers(section, field, value):
    d = cv.to_dict(launch.get_config(QUICKSTART))
    d[section][field] = value
    with pytest.raises(cv.ConfigError, match=f"{section}.{field} must be"):
        cv.validate(d)


def test_renamed_fields_are_read_under_their_new_names(monkeypatch, capsys):
    monkeypatch.setattr(cv, "ALIASES", {"tasks.n_problems": "tasks.n_train", "stages.learning_rate": "stages.lr"})
    d = cv.to_dict(launch.get_config(QUICKSTART))
    d["tasks"]["n_problems"] = d["tasks"].pop("n_train") + 1
    d["stages"][0]["learning_rate"] = d["stages"][0].pop("lr") * 2
    want = cv.to_dict(launch.get_config(QUICKSTART))
    want["tasks"]["n_train"] += 1
    want["stages"][0]["lr"] *= 2
    assert json.loads(json.dumps(cv.validate(d).to_dict())) == json.loads(json.dumps(want))
    err = capsys.readouterr().err
    assert "tasks.n_problems is deprecated, read as tasks.n_train" in err
    assert "stages[0].learning_rate is deprecated, read as stages[0].lr" in err
    monkeypatch.setattr(cv, "ALIASES", {"stages.kl_lr": "stages.curriculum.refresh_every"})  # into a sub-section
    nested = cv.to_dict(launch.get_config(QUICKSTART))
    del nested["stages"][2]["curriculum"]["refresh_every"]
    nested["stages"][2]["kl_lr"] = 7
    assert cv.validate(nested).stages[2].curriculum.refresh_every == 7
    assert "stages[2].kl_lr is deprecated, read as stages[2].curriculum.refresh_every" in capsys.readouterr().err
    monkeypatch.setattr(cv, "ALIASES", {"tasks.n_problems": "tasks.n_train"})
    d["tasks"]["n_train"] = 5  # both names: the old one is not silently dropped
    with pytest.raises(cv.ConfigError, match="tasks.n_problems is not a known field"):
        cv.validate(d)


def test_an_old_run_directory_resumes(monkeypatch, tmp_path):
    """An old run's config.json (a field renamed since, a field added since missing, the kernels record) is accepted
    on resume and validates; a changed value is not."""
    cfg = cv.validate(launch.get_config(QUICKSTART))
    old = cfg.to_dict()
    old["tasks"]["n_problems"] = old["tasks"].pop("n_train")  # the old name
    del old["run"]["device_memory_gib"], old["eval"]["samples"]  # added to the code after that run, at defaults
    old["kernels"] = {"backend": "cpu"}
    work = tmp_path / "run"
    (work / "checkpoints" / "last").mkdir(parents=True)
    (work / "config.json").write_text(json.dumps(old))
    monkeypatch.setattr(wstate, "written_steps", lambda path: [1])  # a written checkpoint
    monkeypatch.setattr(cv, "ALIASES", {"tasks.n_problems": "tasks.n_train"})
    wstate.check_resume(str(work), cfg)
    assert cv.validate(old) == cfg  # the old config.json itself validates into the same tree (load_policy, eval)
    changed = cfg.replace(seed=cfg.seed + 1)
    with pytest.raises(cv.ConfigError, match="holds a run with a different config"):
        wstate.check_resume(str(work), changed)
