"""ByteTokenizer: lossless round trips (Chinese, English, emoji), specials, batch padding and masks."""
import numpy as np
import pytest

from models.tokenizer import ByteTokenizer

TEXTS = [
    "Question: what is 12 * 7?\nSolution:\n",
    "问题：计算 3/4 + 1/8。\n解答：\n步骤一：通分。\n答案：7/8",
    "emoji 🙂🚀 and ümlaut, tabs\tand\nnewlines",
    "",
]


@pytest.fixture
def tok():
    return ByteTokenizer()


def test_constants(tok):
    assert (tok.PAD, tok.BOS, tok.EOS) == (0, 1, 2)
    assert tok.vocab_size == 259


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids[0] == tok.BOS
    # Independent reference: every UTF-8 byte b is id b + 3.
    assert ids[1:] == [b + 3 for b in text.encode("utf-8")]
    assert all(3 <= i <= 258 for i in ids[1:])
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, add_bos=False, add_eos=True)) == text


def test_chinese_is_three_bytes_per_char(tok):
    assert len(tok.encode("答案", add_bos=False)) == 6


def test_decode_stops_at_eos_and_skips_specials(tok):
    ids = [tok.BOS] + tok.encode("ab", add_bos=False) + [tok.EOS] + tok.encode("zz", add_bos=False)
    assert tok.decode(ids) == "ab"
    assert tok.decode([tok.PAD, tok.PAD] + ids) == "ab"
    assert tok.decode(ids, skip_special=False) == "<bos>ab<eos>"


def test_decode_invalid_utf8_does_not_raise(tok):
    # A lone continuation byte and a truncated 3-byte character, as a random model may emit.
    assert tok.decode([0x80 + 3, 0xE7 + 3, 0x94 + 3, ord("a") + 3]) == "\ufffd\ufffda"


def test_decode_out_of_range_id(tok):
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([259])


def test_encode_batch_right_padding(tok):
    ids, mask = tok.encode_batch(["ab", "问"], add_eos=True)
    assert ids.dtype == np.int32 and mask.dtype == np.int32
    # "ab": BOS a b EOS (4) ; "问": BOS + 3 bytes + EOS (5)
    assert ids.shape == (2, 5)
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(ids[0], [1, ord("a") + 3, ord("b") + 3, 2, 0])
    assert tok.decode_batch(ids) == ["ab", "问"]


def test_encode_batch_left_padding(tok):
    ids, mask = tok.encode_batch(["a", "abc"], pad_left=True)
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(ids[0], [0, 0, 1, ord("a") + 3])
    assert tok.decode_batch(ids) == ["a", "abc"]


def test_encode_batch_max_len_truncation(tok):
    ids, mask = tok.encode_batch(["abcdef"], max_len=3, pad_left=True, add_bos=False)
    np.testing.assert_array_equal(ids[0] - 3, [ord(c) for c in "def"])  # left padding keeps the tail
    ids, mask = tok.encode_batch(["abcdef"], max_len=3, add_bos=False)
    np.testing.assert_array_equal(ids[0] - 3, [ord(c) for c in "abc"])
    ids, mask = tok.encode_batch(["a"], max_len=4)
    assert mask.sum() == 2 and ids.shape == (1, 4)
    with pytest.raises(ValueError, match="max_len"):
        tok.encode_batch(["a"], max_len=0)


def test_decode_batch_lengths(tok):
    ids, _ = tok.encode_batch(["hello", "world"], add_bos=False)
    assert tok.decode_batch(ids, lengths=[2, 5]) == ["he", "world"]
    with pytest.raises(ValueError, match="lengths"):
        tok.decode_batch(ids, lengths=[1])
