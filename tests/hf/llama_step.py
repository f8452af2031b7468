#!/usr/bin/env python3
"""One AdamW step of a transformers Llama-family model in plain PyTorch, and its loss after the step.

    llama_step.py MODEL_DIR DATA_BIN LR WEIGHT_DECAY BETA1 BETA2 EPS

MODEL_DIR is what init_from_llama_reference.py saved; DATA_BIN its llm.c shard of 8 x 64 + 1 tokens.
The batch is the shard's 8 samples (tokens [64 i, 64 i + 65)), kiln's first (and, with
--micro-batch 8, every) batch. In fp32, train mode (dropout 0): the mean next-token cross-entropy,
backward, then torch.optim.AdamW (foreach off) with the given lr, betas and eps, the weight decay
on the matrices only (every parameter of two or more dimensions: the embeddings, the projections)
and none on the norms -- kiln's grouping -- then the loss of the same 8 samples with the new
weights, in eval mode. Prints one JSON line {"loss_before", "loss_after"}.
"""
import json
import os
import struct
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

d, data = sys.argv[1], sys.argv[2]
lr, wd, b1, b2, eps = map(float, sys.argv[3:8])
raw = open(data, "rb").read()
n = struct.unpack("<256i", raw[:1024])[2]
tokens = torch.tensor(struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n]), dtype=torch.long)
T = 64
x = torch.stack([tokens[i * T:i * T + T + 1] for i in range(len(tokens) // T)])
model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
V = model.config.vocab_size


def loss_fn():
    logits = model(input_ids=x[:, :T]).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1))


model.train()
params = [p for p in model.parameters() if p.requires_grad]
decay = [p for p in params if p.dim() >= 2]
no_decay = [p for p in params if p.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=lr, betas=(b1, b2), eps=eps, foreach=False)
loss = loss_fn()
loss.backward()
opt.step()
model.eval()
with torch.no_grad():
    after = loss_fn().item()
print(json.dumps({"loss_before": loss.item(), "loss_after": after}))
