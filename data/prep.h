// data/prep.h -- `kiln prep`: text files to llm.c token shards, and the tokenizer beside them.
//
// Documents: a text file is one document, or several split at `separator` (the pieces between
// its occurrences; empty ones dropped); a JSONL file (input_format jsonl, or auto and a name
// ending in .jsonl: Hugging Face datasets' to_json export) is one document per line, the string
// in its `jsonl_field` ("text"). A line that is not JSON, or has no such string, is refused with
// the file and line.
// Tokenizer, by default the byte-level one: byte b -> token b (0..255); every document is
// preceded by the end-of-text token 256, as llm.c precedes GPT-2 documents with
// EOT. Vocabulary: 257 ids, so any model with vocab_size >= 257 (the tiny preset has 512) trains
// on the output. With `tokenizer` (a Hugging Face tokenizer.json) or `vocab` + `merges` (GPT-2's
// vocab.json and merges.txt), a byte-level BPE (data/hf_tokenizer.h) encodes instead, through
// Python's tokenizers library (tools/bpe_tokenizer.py): each document is end-of-text (the tokenizer's
// <|endoftext|> id), then its ids.
// Streamed (docs/data.md): one input file and one shard in memory at a time; the shards go into
// a staging directory in out_dir and are moved in once all are written; progress on stderr every
// 5 s of a long run (the BPE path's from tools/bpe_tokenizer.py's per-file lines, as they come).
// Chat (`chat`, kiln prep --chat; tools/chat_data.py): every input is JSONL of conversations
// ({"messages": [{"role", "content"}, ...]} per line, the field `jsonl_field` or "messages"), each
// rendered by the tokenizer's own chat template (tokenizer_config.json's or chat_template.jinja
// beside `tokenizer`, or `chat_template`'s file) through transformers' apply_chat_template, and a
// document. Beside every shard X.bin goes its target mask X.mask (data/target_mask.h): 1 on the
// assistant's turns, which training and evaluation take the loss over, 0 elsewhere; and beside the
// tokenizer the template as chat_template.jinja, which training's checkpoints carry in their
// tokenizer_config.json.
// Output: <out_dir>/val_000000.bin holding the first `val_tokens` tokens (none if 0), then
// <out_dir>/train_000000.bin, train_000001.bin, ... of at most `shard_tokens` tokens each, and
// <out_dir>/tokenizer.json: the tokenizer, which `kiln train` finds beside the shards and every
// checkpoint carries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

constexpr int32_t kByteEot = 256;
constexpr int64_t kByteVocab = 257;

struct PrepConfig {
  std::vector<std::string> inputs;    // text or JSONL files (documents: above)
  std::string input_format = "auto";  // auto (.jsonl -> jsonl, else text) | text | jsonl
  std::string jsonl_field;            // the JSONL field holding a document's text ("text"), or a conversation's messages ("messages")
  bool chat = false;                  // inputs are chat JSONL (above); needs `tokenizer`
  std::string chat_template;          // a Jinja chat template file to use instead of the tokenizer's own
  std::string separator;              // text files: documents end where this text stands; empty: one per file
  std::string out_dir;                // created if missing
  int64_t shard_tokens = 100'000'000; // tokens per train shard (llm.c's default shard size)
  int64_t val_tokens = 0;             // tokens for the validation shard
  std::string tokenizer;              // a tokenizer.json to encode with; empty = byte-level (or vocab + merges)
  std::string vocab, merges;          // GPT-2-style vocab.json + merges.txt, both or neither
};

struct PrepResult {
  int64_t total_tokens = 0;
  int64_t input_files = 0;         // text files read (after expanding globs)
  int64_t documents = 0;           // documents in them (each begins with end-of-text)
  std::vector<std::string> files;  // every shard written, val first
  std::string tokenizer_file;      // the tokenizer.json written beside them
  std::string tokenizer;           // "byte" or "bpe"
  int64_t vocab_size = 0;          // the tokenizer's ids: a model needs at least this --vocab-size
  int64_t eot = 0;                 // its end-of-text id
  int64_t trained_tokens = -1;     // chat: the tokens the masks train on (-1: no masks)
  std::string chat_template_file;  // chat: the chat_template.jinja written beside the tokenizer
};

// The JSONL field prep reads: cfg.jsonl_field, else "messages" under --chat and "text" otherwise.
std::string jsonl_field_of(const PrepConfig& cfg);

// Byte-level tokens of one document: EOT then its bytes.
std::vector<int32_t> tokenize_bytes(const std::string& text);

// The documents of one input file's contents (rules above); `path` names it in errors. A text file
// without a separator is its one document: `contents` moves in, not copied.
std::vector<std::string> split_documents(const std::string& path, std::string contents, const PrepConfig& cfg);

// Throws ConfigError for bad settings and DataError for unreadable inputs or write failures.
PrepResult run_prep(const PrepConfig& cfg);

}  // namespace kiln
