"""SFT masks a tool's output as RL does (issue 52, item 4): rl.sft.build_sft_batch puts no loss on the ids the tool
appends after a call (rewards.python_tool.tool_output_mask, the sampler's rule), so garbage there moves neither the
SFT loss nor its gradient, while a policy token does."""
import jax
import jax.numpy as jnp
import numpy as np

from models.tokenizer import ByteTokenizer
from rewards.python_tool import PythonTool
from rl.losses import sft_loss
from rl.sft import build_sft_batch

TOK = ByteTokenizer()
PROMPT = "What is 12*34?"
GOLD = "<py>print(12*34)</py><out>408\n</out>Answer: 408"


def _loss_and_grad(logits, tokens, mask):
    f = lambda lg: sft_loss(lg, jnp.asarray(tokens), jnp.asarray(mask))[0]  # noqa: E731
    v, g = jax.value_and_grad(f)(jnp.asarray(logits))
    return float(v), np.asarray(g)


def test_sft_batch_masks_exactly_the_tools_reply():
    b = build_sft_batch([PROMPT], [GOLD], TOK, 96)
    p = len(TOK.encode(PROMPT, add_bos=True))
    call_end = GOLD.index("</py>") + len("</py>")
    reply = PythonTool(TOK).output_ids("408\n")  # what the tool appends in a rollout, policy_mask 0 there
    start = p + len(TOK.encode(GOLD[:call_end], add_bos=False))
    np.testing.assert_array_equal(b["tokens"][0, start:start + len(reply)], reply)
    n = p + len(TOK.encode(GOLD, add_bos=False, add_eos=True))
    want = np.zeros(96, np.int32)
    want[p:n] = 1
    want[start:start + len(reply)] = 0
    np.testing.assert_array_equal(b["loss_mask"][0], want)
    # no tool call: unchanged (every answer id and the EOS)
    plain = build_sft_batch([PROMPT], ["<out>408</out> Answer: 408"], TOK, 96)
    assert plain["loss_mask"][0].sum() == len(TOK.encode("<out>408</out> Answer: 408", add_bos=False, add_eos=True))


def test_garbage_in_tool_output_moves_no_sft_loss_or_gradient():
    """Same-length garbage inside the output block as the targets: loss and d loss / d logits unchanged; a changed
    policy token (the answer's last digit) changes both."""
    b = build_sft_batch([PROMPT], [GOLD], TOK, 96)
    junk = build_sft_batch([PROMPT], [GOLD.replace("<out>408\n</out>", "<out>#!?\n</out>")], TOK, 96)
    other = build_sft_batch([PROMPT], [GOLD[:-1] + "9"], TOK, 96)
    assert (junk["tokens"] != b["tokens"]).sum() == 3 and (other["tokens"] != b["tokens"]).sum() == 1
    np.testing.assert_array_equal(junk["loss_mask"], b["loss_mask"])
    logits = np.random.default_rng(0).normal(0, 1, (1, 96, 259)).astype(np.float32)
    v, g = _loss_and_grad(logits, b["tokens"], b["loss_mask"])
    vj, gj = _loss_and_grad(logits, junk["tokens"], junk["loss_mask"])
    assert vj == v and np.array_equal(gj, g)
    vo, go = _loss_and_grad(logits, other["tokens"], other["loss_mask"])
    assert vo != v and not np.array_equal(go, g)


def test_chat_cold_start_masks_the_tool_turn():
    """A chat model's demonstration (python_tool.demonstration): no loss on the template's tool turn, the very ids the
    tool appends in a rollout; loss on the call before it and the answer after it."""
    import random

    from experiments.configs.fixtures import make_tiny_files
    from models.tokenizer import HFTokenizer
    from rewards.python_tool import demonstration
    from rl.tasks.render import render_solution
    from rl.tasks.tool_arith import TOOL_MUL

    tok = HFTokenizer.from_pretrained(f"{make_tiny_files()}/model")
    text = demonstration(tok, render_solution(TOOL_MUL.problem(random.Random(0), 1), "en"))
    tool = PythonTool(tok)
    call_end = text.index(tool.markers.call_end) + len(tool.markers.call_end)
    reply = tool(tok.encode(text[:call_end], add_bos=False))
    b = build_sft_batch(["q"], [text], tok, 256)
    p = len(tok.encode("q", add_bos=True))
    start = p + len(tok.encode(text[:call_end], add_bos=False))
    np.testing.assert_array_equal(b["tokens"][0, start:start + len(reply)], reply)
    n = p + len(tok.encode(text, add_bos=False, add_eos=True))
    assert b["loss_mask"][0, start:start + len(reply)].sum() == 0
    assert b["loss_mask"][0, p:start].all() and b["loss_mask"][0, start + len(reply):n].all()
