"""The docs' examples run: every code block in README.md and docs/*.md marked with an HTML comment on the line
before it is executed, in document order, so a command or snippet that stops working fails here.

    <!-- doctest -->            the next ```bash block: each `python -m experiments.NAME ...` command runs (in this
                                process, through NAME's main(argv)) and must exit 0; the next ```python block
                                runs, and a line `expr  # -> literal` asserts expr == literal
    <!-- doctest: dry_run -->   the same, with --dry_run added to every launch / sweep command (full-size configs)
    <!-- doctest: output -->    the next ```text block is the output of the command block before it: its lines,
                                numbers masked, must appear in that order in the real output ("..." lines skipped)

Paths under runs/ are moved to a temporary directory (one per page: a later block may use an earlier block's
workdir); commands run from the repository root. Tiny variants and --dry_run keep this fast, and all pages run in
one test (one process), so a second page's tiny run reuses the first one's compiles.
"""
import ast
import contextlib
import importlib
import io
import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
MARK = re.compile(r"^<!--\s*doctest(?::\s*([\w_]+))?\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(mode, language, code) of every marked fenced block, in order ('' = run)."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = MARK.match(lines[i].strip())
        if m and i + 1 < len(lines) and FENCE.match(lines[i + 1].strip()):
            lang = FENCE.match(lines[i + 1].strip()).group(1)
            j = i + 2
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            out.append((m.group(1) or "", lang, "\n".join(lines[i + 2:j])))
            i = j
        i += 1
    return out


def commands(code: str) -> list[str]:
    """Shell lines of a bash block: continuations joined, blank and comment lines dropped, `  # comment` cut."""
    out, cur = [], ""
    for line in code.splitlines():
        line = re.sub(r"\s{2,}#.*$", "", line.rstrip())
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cur += (line[:-1].strip() + " ") if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            out.append(cur.strip())
            cur = ""
    return out


def mask(text: str, tmp: str) -> list[str]:
    text = text.replace(tmp + os.sep, "")
    return [" ".join(re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", ln).split()) for ln in text.splitlines() if ln.strip()]


def run_command(cmd: str, tmp: str, dry_run: bool) -> str:
    argv = shlex.split(cmd)
    if len(argv) < 3 or os.path.basename(argv[0]) not in ("python", "python3") or argv[1] != "-m" or \
            not argv[2].startswith("experiments."):
        raise AssertionError(f"doctest commands are `python -m experiments.NAME ...`, got {cmd!r}")
    args = [os.path.join(tmp, a) if a.startswith("runs/") else a for a in argv[3:]]
    if dry_run and argv[2] in ("experiments.launch", "experiments.sweep") and "--help_config" not in args:
        args.append("--dry_run")
    module = importlib.import_module(argv[2])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = module.main(args)
        except SystemExit as e:
            rc = e.code
    assert rc in (0, None), f"{cmd} exited {rc}:\n{buf.getvalue()[-3000:]}"
    return buf.getvalue()


def run_python(code: str, tmp: str) -> None:
    code = re.sub(r"""(["'])runs/""", lambda m: m.group(1) + tmp + "/runs/", code)
    lines = []
    for line in code.splitlines():
        expr, sep, want = line.partition("  # -> ")
        lines.append(f"assert ({expr.strip()}) == {want.strip()}, repr({expr.strip()})" if sep else line)
        if sep:
            ast.literal_eval(want.strip())  # the expected value is a plain literal
    exec(compile("\n".join(lines), "<doc>", "exec"), {"__name__": "__doc__"})


def check_output(expected: str, got: str, tmp: str) -> None:
    want = [ln for ln in mask(expected, tmp) if ln != "..."]
    have = mask(got, tmp)
    i = 0
    for w in want:
        while i < len(have) and have[i] != w:
            i += 1
        assert i < len(have), f"documented output line not found (in order): {w!r}\nreal output:\n{got[-4000:]}"
        i += 1


MARKED = [p for p in PAGES if blocks(open(os.path.join(ROOT, p), encoding="utf-8").read())]


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_marked_examples_run(tmp_path, monkeypatch):
    """All pages in one test: one process, so a page's tiny run reuses the compiles of the page before it."""
    assert "docs/training.md" in MARKED
    monkeypatch.chdir(ROOT)
    for page in MARKED:
        tmp = str(tmp_path / page.replace("/", "_"))
        os.makedirs(tmp)
        last_out = None
        for mode, lang, code in blocks(open(os.path.join(ROOT, page), encoding="utf-8").read()):
            try:
                if mode == "output":
                    assert last_out is not None, "an output block without a command block before it"
                    check_output(code, last_out, tmp)
                elif lang in ("bash", "sh", "shell"):
                    last_out = "".join(run_command(c, tmp, mode == "dry_run") for c in commands(code))
                elif lang == "python":
                    run_python(code, tmp)
                    last_out = None
                else:
                    raise AssertionError(f"a doctest block must be bash or python, got {lang!r}")
            except AssertionError as e:
                raise AssertionError(f"{page}: {e}\nblock:\n{code[:600]}") from None


def test_the_doctest_reader():
    text = "x\n<!-- doctest: dry_run -->\n```bash\npython -m experiments.launch --a 1 \\\n    --b 2  # note\n# c\n```\n"
    assert blocks(text) == [("dry_run", "bash", "python -m experiments.launch --a 1 \\\n    --b 2  # note\n# c")]
    assert commands(blocks(text)[0][2]) == ["python -m experiments.launch --a 1 --b 2"]
    assert mask("pass@1 0.125 in /t/runs/x 12 s", "/t") == ["pass@# # in runs/x # s"]
    with pytest.raises(AssertionError):
        check_output("a 1\nb 2", "b 3\na 4", "/t")  # order matters
    check_output("a 1\n...\nb 2", "a 7\nzzz\nb 9", "/t")
    with pytest.raises(AssertionError, match="python -m experiments"):
        run_command("make demo", "/t", False)
    run_python("x = [1, 2]\nlen(x)  # -> 2", "/t")
    with pytest.raises(AssertionError):
        run_python("len([1])  # -> 2", "/t")


def test_help_config_documents_every_field_itself():
    """--help_config: every field (model.* and reward.* included) has its own one-line doc, no pointer elsewhere,
    and the step-reward fields do not claim sympy checks (rewards/steps.py uses exact Fraction arithmetic)."""
    from rl import config_validation as cv

    lines = cv.describe().splitlines()
    assert any(ln.startswith("model.") for ln in lines) and any(ln.startswith("reward.") for ln in lines)
    for ln in lines:
        field, sep, doc = ln.partition("  # ")
        assert sep and len(doc.strip()) > 3, f"undocumented field: {ln!r}"
        assert "documented there" not in doc and "see there" not in doc, ln
        if "step" in field:
            assert "sympy" not in doc.lower(), ln


DOC_PAGES = PAGES + ["REPRODUCING.md", "BENCHMARKS.md"]
INLINE = re.compile(r"`(python3? -m experiments\.[^`]+)`")


def documented_commands(text: str) -> list[str]:
    """Every `python -m experiments.X ...` a page shows: in fenced blocks of any kind (continuations joined, a
    leading `$ ` dropped) and in inline code."""
    out, in_fence, block = [], False, []
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if in_fence:
                out += commands("\n".join(block))
            in_fence, block = not in_fence, []
        elif in_fence:
            block.append(re.sub(r"^\s*\$ ", "", line))
    out += [m.group(1) for m in INLINE.finditer(text)]
    cmd = re.compile(r"^(\S*/)?python3? -m (experiments(\.[a-z0-9_]+)+)(\s.*)?$")  # .venv/bin/python too; not NAME
    out = [re.sub(r"^(\w+=\S* )+", "", c) for c in out]
    return [f"python -m {m.group(2)}{m.group(4) or ''}" for m in map(cmd.match, out) if m]


class _Parsed(Exception):
    pass


def parser_of(module_name: str, monkeypatch):
    """The argparse parser a module's main() builds, captured as main() starts parsing (nothing runs)."""
    import argparse

    seen = {}

    def capture(self, *a, **k):
        seen["parser"] = self
        raise _Parsed

    module = importlib.import_module(module_name)
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        m.setattr(argparse.ArgumentParser, "parse_args", capture)
        m.setattr("sys.argv", [module_name])
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                module.main([])
            except _Parsed:
                pass
    assert "parser" in seen, f"{module_name}.main() builds no argparse parser"
    return seen["parser"]


def flags_of(cmd: str) -> tuple[str, list[str]]:
    """(module, the --flags of a documented command), placeholders such as `[--seeds 0,1,2]` unwrapped."""
    words = [w[1:] if w.startswith("[--") else w for w in shlex.split(cmd, comments=True)]
    return words[2], [w.split("=", 1)[0].rstrip("]") for w in words[3:] if w.startswith("--") and len(w) > 2]


def test_documented_commands_use_flags_that_exist(monkeypatch):
    """A documented command whose flag was renamed or removed fails here (README.md, docs/*.md, REPRODUCING.md,
    BENCHMARKS.md; every code block and inline command, not only the doctest ones): each --flag must be one the
    module's argument parser knows (--config.* overrides for the launcher and the sweep)."""
    monkeypatch.chdir(ROOT)
    parsers, bad, n = {}, [], 0
    for page in DOC_PAGES:
        for cmd in documented_commands(open(os.path.join(ROOT, page), encoding="utf-8").read()):
            module, flags = flags_of(cmd)
            if module not in parsers:
                parsers[module] = set(parser_of(module, monkeypatch)._option_string_actions)
            for f in flags:
                n += 1
                if f not in parsers[module] and not (f.startswith("--config.") and module in (
                        "experiments.launch", "experiments.sweep")):
                    bad.append(f"{page}: {module} has no {f} ({cmd[:120]})")
    assert n > 100 and not bad, "\n".join(bad)


def test_the_flag_check_catches_a_removed_flag(monkeypatch):
    text = "```bash\n$ python -m experiments.sample --workdir runs/x \\\n    --no_such_flag 3\n```\nor `python -m " \
           "experiments.eval --ckpt best`"
    cmds = documented_commands(text)
    assert cmds == ["python -m experiments.sample --workdir runs/x --no_such_flag 3",
                    "python -m experiments.eval --ckpt best"]
    known = set(parser_of("experiments.sample", monkeypatch)._option_string_actions)
    assert "--workdir" in known and flags_of(cmds[0])[1][1] not in known
