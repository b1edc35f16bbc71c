"""experiments/bench/w2.py: its prompts against a reference written here (quick; its FLOP counts are
models/flops.py's, tests/test_flops.py), and the bench end to end on a tiny Hugging Face fixture folder without the
peer (slow: compiles the sampler, the reference pass and the update in a subprocess)."""
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_folders import run_ready_folder  # noqa: E402

from models.cpu import allocator  # noqa: E402


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

