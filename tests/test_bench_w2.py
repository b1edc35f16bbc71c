"""experiments/bench/w2.py: its FLOP count and prompts against references written here (quick), and the bench end to
end on a tiny Hugging Face fixture folder without the peer (slow: compiles the sampler, the reference pass and the
update in a subprocess)."""
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_folders import run_ready_folder  # noqa: E402

from models.cpu import allocator  # noqa: E402


def test_update_flops_counts_each_prompt_once_and_every_query_key_pair():
    from experiments.bench import w1
    from models.config import ModelConfig

    cfg = ModelConfig(vocab_size=40, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24,
                      n_experts=0, max_seq_len=64)  # dense, as SmolLM2
    pmask = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])  # prompts of 3 and 4 real tokens, left-padded
    attn = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]])  # K = 2 answers per prompt
    # float64 reference by enumeration: every real token once (prompt tokens once per prompt), and for each real
    # query token the keys it attends to (itself and every real token before it in its sequence).
    weights = (cfg.n_layers * (2 * cfg.d_model * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
                               + 3 * 2 * cfg.d_model * cfg.d_ff) + 2 * cfg.d_model * cfg.vocab_size) / 2.0
    tokens = pairs = 0.0
    for g in range(2):
        p = int(pmask[g].sum())
        for q in range(p):
            tokens += 1
            pairs += q + 1
        for k in range(2):
            for q in range(int(attn[2 * g + k].sum())):
                tokens += 1
                pairs += p + q + 1
    expected = 3 * (2 * weights * tokens + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * pairs)
    assert w1.update_flops(cfg, pmask, attn, 2) == pytest.approx(expected, rel=1e-12)
    # sampling is one forward over the same tokens (prefill once per prompt, each generated token), but the prefill
    # computes only the prompt's last logits: no LM head on the prompt tokens (models/flops.py's convention); the
    # floor adds the reference's forward only with a KL term
    lengths = attn.sum(1)
    decode = w1.decode_flops(cfg, pmask, lengths, 2)
    assert decode == pytest.approx(expected / 3 - 2 * cfg.d_model * cfg.vocab_size * pmask.sum(), rel=1e-12)
    assert w1.floor_flops(expected, decode, kl=0.04) == pytest.approx(expected * 4 / 3 + decode, rel=1e-12)
    assert w1.floor_flops(expected, decode, kl=0.0) == pytest.approx(expected + decode, rel=1e-12)


def test_problems_are_two_digit_arithmetic_with_the_right_gold():
    from experiments.bench import w2

    probs = w2.problems(64)
    assert probs == w2.problems(64)  # seeded
    ops = set()
    for text, gold in probs:
        m = re.fullmatch(r"Compute (\d+) ([+-]) (\d+)\. Think step by step, then give the final answer on a line "
                         r"'Answer: <number>'\.", text)
        assert m, text
        x, op, y = int(m[1]), m[2], int(m[3])
        assert 10 <= x <= 99 and 10 <= y <= 99
        assert gold == (x + y if op == "+" else x - y)
        ops.add(op)
    assert ops == {"+", "-"}


@pytest.mark.slow
def test_w2_runs_end_to_end_on_a_tiny_fixture(tmp_path, capsys):
    from experiments.bench import w2

    folder = run_ready_folder(tmp_path, context=256)
    out = tmp_path / "w2.json"
    # No --no_peer: a folder is not a GGUF file, so the bench says the peer is skipped and reports ours alone.
    w2.main(["--model", folder, "--kl", "0.04", "--steps", "1", "--prompts", "2", "--new_tokens", "8",
             "--microbatches", "2", "--logits_chunk", "16", "--allocator", "heap_reuse", "--compare_allocator", "hugepages", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "peer skipped" in printed and "[allocator] KL 0.04: heap_reuse / hugepages" in printed
    saved = json.loads(out.read_text())
    assert saved["workload"] == "W2" and saved["logits_chunk"] == 16
    (rep,) = saved["reps"]
    assert rep["peer"] is None and rep["ratios"] == []
    (ours,) = rep["ours"]
    assert ours["kl"] == 0.04 and all(ours["phases_s"][k] > 0 for k in ("sampling", "logprob", "update"))
    assert 0 < ours["update_mfu"] and ours["peak_gflops"] > 0 and ours["peak_rss_mib"] > 0
    assert ours["floor_s"] > 0 and ours["step_over_floor"] > 1  # no step beats its FLOPs at the matmul peak
    assert 0 < ours["update_mfu_per_cpu_s"] and ours["peak_gflop_per_cpu_s"] > 0
    assert 2 * 8 <= ours["generated_tokens"] <= 2 * 8 * 8  # 2 prompts x 8 samples, 1..8 tokens each
    assert ours["update_sys_cpu_s"] >= 0 and 0 < ours["update_mfu_per_user_cpu_s"]
    if allocator.supported():  # the launcher's setting plus the opt-in heap reuse
        assert set(allocator.TUNABLES + allocator.HEAP_REUSE_TUNABLES) <= set(ours["glibc_tunables"].split(":"))
    # The same setting again under the huge-page tunable alone, its own process and figures
    ab = rep["allocator_ab"]
    assert ab["allocator"] == "heap_reuse" and ab["other_allocator"] == "hugepages" and ab["kl"] == 0.04
    if allocator.supported():
        assert set(ab["other"]["glibc_tunables"].split(":")).isdisjoint(allocator.HEAP_REUSE_TUNABLES)
    assert ab["other"]["phases_s"]["update"] > 0
    assert ab["update_ratio"] == pytest.approx(ours["phases_s"]["update"] / ab["other"]["phases_s"]["update"])


def test_microbatches_must_divide_the_prompts():
    from experiments.bench import w2

    with pytest.raises(SystemExit):
        w2.main(["--prompts", "2", "--microbatches", "4", "--no_peer"])

