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
--peak-tflops. The first --warmup-steps steps (compilation, allocator warm-up) are not timed.
Prints one JSON line: params, flops_per_token, tokens_per_s, step_ms, tflops, mfu, peak_mem_gb,
loss (first, last). tests/cli/pytorch_peer.sh checks on the CPU that N and F equal kiln's.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # kiln's (models/gpt_config.cpp): layers, heads, width, context, vocabulary
    "tiny": (4, 4, 128, 128, 512),
    "gpt2-124m": (12, 12, 768, 1024, 50257),
    "gpt2-350m": (24, 16, 1024, 1024, 50257),
    "gpt2-774m": (36, 20, 1280, 1024, 50257),
    "gpt2-1.5b": (48, 25, 1600, 1024, 50257),
}
PEAKS = [("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0)]


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=0, help="default: the preset's context")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (0: print the counts and exit)")
    ap.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first (compilation)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="autocast dtype (fp32: none)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()

    layers, heads, d, seq_len, vocab = PRESETS[args.model]
    seq_len = args.seq_len or seq_len
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = GPT(layers, heads, d, seq_len, vocab).to(dev)
    params = sum(p.numel() for p in model.parameters())
    flops_per_token = 6 * (params - model.wpe.weight.numel()) + 12 * layers * d * seq_len
    if args.steps == 0:
        print(json.dumps({"model": args.model, "seq_len": seq_len, "params": params, "flops_per_token": flops_per_token}))
        return
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
    step_fn = torch.compile(model) if args.compile else model
    x = torch.randint(0, vocab, (args.micro_batch, seq_len), device=dev)
    y = torch.randint(0, vocab, (args.micro_batch, seq_len), device=dev)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def step():
        with amp:
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    losses = []
    for _ in range(args.warmup_steps):
        losses.append(step().item())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    last = loss.item()  # synchronises once, after the timed steps
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens_per_s = args.steps * args.micro_batch * seq_len / seconds
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAKS if k in name), 0.0)
    tflops = tokens_per_s * flops_per_token / 1e12
    print(json.dumps({
        "peer": "pytorch" + ("+compile" if args.compile else " eager"),
        "torch": torch.__version__, "device": name, "model": args.model, "micro_batch": args.micro_batch,
        "seq_len": seq_len, "dtype": args.dtype, "params": params, "flops_per_token": flops_per_token,
        "steps": args.steps, "step_ms": 1e3 * seconds / args.steps, "tokens_per_s": tokens_per_s, "tflops": tflops,
        "mfu": tflops / peak if peak else None,
        "peak_mem_gb": torch.cuda.max_memory_allocated(dev) / 1e9 if cuda else None,
        "loss_first": losses[0] if losses else None, "loss_last": last,
    }))


if __name__ == "__main__":
    main()
