"""A Python tool for tool-integrated sampling: the code between the call markers runs in the sandbox and its output
comes back as token ids, tokenized once (models/tool_sampling.generate_with_tools calls it at each call end).

    tool = PythonTool(tok)                              # markers: byte_markers() or chat_markers(tok)
    out = generate_with_tools(params, cfg, prompts, key, tool_fn=tool, call_end_ids=tool.call_end_ids,
                              max_turns=3, max_new_tokens=256, eos_id=tok.stop_ids, pad_id=tok.pad_id, ...)

A row whose text ends with the call-end marker, after a call-start marker, is a call: the text between them is run
by rewards/code_exec.py's sandbox (every guarantee of docs/security.md holds: the code runs in the same contained
process as generated code under test, with ExecConfig's limits) and the tool returns the ids of

    out_start + stdout + out_end             or, when the code raised,   out_start + <the error's last line> + out_end

stdout capped at max_output_chars characters inside the sandbox and the ids at max_output_tokens (the ids of the
closing marker are always kept, so the model sees where the output ends). The output is data: every marker string
and every special-token string of the tokenizer is removed from it before tokenizing, so no program can close its
output block early, forge a turn or an EOS, or print a call. A row that does not end with a whole call (a call-end
id that ends something else, e.g. the ">" of "<py>" for the byte tokenizer) gets None: not a call, no turn counted.

Markers. Byte tokenizer (fixed, byte_markers()):   <py> code </py>   then   <out> output </out>
(call_end_ids = [id of ">"]: the sampler pauses at every sampled ">" and this tool answers None unless the text ends
with "</py>".) Chat tokenizer (chat_markers(tok)): the call markers are the same text; the output markers come from
the chat template: a conversation [user, assistant, tool] is rendered with sentinels, and out_start is the text from
the end of the assistant's content to the tool's content (the assistant turn's end and the template's tool turn
header), out_end the text from the tool's content to the end with add_generation_prompt (the tool turn's end and a
new assistant header). A template without a `tool` role (it raises, or drops the message) gets the same with a
`user` turn whose content is wrapped in <out> ... </out>.

Rewards on a tool-using answer should read what the policy wrote (the tokens under generate_with_tools'
policy_mask), not the tool's output: a program that prints "\\boxed{42}" would otherwise answer for the policy.
Text-level markers cannot tell the two apart (the policy may write "<out>" itself); the token-level mask can.
"""
from __future__ import annotations

import dataclasses
import re

from models.chat_template import TemplateLimit
from rewards.code_exec import ExecConfig, run_function_tests_detailed

_SENTINEL_A = "\u2063ASSISTANT_SENTINEL\u2063"
_SENTINEL_T = "\u2063TOOL_SENTINEL\u2063"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolMarkers:
    call_start: str  # the policy writes call_start + code + call_end
    call_end: str
    out_start: str  # the tool answers out_start + output + out_end
    out_end: str


def byte_markers() -> ToolMarkers:
    """The fixed markers of the byte tokenizer (short: every byte is a token)."""
    return ToolMarkers(call_start="<py>", call_end="</py>", out_start="<out>", out_end="</out>")


def _tool_system_prompt(m: ToolMarkers) -> str:
    return (f"To multiply, call the Python tool: reply with {m.call_start}print(A*B){m.call_end}, where A and B are "
            f"the two numbers. For 123*45 you reply:\n{m.call_start}print(123*45){m.call_end}\nThe tool replies "
            f"5535, then you reply: Answer: 5535")


# A system turn for a chat model with the tool (model.system_prompt; `experiments.eval --model ... --tools`): how to
# call it, with the exact call markers (the same text for every tokenizer: byte_markers and chat_markers share
# them; only the output markers come from the chat template) and one short example. Worded for products (the
# tool_mul family): of 10 wordings tried on SmolLM2-135M-Instruct (greedy, 8 products), longer and more general
# ones ("write a Python program that prints the result ...") made it describe the tool or write ``` blocks
# instead of calling it (0-2 calls with the factors in 8); this one 6 in 8. docs/tools.md has the figures.
TOOL_SYSTEM_PROMPT = _tool_system_prompt(byte_markers())


def chat_markers(tok) -> ToolMarkers:
    """Output markers from tok's chat template (a `tool` turn, else a `user` turn with <out> ... </out>)."""
    base = byte_markers()
    for role, inner_start, inner_end in (("tool", "", ""), ("user", base.out_start, base.out_end)):
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL_A},
                    {"role": role, "content": _SENTINEL_T}]
        try:  # through the one bounded renderer (models/chat_template.py): a loop only for the tool role ends
            text = tok.render_chat_template(messages, add_generation_prompt=True)
        except TemplateLimit as e:  # a template past its bounds is an error, not "no tool role"
            raise ValueError(f"chat_markers: rendering a {role} turn: {e}") from None
        except Exception:  # noqa: BLE001 - jinja2's TemplateError (raise_exception) or a template bug: next role
            continue
        a, t = text.find(_SENTINEL_A), text.find(_SENTINEL_T)
        if a < 0 or t < a:
            continue
        return dataclasses.replace(base, out_start=text[a + len(_SENTINEL_A): t] + inner_start,
                                   out_end=inner_end + text[t + len(_SENTINEL_T):])
    raise ValueError("chat_markers: the chat template renders neither a tool nor a user turn after an assistant turn")


# Runs inside the sandbox: the tool's code under exec with stdout captured (the first `cap` characters), returning
# [stdout, the error's last line or ""] as JSON. BaseException too: the harness's per-call alarm arrives as one.
_WRAPPER = '''
def _tool_main(source, cap):
    import builtins, sys, traceback

    class Capped:
        def __init__(self):
            self.parts, self.n = [], 0
        def write(self, s):
            s = str(s)
            if self.n < cap:
                self.parts.append(s[: cap - self.n])
            self.n += len(s)
            return len(s)
        def flush(self):
            pass

    out = Capped()
    sys.stdout = out
    error = ""
    try:
        exec(compile(source, "<tool>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except BaseException as e:
        lines = traceback.format_exception_only(type(e), e)
        error = (lines[-1] if lines else type(e).__name__).strip()
    finally:
        sys.stdout = sys.__stdout__
    return ["".join(out.parts), error]
'''


def demonstration(tok, text: str) -> str:
    """A gold tool-use solution (rl/tasks/tool_arith.py writes its output blocks with byte_markers) in `tok`'s
    markers: for a chat tokenizer each `<out>...</out>` block becomes the template's tool turn, the text the tool
    rollout appends after a call, so a cold start on a chat model shows the trajectory its rollouts produce.
    Unchanged for the byte tokenizer and for text without an output block."""
    b = byte_markers()
    if not getattr(tok, "chat_template", None) or b.out_start not in text:
        return text
    c = chat_markers(tok)
    return text.replace(b.out_start, c.out_start).replace(b.out_end, c.out_end)


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """text with every lone surrogate (U+D800..U+DFFF, which no UTF-8 tokenizer can encode) replaced by U+FFFD.

    A program can print or raise one (print('\\ud800')); the sandbox's JSON carries it back escaped, and the
    tokenizer's encode then raised (UnicodeEncodeError, or TypeError from an HF tokenizer) in the tool thread pool,
    which ended the run (and a resume replayed the same samples). json.loads already joins valid surrogate pairs."""
    return _SURROGATE.sub("\ufffd", text)


class PythonTool:
    """tool_fn for generate_with_tools: row ids -> output ids (or None when the row does not end with a call)."""

    def __init__(self, tok, markers: ToolMarkers | None = None, *, exec_cfg: ExecConfig | None = None,
                 max_output_tokens: int = 64, max_output_chars: int = 2000):
        if not isinstance(max_output_tokens, int) or max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be an int >= 1, got {max_output_tokens!r}")
        if not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise ValueError(f"max_output_chars must be an int >= 1, got {max_output_chars!r}")
        self.tok = tok
        self.markers = markers or default_markers(tok)
        # The JSON of the captured output: up to 6 characters per character (\\uXXXX), plus the error line.
        self.exec_cfg = exec_cfg or ExecConfig(timeout_s=5.0, per_test_timeout_s=3.0, cpu_s=5,
                                               max_output_chars=6 * max_output_chars + 2000)
        self.max_output_tokens = max_output_tokens
        self.max_output_chars = max_output_chars
        self._close_ids = tok.encode(self.markers.out_end, add_bos=False)
        if len(self._close_ids) >= max_output_tokens:
            raise ValueError(f"max_output_tokens {max_output_tokens} leaves no room inside the closing marker's "
                             f"{len(self._close_ids)} ids")
        end_ids = tok.encode(self.markers.call_end, add_bos=False)
        if not end_ids:
            raise ValueError("the call_end marker encodes to no ids")
        self.call_end_ids = [end_ids[-1]]
        # Strings an output may not contain: the markers, and (HF tokenizers) every special token's text.
        specials = getattr(tok, "special_tokens", {}).values()
        added = getattr(getattr(tok, "_tok", None), "get_added_tokens_decoder", lambda: {})()
        self._forbidden = sorted({*dataclasses.asdict(self.markers).values(), *specials,
                                  *(t.content for t in added.values())} - {""}, key=len, reverse=True)

    def extract_code(self, text: str) -> str | None:
        """The code of the call `text` ends with, or None when it does not end with one."""
        return extract_code(self.markers, text)

    def run(self, code: str) -> str:
        """The text a call returns (stdout, or the error's last line), sanitised; never raises."""
        try:
            r = run_function_tests_detailed(_WRAPPER, "_tool_main", [([code, self.max_output_chars], None)],
                                            self.exec_cfg)
        except Exception as e:  # noqa: BLE001 - a harness failure must not end the rollout (it ended a run once)
            return f"Error: the tool failed ({type(e).__name__})"
        value = r.values[0] if r.values else None
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
            stdout, error = value
            text = error or stdout
            if error.endswith("SandboxTimeout"):  # the harness's per-call alarm
                text = "TimeoutError: the code ran over its time limit"
        elif r.timed_out or (r.case_errors and r.case_errors[0] == "timeout"):
            text = "TimeoutError: the code ran over its time limit"
        elif r.case_errors and r.case_errors[0] == "too_long":
            text = "Error: output too long"
        else:
            text = f"Error: {r.error or (r.case_errors[0] if r.case_errors else 'no result')}"
        # The one place tool output becomes text: valid text from here on, so no output can end the run.
        text = valid_text(text[: self.max_output_chars])
        for s in self._forbidden:  # longest first, repeated until none is left (removal can join two halves)
            while s in text:
                text = text.replace(s, "")
        return text

    def output_ids(self, text: str) -> list[int]:
        """out_start + text + out_end tokenized once, capped at max_output_tokens (the closing ids kept)."""
        ids = self.tok.encode(self.markers.out_start + text + self.markers.out_end, add_bos=False)
        if len(ids) > self.max_output_tokens:
            ids = ids[: self.max_output_tokens - len(self._close_ids)] + self._close_ids
        return ids

    def __call__(self, row_ids) -> list[int] | None:
        code = call_code(self.tok, self.markers, row_ids)
        if code is None:
            return None
        return self.output_ids(self.run(code))


def default_markers(tok) -> ToolMarkers:
    """The markers PythonTool(tok) uses: chat_markers for a tokenizer with a chat template, else byte_markers."""
    return chat_markers(tok) if getattr(tok, "chat_template", None) else byte_markers()


def extract_code(markers: ToolMarkers, text: str) -> str | None:
    """The code of the call `text` ends with (call_start + code + call_end), or None when it does not end with one."""
    if not text.endswith(markers.call_end):
        return None
    body_end = len(text) - len(markers.call_end)
    start = text.rfind(markers.call_start, 0, body_end)
    if start < 0 or markers.call_end in text[start:body_end]:
        return None
    return text[start + len(markers.call_start): body_end]


def call_code(tok, markers: ToolMarkers, row_ids) -> str | None:
    """The code of the call the row ends with, or None: the one rule of what a call is (the tool answers by it when
    the sampler pauses, and tool_output_mask finds a demonstration's tool output by it)."""
    # Only the ids after the row's last stop id are decoded: tokenizers' decode ends at EOS, a chat prompt (and
    # a chat tool turn) holds several, and a call never spans one (a sampled EOS ends the row).
    vocab = getattr(tok, "vocab_size", None)  # a model's padded embedding rows may hold ids past it
    ids = [int(i) for i in row_ids if vocab is None or 0 <= int(i) < vocab]
    stops = {int(i) for i in getattr(tok, "stop_ids", (tok.eos_id,))}
    last = max((k for k, i in enumerate(ids) if i in stops), default=-1)
    return extract_code(markers, tok.decode(ids[last + 1:], skip_special=False))


def tool_output_mask(tok, ids, markers: ToolMarkers | None = None) -> list[int]:
    """Per id of a written trajectory (a demonstration, an SFT row): 0 on the tool's output, 1 elsewhere; the
    policy_mask generate_with_tools gives a sampled one.

    By the sampler's own rule: after an id that ends a call (call_code, what PythonTool answers by), the tool appends
    out_start + output + out_end; here those ids are the ones that follow the call when they open with out_start's
    ids, up to and including the first out_end ids (the tool removes the markers from any output, so the first
    out_end closes it; an unclosed block runs to the end of the row). SFT puts no loss there, as RL puts no gradient:
    a cold start must not teach the model to predict the tool's result."""
    markers = markers or default_markers(tok)
    ids = [int(i) for i in ids]
    mask = [1] * len(ids)
    end_ids = tok.encode(markers.call_end, add_bos=False)
    open_ids = tok.encode(markers.out_start, add_bos=False)
    close_ids = tok.encode(markers.out_end, add_bos=False)
    if not end_ids or not open_ids or not close_ids:
        return mask
    t = 0
    while t < len(ids):
        a = t + 1
        if (ids[t] != end_ids[-1] or ids[a: a + len(open_ids)] != open_ids
                or call_code(tok, markers, ids[:a]) is None):
            t += 1
            continue
        b = next((k + len(close_ids) for k in range(a + len(open_ids), len(ids) - len(close_ids) + 1)
                  if ids[k: k + len(close_ids)] == close_ids), len(ids))
        mask[a:b] = [0] * (b - a)
        t = b
    return mask
