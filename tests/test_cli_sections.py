"""Any section from the command line (issue 53, item 3): `--config.X.field=value` turns an off (None) section on with
its defaults, `--config.X=dict(...)` / `{...}` read as the literals a config file writes (never evaluated),
--help_config lists every section's fields, upcycling a dense checkpoint takes one override, and the README's
command-line forms pass a dry run. Invalid input fails before compute, naming the field."""
import contextlib
import io
import os
import re
import shlex

import pytest

from experiments import launch
from rl import config_validation as cv
from rl import setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRPO_TINY = os.path.join(ROOT, "experiments/configs/grpo_arith.py") + ":variant=tiny"  # stage 1 is GRPO
SMOLLM2_TINY = os.path.join(ROOT, "experiments/configs/smollm2_grpo.py") + ":variant=tiny"  # a dense checkpoint, LoRA


def dry_run(spec: str, *overrides: str) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = launch.main(["--config", spec, "--dry_run", *overrides])
    return rc, buf.getvalue()


def test_literal_reads_dict_calls_and_evaluates_nothing():
    assert launch.literal("dict(kind='python', max_turns=2)") == {"kind": "python", "max_turns": 2}
    assert launch.literal("{'n_experts': 4}") == {"n_experts": 4}
    assert launch.literal("dict(a=dict(b=(1, 2)), c=[None, True])") == {"a": {"b": (1, 2)}, "c": [None, True]}
    assert launch.literal("dict()") == {} and launch.literal(" 1e-5 ") == 1e-5
    for text in ["__import__('os').getcwd()", "dict(**x)", "dict({'a': 1})", "dict(a=f())", "os.sep", "lambda: 1",
                 "dict(a=1", "{[1]: 2}"]:
        with pytest.raises(ValueError, match="not a literal"):
            launch.literal(text)


def test_a_field_of_an_off_section_turns_it_on_with_its_defaults():
    cfg = launch.get_config(GRPO_TINY)
    assert cfg.model.upcycle is None and cfg.model.lora is None
    launch.apply_overrides(cfg, [("model.n_experts", "0"), ("model.upcycle.n_experts", "8"), ("model.lora.rank", "4"),
                                 ("stages[1].tools.kind", "python")])
    assert cv.to_dict(cfg.model.upcycle) == {"n_experts": 8, "top_k": 2, "moe_every": 2, "router_init_std": 0.02,
                                             "capacity_factor": None}
    typed = cv.validate(cfg, complete=False)
    assert typed.model.lora.rank == 4 and typed.model.lora.alpha == 16.0  # the rest at the section's defaults
    assert typed.model.upcycle.n_experts == 8 and typed.stages[1].tools.kind == "python"


def test_the_prm_wings_section_from_the_command_line():
    """--config.prm.* sets the PRM wing's section (prm/config.py, registered by prm.install()), created with its
    defaults where a config file left it out; a weight without a path fails the dry run naming prm.path."""
    cfg = launch.get_config(GRPO_TINY)
    launch.apply_overrides(cfg, [("prm.weight", "0.1"), ("prm.path", "runs/prm/seed{seed}/prm")])
    typed = cv.validate(cfg)
    assert typed.prm.weight == 0.1 and typed.prm.path == "runs/prm/seed{seed}/prm" and typed.prm.agg == "min"
    del cfg["prm"]  # a config file built without the section
    launch.apply_overrides(cfg, [("prm.steps", "true")])
    assert cv.to_dict(cfg.prm) == {"path": "", "weight": 0.0, "agg": "min", "steps": True}
    rc, out = dry_run(GRPO_TINY, "--config.prm.weight=0.1")
    assert rc == 2 and "prm.path must name a PRM file when prm.weight > 0 or prm.steps is on" in out, out


@pytest.mark.parametrize("text", ["dict(kind='python', max_turns=2)", 'dict(kind="python", max_turns=2)',
                                  "{'kind': 'python', 'max_turns': 2}"])
def test_a_section_as_dict_or_braces(text):
    cfg = launch.get_config(GRPO_TINY)
    launch.apply_override(cfg, "stages[1].tools", text)
    launch.apply_override(cfg, "model.lora", "dict(rank=4, targets=('attn/wq', 'attn/wv'))")
    typed = cv.validate(cfg, complete=False)
    assert typed.stages[1].tools.kind == "python" and typed.stages[1].tools.max_turns == 2
    assert typed.stages[1].tools.timeout_s == 5.0  # a field the dict leaves out takes its default
    assert typed.model.lora.targets == ("attn/wq", "attn/wv")


@pytest.mark.parametrize("path,value,message", [
    ("model.upcycle.nexperts", "4", "--config.model.upcycle.nexperts: no field 'nexperts' there; did you mean "
                                    "'n_experts'?"),
    ("model.d_model.x", "1", "--config.model.d_model.x: model.d_model is 32, not a section"),
    ("model.expert_d_ff.x", "1", "model.expert_d_ff is None and not a section"),
    ("stages[0].tools.kind", "python", "--config.stages[0].tools.kind: stages[0].tools does not exist"),  # sft
    ("stages[1].loss.clip_high", "0.3", "stages[1].loss does not exist"),  # flat keys: stages[1].clip_high
    ("stages[7].tools.kind", "python", "stages[7] does not exist"),
])
def test_a_path_that_names_no_section_is_refused(path, value, message):
    with pytest.raises(cv.ConfigError) as e:
        launch.apply_override(launch.get_config(GRPO_TINY), path, value)
    assert message in str(e.value)


@pytest.mark.parametrize("path,value,message", [
    ("model.upcycle", "dict(n_experts=1)", "upcycle.n_experts must be >= 2, got 1"),
    ("model.upcycle", "dict(experts=4)", "upcycle.experts is not a known field"),
    ("model.lora.rank", "0", "lora.rank must be >= 1, got 0"),
    ("stages[1].tools", "dict(kind='bash')", "stages[1].tools.kind must be one of |python, got 'bash'"),
    ("stages[1].tools", "dict(kind=__import__('os'))", "stages[1].tools must be a section"),  # kept as text
])
def test_invalid_sections_fail_before_compute_naming_the_field(path, value, message):
    rc, out = dry_run(GRPO_TINY, f"--config.{path}={value}")
    assert rc == 2 and message in out, out


def test_help_config_lists_every_section_with_its_fields(capsys):
    assert launch.main(["--help_config"]) == 0
    out = capsys.readouterr().out
    for line in ["model.lora.rank = 8  #", "model.lora.targets = (", "model.upcycle.n_experts = 4  #",
                 "model.upcycle.capacity_factor = None  #", "stages[i].tools.kind = ''  # (grpo/ppo)",
                 "stages[i].tools.max_turns = 2  # (grpo/ppo)", "stages[i].curriculum.enabled = False  # (grpo/ppo)",
                 "prm.path = ''  #", "prm.weight = 0.0  #", "eval.k = 8  #"]:
        assert line in out, line
    assert "turns it on" in next(ln for ln in out.splitlines() if ln.startswith("model.upcycle = None"))


def test_upcycling_a_dense_checkpoint_takes_one_override():
    """The checkpoint's own n_experts=0 wins over the section's default 4 (no model.n_experts=0 needed), and LoRA
    on the upcycled model says in the dry run what stays frozen."""
    rc, out = dry_run(SMOLLM2_TINY, "--config.model.upcycle.n_experts=4")
    assert rc == 0, out
    assert "model.n_experts = 4 -> 0" in out  # the checkpoint's architecture, noted
    note = next(ln for ln in out.splitlines() if ln.startswith("note: model.lora on the upcycled model"))
    assert "routers of its 1 MoE block stay at their random init" in note
    assert "moe/w_gate, moe/w_up, moe/w_down not in model.lora.targets" in note
    rc, out = dry_run(SMOLLM2_TINY, "--config.model.upcycle.n_experts=4", "--config.model.lora=None")
    assert rc == 0 and "note: model.lora" not in out, out


def test_upcycling_an_moe_checkpoint_is_refused_naming_its_experts():
    cfg = cv.default_config()
    launch.apply_overrides(cfg, [("model.hf_path", os.path.join(ROOT, "tests/data/hf/qwen3_moe")),
                                 ("model.upcycle.n_experts", "4")])
    with pytest.raises(cv.ConfigError, match=r"model.upcycle needs a dense model to upcycle .* got n_experts=4"):
        setup.build_model_cfg(cv.validate(cfg, complete=False))


# -- the README's command-line forms ------------------------------------------------------------------------------
SECTION_PATH = r"(?:stages\[\w+\]|{})(?:\.\w+)+".format("|".join(cv.SECTIONS))


def readme_forms() -> list[tuple[str, str]]:
    """(path, value) of every config override README.md shows: the --config.* flags of its commands and each
    inline `--config.PATH=VALUE` or `PATH = VALUE` span whose PATH starts at a config section."""
    from tests.test_docs import documented_commands

    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    flags = [w for cmd in documented_commands(text) for w in shlex.split(cmd) if w.startswith("--config.")]
    spans = re.findall(r"`([^`\n]+)`", text)
    forms = [m.groups() for s in flags + spans
             if (m := re.fullmatch(rf"(?:--config\.)?({SECTION_PATH})\s?=\s?(.+)", s.strip()))]
    return list(dict.fromkeys(forms))


def test_readme_command_line_forms_pass_a_dry_run():
    """Each form as a command-line override on the tiny GRPO recipe (stages[i], stages[0] -> its GRPO stage); a
    checkpoint path (model.hf_path / model.pretrained, files a clone does not have) -> the tiny test checkpoint."""
    from experiments.configs.fixtures import make_tiny_files

    forms = readme_forms()
    paths = [p for p, _ in forms]
    assert "stages[i].tools" in paths and "stages[1].clip_high" in paths and "run.overlap" in paths, forms
    tiny_ckpt = os.path.join(make_tiny_files(), "model")
    for path, value in forms:
        path = path.replace("stages[i]", "stages[1]").replace("stages[0]", "stages[1]")  # README's RL stage
        if path in ("model.hf_path", "model.pretrained"):
            path, value = "model.hf_path", tiny_ckpt
        rc, out = dry_run(GRPO_TINY, f"--config.{path}={value}")
        assert rc == 0 and "config OK" in out, f"README's {path}={value}:\n{out[-2000:]}"


def test_another_task_mix_on_a_checkpoint_recipe_measures_its_prompts_again():
    """A checkpoint recipe's tasks.max_prompt_len fits its own prompts; `--config.tasks.mix=...` alone (no second
    override) gets the new prompts' length in the checkpoint's tokens, noted, as a byte-tokenizer recipe's are."""
    rc, out = dry_run(SMOLLM2_TINY, "--config.tasks.mix=gym@basic_arithmetic")
    assert rc == 0, out
    assert "tasks.max_prompt_len = 144 -> " in out and "config OK" in out
    rc, out = dry_run(SMOLLM2_TINY)  # its own prompts: nothing measured again
    assert rc == 0 and "tasks.max_prompt_len = 144 ->" not in out
