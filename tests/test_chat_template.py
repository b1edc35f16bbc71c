"""The one bounded renderer of chat templates (models/chat_template.py): hostile templates stop fast with a clear
TemplateLimit (a constant power, a repetition, a JSON indent, widths, doubling loops, joins of one long string,
output), a real template renders as before, and the renders that escaped the bounds go through it:
python_tool.chat_markers (the tool recipe's dry run) and `experiments.eval --model ... --tools`."""
import json
import os
import time
from pathlib import Path

import pytest

from experiments import eval as ev_cli
from experiments import launch
from models import chat_template
from models.tokenizer import HFTokenizer
from rewards.python_tool import chat_markers
from tests.hf_folders import run_ready_folder

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "data" / "hf" / "tokenizer"
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# ChatML, but a tool turn loops ~10^10 times: a dry run that renders only user turns passed it.
TOOL_LOOP = CHATML.replace("{% for m in messages %}", "{% for m in messages %}{% if m['role'] == 'tool' %}{% for i in "
                           "range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}")

HOSTILE = {  # template -> what the error names
    "{{ (3**40000000) > 0 }}": "computes 3 ** 40000000",  # 28 s in one C call, from the compiler's constant folding
    "{{ 9**(9**9) }}": "computes 9 ** 387420489",  # never finished
    "{{ (2**60000) * (2**60000) > 0 }}": "over 65536 bits",
    "{{ 'x' * 1500000000 }}": "by repetition",  # 1.5 GB
    "{{ messages|tojson(indent=100000000) }}": "passes 100000000 to the tojson filter",  # 1.3 GB
    "{{ range(100000)|list|tojson(indent=16) }}": "a JSON text",
    "{{ 'x'|center(1000000000) }}": "passes 1000000000 to the center filter",
    "{{ 'x'.ljust(1000000000) }}": "passes 1000000000 to ljust",
    "{{ '{:>1000000000}'.format(1) }}": "a formatted string",
    "{{ '%1000000000d' % 1 }}": "a %-formatted string",
    "{{ ('a' * 999999)|replace('a', 'xx') }}": "a replaced string",
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}":
        "output",
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}": "by +",
    "{% set s = 'x' * 1000000 %}{{ ([s] * 1000)|join }}": "a joined string",
    "{% set s = 'x' * 1000000 %}{{ [s] * 1000 }}": "output",
    "{% set s = 'x' * 1000000 %}{% set b %}{% for i in range(1000) %}{{ s }}{% endfor %}{% endset %}{{ b }}":
        "output",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "ran past 200000 steps",
}


@pytest.fixture
def tok():
    return HFTokenizer.from_pretrained(FIXTURE)


def _with_template(tok, template: str):
    tok.chat_template = template
    tok.__dict__.pop("_template", None)  # compiled on first use
    return tok


@pytest.mark.parametrize("template", list(HOSTILE))
def test_a_hostile_template_stops_fast_naming_the_bound(tok, template):
    t0 = time.monotonic()
    with pytest.raises(chat_template.TemplateLimit, match="the chat template") as e:
        _with_template(tok, template).render_chat_template([{"role": "user", "content": "hi"}])
    assert HOSTILE[template] in str(e.value) and time.monotonic() - t0 < 2.0


def test_a_loop_keeping_many_bounded_values_alive_stops_at_the_memory_bound(tok, monkeypatch):
    """Each value below is under every size bound, but the list keeps them all: the memory the render gained is
    checked every 64 lines of a long render (here from the start, against 64 MiB; by default past 2048 lines,
    against 1 GiB)."""
    monkeypatch.setattr(chat_template, "MAX_RENDER_BYTES", 64 << 20)
    monkeypatch.setattr(chat_template, "MEMORY_CHECK_AFTER", 0)
    hoard = ("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [('x' * 500000) ~ i] %}"
             "{% endfor %}{{ ns.l|length }}")
    t0 = time.monotonic()
    with pytest.raises(chat_template.TemplateLimit, match="holds over 64 MiB of values"):
        _with_template(tok, hoard).render_chat_template([{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < 2.0


def test_a_real_template_renders_as_before(tok):
    """The fixture's own template renders what transformers rendered (tests/data/hf/tokenizer_expected.json), and
    the bounded operators and filters give their ordinary values."""
    for chat in json.loads((FIXTURE.parent / "tokenizer_expected.json").read_text(encoding="utf-8"))["chats"]:
        kwargs = {k: v for k, v in chat["kwargs"].items() if k not in ("tokenize", "add_generation_prompt")}
        assert tok.render_chat_template(chat["messages"], chat["kwargs"].get("add_generation_prompt", True),
                                        **kwargs) == chat["text"]
    small = ("{{ 2**10 }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ '%03d|%s' % (7, 'x') }} {{ 'x'|center(5) }} "
             "{{ messages|tojson(indent=2)|length }} {{ ['a', 'b']|join(',') }} {{ '{}-{}'.format(1, 2) }} "
             "{{ 'a' ~ 1 }}")
    assert _with_template(tok, small).render_chat_template([{"role": "user", "content": "q"}]) == \
        "1024 ababab [1, 2] 007|x   x   50 a,b 1-2 a1"


def test_chat_markers_stop_on_a_template_that_loops_only_for_the_tool_role(tok):
    """It hung the tool recipe after its dry run (chat_markers rendered with no bound); now a ValueError."""
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="chat_markers: rendering a tool turn: the chat template ran past"):
        chat_markers(_with_template(tok, TOOL_LOOP))
    assert time.monotonic() - t0 < 3.0


def test_the_tool_recipe_dry_run_renders_the_tool_turn(tmp_path, capsys):
    folder = run_ready_folder(tmp_path, context=1024)
    (Path(folder) / "chat_template.jinja").write_text(TOOL_LOOP)
    rc = launch.main(["--config", "experiments/configs/tool_arith.py", "--dry_run", f"--config.model.hf_path={folder}"])
    err = capsys.readouterr().err
    assert rc == 2 and f"model.hf_path: {folder}: chat_markers: rendering a tool turn" in err, err


def test_eval_with_tools_on_a_gguf_whose_tool_turn_loops_exits_2(tmp_path, capsys):
    from test_gguf import model_and_tokenizer_file

    path = model_and_tokenizer_file(tmp_path / "loop.gguf", tok={"tokenizer.chat_template": TOOL_LOOP})
    rc = ev_cli.main(["--model", str(path), "--mix", "tool_mul", "--tools", "--n", "2", "--k", "0",
                      "--max-new-tokens", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and "rendering a tool turn: the chat template ran past" in err, err


def test_every_render_goes_through_the_renderer():
    """No module compiles or renders a template by itself: Jinja is imported by models/chat_template.py only."""
    users = [p for d in ("models", "rewards", "rl", "prm", "experiments") for p in (REPO / d).rglob("*.py")
             if "import jinja2" in p.read_text(encoding="utf-8") or "from jinja2" in p.read_text(encoding="utf-8")]
    assert [os.path.relpath(p, REPO) for p in users] == [os.path.join("models", "chat_template.py")]
