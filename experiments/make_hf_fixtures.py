"""Makes the reference fixtures under tests/data/hf/ with `transformers` (the library that defines the formats).

    python3.11 -m venv /tmp/hfref
    /tmp/hfref/bin/pip install torch==2.13.0 transformers==5.23.0 safetensors numpy   # the hf-reference extra
    /tmp/hfref/bin/python experiments/make_hf_fixtures.py                              # from the repository root
    /tmp/hfref/bin/python experiments/make_hf_fixtures.py llama                        # only the named fixture(s)

For each of qwen2, qwen3, qwen3_moe, mixtral and llama it writes a tiny random checkpoint folder (config.json +
safetensors; qwen3_moe sharded over several files with model.safetensors.index.json) and expected.npz with
transformers' float32 logits for a fixed batch, and its greedy continuation (KV cache) of left-padded prompts. The
weights are random with unit-scale logits, norm scales around 1 and non-zero biases, so a wrong name mapping, a
swapped q/k norm or a missing bias changes the logits; the script checks that every greedy step wins by a margin
that float32 rounding cannot flip.

It also writes a tiny byte-level BPE tokenizer (Qwen2-style pre-tokenizer, ChatML specials, trained here on a few
lines of Chinese and English math text) with a chat template, and tokenizer_expected.json: transformers' ids for
the texts and conversations listed below, and the rendered chat text. The default tests (tests/test_hf.py,
tests/test_tokenizer.py) compare models/hf.py, models/sampling.py and models/tokenizer.py against these files
without torch or transformers. This script never runs in the tests.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
ARCHS = {
    # Qwen2.5-style: q/k/v bias, tied embeddings
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # Qwen3-style: q/k norm, head_dim 8 with 4 heads (q width 32 != hidden 16), tied embeddings
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(head_dim=8, tie_word_embeddings=True,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Qwen3-MoE: block 0 dense (mlp_only_layers), block 1 and 2 MoE, raw (unrenormalised) top-k probabilities
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(num_hidden_layers=3, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                       decoder_sparse_step=1, mlp_only_layers=[0], norm_topk_prob=False, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # Mixtral: every block MoE, softmax over the top-k logits, rms_norm_eps 1e-5
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5, sliding_window=None,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # Llama: no biases, untied embeddings, head_dim 8 with 4 heads, one key/value head, rope base 5e5
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(head_dim=8, num_key_value_heads=1, tie_word_embeddings=False, rms_norm_eps=1e-5,
                   attention_bias=False, mlp_bias=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
}
MIN_MARGIN = 1e-3  # top-1 minus top-2 logit at every greedy step; float32 differences are ~1e-6
NEW_TOKENS = 8


def randomize(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.5 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:  # [.., out, in]: unit-scale outputs
                p.copy_(noise / p.shape[-1] ** 0.5)


def greedy_with_margin(model, prompt_ids, prompt_mask):
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, max_new_tokens=NEW_TOKENS,
                         do_sample=False, eos_token_id=None, pad_token_id=0, return_dict_in_generate=True,
                         output_scores=True)
    scores = torch.stack(out.scores, 1)  # [B, N, V]
    top2 = torch.topk(scores, 2, dim=-1).values
    margin = float((top2[..., 0] - top2[..., 1]).min())
    return out.sequences[:, prompt_ids.shape[1]:], margin


def make_model(arch: str) -> None:
    cfg_cls, model_cls, extra = ARCHS[arch]
    folder = OUT / arch
    for seed in range(100):
        torch.manual_seed(seed)
        cfg = cfg_cls(**{**COMMON, **extra})
        cfg.use_cache = True
        model = model_cls(cfg).eval()
        randomize(model, seed)
        rng = np.random.default_rng(seed)
        input_ids = torch.tensor(rng.integers(0, VOCAB, size=(2, 9)), dtype=torch.long)
        prompt_ids = torch.tensor(rng.integers(1, VOCAB, size=(2, 5)), dtype=torch.long)
        prompt_mask = torch.ones_like(prompt_ids)
        prompt_mask[0, :2] = 0  # row 0 is left-padded: 3 real tokens
        prompt_ids[0, :2] = 0
        with torch.no_grad():
            logits = model(input_ids).logits
            greedy, margin = greedy_with_margin(model, prompt_ids, prompt_mask)
        if margin > MIN_MARGIN:
            break
    else:
        raise RuntimeError(f"{arch}: no seed gave greedy margins above {MIN_MARGIN}")
    if folder.exists():
        shutil.rmtree(folder)
    # the MoE checkpoint is sharded over several files to exercise model.safetensors.index.json
    model.save_pretrained(folder, max_shard_size="40KB" if arch == "qwen3_moe" else "50GB")
    (folder / "generation_config.json").unlink(missing_ok=True)
    np.savez_compressed(folder / "expected.npz", input_ids=input_ids.numpy().astype(np.int32),
                        logits=logits.numpy().astype(np.float32), prompt_ids=prompt_ids.numpy().astype(np.int32),
                        prompt_mask=prompt_mask.numpy().astype(np.int32), greedy=greedy.numpy().astype(np.int32),
                        seed=np.int32(seed), min_margin=np.float32(margin))
    files = sorted(p.name for p in folder.iterdir())
    print(f"{arch}: seed {seed}, greedy margin {margin:.4f}, files {files}")


# ---- tokenizer ---------------------------------------------------------------------------------------------------------
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenization pattern: letters runs, single digits, punctuation runs, newlines, spaces
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
CORPUS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? The answer is 72.",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.",
    "Let $f(x) = \\frac{3}{4}x^2 - 1$. Find $f(2)$. The final answer is \\boxed{2}.",
    "Step 1: add the numbers. Step 2: divide by the total. Therefore the answer is 17.",
    "问题：小明有5个苹果，又买了3个。他现在一共有多少个苹果？",
    "解答：步骤一：5 + 3 = 8。步骤二：所以小明一共有8个苹果。答案：8",
    "一个长方形的长是12厘米，宽是5厘米，它的面积是多少平方厘米？答案：60平方厘米",
    "请一步一步地推理，并把最终答案写在 \\boxed{} 中。",
    "计算：3/4 + 1/8 = 7/8，最终答案：7/8",
]
CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "{{- '<|im_start|>system\\nTools:\\n' }}\n"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n' }}{%- endfor %}\n"
    "{{- '<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "{{- '<|im_start|>system\\nPlease reason step by step, and put your final answer within \\\\boxed{}.<|im_end|>\\n' }}\n"
    "{%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{%- for message in loop_messages %}\n"
    "{%- if message['role'] not in ['user', 'assistant'] %}\n"
    "{{- raise_exception('Conversation roles must be user or assistant') }}\n"
    "{%- endif %}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|im_start|>assistant\\n' }}\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\n"
    "{%- endif %}\n"
)
TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\n#### 72",
    "问题：小明有 5 个苹果，又买了 3 个。他现在一共有多少个苹果？\n答案：8 个",
    "Let $g(x) = \\sqrt{x^2 + 9}$. Compute $g(4)$.\n\\boxed{5}",
    "计算：１２＋３４＝？（全角数字）  两个空格\t制表符",
    "Unseen words: zebra quokka 🙂 龘",
    "A literal special token <|im_end|> inside text, then more.",
    "",
]
CHATS = [
    {"messages": [{"role": "system", "content": "You are a careful math tutor."},
                  {"role": "user", "content": "问题：3 + 5 = ?"},
                  {"role": "assistant", "content": "答案：8"},
                  {"role": "user", "content": "What is 12 * 7?  "}],
     "kwargs": {}},
    {"messages": [{"role": "user", "content": "一个长方形的长是12厘米，宽是5厘米，面积是多少？"}], "kwargs": {}},
    {"messages": [{"role": "user", "content": "Find 2^10."}], "kwargs": {"enable_thinking": False}},
    {"messages": [{"role": "user", "content": "用计算器算 17 × 23"}],
     "kwargs": {"tools": [{"name": "calculator", "description": "计算器: evaluates arithmetic"}]}},
]


def make_tokenizer() -> None:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                  pad_token="<|endoftext|>")
    hf_tok.chat_template = CHAT_TEMPLATE
    folder = OUT / "tokenizer"
    if folder.exists():
        shutil.rmtree(folder)
    hf_tok.save_pretrained(folder)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)  # what a user of the folder gets

    def ids(x):
        return list(x["input_ids"] if isinstance(x, (dict, transformers.BatchEncoding)) else x)

    expected = {
        "eos_id": hf_tok.eos_token_id, "pad_id": hf_tok.pad_token_id,
        "texts": [{"text": t, "ids": hf_tok.encode(t, add_special_tokens=False),
                   "decoded": hf_tok.decode(hf_tok.encode(t, add_special_tokens=False), skip_special_tokens=True)}
                  for t in TEXTS],
        "chats": [{**c, "text": hf_tok.apply_chat_template(c["messages"], add_generation_prompt=True, tokenize=False,
                                                           **c["kwargs"]),
                   "ids": ids(hf_tok.apply_chat_template(c["messages"], add_generation_prompt=True, tokenize=True,
                                                         **c["kwargs"]))}
                  for c in CHATS],
        "chat_no_generation_prompt": {
            "messages": CHATS[0]["messages"],
            "ids": ids(hf_tok.apply_chat_template(CHATS[0]["messages"], add_generation_prompt=False,
                                                  tokenize=True))},
    }
    (OUT / "tokenizer_expected.json").write_text(json.dumps(expected, ensure_ascii=False, indent=1) + "\n")
    print(f"tokenizer: {hf_tok.vocab_size} entries + {len(SPECIALS)} specials, files "
          f"{sorted(p.name for p in folder.iterdir())}")


def main(names: list[str]) -> None:
    """Every fixture, or only the named ones (architectures and/or "tokenizer")."""
    unknown = sorted(set(names) - set(ARCHS) - {"tokenizer"})
    if unknown:
        raise SystemExit(f"unknown fixture(s) {unknown}; known: {sorted(ARCHS)} and tokenizer")
    OUT.mkdir(parents=True, exist_ok=True)
    torch.set_default_dtype(torch.float32)
    for arch in ARCHS:
        if not names or arch in names:
            make_model(arch)
    if not names or "tokenizer" in names:
        make_tokenizer()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"total fixture size: {total / 1024:.0f} KiB (transformers {transformers.__version__}, torch "
          f"{torch.__version__})")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
