"""experiments.eval --model: a pretrained model (a tiny GGUF file written here) evaluated without a run directory."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("gguf")

from test_tokenizer_gguf import tiny_llama_weights, write_tiny_gguf  # noqa: E402

from experiments import eval as ev_cli  # noqa: E402


def tiny_llama_gguf(path, seed: int = 0):
    """A 2-layer llama (d_model 32, 4 / 2 heads of 8) over the tiny tokenizer's vocabulary, float32 weights."""
    tensors, meta = tiny_llama_weights(seed)
    return write_tiny_gguf(path, llama={"meta": meta, "tensors": tensors})


def test_model_path_evaluates_through_the_chat_template(tmp_path, capsys):
    model = tiny_llama_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "out"
    rc = ev_cli.main(["--model", str(model), "--mix", "add", "--n", "6", "--k", "2", "--temperature", "0.9",
                      "--max-new-tokens", "6", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "pass@1" in printed and "pass@2 (T 0.9)" in printed and "maj@2 (T 0.9)" in printed and "95% CI" in printed
    summary = json.loads((out / "summary.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert summary["metrics"]["n_problems"] == 6 and summary["k"] == 2
    assert len(samples) == 6 * 3  # per problem: greedy + both samples
    greedy = [s for s in samples if s["kind"] == "greedy"]
    # pass@1 is the fraction of greedy answers the reward marked solved, recomputed from the written samples
    assert summary["summary"]["pass@1"] == pytest.approx(np.mean([s["reward"]["solved"] > 0.5 for s in greedy]))
    lo, hi = summary["summary"]["pass@1_ci95"]
    assert 0.0 <= lo <= summary["summary"]["pass@1"] <= hi <= 1.0
    for s in greedy:  # a system turn asking for steps and an Answer line, then the question, then the reply's header
        assert s["prompt"].startswith("<|im_start|>system\n" + ev_cli.SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n")
        assert s["prompt"].endswith("<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow  # ~17 s cold; the tool rollout itself: tests/test_tool_rl.py, test_tool_sampling.py
def test_model_path_with_tools_reports_pass1_with_and_without_and_shows_the_tool_turns(tmp_path, capsys, monkeypatch):
    """--tools on the fixtures.py tiny checkpoint (a Hugging Face folder with a ChatML template) with a forced tool
    (every sampled id is a call; the reply is the real tool's output of print(6*7)): both pass@1 figures, each
    recomputed from the written samples, the tool metrics, the tool system prompt, the tool's turns verbatim; the k
    samples (pass@k, sample accuracy) are drawn with the tool too."""
    from experiments.configs.fixtures import make_tiny_files
    from models.tokenizer import HFTokenizer
    from rewards.python_tool import TOOL_SYSTEM_PROMPT
    from rl import tool_rollout
    from test_tool_rl import ForcedChatTool

    monkeypatch.setattr(tool_rollout, "make_tool", lambda tok, cfg: ForcedChatTool(tok))
    model = f"{make_tiny_files()}/model"  # the tool prompt: 178 of its tokens, padded to 192, + 64 = its context
    out = tmp_path / "out"
    rc = ev_cli.main(["--model", model, "--mix", "tool_mul", "--difficulty", "1", "--tools", "--max-turns", "2",
                      "--n", "4", "--k", "2", "--max-new-tokens", "64", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "pass@1_no_tools" in printed and "tools/calls_per_sample" in printed
    summary = json.loads((out / "summary.json").read_text())
    m = summary["metrics"]
    assert summary["tools"] == {"kind": "python", "max_turns": 2, "max_output_tokens": 32, "timeout_s": 5.0}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    plain = [s for s in samples if s["kind"] == "greedy"]
    with_tools = [s for s in samples if s["kind"] == "greedy+tools"]
    assert len(plain) == len(with_tools) == 4
    assert m["pass@1_no_tools"] == pytest.approx(np.mean([s["reward"]["solved"] > 0.5 for s in plain]))
    assert m["pass@1_tools"] == m["pass@1"] == pytest.approx(np.mean([s["reward"]["solved"] > 0.5
                                                                       for s in with_tools]))
    for s in samples:
        assert s["prompt"].startswith("<|im_start|>system\n" + TOOL_SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n")
    tok = HFTokenizer.from_pretrained(model)
    reply = tool_rollout.tool_text(tok, ForcedChatTool(tok).reply)
    assert reply == "<|im_end|>\n<|im_start|>tool\n42\n<|im_end|>\n<|im_start|>assistant\n"
    calls = [sum(t["role"] == "tool" for t in s["turns"]) for s in with_tools]
    assert m["tools/calls_per_sample"] == pytest.approx(np.mean(calls)) and max(calls) == 2  # max_turns holds
    assert m["tools/errors"] == 0
    sampled = [s for s in samples if s["kind"].startswith("sample")]
    assert len(sampled) == 4 * 2 and all(any(t["role"] == "tool" for t in s["turns"]) for s in sampled)
    assert m["sample_accuracy"] == pytest.approx(np.mean([s["reward"]["solved"] > 0.5 for s in sampled]))
    for s in with_tools:  # the tool's turns verbatim (cut only by the token budget), the policy's between them
        tool_turns = [t["text"] for t in s["turns"] if t["role"] == "tool"]
        assert all(reply.startswith(t) for t in tool_turns) and (not tool_turns or tool_turns[0] == reply)


def test_a_bad_tools_flag_or_a_too_long_answer_is_refused_naming_the_field(tmp_path, capsys):
    from experiments.configs.fixtures import make_tiny_files

    assert ev_cli.main(["--model", str(tmp_path / "none"), "--tools", "--max-turns", "0"]) == 2
    assert "max_turns" in capsys.readouterr().err
    # the tool prompt is 178 tokens of the tiny checkpoint's, padded to 192; its context is 256
    assert ev_cli.main(["--model", f"{make_tiny_files()}/model", "--mix", "tool_mul", "--tools", "--n", "2"]) == 2
    assert "--max-new-tokens (256) + the prompt width (192) exceed the model's context (256)" in capsys.readouterr().err


def test_write_gsm8k_file_reads_back_as_a_gsm8k_source(tmp_path):
    from rl import tasks
    from rl.tasks import gsm8k_math

    path = tmp_path / "g.jsonl"
    assert ev_cli.main(["--write-gsm8k", str(path), "--n", "12"]) == 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    word = tasks.load_mix("word", n=12, seed=0, split="test", difficulty=1)
    assert [r["question"] for r in lines] == [p.question for p in word]
    back = gsm8k_math.read(str(path), "gsm8k")  # the gsm8k@FILE source's reader
    assert [(p.question, p.answer) for p in back] == [(p.question, p.answer) for p in word]
    assert all(p.steps for p in back)


def test_bad_model_and_arguments(tmp_path, capsys):
    assert ev_cli.main(["--model", str(tmp_path / "missing-model")]) == 2
    assert "missing-model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ev_cli.main(["--model", "x", "--workdir", "y"])


def test_smollm2_sampler_bench_json_on_a_tiny_gguf(tmp_path, capsys):
    """The sampler benchmark's own side on a tiny GGUF (the peer's python missing: reported, no ratio)."""
    from experiments.bench import smollm2_sampler

    model = tiny_llama_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "b.json"
    assert smollm2_sampler.main(["--model", str(model), "--rows", "2", "--new-tokens", "3", "--reps", "1",
                                 "--peer-python", str(tmp_path / "no-python"), "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    ours = saved["ours"]
    assert ours["rows"] == 2 and ours["new_tokens"] == 3 and ours["prefill_tok_per_s"] > 0
    f, p = ours["full_s_median"], ours["prefill_s_median"]  # a tiny model can decode within the prefill's noise
    assert ours["decode_tok_per_s"] == (pytest.approx(2 * 2 / (f - p)) if f > p else None)
    assert smollm2_sampler.decode_rate(2, 3, 1.5, 0.5) == 4.0 and smollm2_sampler.decode_rate(2, 3, 0.5, 0.5) is None
    assert "no peer python" in saved["peer"]["error"] and saved["ratios"] == {}
    assert "no peer python" in capsys.readouterr().out
