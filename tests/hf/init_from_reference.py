#!/usr/bin/env python3
"""A GPT-2 model saved by transformers, a token shard, and transformers' loss on kiln's first batch.

    init_from_reference.py OUT_DIR

Writes, under OUT_DIR:
  hf/            GPT2LMHeadModel(n_layer 2, n_head 4, n_embd 64, n_positions 64, vocab_size 300),
                 random init from torch.manual_seed(1234) with initializer_range 0.2 (ten times
                 GPT-2's, so the logits are far from uniform and the loss depends visibly on every
                 weight), written by save_pretrained() (model.safetensors + config.json)
  broken/        the same, with transformer.h.0.attn.c_proj.weight transposed (a square matrix: no
                 shape check can notice it)
  data.bin       an llm.c shard (data/token_file.h: 256 x int32 header, magic 20240520, version 1,
                 then uint16 tokens) of 8 x 64 + 1 random tokens in [0, 300)
  reference.json transformers' losses:
                   loss_T64        the 8 samples of 64 tokens (data/token_dataset.h: sample i is
                                   tokens [64 i, 64 i + 65)), which is kiln's first batch with
                                   --micro-batch 8 x dp 1 (or 4 x dp 2): the batch holds every
                                   sample of the shard, in an order set by the seed, and the loss
                                   is the mean over its tokens, so the order does not matter
                   loss_T32        the 16 samples of 32 tokens (--seq-len 32: wpe's first 32 rows)
                   loss_T64_shift  the 8 windows shifted by one token: another batch (the check's
                                   failing case)
The loss is the mean next-token cross-entropy over all positions, in fp32 on the CPU, in eval mode
(no dropout), as kiln's GPT::loss computes it.
"""
import json
import os
import struct
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

out = sys.argv[1]
V, T, N = 300, 64, 8
torch.manual_seed(1234)
cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=T, vocab_size=V, initializer_range=0.2,
                 bos_token_id=V - 1, eos_token_id=V - 1)
model = GPT2LMHeadModel(cfg).float().eval()
model.save_pretrained(os.path.join(out, "hf"))

broken = os.path.join(out, "broken")
model.save_pretrained(broken)
tensors = load_file(os.path.join(broken, "model.safetensors"))
name = "transformer.h.0.attn.c_proj.weight"
tensors[name] = tensors[name].t().contiguous()
save_file(tensors, os.path.join(broken, "model.safetensors"), metadata={"format": "pt"})

g = torch.Generator().manual_seed(7)
tokens = torch.randint(0, V, (N * T + 2,), generator=g)
with open(os.path.join(out, "data.bin"), "wb") as f:
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, N * T + 1
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack(f"<{N * T + 1}H", *tokens[: N * T + 1].tolist()))


def loss(t, offset=0):
    n = (N * T + 1 - 1) // t
    x = torch.stack([tokens[offset + i * t: offset + i * t + t] for i in range(n)])
    y = torch.stack([tokens[offset + i * t + 1: offset + i * t + t + 1] for i in range(n)])
    with torch.no_grad():
        logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).item()


ref = {"loss_T64": loss(T), "loss_T32": loss(32), "loss_T64_shift": loss(T, offset=1)}
json.dump(ref, open(os.path.join(out, "reference.json"), "w"))
print(json.dumps(ref))
