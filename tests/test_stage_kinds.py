"""Stage kinds own what they know (issue 51): no module outside rl/stages/ branches on a stage kind's name. What a
caller needs of a kind (is it RL, the problems it asks for, its rows per step, its answers, seconds and memory, what
it trained) is a field of its rl.stages.Kind. Checked from the code's own syntax (ast): a stage's kind (`x.kind`,
`x["kind"]`, `x.get("kind")`) compared with a stage kind's name (or a collection holding one) fails. A recipe that
picks its stages by name (`stage("grpo", ...)`, a table keyed by kind) compares nothing and passes."""

import ast
from pathlib import Path

from rl.stages import KINDS

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("rl", "prm", "experiments")
OWNER = ROOT / "rl" / "stages"  # the registry and the kinds' own modules may name kinds
# A `kind` that is not a stage's: path -> why
NOT_STAGE_KINDS = {
    "experiments/bench/w1.py": "the TRL peer's result records carry their own `kind` (its trainer, named grpo)",
}


def _is_kind(node) -> bool:
    """x.kind, x["kind"] or x.get("kind")."""
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "kind"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind")


def _names_a_kind(node) -> bool:
    """A stage kind's name as a string literal, or a tuple / list / set literal holding one."""
    if isinstance(node, ast.Constant):
        return node.value in KINDS
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(e) for e in node.elts)
    return False


def kind_name_branches(source: str, filename: str = "<src>") -> list[int]:
    """Line numbers where a stage's kind is compared with a stage kind's name."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_kind(o) for o in operands) and any(_names_a_kind(o) for o in operands):
                found.append(node.lineno)
    return found


def test_no_module_outside_the_stage_registry_branches_on_a_kind_name():
    found = []
    for pkg in SCANNED:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if OWNER in path.parents or rel in NOT_STAGE_KINDS:
                continue
            found += [f"{rel}:{line}" for line in kind_name_branches(path.read_text(), rel)]
    assert not found, ("a stage kind's name compared outside rl/stages/ (ask its rl.stages.Kind instead, or add "
                       f"the field the caller needs to Kind): {found}")


def test_the_exempt_files_still_exist_and_still_need_it():
    for rel in NOT_STAGE_KINDS:
        assert kind_name_branches((ROOT / rel).read_text(), rel), f"{rel} no longer compares a kind: remove it"


def test_the_scan_sees_every_form_and_nothing_else():
    src = ('if s.kind == "sft": pass\n'
           'if st.kind in ("grpo", "ppo"): pass\n'
           'if s["kind"] != "rejection": pass\n'
           'if d.get("kind") not in ["ppo"]: pass\n'
           'if "grpo" == cfg.stages[0].kind: pass\n'
           'if tools.kind == "python": pass\n'  # not a stage kind's name
           'if kind == "sft": pass\n'  # a name the recipe builds from, not a stage's kind
           'x = TABLE[s.kind]\n'
           'if KINDS[s.kind].is_rl: pass\n')
    assert kind_name_branches(src) == [1, 2, 3, 4, 5]


def test_sft_problem_count_reads_the_typed_config():
    """The SFT length check's count (rl.stages.sft_problem_count) on a validated RunConfig: a stage of a kind that
    fine-tunes on demonstrations counts its n_problems (0 = all of tasks.n_train); read as a mapping it once gave 0,
    which skipped the check of the worked solutions' lengths."""
    from experiments.configs import quickstart
    from rl import config_validation as cv
    from rl.stages import sft_problem_count

    cfg = cv.typed(quickstart.get_config("variant=tiny").to_dict())
    sft = [s for s in cfg.stages if s.kind == "sft"]
    assert sft and sft_problem_count(cfg) == (sft[0].n_problems or cfg.tasks.n_train) > 0
