#!/usr/bin/env python3
"""Greedy continuation of token ids by transformers' GPT2LMHeadModel, loaded from a kiln checkpoint.

    greedy_generate.py DIR IDS_JSON N CANDIDATES

DIR: a checkpoint directory as kiln writes it (model.safetensors + config.json). IDS_JSON: the
context, a JSON list of ids (kiln sample's end-of-text then the prompt's ids). Runs N steps of
greedy decoding written out here (the full forward each step, no cache, no generate() settings to
get wrong): the next id is the argmax of the last position's logits over ids [0, CANDIDATES) --
what `kiln sample --temperature 0` draws among (its tokenizer's ids). Prints one JSON line
{"ids": [...]} with the N new ids. fp32 on the CPU. Exit 77 when transformers is missing.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main():
    if len(sys.argv) != 5:
        print("usage: greedy_generate.py DIR IDS_JSON N CANDIDATES", file=sys.stderr)
        sys.exit(2)
    ckpt, ids, n, candidates = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    try:
        import torch
        import transformers
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        print(f"greedy_generate: SKIP: {e}", file=sys.stderr)
        sys.exit(77)
    transformers.utils.logging.disable_progress_bar()
    model = GPT2LMHeadModel.from_pretrained(ckpt, local_files_only=True, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids + out]), use_cache=False).logits[0, -1, :candidates]
            out.append(int(logits.argmax()))
    print(json.dumps({"ids": out}))


if __name__ == "__main__":
    main()
