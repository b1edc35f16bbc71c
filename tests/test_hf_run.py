"""A checkpoint folder as the run's policy (model.hf_path, rl/setup.py) and the real-model config
experiments/configs/qwen_gsm8k.py: architecture from config.json with the section's run-time options, named errors,
the folder's tokenizer and chat template for prompts, the weights as the starting policy, and the tiny variant
(a random qwen3 checkpoint, a byte-level BPE tokenizer, GSM8K-style files) checked and run end to end."""
import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest

from experiments import launch
from experiments.configs.fixtures import make_tiny_files
from models import hf
from rl import config_validation as cv
from rl import context, setup
from rl.tasks.render import prompt_text, render_prompt, render_user_message

ROOT = Path(__file__).resolve().parents[1]
QWEN3 = ROOT / "tests" / "data" / "hf" / "qwen3"
CONFIG = str(ROOT / "experiments" / "configs" / "qwen_gsm8k.py")


def _cfg(**model):
    c = cv.default_config()
    c.model.update(model)
    return cv.to_dict(c)


def _run(**model) -> cv.RunConfig:
    """The validated config (what the builders take) of a default config with these model fields."""
    return cv.typed(_cfg(**model))


def test_architecture_from_the_checkpoint_runtime_options_from_the_config():
    want = hf.config_from_hf(json.loads((QWEN3 / "config.json").read_text()))
    got = setup.build_model_cfg(_run(hf_path=str(QWEN3), dtype="bfloat16", param_dtype="float32", remat=True,
                                     max_seq_len=48, router_z_coef=0.0))
    assert got == want.replace(dtype="bfloat16", remat=True, max_seq_len=48, router_z_coef=0.0)
    assert got.qk_norm and got.head_dim == 8 and got.vocab_size == 96  # from config.json, not the section defaults
    assert setup.build_model_cfg(_run()) == setup.build_model_cfg(_run(hf_path=""))  # no folder: the section


@pytest.mark.parametrize("model,note", [
    ({"d_model": 48}, "model.d_model = 48 -> 16"),
    ({"qk_norm": False, "attn_bias": True}, "model.attn_bias = True -> False"),
    ({"max_seq_len": 4096}, "model.max_seq_len = 4096 -> 64 (clipped to the checkpoint's context"),
])
def test_the_checkpoint_wins_and_says_so(model, note):
    """A recipe's architecture fields give way to the checkpoint's (rl/pretrained.py), with a note naming each."""
    notes = []
    got = setup.build_model_cfg(_run(**{"hf_path": str(QWEN3), **model}), notes)
    assert got == hf.config_from_hf(json.loads((QWEN3 / "config.json").read_text()))
    assert any(n.startswith(note) for n in notes), notes


def test_unreadable_checkpoint_is_named():
    with pytest.raises(cv.ConfigError, match="model.hf_path: /nowhere/at/all: not a folder"):
        setup.build_model_cfg(_run(hf_path="/nowhere/at/all"))


def test_hf_path_fields_are_validated_and_documented():
    d = _cfg()
    d["model"]["hf_path"] = 3
    d["stages"] = [cv.to_dict(cv.stage("sft"))]
    with pytest.raises(cv.ConfigError, match="model.hf_path must be a string"):
        cv.validate(d)
    text = cv.describe()
    assert "model.hf_path = ''" in text and "model.chat_template = True" in text and "run.device_memory_gib" in text


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_files(str(tmp_path_factory.mktemp("tiny")))


def test_tokenizer_chat_prompts_and_starting_weights(tiny_folder):
    from rl.tasks import get_source

    cfg = _run(hf_path=os.path.join(tiny_folder, "model"))
    cfg = cfg.replace(tasks=cfg.tasks.replace(lang="en"))
    tok = setup.build_tokenizer(cfg)
    p = get_source(f"gsm8k@{tiny_folder}/test.jsonl").problems[0]
    text = prompt_text(cfg, tok, p)
    assert text == f"<|im_start|>user\n{render_user_message(p, 'en')}<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_bos=True)
    assert ids == tok.apply_chat_template([{"role": "user", "content": render_user_message(p, "en")}])
    assert ids[0] == tok._tok.token_to_id("<|im_start|>")  # the template's special tokens are single ids
    assert tok.stop_ids == (tok.eos_id,) and tok.eos_id == tok._tok.token_to_id("<|im_end|>")
    assert tok.decode(ids) == "user\n" + render_user_message(p, "en")  # decoding stops at the end of the turn
    assert prompt_text(cfg.replace(model=cfg.model.replace(chat_template=False)), tok, p) == render_prompt(p, "en")
    # the starting policy is the checkpoint's weights, in the configured storage dtype
    ctx = context.RunContext(cfg=cfg, workdir="", model_cfg=setup.build_model_cfg(cfg), tok=tok, mesh=None,
                             rules=None, row_multiple=1, train=[], val=[], test=[])
    _, want = hf.load(os.path.join(tiny_folder, "model"))
    got = ctx.init_params()
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), np.asarray(b))), got, want))
    with pytest.raises(cv.ConfigError, match="model.hf_path .*no tokenizer.json"):  # a folder without tokenizer.json
        setup.build_tokenizer(cfg.replace(model=cfg.model.replace(hf_path=str(QWEN3))))


def test_system_prompt_is_a_system_turn_before_the_bare_question(tiny_folder):
    """model.system_prompt (the pretrained recipes and `experiments.eval --model`): a system turn, then the
    question alone as the user turn; the same function renders the run's prompts and the eval command's."""
    from experiments.eval import SYSTEM_PROMPT
    from rl.tasks import get_source

    cfg = _run(hf_path=os.path.join(tiny_folder, "model"), system_prompt="Be brief.")
    tok = setup.build_tokenizer(cfg)
    p = get_source(f"gsm8k@{tiny_folder}/test.jsonl").problems[0]
    want = (f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{p.question}<|im_end|>\n"
            "<|im_start|>assistant\n")
    assert prompt_text(cfg, tok, p) == want
    ctx = context.RunContext(cfg=cfg, workdir="", model_cfg=None, tok=tok, mesh=None, rules=None,
                            row_multiple=1, train=[], val=[], test=[])
    assert ctx.prompt(p) == want
    assert "Answer: <number>" in SYSTEM_PROMPT
    bad = _cfg(hf_path=os.path.join(tiny_folder, "model"))
    bad["model"]["system_prompt"] = 7
    with pytest.raises(cv.ConfigError, match="model.system_prompt"):
        cv.validate(bad)


def test_tiny_variant_dry_run(capsys):
    assert launch.main(["--config", CONFIG + ":variant=tiny", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "memory plan per device (1 device)" in out and "bfloat16" in out and "config OK" in out


@pytest.mark.slow
def test_tiny_variant_trains_end_to_end(tmp_path):
    """A cold start then two GRPO iterations from the checkpoint folder, bf16 compute with float32 master weights,
    prompts through the chat template, the official-style test file as the test set (~90 CPU seconds)."""
    wd = tmp_path / "run"
    assert launch.main(["--config", CONFIG + ":variant=tiny", "--workdir", str(wd)]) == 0
    recs = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in recs if r.get("phase") == "train" and r.get("stage") == "grpo"]
    assert len(grpo) == 2 and all(r["optimizer_steps"] >= 1 and r["grad_norm"] > 0 for r in grpo), grpo
    # bf16 sampler vs bf16 trainer logprobs: rounding only (measured max 0.05-0.07, mean 0.0015-0.0019 with the slot
    # sampler's ring cache; a wrong position or cache entry moves them by O(1))
    assert all(r["mismatch/logp_max_abs"] < 0.15 and r["mismatch/logp_mean_abs"] < 0.01 for r in grpo), grpo
    summary = json.loads((wd / "summary.json").read_text())
    assert set(summary["eval"]) >= {"cold_start", "grpo"}
    conf = json.loads((wd / "config.json").read_text())
    assert conf["model"]["dtype"] == "bfloat16" and conf["model"]["param_dtype"] == "float32"
    sample = json.loads((wd / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("<|im_start|>user\n") and sample["prompt"].endswith("<|im_start|>assistant\n")
