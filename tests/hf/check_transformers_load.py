#!/usr/bin/env python3
"""Load a kiln checkpoint directory with Hugging Face transformers and report its loss.

    check_transformers_load.py DIR TOKENS_FILE

DIR holds model.safetensors and config.json as kiln writes them (runtime/checkpoint/hf_gpt2.h). It is loaded
with GPT2LMHeadModel.from_pretrained(DIR) offline (HF_HUB_OFFLINE=1, local_files_only), in fp32.
The check fails (exit 1) unless every weight of the model came from the file and every tensor of
the file was used: no missing (newly initialised), unexpected, or mismatched keys, and lm_head
tied to transformer.wte.

TOKENS_FILE is JSON, {"sequences": [[t_0 .. t_T], ...]} or just the list of sequences, all of one
length T + 1 <= n_positions + 1. The loss is the mean next-token cross-entropy over all positions:
inputs t_0..t_{T-1}, targets t_1..t_T, over the model's vocab_size logits -- what kiln's
GPT::loss computes on the same batch. Prints one JSON line: {"loss": ..., "tokens": ..., ...}.

Exit codes: 0 ok, 1 check failed, 2 bad arguments, 77 transformers/safetensors not installed
(the CTest skip code).
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def fail(msg):
    print(f"check_transformers_load: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 3:
        print("usage: check_transformers_load.py DIR TOKENS_FILE", file=sys.stderr)
        sys.exit(2)
    ckpt, tokens_file = sys.argv[1], sys.argv[2]
    try:
        import safetensors  # noqa: F401  (transformers reads model.safetensors with it)
        import torch
        import transformers
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        print(f"check_transformers_load: SKIP: {e} (launch/setup.sh installs transformers into .venv)",
              file=sys.stderr)
        sys.exit(77)

    transformers.utils.logging.disable_progress_bar()
    model, info = GPT2LMHeadModel.from_pretrained(
        ckpt, local_files_only=True, output_loading_info=True, dtype=torch.float32)
    problems = {k: sorted(map(str, v)) for k, v in info.items() if v}
    if problems:
        # missing_keys: newly initialised; unexpected_keys: in the file, unused; mismatched_keys.
        fail(f"{ckpt}: transformers did not load the file cleanly: {json.dumps(problems)}")
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        fail(f"{ckpt}: lm_head.weight is not tied to transformer.wte.weight")
    bad_dtype = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad_dtype:
        fail(f"{ckpt}: parameters not float32: {bad_dtype[:3]}")

    with open(tokens_file) as f:
        data = json.load(f)
    seqs = torch.tensor(data["sequences"] if isinstance(data, dict) else data, dtype=torch.long)
    if seqs.dim() != 2 or seqs.size(1) < 2:
        fail(f"{tokens_file}: need a list of equal-length sequences of at least 2 tokens")
    inputs, targets = seqs[:, :-1], seqs[:, 1:]

    model.eval()
    with torch.no_grad():
        logits = model(input_ids=inputs).logits
    vocab = model.config.vocab_size
    if logits.size(-1) != vocab:
        fail(f"logits have {logits.size(-1)} entries, config vocab_size is {vocab}")
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1))
    print(json.dumps({
        "loss": loss.item(),
        "tokens": targets.numel(),
        "sequences": seqs.size(0),
        "vocab_size": vocab,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
