"""A run-ready Hugging Face folder built from the project's fixtures in tests/data/hf (for the tests that run a
recipe on a checkpoint): the qwen3 fixture's architecture with the fixture tokenizer (byte-level BPE, ChatML
specials, a chat template with a system prompt) and random weights, written by models.hf.save.

    folder = run_ready_folder(tmp_path)                    # context 1024 (max_position_embeddings)
    folder = run_ready_folder(tmp_path, context=64)        # a short context, for the clipping tests

The fixture checkpoints themselves (tests/data/hf/qwen3 ...) have 96-row embeddings for transformers' reference
logits; the tokenizer has 420 ids, so a folder that runs needs the embedding resized: that is all this changes.
"""
import json
import shutil
from pathlib import Path

HF = Path(__file__).resolve().parent / "data" / "hf"


def run_ready_folder(root, context: int = 1024, name: str = "qwen3_chat") -> str:
    import jax

    from models import hf, transformer
    from models.tokenizer import HFTokenizer

    out = Path(root) / name
    if (out / "config.json").exists():
        return str(out)
    out.mkdir(parents=True)
    for f in (HF / "tokenizer").iterdir():
        shutil.copy(f, out / f.name)
    vocab = HFTokenizer.from_pretrained(out).vocab_size
    fixture = json.loads((HF / "qwen3" / "config.json").read_text())
    cfg = hf.config_from_hf({**fixture, "vocab_size": vocab, "max_position_embeddings": context})
    hf.save(out, cfg, transformer.init(cfg, jax.random.key(0)))
    return str(out)
