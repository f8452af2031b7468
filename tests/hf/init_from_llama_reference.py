#!/usr/bin/env python3
"""Llama-family models saved by transformers, a token shard, and transformers' loss on kiln's first batch.

    init_from_llama_reference.py OUT_DIR

Writes, under OUT_DIR (every model: 2 layers, hidden 64, 4 heads over 2 kv heads, intermediate
176, 64 positions, vocabulary 300, random init from torch.manual_seed(1234) with initializer_range
0.2 so the loss depends visibly on every weight, save_pretrained in fp32):
  llama/          LlamaForCausalLM, rope base 10000, untied output layer
  llama_sharded/  the same model saved with max_shard_size 100KB: model.safetensors.index.json and
                  its shards (every model above 5 GB is saved so)
  qwen2/          Qwen2ForCausalLM: q/k/v biases, tied output layer, rms eps 1e-6, base 1e6
  llama31/        LlamaForCausalLM with Llama-3.1's rope scaling (factor 8, low 1, high 4, an
                  original context of 16: T 64 spans its three bands), base 500000
  mistral_window/ MistralForCausalLM with sliding_window 32 (shorter than its 64 positions)
  mixtral/        MixtralForCausalLM: 4 SwiGLU experts, top-2, in both blocks
  llama/tokenizer.json, qwen2/tokenizer.json: a byte-level BPE of exactly 300 ids (GPT-2's kind,
                  <|endoftext|> = 0) trained here on a small word list, so kiln sample can read
                  prompts for these directories
  data.bin        an llm.c shard (256 x int32 header, magic 20240520, version 1, uint16 tokens) of
                  8 x 64 + 1 random tokens in [0, 300)
  reference.json  {name: transformers' loss on the 8 samples of 64 tokens}: kiln's first batch with
                  --micro-batch 8 (tests/hf/init_from_reference.py says why the order does not
                  matter); mistral_window's at --seq-len 32 (16 samples), where its window is inert,
                  and at 64 (mistral_window_64), where it acts
The loss is the mean next-token cross-entropy over all positions, fp32, CPU, eval mode.
"""
import json
import os
import struct
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,  # noqa: E402
                          MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

out = sys.argv[1]
V, T, N = 300, 64, 8
common = dict(vocab_size=V, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=T, initializer_range=0.2, hidden_act="silu")
g = torch.Generator().manual_seed(7)
tokens = torch.randint(0, V, (N * T + 1,), generator=g)
header = [0] * 256
header[0], header[1], header[2] = 20240520, 1, len(tokens)
with open(os.path.join(out, "data.bin"), "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens.tolist()))


def loss_of(model, t):
    x = torch.stack([tokens[i * t:i * t + t + 1] for i in range(len(tokens) // t)])
    with torch.no_grad():
        logits = model(input_ids=x[:, :t]).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1)).item()


models = {
    "llama": (LlamaForCausalLM, LlamaConfig(**common, rope_theta=10000.0, tie_word_embeddings=False)),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**common, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                            use_sliding_window=False)),
    "llama31": (LlamaForCausalLM, LlamaConfig(**common, tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "mistral_window": (MistralForCausalLM, MistralConfig(**common, sliding_window=32, tie_word_embeddings=False)),
    "mixtral": (MixtralForCausalLM, MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2, rope_theta=1e6,
                                                  router_aux_loss_coef=0.02, sliding_window=None, tie_word_embeddings=False)),
}
reference = {}
for name, (cls, cfg) in models.items():
    torch.manual_seed(1234)
    model = cls(cfg).float().eval()
    model.save_pretrained(os.path.join(out, name))
    reference[name] = loss_of(model, 32 if name == "mistral_window" else T)
    if name == "mistral_window":
        reference["mistral_window_64"] = loss_of(model, T)
    if name == "llama":
        model.save_pretrained(os.path.join(out, "llama_sharded"), max_shard_size="100KB")
        reference["llama_sharded"] = reference["llama"]
from tokenizers import ByteLevelBPETokenizer  # noqa: E402
import random  # noqa: E402
random.seed(3)
words = "the quick brown fox jumps over a lazy dog while kiln trains models".split()
tok = ByteLevelBPETokenizer()
tok.train_from_iterator([" ".join(random.choice(words) for _ in range(2000))], vocab_size=V, min_frequency=2,
                        special_tokens=["<|endoftext|>"])
assert tok.get_vocab_size() == V, tok.get_vocab_size()
for name in ("llama", "qwen2"):
    tok.save(os.path.join(out, name, "tokenizer.json"))
json.dump(reference, open(os.path.join(out, "reference.json"), "w"))
print(json.dumps(reference))
