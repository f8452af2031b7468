#!/usr/bin/env python3
"""Test material for tests/hf/tokenizer.sh, made here with Hugging Face's tokenizers (no download).

    make_tokenizer.py DIR

Writes into DIR:
  doc0.txt .. doc3.txt   UTF-8 text: sentences of a small word list, with accents and a CJK word
  tok/tokenizer.json     a byte-level BPE trained on them (GPT-2's kind: ByteLevel pre-tokenizer and
                         decoder, <|endoftext|> special), 320 ids
  tok/vocab.json, tok/merges.txt   the same model as GPT-2 ships its files
  wordpiece.json         a WordPiece tokenizer (not byte-level BPE: kiln must refuse it)
  noeot.json             a byte-level BPE without <|endoftext|> (refused)
  latin1.txt             text that is not UTF-8 (a BPE tokenizer cannot read it: refused)
"""
import os
import random
import sys

from tokenizers import ByteLevelBPETokenizer, Tokenizer, models, pre_tokenizers, trainers


def main():
    out = sys.argv[1]
    random.seed(7)
    words = "the quick brown fox jumps over a lazy dog while kiln trains models on many nodes héllo wörld 日本".split()
    docs = []
    for k in range(4):
        docs.append(" ".join(random.choice(words) for _ in range(6000)) + f"\ndocument {k}\n")
        with open(os.path.join(out, f"doc{k}.txt"), "w", encoding="utf-8") as f:
            f.write(docs[-1])
    os.makedirs(os.path.join(out, "tok"), exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=320, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    bpe.save(os.path.join(out, "tok", "tokenizer.json"))
    bpe.save_model(os.path.join(out, "tok"))
    noeot = ByteLevelBPETokenizer()
    noeot.train_from_iterator(docs, vocab_size=300, min_frequency=2, show_progress=False)
    noeot.save(os.path.join(out, "noeot.json"))
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.train_from_iterator(docs, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]", "<|endoftext|>"], show_progress=False))
    wp.save(os.path.join(out, "wordpiece.json"))
    with open(os.path.join(out, "latin1.txt"), "wb") as f:
        f.write("caf\u00e9 au lait".encode("latin-1"))


if __name__ == "__main__":
    main()
