"""rl/rollout.py sample: continuous batching (the default) and static calls give each prompt's rows together, in
order, at per-row temperatures; Samples.split separates one call's greedy answers from its samples."""
import jax
import numpy as np
import pytest

from models import sampling, slot_sampling, transformer
from models.config import ModelConfig
from models.tokenizer import ByteTokenizer
from rl import rollout

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=48, n_experts=0, max_seq_len=64)
TEXTS = ["12+7=", "3*4=", "100-1="]


def _draw(batching, ks, temperature, key=1):
    params = transformer.init(CFG, jax.random.key(0))
    gen = lambda p, c, x, k, **kw: sampling.generate(p, c, x, k, **kw)  # noqa: E731
    slots = (lambda p, c, x, k, **kw: slot_sampling.generate_slots(p, c, x, k, **kw)) if batching == "continuous" \
        else None
    return rollout.sample(gen, params, CFG, ByteTokenizer(), TEXTS, ks, jax.random.key(key), temperature=temperature,
                          max_new_tokens=12, max_prompt_len=16, rows_per_call=4, generate_slots=slots)


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_rows_in_prompt_order_with_per_row_temperatures(batching):
    ks = [1 + 2] * 3
    temps = np.tile([0.0, 1.0, 1.0], 3)
    s = _draw(batching, ks, temps)
    assert s.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and len(s.texts) == 9
    greedy, samples = s.split(1)
    assert greedy.prompt_index.tolist() == [0, 1, 2] and samples.group_sizes.tolist() == [2, 2, 2]
    # the greedy rows are the greedy answers of a greedy-only draw
    alone = _draw(batching, [1] * 3, 0.0, key=5)
    np.testing.assert_array_equal(greedy.tokens, alone.tokens)
    assert greedy.texts == alone.texts
    with pytest.raises(ValueError, match="split"):
        s.split(3)


def test_continuous_and_static_draw_the_same_greedy_rows():
    a, b = _draw("continuous", [2, 1, 3], 0.0), _draw("static", [2, 1, 3], 0.0)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
