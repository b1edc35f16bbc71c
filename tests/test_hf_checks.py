"""A damaged or hostile Hugging Face folder is a clear error in the dry run, naming the file and the problem, in
bounded time (models/hf_checks.py, run by rl/preflight.py): truncated, empty, garbage-header or missing-shard
safetensors, shapes that disagree with config.json, NaN weights, garbage or wrong-schema tokenizer / generation
files, a config.json that is a list or has 1e9 layers, a chat template that raises or loops. A run that never wrote
a checkpoint does not pin its config."""
import json
import os
import shutil

import jax
import numpy as np
import pytest

from experiments import launch
from models import hf, hf_checks, layer_stack
from rl import config_validation as cv
from rl import preflight
from tests.hf_folders import run_ready_folder

QUICKSTART = "experiments/configs/quickstart.py:variant=tiny"


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return run_ready_folder(tmp_path_factory.mktemp("good"), context=256)


@pytest.fixture
def folder(good, tmp_path):
    """A fresh copy of a sound run-ready folder, to damage."""
    out = tmp_path / "ckpt"
    shutil.copytree(good, out)
    return out


def _cfg(path) -> dict:
    c = cv.to_dict(launch.get_config(QUICKSTART))
    c["model"].update(hf_path=str(path), max_seq_len=256)
    c["tasks"]["max_prompt_len"] = 200
    return c


def _problems(path) -> str:
    with pytest.raises(cv.ConfigError) as e:
        preflight.check_environment(_cfg(path), verbose=False)
    return str(e.value)


def test_the_sound_folder_passes(good):
    preflight.check_environment(_cfg(good), verbose=False)


def test_an_upcycled_run_checks_the_folder_as_the_dense_model_it_holds(good):
    """model.upcycle makes the run's model an MoE after loading; the folder holds the dense model, and the dry run
    checks its tensors against that (it used to ask for the MoE's router tensors: experiments/configs/
    smollm2_upcycle.py:variant=tiny failed before any compute)."""
    c = _cfg(good)
    c["model"].update(n_experts=0, upcycle=dict(n_experts=4, top_k=2, moe_every=2))
    preflight.check_environment(c, verbose=False)


def _write(path, data: bytes):
    path.write_bytes(data)


@pytest.mark.parametrize("damage,message", [
    (lambda f: _write(f / "model.safetensors", (f / "model.safetensors").read_bytes()[:-100]),
     "(truncated)"),
    (lambda f: _write(f / "model.safetensors", b""), "model.safetensors: 0 bytes, too short for a safetensors file"),
    (lambda f: _write(f / "model.safetensors", os.urandom(4096)), "model.safetensors: header length"),
    (lambda f: _write(f / "model.safetensors", (8).to_bytes(8, "little") + b"{garbage" + b"\0" * 64),
     "model.safetensors: the header is not JSON"),
    (lambda f: (f / "config.json").write_text(json.dumps({**json.loads((f / "config.json").read_text()),
                                                          "intermediate_size": 48})),
     "config.json and the weights disagree: checkpoint tensor model.layers.0.mlp.gate_proj.weight has shape (32, 16), config.json implies (48, 16)"),
    (lambda f: (f / "config.json").write_text("[1, 2]"), "config.json: must hold a JSON object"),
    (lambda f: (f / "config.json").write_text("{oops"), "config.json: not valid JSON"),
    (lambda f: (f / "config.json").write_text(json.dumps({**json.loads((f / "config.json").read_text()),
                                                          "num_hidden_layers": 10**9})),
     "config.json: n_layers must be <= 10000, got 1000000000"),
    (lambda f: (f / "config.json").write_text(json.dumps({**json.loads((f / "config.json").read_text()),
                                                          "num_hidden_layers": 1e9})),
     "config.json: n_layers must be an int, got 1000000000.0"),
    (lambda f: (f / "config.json").write_text(json.dumps({**json.loads((f / "config.json").read_text()),
                                                          "rope_parameters": [1]})), "config.json: AttributeError"),
    (lambda f: (f / "tokenizer.json").write_text("not json at all"), "tokenizer.json: not valid JSON"),
    (lambda f: (f / "tokenizer.json").write_text(json.dumps({"model": {"type": "Nope"}})),
     "tokenizer.json: the tokenizers library cannot read it"),
    (lambda f: (f / "tokenizer.json").write_text("[]"), "tokenizer.json: must hold a JSON object"),
    (lambda f: (f / "tokenizer_config.json").write_text("\x00\xff"), "tokenizer_config.json: not valid JSON"),
    (lambda f: (f / "tokenizer_config.json").write_text(json.dumps({"eos_token": 5})),
     "tokenizer_config.json: eos_token must be a string"),
    (lambda f: (f / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": 7})),
     "tokenizer_config.json: chat_template must be a string"),
    (lambda f: (f / "generation_config.json").write_text("{]"), "generation_config.json: not valid JSON"),
    (lambda f: (f / "generation_config.json").write_text(json.dumps({"eos_token_id": "x"})),
     "generation_config.json: eos_token_id must be an id or a list of ids"),
    (lambda f: (f / "chat_template.jinja").write_text("{{ raise_exception('roles must alternate') }}"),
     "the chat template fails on a one-turn conversation (TemplateError: roles must alternate)"),
    (lambda f: (f / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                                                      "{% for i in range(100000) %}{% for j in range(100000) %}"
                                                      "{% endfor %}{% endfor %}"),
     "the chat template ran past 200000 steps"),
    (lambda f: (f / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                                                      "{% if messages[0]['content'].startswith('Question') %}{% for i in "
                                                      "range(100000) %}{% for j in range(100000) %}{% endfor %}"
                                                      "{% endfor %}{% endif %}"),
     "the chat template ran past 200000 steps"),
])
def test_damaged_folder_is_named_in_the_dry_run(folder, damage, message):
    damage(folder)
    text = _problems(folder)
    assert message in text and str(folder) in text, text


def test_missing_shard_and_an_index_that_lies(folder):
    """A sharded checkpoint (model.safetensors.index.json) with one shard gone, then one whose index names a tensor
    its file does not hold."""
    cfg, params = hf.load(folder)
    os.remove(folder / "model.safetensors")
    hf.save(folder, cfg, params, max_shard_bytes=20_000)
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    preflight.check_environment(_cfg(folder), verbose=False)  # sound when whole
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards[-1].rename(folder / "elsewhere.bin")
    assert f"shard(s) ['{shards[-1].name}'] are missing" in _problems(folder)
    (folder / "elsewhere.bin").rename(shards[-1])
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = shards[-1].name if index["weight_map"][name] != shards[-1].name else shards[0].name
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert f"tensor '{name}' is not in" in _problems(folder)


def test_nan_weights_are_refused_by_the_dry_run_and_by_the_loader(folder):
    cfg, params = hf.load(folder)
    params = layer_stack.per_layer(jax.tree.map(np.asarray, params), cfg)  # hf.save takes either layout
    params["block_1"]["mlp"]["w_up"] = params["block_1"]["mlp"]["w_up"].copy()
    params["block_1"]["mlp"]["w_up"][3, 5] = np.nan
    hf.save(folder, cfg, params)
    text = _problems(folder)
    assert "model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' holds 1 inf/nan value(s)" in text, text
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight holds inf/nan values"):
        hf.load(folder)
    bf = np.array([1.0, np.inf, 2.0], dtype=np.float32)  # the bit test of each float width, against numpy's isfinite
    for dt in ("F32", "F16", "F64"):
        arr = bf.astype({"F32": np.float32, "F16": np.float16, "F64": np.float64}[dt])
        view, mask = hf_checks._EXPONENT[dt]
        assert np.count_nonzero((arr.view(view) & view(mask)) == view(mask)) == np.count_nonzero(~np.isfinite(arr))


def test_the_launcher_names_the_file_and_exits_2(folder, capsys):
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "generation_config.json").write_text("[]")
    code = launch.main(["--config", QUICKSTART, "--dry_run", f"--config.model.hf_path={folder}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"{folder}/model.safetensors: 0 bytes" in err and f"{folder}/generation_config.json: must hold" in err


def test_a_run_that_never_wrote_a_checkpoint_does_not_pin_its_config(good, tmp_path, capsys):
    """The first launch had a wrong model.hf_path and stopped before its first checkpoint: the corrected command is
    accepted in that workdir (a workdir with a checkpoint still refuses a different config)."""
    wd = tmp_path / "run"
    (wd / "checkpoints" / "last").mkdir(parents=True)
    old = _cfg("/wrong/folder")
    (wd / "config.json").write_text(json.dumps(old))
    assert launch.main(["--config", QUICKSTART, "--dry_run", "--workdir", str(wd), f"--config.model.hf_path={good}"]) == 0
    from rl.checkpoint import Checkpointer  # a written checkpoint (with its checksums) pins the config

    Checkpointer(str(wd / "checkpoints")).save(3, {"x": np.zeros(2, np.float32)}, {"unit": 3})
    assert launch.main(["--config", QUICKSTART, "--dry_run", "--workdir", str(wd), f"--config.model.hf_path={good}"]) == 2
    assert "holds a run with a different config" in capsys.readouterr().err
