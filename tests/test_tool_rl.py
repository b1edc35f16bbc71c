"""RL on tool trajectories (rl/tool_rollout.py): the policy's own text (tool output removed) is what rewards read,
the loss / KL / advantages see policy tokens only, tool metrics and the copied-answer sign, and a tiny GRPO
iteration whose rollouts call a deterministic tool end to end (mismatch at float32 round-off)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import tool_arith
from experiments.configs.common import stage
from models import transformer
from models.tokenizer import ByteTokenizer
from rewards.parse import extract_answer
from rewards.python_tool import PythonTool, byte_markers
from rl import config_validation as cv
from rl import hacking, losses, rollout, stages, tool_rollout
from rl.context import build_context
from rl.stages import iteration

TOK = ByteTokenizer()
M = byte_markers()


def response(*parts):
    """(ids, policy mask) of a response made of (text, is_policy) parts, EOS appended to the policy's last."""
    ids, mask = [], []
    for text, pol in parts:
        x = TOK.encode(text, add_bos=False)
        ids += x
        mask += [int(pol)] * len(x)
    return np.array(ids + [TOK.EOS], np.int32), np.array(mask + [1], np.int32)


def test_policy_text_drops_tool_output_and_turns_show_each_segment():
    ids, mask = response(("<py>print(6*7)</py>", True), ("<out>Answer: 99\n</out>", False), (" Answer: 42", True))
    text = tool_rollout._policy_text(TOK, ids, mask, len(ids))
    assert text == "<py>print(6*7)</py> Answer: 42"
    assert extract_answer(text) == "42"  # the tool's "Answer: 99" cannot answer for the policy
    turns = tool_rollout.turn_records(TOK, ids, mask, len(ids))
    assert [t["role"] for t in turns] == ["policy", "tool", "policy"]
    assert turns[1]["text"] == "<out>Answer: 99\n</out>"
    a = {"tokens": np.concatenate([np.zeros((1, 3), np.int32), ids[None]], 1), "resp_start": np.array([3]),
         "lengths": np.array([len(ids)]), "loss_mask": np.concatenate([np.zeros((1, 3), np.int32), mask[None]], 1)}
    assert tool_rollout.policy_texts(TOK, a) == [text]


@pytest.mark.parametrize("code,out,answer,copied,errors", [
    ("print(4200)", "4200\n", "4200", 1, 0),             # a literal printed, then copied: the sign
    ("print(60*70)", "4200\n", "4200", 0, 0),            # computed by the program: fine
    ("print('4200')", "4200\n", "4200", 1, 0),
    ("print(4200)", "4200\n", "17", 0, 0),               # printed a literal, answered something else
    ("print(1/0)", "ZeroDivisionError: division by zero", "3", 0, 1),
])
def test_row_facts_count_tool_tokens_errors_and_copied_answers(code, out, answer, copied, errors):
    tool_text = f"{M.out_start}{out}{M.out_end}"
    ids, mask = response((f"{M.call_start}{code}{M.call_end}", True), (tool_text, False), (f"\nAnswer: {answer}", True))
    n_tool, n_err, cp = tool_rollout.row_facts(TOK, ids, mask, len(ids), M)
    assert (n_tool, n_err, cp) == (len(TOK.encode(tool_text, add_bos=False)), errors, copied)


def test_chat_tool_turns_read_whole_although_they_hold_eos_ids():
    """A chat template's tool turn starts with the assistant turn's end (the EOS id) and a decode stops at EOS: the
    turn's text in samples.jsonl and the error / copied-answer facts still read the whole output."""
    from experiments.configs.fixtures import make_tiny_files
    from models.tokenizer import HFTokenizer

    tok = HFTokenizer.from_pretrained(f"{make_tiny_files()}/model")
    tool = PythonTool(tok)
    m = tool.markers
    assert m.out_start.startswith("<|im_end|>") and tok.encode("<|im_end|>", add_bos=False) == [tok.eos_id]
    for code, out, answer, errors, copied in (("print(1/0)", "ZeroDivisionError: division by zero", "3", 1, 0),
                                              ("print(4200)", "4200\n", "4200", 0, 1)):
        parts = [tok.encode(f"{m.call_start}{code}{m.call_end}", add_bos=False), tool.output_ids(out),
                 tok.encode(f"Answer: {answer}", add_bos=False)]
        ids = np.array([i for p in parts for i in p], np.int32)
        mask = np.array([1] * len(parts[0]) + [0] * len(parts[1]) + [1] * len(parts[2]), np.int32)
        turns = tool_rollout.turn_records(tok, ids, mask, len(ids))
        assert [t["role"] for t in turns] == ["policy", "tool", "policy"]
        assert turns[1]["text"] == m.out_start + out + m.out_end == tool_rollout.tool_text(tok, parts[1])
        assert tool_rollout.row_facts(tok, ids, mask, len(ids), m) == (len(parts[1]), errors, copied)


def test_a_chat_cold_start_shows_the_tool_turn_its_rollouts_produce():
    """A tool_mul gold solution for a chat model (RunContext.solution -> python_tool.demonstration): the output block
    becomes the template's tool turn, the very text (and ids) the Python tool appends after the call; the byte
    tokenizer's demonstration is unchanged."""
    import random

    from experiments.configs.fixtures import make_tiny_files
    from models.tokenizer import HFTokenizer
    from rewards.python_tool import demonstration
    from rl.tasks.render import render_solution
    from rl.tasks.tool_arith import TOOL_MUL

    tok = HFTokenizer.from_pretrained(f"{make_tiny_files()}/model")
    p = TOOL_MUL.problem(random.Random(0), 1)
    gold = render_solution(p, "en")
    assert demonstration(ByteTokenizer(), gold) == gold and "<out>" in gold
    text = demonstration(tok, gold)
    tool = PythonTool(tok)
    call_end = text.index(tool.markers.call_end) + len(tool.markers.call_end)
    out_ids = tool(np.array(tok.encode(text[:call_end], add_bos=False), np.int32))
    reply = tool_rollout.tool_text(tok, out_ids)
    assert reply == f"<|im_end|>\n<|im_start|>tool\n{p.answer}\n<|im_end|>\n<|im_start|>assistant\n"
    assert text[call_end:].startswith(reply) and text.endswith(f"Answer: {p.answer}")
    ids = tok.encode(text, add_bos=False)
    start = len(tok.encode(text[:call_end], add_bos=False))
    assert ids[start:start + len(out_ids)] == list(out_ids)  # one tokenization: the tool's ids appear verbatim


def test_loss_kl_and_normalisers_ignore_tool_tokens():
    """with_policy_mask puts the policy mask on the train rows; the clipped loss and the KL aggregated with it
    (every aggregation) do not move when anything on tool tokens changes, and equal a float64 reference over
    policy tokens only."""
    P = 4
    ids, pmask = response(("<py>x</py>", True), ("<out>1</out>", False), ("A: 1", True))
    L = len(ids)
    smpl = tool_rollout.ToolSamples(prompt_index=np.array([0]), tokens=ids[None], logprobs=np.zeros((1, L), np.float32),
                                    lengths=np.array([L], np.int32), texts=[""], group_sizes=np.array([1]),
                                    policy_mask=pmask[None], turns=np.array([1]))
    b = tool_rollout.with_policy_mask(rollout.build_batch([[1, 5, 6, 7]], smpl, P + L + 3), smpl)
    m = b["loss_mask"].astype(np.float64)
    np.testing.assert_array_equal(m[0, P : P + L], pmask)
    assert m[0, :P].sum() == 0 and m[0, P + L :].sum() == 0
    rng = np.random.default_rng(0)
    T = m.shape[1]
    logp, old, ref = (rng.normal(-2, 0.3, (1, T)) for _ in range(3))
    adv = rng.normal(0, 1, (1, T))
    tool_pos = (b["attn_mask"] > 0) & (m == 0)
    tool_pos[0, :P] = False
    assert tool_pos.sum() == len(TOK.encode("<out>1</out>", add_bos=False))
    junk = lambda x: np.where(tool_pos, x + 7.0, x)  # noqa: E731
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        def loss(lp, o, a, r):
            pl, _ = losses.policy_loss(jnp.asarray(lp, jnp.float32), jnp.asarray(o, jnp.float32),
                                       jnp.asarray(a, jnp.float32), jnp.asarray(m, jnp.float32), 0.2, 0.28, agg=agg,
                                       max_len=32)
            kl = losses.aggregate(losses.kl_penalty(jnp.asarray(lp, jnp.float32), jnp.asarray(r, jnp.float32), "k3"),
                                  jnp.asarray(m, jnp.float32), agg, 32)
            return float(pl), float(kl)
        base = loss(logp, old, adv, ref)
        assert loss(junk(logp), junk(old), junk(adv), junk(ref)) == base
        # float64 reference over policy tokens only
        ratio = np.exp(logp - old)
        per = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 1.28))
        d = ref - logp
        kl_tok = np.exp(d) - d - 1
        n = m.sum()
        den = {"token-mean": n, "seq-mean-token-mean": n, "seq-mean-token-sum": 1.0, "seq-mean-token-sum-norm": 32.0}
        np.testing.assert_allclose(base, ((per * m).sum() / den[agg], (kl_tok * m).sum() / den[agg]), rtol=1e-5)


class ForcedTool:
    """A deterministic tool_fn that answers every sampled call-end id: the byte ids of '<out>7\\n</out>'."""

    call_end_ids = list(range(3, 259))  # every byte: a random tiny policy calls at once
    reply = TOK.encode("<out>7\n</out>", add_bos=False)

    def __call__(self, row_ids):
        return list(self.reply)


class ForcedChatTool:
    """A deterministic tool_fn for a chat tokenizer: every sampled id but the stop and pad ids is a call end, and
    every call gets the real Python tool's reply to `print(6*7)` (its chat tool turn around "42\\n"), run once in
    the sandbox here."""

    def __init__(self, tok):
        real = PythonTool(tok)
        self.reply = real.output_ids(real.run("print(6*7)"))
        stops = {int(i) for i in tok.stop_ids} | {int(tok.PAD)}
        self.call_end_ids = [i for i in range(tok.vocab_size) if i not in stops]

    def __call__(self, row_ids):
        return list(self.reply)


@pytest.mark.parametrize("kind", ["grpo", pytest.param("ppo", marks=pytest.mark.slow)])
def test_tiny_rl_iteration_with_tool_calls(kind, tmp_path, monkeypatch):
    """One GRPO (PPO) iteration of tool_arith's tiny variant (no cold start) with a forced tool: calls happen, the
    tool ids sit verbatim in the train rows under loss_mask 0, with behaviour logprob, advantage and KL 0 there, and
    the sampler / trainer mismatch stays at float32 round-off."""
    monkeypatch.setattr(tool_rollout, "make_tool", lambda tok, cfg: ForcedTool())
    c = tool_arith.get_config("variant=tiny")
    if kind == "grpo":
        c.stages = [c.stages[1]]
        c.stages[0].update(dict(iterations=1, n_prompts=2, samples=2, kl_coef=0.05))
    else:
        c.stages = [stage("ppo", "ppo", iterations=1, n_prompts=2, samples=2, token_budget=1024,
                                     warmup_steps=0, kl_coef=0.05, tools=dict(tool_arith.TOOLS))]
    ctx = build_context(cv.validate(c), str(tmp_path))
    cfg = stages.parse_stage(ctx.cfg.stages[0].to_dict() if hasattr(ctx.cfg.stages[0], "to_dict")
                             else ctx.cfg.stages[0])
    assert cfg.tools.on and cfg.kl.uses_reference
    seen = {}
    real_update = iteration.update

    def spy(st, a, extra, keep, coef, u):
        seen.update(a=a, extra=extra)
        return real_update(st, a, extra, keep, coef, u)

    monkeypatch.setattr(iteration, "update", spy)
    params = transformer.init(ctx.model_cfg, jax.random.PRNGKey(0))
    st = stages.init(ctx, 0, cfg, params)
    st, m = stages.unit(st, 0)
    assert m["tools/calls_per_sample"] > 0 and m["tools/tokens"] > 0
    assert m["mismatch/logp_max_abs"] <= 1e-4
    a, adv = seen["a"], seen["extra"]["advantages"]
    reply = ForcedTool.reply
    n_found = 0
    for r in range(a["tokens"].shape[0]):
        s, L = int(a["resp_start"][r]), int(a["lengths"][r])
        resp, lm = a["tokens"][r, s : s + L], a["loss_mask"][r, s : s + L]
        for start, end, pol in tool_rollout.segments(lm, L):
            if pol:
                continue
            seg = list(resp[start:end])
            assert seg == reply[: len(seg)]  # verbatim (cut only by the length budget)
            n_found += 1
        tool_pos = np.zeros(a["tokens"].shape[1], bool)
        tool_pos[s : s + L] = lm == 0
        assert not a["sample_logp"][r, tool_pos].any() and not adv[r, tool_pos].any()
        assert not (a["ref_logp"][r, tool_pos]).any()  # the reference logprobs are masked: KL 0 there
        kl = np.asarray(losses.kl_penalty(jnp.asarray(a["sample_logp"][r]), jnp.asarray(a["ref_logp"][r]), "k3"))
        assert not (kl * a["loss_mask"][r])[tool_pos].any()
    assert n_found == int(a["tool_turns"].sum())


def test_tool_copy_sign_only_in_tool_stages():
    recs = [{"step": i, "phase": "train", "accuracy": 0.3, "response_length": 40.0, "reward/format": 0.9,
             "tools/copied_answer": 0.3 * i / 11} for i in range(12)]
    rep = hacking.stage_report(recs)
    assert "tool_copy" in rep["flagged"]
    want = np.mean([0.3 * i / 11 for i in (8, 9, 10, 11)])  # the last third's mean
    assert rep["signs"]["tool_copy"]["numbers"]["copied_end"] == pytest.approx(want)
    quiet = hacking.stage_report([{**r, "tools/copied_answer": 0.0} for r in recs])
    assert quiet["signs"]["tool_copy"]["flag"] is False
    plain = hacking.stage_report([{k: v for k, v in r.items() if not k.startswith("tools/")} for r in recs])
    assert "tool_copy" not in plain["signs"]


def test_tools_section_is_off_by_default_and_refuses_routes():
    g = stages.parse_stage(stages.defaults("grpo"))
    assert not g.tools.on and g.to_dict()["tools"]["kind"] == ""
    from schema import FieldErrors
    with pytest.raises(FieldErrors, match="tools"):
        stages.parse_stage({**stages.defaults("grpo"), "tools": {"kind": "python"}, "routing_replay": True})
    with pytest.raises(FieldErrors, match="kind"):
        stages.parse_stage({**stages.defaults("ppo"), "tools": {"kind": "bash"}})
    assert dataclasses.replace(g.tools, kind="python").on


@pytest.mark.slow  # ~35 s with a warm compile cache: two launches with evals
def test_tool_arith_tiny_runs_both_arms(tmp_path):
    """The recipe's tiny variant end to end: cold start on tool demonstrations, GRPO with tools (metrics of the
    tool calls, evals with pass@1 with and without tools, samples.jsonl turns); the no-tool arm samples without."""
    import json
    import os

    from experiments import launch
    from rl.metrics import read_jsonl

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "experiments/configs/tool_arith.py")
    for arm in ("tools", "notools"):
        wd = tmp_path / arm
        assert launch.main(["--config", f"{path}:variant=tiny,arm={arm}", "--workdir", str(wd)]) == 0
        recs = read_jsonl(wd / "metrics.jsonl")
        train = [r for r in recs if r["phase"] == "train" and r["stage"] == "grpo"]
        evals = [r for r in recs if r["phase"] == "eval"]
        assert train and all(r["mismatch/logp_max_abs"] <= 1e-4 for r in train)
        samples = [json.loads(x) for x in (wd / "samples.jsonl").read_text().splitlines()]
        if arm == "tools":
            assert all("tools/calls_per_sample" in r for r in train)
            assert all("validation/pass@1_no_tools" in r for r in evals)
            assert all(r["validation/pass@1"] == r["validation/pass@1_tools"] for r in evals)  # judged with tools
            tool_recs = [s for s in samples if s["kind"] == "greedy+tools"]
            assert tool_recs and all(t["role"] in ("policy", "tool") for s in tool_recs for t in s["turns"])
            # experiments.eval --tools on the run's checkpoint: the same figures, in evals/last-test-tools.json
            from experiments import eval as ev_cli

            assert ev_cli.main(["--workdir", str(wd), "--ckpt", "last", "--tools", "--n", "4", "--k", "0"]) == 0
            saved = json.loads((wd / "evals" / "last-test-tools.json").read_text())
            assert saved["tools"]["kind"] == "python" and saved["metrics"]["n_problems"] == 4
            assert saved["metrics"]["pass@1"] == saved["metrics"]["pass@1_tools"]
            assert {"pass@1_no_tools", "tools/calls_per_sample", "tools/errors"} <= set(saved["metrics"])
        else:
            assert not any(k.startswith("tools/") or "pass@1_tools" in k for r in recs for k in r)
            assert not any(s["kind"] == "greedy+tools" for s in samples)


@pytest.mark.slow  # 20-30 s with a cold compile cache: a launch with two evals and two GRPO iterations
def test_smollm2_tools_tiny_runs_with_tools_end_to_end(tmp_path, monkeypatch):
    """smollm2_tools.py's tiny variant (the recipe on the fixtures.py tiny checkpoint: chat template, tool system
    prompt, LoRA, KL) with the forced chat tool: both GRPO iterations call the tool and take optimizer steps with the
    mismatch at float32 round-off, every eval reports pass@1 with and without tools, and samples.jsonl shows the
    tool's chat turn with the real tool's output."""
    import json
    import os

    from experiments import launch
    from models.tokenizer import HFTokenizer
    from rewards.python_tool import TOOL_SYSTEM_PROMPT
    from rl.metrics import read_jsonl

    monkeypatch.setattr(tool_rollout, "make_tool", lambda tok, cfg: ForcedChatTool(tok))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "experiments/configs/smollm2_tools.py")
    wd = tmp_path / "run"
    assert launch.main(["--config", f"{path}:variant=tiny", "--workdir", str(wd)]) == 0
    recs = read_jsonl(wd / "metrics.jsonl")
    train = [r for r in recs if r["phase"] == "train"]
    evals = [r for r in recs if r["phase"] == "eval"]
    assert len(train) == 2 and evals
    for r in train:
        assert r["tools/calls_per_sample"] > 0 and r["tools/errors"] == 0
        assert "skipped_iteration" not in r and np.isfinite(r["loss"]) and r["mismatch/logp_max_abs"] <= 1e-4
    assert all(r["validation/pass@1"] == r["validation/pass@1_tools"] and "validation/pass@1_no_tools" in r
               and r["validation/tools/calls_per_sample"] > 0 for r in evals)
    from experiments.configs.fixtures import make_tiny_files

    tok = HFTokenizer.from_pretrained(f"{make_tiny_files()}/model")
    reply = tool_rollout.tool_text(tok, ForcedChatTool(tok).reply)
    assert "<|im_start|>tool\n42\n" in reply
    samples = [json.loads(x) for x in (wd / "samples.jsonl").read_text().splitlines()]
    tool_recs = [s for s in samples if s["kind"] == "greedy+tools"]
    assert tool_recs and all(s["prompt"].startswith("<|im_start|>system\n" + TOOL_SYSTEM_PROMPT) for s in tool_recs)
    tool_turns = [t["text"] for s in tool_recs for t in s["turns"] if t["role"] == "tool"]
    assert tool_turns and all(reply.startswith(t) for t in tool_turns)  # verbatim (cut only by the budget)
    assert any(t == reply for t in tool_turns)
