#!/usr/bin/env python3
"""The PyTorch peer of `kiln bench` (issue 21, point 2): a plain GPT-2 training loop, as a user
would write it, measured on the same GPU in the same call as kiln.

    python bench/pytorch_gpt2.py --model gpt2-124m --micro-batch 16 [--compile] [--steps 30]

The model is kiln's (models/gpt.h) written the nanoGPT way: learned positions, pre-LayerNorm
blocks (eps 1e-5), fused QKV with bias, causal SDPA (F.scaled_dot_product_attention: flash on a
GPU), GELU (tanh approximation), the output layer tied to wte, the vocabulary padded to a
multiple of 128 (50304 for GPT-2's 50257) as kiln pads it. Training: bf16 autocast (fp32 weights,
PyTorch AMP's usual recipe), AdamW(fused=True on CUDA) with kiln's defaults (betas 0.9/0.95,
weight decay 0.1 on matrices and embeddings only), gradient clipping at 1.0, random tokens.

Counted as kiln counts (models/flops.h, docs/metrics.md): FLOPs per token
F = 6 N + 12 L d T, N = the parameters less the position embedding (the padded vocabulary's rows
included); MFU = tokens/s x F / peak, peak 989 TFLOP/s for H100 / H200 (dense bf16) or
--peak-tflops. The first --warmup-steps steps (compilation, allocator warm-up) are not timed (the
loop, the command line and the JSON line: bench/peer_loop.py, shared with pytorch_llama.py).
Prints one JSON line: params, flops_per_token, tokens_per_s, step_ms, tflops, mfu, peak_mem_gb,
loss (first, last). tests/cli/pytorch_peer.sh checks on the CPU that N and F equal kiln's.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import peer_loop

PRESETS = {  # kiln's (models/gpt_config.cpp): layers, heads, width, context, vocabulary
    "tiny": (4, 4, 128, 128, 512),
    "gpt2-124m": (12, 12, 768, 1024, 50257),
    "gpt2-350m": (24, 16, 1024, 1024, 50257),
    "gpt2-774m": (36, 20, 1280, 1024, 50257),
    "gpt2-1.5b": (48, 25, 1600, 1024, 50257),
}


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=1e-5)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, d, seq_len, vocab):
        super().__init__()
        self.padded_vocab = (vocab + 127) // 128 * 128
        self.wte = nn.Embedding(self.padded_vocab, d)
        self.wpe = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output layer
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    args = peer_loop.parse_args(__doc__, PRESETS, "gpt2-124m", 16)
    layers, heads, d, seq_len, vocab = PRESETS[args.model]
    seq_len = args.seq_len or seq_len
    dev = peer_loop.device(args)
    model = GPT(layers, heads, d, seq_len, vocab).to(dev)
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * (params - model.wpe.weight.numel()) + 12 * layers * d * seq_len
    peer_loop.run(args, dev, model, seq_len, vocab, params, flops_per_token)


if __name__ == "__main__":
    main()
