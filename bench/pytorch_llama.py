#!/usr/bin/env python3
"""The PyTorch peer of `kiln bench` for the Llama family (issue 49): a plain Llama training loop, as
a transformers / torchtitan user would write it, measured on the same GPU in the same call as kiln.

    python bench/pytorch_llama.py --model llama3-1b --micro-batch 4 --seq-len 2048 [--compile] [--steps 30]

The model is kiln's Llama shape (models/gpt_config.h) written the Hugging Face way: pre-RMSNorm
blocks (torch.nn.RMSNorm, the preset's eps), rotary position embeddings in transformers' rotate-half
layout (base rope_theta; Llama-3.1's frequency scaling for llama3-1b, as models/rotary.h),
separate q / k / v / o projections, grouped-query attention through causal SDPA
(F.scaled_dot_product_attention(..., enable_gqa=True): flash on a GPU; k and v repeated on a torch
without enable_gqa), a SwiGLU feed-forward down(silu(gate x) * up x), no biases (q, k, v biases
for qwen2-0.5b), an lm_head of its own unless the preset ties it to the token embedding, the
vocabulary padded to a multiple of 128 as kiln pads it. Training exactly as bench/pytorch_gpt2.py (bench/peer_loop.py):
bf16 autocast (fp32 weights), AdamW(fused=True on CUDA) with kiln's defaults (betas 0.9/0.95,
weight decay 0.1 on matrices and embeddings only), gradient clipping at 1.0, random tokens.

Counted as kiln counts (models/flops.h): FLOPs per token F = 6 N + 12 L d T, N = the parameters
less the token embedding when lm_head is untied (a lookup; tied, it is the output layer and
counted once); MFU = tokens/s x F / peak, peak 989 TFLOP/s for H100 / H200 (dense bf16) or
--peak-tflops. The first --warmup-steps steps (compilation, allocator warm-up) are not timed.
--steps 0 builds the model on the meta device (no memory, no init: llama3-8b in a second) and
prints params and flops_per_token only. Otherwise prints one JSON line as pytorch_gpt2.py does.
tests/cli/pytorch_peer.sh checks on the CPU that N and F equal kiln's.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import peer_loop


def llama_ffn_hidden(d, multiplier, multiple_of):  # models/gpt_config.cpp's llama_ffn_hidden
    f = int(multiplier * (2 * (4 * d) // 3))
    return (f + multiple_of - 1) // multiple_of * multiple_of


# kiln's presets (models/gpt_config.cpp): layers, heads, kv heads, width, ffn, context, vocabulary,
# rope_theta, rope_factor (Llama-3.1 scaling; 0: none), norm eps, tied, q/k/v biases
PRESETS = {
    "tiny-llama": (4, 4, 2, 128, llama_ffn_hidden(128, 1.0, 32), 128, 512, 1e4, 0.0, 1e-5, False, False),
    "llama3-1b": (16, 32, 8, 2048, llama_ffn_hidden(2048, 1.5, 256), 8192, 128256, 5e5, 32.0, 1e-5, True, False),
    "llama3-8b": (32, 32, 8, 4096, llama_ffn_hidden(4096, 1.3, 1024), 8192, 128256, 5e5, 0.0, 1e-5, False, False),
    "mistral-7b": (32, 32, 8, 4096, 14336, 8192, 32000, 1e4, 0.0, 1e-5, False, False),
    "qwen2-0.5b": (24, 14, 2, 896, 4864, 8192, 151936, 1e6, 0.0, 1e-6, True, True),
}


def sdpa_has_gqa():
    try:
        q = torch.zeros(1, 2, 1, 2)
        F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], is_causal=True, enable_gqa=True)
        return True
    except TypeError:  # torch < 2.5
        return False


GQA = sdpa_has_gqa()


def rope_inv_freq(h, theta, factor, low=1.0, high=4.0, original=8192):
    """inv_freq [h/2] = theta^(-2i/h), with Llama-3.1's scaling when factor > 0 (transformers'
    _compute_llama3_parameters): wavelengths over original/low divided by factor, under
    original/high kept, those between interpolated."""
    inv = 1.0 / theta ** (torch.arange(0, h, 2, dtype=torch.int64).float() / h)
    if factor <= 0:
        return inv
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):  # [x1, x2] -> [-x2, x1], halves of the head width
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn, eps, qkv_bias):
        super().__init__()
        self.heads, self.kv_heads, self.h = heads, kv_heads, d // heads
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.q_proj = nn.Linear(d, d, bias=qkv_bias)
        self.k_proj = nn.Linear(d, kv_heads * self.h, bias=qkv_bias)
        self.v_proj = nn.Linear(d, kv_heads * self.h, bias=qkv_bias)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        a = self.input_layernorm(x)
        q = self.q_proj(a).view(b, t, self.heads, self.h).transpose(1, 2)  # [B, H, T, h]
        k = self.k_proj(a).view(b, t, self.kv_heads, self.h).transpose(1, 2)  # [B, KV, T, h]
        v = self.v_proj(a).view(b, t, self.kv_heads, self.h).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # as transformers: the tables in q's dtype
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if GQA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        else:
            g = self.heads // self.kv_heads
            y = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, d))
        m = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))


class Llama(nn.Module):
    def __init__(self, layers, heads, kv_heads, d, ffn, seq_len, vocab, theta, rope_factor, eps, tied, qkv_bias):
        super().__init__()
        self.padded_vocab = (vocab + 127) // 128 * 128
        self.embed_tokens = nn.Embedding(self.padded_vocab, d)
        self.layers = nn.ModuleList(Block(d, heads, kv_heads, ffn, eps, qkv_bias) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=eps)
        self.lm_head = None if tied else nn.Linear(d, self.padded_vocab, bias=False)
        # cos / sin [T, h] in fp32, made once: cat(p * inv_freq, p * inv_freq) for p < T
        angles = torch.outer(torch.arange(seq_len).float(), rope_inv_freq(d // heads, theta, rope_factor))
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for name, p in self.named_parameters():
            if "layernorm" in name or name == "norm.weight":
                nn.init.ones_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:  # kiln's: 0.02, the residual projections 0.02 / sqrt(2 L)
                resid = name.endswith(("o_proj.weight", "down_proj.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if resid else 0.02)

    def forward(self, idx, targets):
        t = idx.size(1)
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, self.cos[:t], self.sin[:t])
        x = self.norm(x)
        logits = self.lm_head(x) if self.lm_head is not None else F.linear(x, self.embed_tokens.weight)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def main():
    args = peer_loop.parse_args(__doc__, PRESETS, "llama3-1b", 4)
    layers, heads, kv_heads, d, ffn, seq_len, vocab, theta, rope_factor, eps, tied, qkv_bias = PRESETS[args.model]
    seq_len = args.seq_len or seq_len
    dev = peer_loop.device(args)
    with torch.device("meta" if args.steps == 0 else dev):  # made (and initialised) where it runs
        model = Llama(layers, heads, kv_heads, d, ffn, seq_len, vocab, theta, rope_factor, eps, tied, qkv_bias)
    params = sum(p.numel() for p in model.parameters())
    lookup = 0 if tied else model.embed_tokens.weight.numel()  # untied: the token embedding is not a matmul
    flops_per_token = 6 * (params - lookup) + 12 * layers * d * seq_len
    peer_loop.run(args, dev, model, seq_len, vocab, params, flops_per_token)


if __name__ == "__main__":
    main()
