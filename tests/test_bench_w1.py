"""experiments/bench/w1.py end to end in its smoke mode (slow: compiles the W1 policy twice): the grouped layout's
step has the flat layout's loss on the same samples, and the JSON carries what BENCHMARKS.md quotes."""
import pytest

pytestmark = pytest.mark.slow


def test_w1_quick_grouped_equals_flat():
    from experiments.bench import w1

    grouped = w1.run_setting(0.04, 1, True, microbatches=1, layout="grouped")
    flat = w1.run_setting(0.04, 1, True, microbatches=1, layout="flat")
    # Same seeds, so the same samples; the two layouts compute the same loss (the flat one has 29% more tokens). One
    # microbatch: with more, the slices differ (rows vs whole prompts) and so does the router load-balancing term.
    assert grouped["seconds"]["loss"] == pytest.approx(flat["seconds"]["loss"], rel=1e-4, abs=1e-6)
    assert grouped["seconds"]["generated_tokens"] == flat["seconds"]["generated_tokens"]
    assert grouped["seconds"]["train_tokens"] < flat["seconds"]["train_tokens"]
    for key in ("sampling_tok_s", "peak_rss_mib", "mfu", "heap_trims"):
        assert key in grouped
