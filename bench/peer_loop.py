"""What kiln's PyTorch peers share (bench/pytorch_gpt2.py, bench/pytorch_llama.py): their command
line, the device set-up, and the measured training loop with its one JSON line.

The loop is a plain PyTorch user's: bf16 autocast over fp32 weights (--dtype fp32: none),
AdamW(fused=True on CUDA) with kiln's defaults (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
matrices and embeddings only), gradient clipping at 1.0, one fixed batch of random tokens. The
first --warmup-steps steps (compilation, allocator warm-up) are not timed; the timed steps end
in one synchronisation. MFU = tokens/s x flops_per_token / peak (989 TFLOP/s for H100 / H200
dense bf16, or --peak-tflops).
"""
import argparse
import json
import time

import torch

PEAKS = [("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0)]


def parse_args(doc, presets, default_model, default_micro_batch):
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default=default_model, choices=sorted(presets))
    ap.add_argument("--micro-batch", type=int, default=default_micro_batch)
    ap.add_argument("--seq-len", type=int, default=0, help="default: the preset's context")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (0: print the counts and exit)")
    ap.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first (compilation)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="autocast dtype (fp32: none)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1337)
    return ap.parse_args()


def device(args):
    """The seeded device, TF32 allowed on CUDA (as a PyTorch user's bf16 recipe has it)."""
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return dev


def run(args, dev, model, seq_len, vocab, params, flops_per_token):
    """--steps 0: prints the counts; otherwise trains model (forward(idx, targets) -> loss) and
    prints the measured JSON line."""
    if args.steps == 0:
        print(json.dumps({"model": args.model, "seq_len": seq_len, "params": params, "flops_per_token": flops_per_token}))
        return
    cuda = dev.type == "cuda"
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
