#!/usr/bin/env python3
# tools/bpe_tokenizer.py (not tokenize.py: that would shadow the standard library's module for
# every script in tools/) -- byte-level BPE encoding for kiln, through Hugging Face's `tokenizers`.
#
# kiln does not implement BPE itself: encoding (the pre-tokenizer's regex, the merges) is the
# `tokenizers` library's, as it is for transformers. kiln's C++ side (data/hf_tokenizer.h) runs
# this script and reads what it prints; decoding needs no library (ids -> bytes by the vocabulary
# and GPT-2's byte <-> unicode table) and stays in C++.
#
#   bpe_tokenizer.py prep (--tokenizer tokenizer.json | --vocab vocab.json --merges merges.txt)
#                    [--input-format auto|text|jsonl] [--jsonl-field F] [--separator S]
#                    --save OUT.json [--ids-out IDS] FILE...
#       Every FILE's documents (data/prep.h's rules: a text file is one, or several split at S;
#       a JSONL file one per line, its field F) are written as end-of-text, then their ids, to
#       IDS (default: stdout) as they are encoded: kiln prep streams them into shards. After each
#       file a line `progress FILES_DONE FILES IDS` on stderr (kiln prep shows it every 5 s). Writes the ids of all documents
#       to stdout as little-endian uint32, and the tokenizer (as tokenizer.json; built from the
#       vocabulary and merges when those are given) to OUT.json.
#       With --chat (tools/chat_data.py): every FILE is chat JSONL (JSONL_FIELD: the messages), each
#       conversation rendered by the tokenizer's chat template (--chat-template FILE, else the one
#       beside --tokenizer) is a document, and MASK (--mask-out) gets one byte per id, 1 where the
#       id is trained on (the assistant's turns); --template-out OUT.jinja: the template used.
#   bpe_tokenizer.py encode --tokenizer tokenizer.json --text TEXT
#       Prints the ids of TEXT (no end-of-text added) as one JSON list.
#
# The tokenizer must be a byte-level BPE (GPT-2's kind: model BPE, decoder ByteLevel) with
# an `<|endoftext|>` token, the end-of-text id kiln puts before every document -- or, without one,
# Llama 3's `<|begin_of_text|>` (its documents' opening token) -- or a BPE of SentencePiece's kind
# (Llama 2's, Mistral's: byte fallback, Metaspace), whose documents open with `<s>`
# (data/hf_tokenizer.h). Special tokens
# written in the text itself ("<|endoftext|>") encode to their ids, as the tokenizers library does.
# Bad input: one line `kiln: error: ...` on stderr, exit 2.
import argparse
import array
import json
import sys

import chat_data

EOT = "<|endoftext|>"


def die(message):
    print(f"kiln: error: {message}", file=sys.stderr)
    sys.exit(2)


def load(args, command):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError:
        die(f"{command} needs the Python package 'tokenizers' in KILN_PYTHON's environment (bash launch/setup.sh installs it)")
    if args.tokenizer:
        try:
            tok = Tokenizer.from_file(args.tokenizer)
        except Exception as e:  # the library's own message: a missing file, JSON it cannot read
            die(f"{command}: --tokenizer {args.tokenizer}: cannot load it as a tokenizers tokenizer.json ({str(e).splitlines()[0]})")
        where = args.tokenizer
    else:
        try:
            model = models.BPE.from_file(args.vocab, args.merges)
        except Exception as e:
            die(f"{command}: --vocab {args.vocab} --merges {args.merges}: cannot load them as a BPE model ({str(e).splitlines()[0]})")
        tok = Tokenizer(model)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.decoder = decoders.ByteLevel()  # as GPT-2's own tokenizer.json has them
        if tok.token_to_id(EOT) is not None:
            tok.add_special_tokens([EOT])  # GPT-2's vocab.json holds it; marked special as in its tokenizer.json
        where = args.vocab
    spec = json.loads(tok.to_str())
    model_type, decoder_type = (spec.get("model") or {}).get("type"), (spec.get("decoder") or {}).get("type")
    # SentencePiece's kind (Llama 2, Mistral): byte fallback, spaces spelled U+2581 (data/hf_tokenizer.h)
    sp = "Metaspace" in json.dumps(spec.get("decoder")) + json.dumps(spec.get("pre_tokenizer")) or \
        bool((spec.get("model") or {}).get("byte_fallback"))
    if model_type != "BPE" or (not sp and decoder_type != "ByteLevel"):
        die(f"{command}: {where}: kiln reads byte-level BPE tokenizers (GPT-2's, Qwen2's, Llama 3's: decoder ByteLevel) and "
            f"SentencePiece-kind BPE ones (Llama 2's, Mistral's: byte fallback, Metaspace); this one is model {model_type}, decoder {decoder_type}")
    eot = tok.token_to_id(EOT)
    if eot is None:
        eot = tok.token_to_id("<|begin_of_text|>")  # Llama 3's
    if eot is None and sp:
        eot = tok.token_to_id("<s>")  # SentencePiece's document token
    if eot is None:
        die(f"{command}: {where}: the tokenizer has no {EOT} token (nor Llama 3's <|begin_of_text|>, nor SentencePiece's <s>; "
            "kiln puts it before every document)")
    return tok, eot


def documents(path, contents, args):
    """The documents of one file, as data/prep.cpp's split_documents (which checks the JSONL lines first)."""
    if args.input_format == "jsonl" or (args.input_format == "auto" and path.endswith(".jsonl")):
        docs = []
        for n, line in enumerate(contents.split("\n"), 1):
            if not line.strip(" \t\r"):
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                die(f"prep: {path}, line {n}: not JSON (a JSONL file holds one JSON object per line)")
            if not isinstance(rec, dict) or not isinstance(rec.get(args.jsonl_field), str):
                die(f"prep: {path}, line {n}: no string field '{args.jsonl_field}' (give --jsonl-field NAME for another)")
            docs.append(rec[args.jsonl_field])
        return docs
    if not args.separator:
        return [contents]
    return [d for d in contents.split(args.separator) if d]


def chats(path, contents, args):
    """The conversations of one chat JSONL file: (where, messages) per non-blank line."""
    for n, line in enumerate(contents.split("\n"), 1):
        if not line.strip(" \t\r"):
            continue
        where = f"{path}, line {n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            die(f"prep: {where}: not JSON (a chat file holds one JSON object per line)")
        yield where, chat_data.check_messages(rec, args.jsonl_field, where, die)


def prep(args):
    if not args.tokenizer and not (args.vocab and args.merges):
        die("kiln prep: give --tokenizer tokenizer.json, or --vocab vocab.json with --merges merges.txt")
    tok, eot = load(args, "prep")
    try:
        out = open(args.ids_out, "wb") if args.ids_out else sys.stdout.buffer
    except OSError as e:
        die(f"prep: --ids-out {args.ids_out}: cannot write: {e.strerror}")
    hf = template = mask_out = None
    if args.chat:
        if not args.tokenizer or not args.mask_out:
            die("kiln prep --chat: give --tokenizer tokenizer.json (its chat template beside it) and --mask-out")
        hf, template = chat_data.chat_tokenizer(tok, args.tokenizer, args.chat_template, die)
        try:
            mask_out = open(args.mask_out, "wb")
        except OSError as e:
            die(f"prep: --mask-out {args.mask_out}: cannot write: {e.strerror}")
        if args.template_out:
            with open(args.template_out, "w", encoding="utf-8") as f:
                f.write(template)
    written = 0
    for k, path in enumerate(args.files):
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8")
        except OSError as e:
            die(f"prep: {path}: cannot read: {e.strerror}")
        except UnicodeDecodeError as e:
            die(f"prep: {path}: not UTF-8 text (byte {e.start}); a BPE tokenizer reads text (the byte-level default reads any bytes)")
        if args.chat:
            for where, messages in chats(path, text, args):
                doc, trained = chat_data.conversation(hf, tok, template, messages, eot, where, die)
                ids = array.array("I", doc)
                if sys.byteorder != "little":
                    ids.byteswap()
                out.write(ids.tobytes())
                mask_out.write(bytes(trained))
                written += len(ids)
        for doc in [] if args.chat else documents(path, text, args):
            ids = array.array("I", [eot])
            ids.extend(tok.encode(doc, add_special_tokens=False).ids)
            if sys.byteorder != "little":
                ids.byteswap()
            out.write(ids.tobytes())
            written += len(ids)
        print(f"progress {k + 1} {len(args.files)} {written}", file=sys.stderr, flush=True)
    out.flush()
    if args.ids_out:
        out.close()
    if mask_out:
        mask_out.close()
    tok.save(args.save)


def encode(args):
    if not args.tokenizer:
        die("bpe_tokenizer.py encode: give --tokenizer tokenizer.json")
    tok, _ = load(args, "kiln sample")
    print(json.dumps(tok.encode(args.text, add_special_tokens=False).ids))


def main():
    parser = argparse.ArgumentParser(description="byte-level BPE encoding for kiln (tokenizers)")
    parser.add_argument("command", choices=["prep", "encode"])
    parser.add_argument("--tokenizer")
    parser.add_argument("--vocab")
    parser.add_argument("--merges")
    parser.add_argument("--save")
    parser.add_argument("--ids-out")
    parser.add_argument("--text", default="")
    parser.add_argument("--input-format", default="auto", choices=["auto", "text", "jsonl"])
    parser.add_argument("--jsonl-field", default="text")
    parser.add_argument("--separator", default="")
    parser.add_argument("--chat", action="store_true")
    parser.add_argument("--chat-template")
    parser.add_argument("--mask-out")
    parser.add_argument("--template-out")
    parser.add_argument("files", nargs="*")
    args = parser.parse_intermixed_args()
    if args.command == "prep":
        if not args.save:
            die("bpe_tokenizer.py prep: give --save OUT.json")
        prep(args)
    else:
        encode(args)


if __name__ == "__main__":
    main()
