"""ByteTokenizer: lossless round trips (Chinese, English, emoji), specials, batch padding and masks.
HFTokenizer: ids, decoding and chat templates identical to transformers' (fixtures in tests/data/hf), the shared
interface."""
import json
import shutil
from pathlib import Path

import jinja2
import numpy as np
import pytest

from models.tokenizer import ByteTokenizer, HFTokenizer

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


# ---- HFTokenizer against transformers' ids (tests/data/hf, made by experiments/make_hf_fixtures.py) ----------------
HF_DIR = Path(__file__).parent / "data" / "hf"
EXPECTED = json.loads((HF_DIR / "tokenizer_expected.json").read_text())


@pytest.fixture(scope="module")
def hf_tok():
    return HFTokenizer.from_pretrained(HF_DIR / "tokenizer")


def test_hf_special_ids(hf_tok):
    assert (hf_tok.eos_id, hf_tok.pad_id) == (EXPECTED["eos_id"], EXPECTED["pad_id"])
    assert (hf_tok.EOS, hf_tok.PAD, hf_tok.BOS) == (hf_tok.eos_id, hf_tok.pad_id, None)  # Qwen-style: no BOS
    assert hf_tok.vocab_size == 420


def test_stop_ids_include_generation_config_eos_ids(hf_tok, tmp_path):
    """The sampler stops at every id that ends a turn: EOS, plus generation_config.json's eos_token_id(s)."""
    assert ByteTokenizer().stop_ids == (ByteTokenizer.EOS,) and hf_tok.stop_ids == (hf_tok.eos_id,)
    folder = tmp_path / "tok"
    shutil.copytree(HF_DIR / "tokenizer", folder)
    other = hf_tok.pad_id
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [hf_tok.eos_id, other]}))
    assert HFTokenizer.from_pretrained(folder).stop_ids == (hf_tok.eos_id, other)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": other}))
    assert HFTokenizer.from_pretrained(folder).stop_ids == (hf_tok.eos_id, other)


@pytest.mark.parametrize("case", EXPECTED["texts"], ids=lambda c: c["text"][:20])
def test_hf_encode_decode_match_transformers(hf_tok, case):
    assert hf_tok.encode(case["text"]) == case["ids"]
    assert hf_tok.encode(case["text"], add_bos=True) == case["ids"]  # no BOS token: nothing to add
    assert hf_tok.encode(case["text"], add_eos=True) == case["ids"] + [hf_tok.eos_id]
    if hf_tok.eos_id in case["ids"]:  # decode stops at the first EOS, like ByteTokenizer.decode
        assert hf_tok.decode(case["ids"]) == case["text"].split("<|im_end|>")[0]
    else:
        assert hf_tok.decode(case["ids"]) == case["decoded"]


@pytest.mark.parametrize("case", EXPECTED["chats"], ids=lambda c: str(c["kwargs"] or len(c["messages"])))
def test_hf_chat_template_matches_transformers(hf_tok, case):
    assert hf_tok.render_chat_template(case["messages"], **case["kwargs"]) == case["text"]
    assert hf_tok.apply_chat_template(case["messages"], add_generation_prompt=True, **case["kwargs"]) == case["ids"]


def test_hf_chat_template_without_generation_prompt_and_from_tokenizer_config(hf_tok, tmp_path):
    case = EXPECTED["chat_no_generation_prompt"]
    assert hf_tok.apply_chat_template(case["messages"], add_generation_prompt=False) == case["ids"]
    # older folders keep the template inside tokenizer_config.json instead of chat_template.jinja
    folder = tmp_path / "tok"
    shutil.copytree(HF_DIR / "tokenizer", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (folder / "chat_template.jinja").read_text()
    config["eos_token"] = {"content": config["eos_token"], "special": True}  # AddedToken-style entry
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink()
    legacy = HFTokenizer.from_pretrained(folder)
    assert legacy.eos_id == hf_tok.eos_id
    assert legacy.apply_chat_template(case["messages"], add_generation_prompt=False) == case["ids"]


def test_hf_template_errors_and_sandbox(hf_tok, tmp_path):
    with pytest.raises(jinja2.exceptions.TemplateError, match="roles must be user or assistant"):
        hf_tok.apply_chat_template([{"role": "tool", "content": "x"}])
    # the sandbox refuses attribute tricks a hostile template might try
    hostile = HFTokenizer(hf_tok._tok, eos_token="<|im_end|>",
                          chat_template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        hostile.apply_chat_template([{"role": "user", "content": "x"}])
    no_template = HFTokenizer(hf_tok._tok, eos_token="<|im_end|>")
    with pytest.raises(ValueError, match="no chat template"):
        no_template.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="eos_token"):
        HFTokenizer(hf_tok._tok, eos_token="<|not_a_token|>")
    with pytest.raises(ValueError, match="tokenizer.json"):
        HFTokenizer.from_pretrained(tmp_path)


def test_hf_decode_never_raises_on_model_output(hf_tok):
    # ids past the tokenizer's vocabulary (a checkpoint's padded embedding rows), pads, half a UTF-8 character
    text = hf_tok.decode([hf_tok.pad_id, 168, 248, 10_000, 35, hf_tok.eos_id, 36])
    assert isinstance(text, str) and text.endswith("A") and "\ufffd" in text
    assert hf_tok.decode([35, hf_tok.eos_id, 36], skip_special=False) == "A<|im_end|>"


def test_both_tokenizers_share_the_batch_interface(tok, hf_tok):
    texts = ["问题：3 + 5 = ?", "What is 12 * 7?"]
    for t in (tok, hf_tok):
        ids, mask = t.encode_batch(texts, pad_left=True, add_eos=True)
        assert ids.dtype == np.int32 and ids.shape == mask.shape
        assert np.all(ids[mask == 0] == t.PAD)
        lengths = mask.sum(1)
        for row, text in enumerate(texts):
            np.testing.assert_array_equal(ids[row, ids.shape[1] - lengths[row]:], t.encode(text, add_eos=True))
        assert t.decode_batch(ids) == texts  # PAD dropped, stops at EOS
        assert (t.PAD, t.EOS) == (t.pad_id, t.eos_id)
