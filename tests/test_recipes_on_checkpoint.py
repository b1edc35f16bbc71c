"""Any recipe on a pretrained checkpoint with one override: `--config.model.hf_path=DIR` on the shipped RL configs.

The folder is the project's tiny fixture (tests/data/hf: the qwen3 architecture, the BPE tokenizer with its chat
template, tests/hf_folders.py). The checkpoint's architecture wins over the recipe's model fields (one note each),
the recipe's byte-counted lengths are measured in the checkpoint's tokens, prompts go through the chat template,
and whatever exceeds the checkpoint's context is reported with the value that fits (rl/pretrained.py)."""
import json

import pytest

from experiments import launch
from rl import config_validation as cv
from rl import setup
from rl.workdir_state import check_resume
from tests.hf_folders import run_ready_folder

RECIPES = ["quickstart", "grpo_arith", "ppo_arith", "r1_pipeline"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return run_ready_folder(tmp_path_factory.mktemp("ckpt"))


@pytest.mark.parametrize("name", RECIPES)
def test_each_rl_recipe_dry_runs_on_the_checkpoint(name, folder, capsys):
    code = launch.main(["--config", f"experiments/configs/{name}.py", "--dry_run", f"--config.model.hf_path={folder}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "config OK" in out and f"model.hf_path ({folder}) sets the architecture" in out
    assert "model.d_model = " in out and " -> 16," in out  # the recipe's width gives way, said once
    assert out.count("sets the architecture") == 1
    # the system prompt and chat turn make arithmetic prompts longer than the recipe's 32 bytes; the R1 recipe's 320
    # bytes hold its longest prompt in the BPE tokens too, so it keeps its length
    assert ("tasks.max_prompt_len = 32 -> " in out) == (name != "r1_pipeline")


def _run_two_units(name, folder, workdir, extra=()):
    argv = ["--config", f"experiments/configs/{name}.py:variant=tiny", "--workdir", str(workdir),
            f"--config.model.hf_path={folder}", "--config.run.stop_after=2", *extra]
    assert launch.main(argv) == 0
    conf = json.loads((workdir / "config.json").read_text())
    recs = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r.get("phase") == "train"]
    assert len(train) == 2 and all(r["loss"] == r["loss"] for r in train), train  # two units, finite losses
    return conf, train


def test_quickstart_runs_two_units_on_the_checkpoint(folder, tmp_path):
    """The prompts the run trained on are chat turns of the checkpoint's template; the workdir records the lengths
    it used; a rerun of the same command resumes (the recorded config is the one it resolves to again)."""
    conf, train = _run_two_units("quickstart", folder, tmp_path / "run", ["--config.eval.every=0"])
    assert conf["model"]["hf_path"] == folder and conf["tasks"]["max_prompt_len"] > 32
    assert conf["tasks"]["max_prompt_len"] + conf["sampling"]["max_new_tokens"] == conf["model"]["max_seq_len"]
    assert setup.build_model_cfg(cv.validate(conf)).d_model == 16  # the checkpoint's architecture
    check_resume(str(tmp_path / "run"), conf)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo_arith", "ppo_arith", "r1_pipeline"])
def test_other_recipes_run_two_units_on_the_checkpoint(name, folder, tmp_path):
    _run_two_units(name, folder, tmp_path / "run")


def test_lengths_beyond_the_context_are_reported_with_the_value_that_fits(tmp_path, capsys):
    """A 64-token context: the recipe's max_seq_len is clipped (a note), and prompt + answer that cannot fit is an
    error naming the fields and the room left, in the same pass as the other problems."""
    short = run_ready_folder(tmp_path, context=200, name="short")
    code = launch.main(["--config", "experiments/configs/quickstart.py", "--dry_run", f"--config.model.hf_path={short}"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "tasks.max_prompt_len + sampling.max_new_tokens (163 + 64 = 227) exceed the checkpoint's context (200" in err
    assert "set sampling.max_new_tokens=37" in err
