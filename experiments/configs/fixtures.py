"""Fixture builders shared by the configs' tiny variants and the tests: files made once on disk, cached by a hash.

`make_tiny_files()` writes a tiny random qwen3 checkpoint with a byte-level BPE tokenizer and a ChatML chat template,
and GSM8K-style train/test JSONL files (80 + 16 generated word problems), in a temporary folder; the tiny variants of
qwen_gsm8k.py, smollm2_grpo.py and smollm2_tools.py train on them, and tests load the tokenizer or the checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile

from rl.tasks import load_mix
from rl.tasks.render import render_solution, render_user_message

CHATML = ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _gsm8k_record(p) -> dict:
    """A generated word problem written the way GSM8K writes answers: calculator notes, then '#### answer'."""
    lines = [re.sub(r"(\S+)=(-?\d+)", lambda m: f"{m.group(1)}=<<{m.group(1)}={m.group(2)}>>{m.group(2)}", s)
             for s in p.steps]
    return {"question": p.question, "answer": "\n".join(lines) + f"\n#### {p.answer}"}


def _tokenizer(texts):
    """A byte-level BPE (every byte is a token, so any text encodes) with merges learnt from the tiny data, the
    ChatML special tokens and a ChatML chat template: the shape of a Qwen tokenizer folder, tiny."""
    # here, as the model code in make_tiny_files: only building the files needs it, not reading a config that uses them
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def make_tiny_files(root: str | None = None) -> str:
    """Writes (once) the tiny checkpoint, tokenizer and GSM8K-style train/test files; returns their folder."""
    with open(__file__, "rb") as f:  # the files are cached under a hash of this file: any edit makes new ones
        version = hashlib.sha256(f.read()).hexdigest()[:12]
    folder = os.path.join(root or tempfile.gettempdir(), f"mathrl_qwen_gsm8k_tiny_{version}")
    if os.path.exists(os.path.join(folder, "done")):
        return folder
    # here: the model code (models.hf, its safetensors writer) loads only to build the files, not to read a config
    import jax

    from models import hf, transformer
    from models.config import ModelConfig

    work = tempfile.mkdtemp(dir=os.path.dirname(folder), prefix=os.path.basename(folder) + ".tmp")
    # The train file must spread over the hash range like real data (the run draws train and validation from it by
    # hash): the word source's hash-train and hash-test problems go there, its hash-validation ones to the test file.
    splits = {"train": load_mix("word", 64, 0, "train", 1, unique=True) + load_mix("word", 16, 0, "test", 1),
              "test": load_mix("word", 16, 0, "validation", 1)}
    for name, problems in splits.items():
        with open(os.path.join(work, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(_gsm8k_record(p)) + "\n" for p in problems)
    texts = [t for p in splits["train"] for t in (render_user_message(p, "en"), render_solution(p, "en"))]
    tok = _tokenizer(texts)
    model_dir = os.path.join(work, "model")
    os.makedirs(model_dir)
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML}, f, indent=1)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16,
                      d_ff=64, n_experts=0, moe_every=0, qk_norm=True, tie_embeddings=True, scale_tied_unembed=False,
                      max_seq_len=256)
    hf.save(model_dir, cfg, transformer.init(cfg, jax.random.key(0)))  # written as qwen3 (Qwen3-1.7B's layout)
    open(os.path.join(work, "done"), "w").close()
    try:
        os.rename(work, folder)
    except OSError:  # another process made it first: use theirs
        shutil.rmtree(work, ignore_errors=True)
    return folder
