// data/hf_tokenizer.h -- Hugging Face tokenizer.json: BPE tokenizers read and written.
//
// The format is the `tokenizers` library's (what transformers' fast tokenizers load). kiln takes
// two kinds of BPE tokenizer.
//
// Byte-level (GPT-2's kind: model BPE, decoder ByteLevel; GPT-2's, Qwen2's and Llama 3's
// tokenizer.json), with a token that precedes every document: `<|endoftext|>` (GPT-2, Qwen2), or
// Llama 3's `<|begin_of_text|>` where there is no `<|endoftext|>`; then a sample also ends at
// `<|end_of_text|>` and `<|eot_id|>`. Every token's string spells bytes through GPT-2's byte <->
// unicode table (bytes_to_unicode in GPT-2's encoder.py: the 188 printable bytes '!'..'~',
// U+00A1..U+00AC, U+00AE..U+00FF stand for themselves, the other 68 bytes for U+0100, U+0101, ...
// in byte order), so:
//   decode(ids) = concat over ids of bytes(vocab^-1[id]) -- special tokens (end-of-text) give
//   nothing -- is a table lookup, done here in C++;
//   encode(text) needs the pre-tokenizer's regex and the merges, and is left to the library
//   itself (tools/bpe_tokenizer.py through distributed/python_tool.h), not written again here.
//
// SentencePiece's kind (Llama 2's and Mistral's: model BPE with byte_fallback, spaces spelled
// U+2581 by a Metaspace pre-tokenizer or a normalizer; the document token <s>, the end </s>).
// Encoding goes through the library as above. A token's string is its text with spaces spelled
// U+2581, and a byte no token holds is a token "<0x0A>". Decoding runs the file's own decoder
// chain -- the library's steps re-done here (tokenizers 0.2x; checked against the library on
// sampled ids by tests/hf/tokenizer.sh) -- over the token strings, the special tokens left out
// (the library's skip_special_tokens):
//   Replace(p, c)     every token: each p replaced by c
//   ByteFallback      each run of byte tokens "<0xHH>": its bytes if they are UTF-8, else one
//                     U+FFFD per byte
//   Fuse              the tokens joined into one
//   Strip(c, a, b)    every token: up to a leading and b trailing c removed
//   Metaspace(r, s)   every token: r -> ' ', except in the first token, where (s not "never")
//                     every r is dropped
// Here rather than in Python because `kiln sample` decodes after every token it streams.
// Other decoders (WordPiece, a Unigram model, ...) are refused with one line.
//
// kiln's byte-level tokenizer (byte b -> id b, end-of-text 256) is written in the same format,
// as a BPE with no merges whose vocabulary maps byte_char(b) to b, so transformers'
// AutoTokenizer loads every kiln checkpoint's tokenizer alike; reading such a file back gives
// the ByteTokenizer, which needs no Python.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace kiln {

// The name of the end-of-text token in every tokenizer kiln reads or writes.
constexpr const char* kEotToken = "<|endoftext|>";

// GPT-2's byte <-> unicode table: the UTF-8 of the character that stands for byte b.
const std::string& byte_char(unsigned char b);

// A byte-level or SentencePiece-kind BPE tokenizer from a tokenizer.json. Decodes in C++; encodes a non-empty text
// through tools/bpe_tokenizer.py (Python's tokenizers), which reads the file at `path`.
class BpeTokenizer : public Tokenizer {
 public:
  // `json_text`: the file's contents; `path`: where it is. ConfigError naming `path` for JSON
  // that is not a byte-level BPE tokenizer with <|endoftext|>.
  BpeTokenizer(std::string path, std::string json_text);
  std::string name() const override { return "bpe"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(bytes_.size()); }
  int64_t eot() const override { return eot_; }
  std::string eot_text() const override { return eot_text_; }
  std::string eos_text() const override { return eos_text_; }
  std::string unk_text() const override { return unk_text_; }
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string hf_json() const override { return text_; }
  std::vector<int64_t> end_tokens() const override { return ends_; }
  bool sentencepiece() const { return sp_; }

 private:
  struct DecodeStep {  // one step of a SentencePiece-kind decoder chain (above)
    std::string type, a, b;  // Replace: pattern, content; Strip: the character; Metaspace: the replacement
    int64_t start = 0, stop = 0;  // Strip's counts
    bool first = true;            // Metaspace: the first token's replacements dropped (prepend_scheme not "never")
  };
  std::string decode_sp(const std::vector<int64_t>& ids) const;
  std::string path_, text_;
  bool sp_ = false;                // SentencePiece's kind: bytes_ holds token strings, decoded by steps_
  std::vector<DecodeStep> steps_;
  std::vector<char> special_;      // id -> 1 for a special token (left out of a decode)
  std::vector<int64_t> ends_;       // eot, and Llama 3's end tokens where present
  std::vector<std::string> bytes_;  // id -> its bytes ("" for a special token)
  std::vector<char> known_;         // id -> 1 if the vocabulary holds it
  int64_t eot_ = -1;
  std::string eot_text_ = kEotToken;  // <|begin_of_text|> where that is eot
  std::string eos_text_ = kEotToken;  // then <|end_of_text|> where the vocabulary has it
  std::string unk_text_;              // SentencePiece's kind: the model's unk_token
};

// The tokenizer of the tokenizer.json at `path`: ByteTokenizer if it is kiln's byte-level one
// (no merges, byte_char(b) -> b for every byte, end-of-text 256, nothing else), BpeTokenizer
// otherwise. ConfigError naming the file: missing, not JSON, not byte-level BPE, no end-of-text.
// Its chat template: chat_template.jinja beside the file, else tokenizer_config.json's
// "chat_template" there (a string, or the "default" of a named list); ConfigError for a
// tokenizer_config.json that is not JSON.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The same without looking beside it for a chat template.
std::unique_ptr<Tokenizer> load_tokenizer_alone(const std::string& path);

// kiln's byte-level tokenizer as tokenizer.json text (see above).
std::string byte_level_tokenizer_json();

// The files that make a directory loadable by AutoTokenizer.from_pretrained: tokenizer.json
// (tok.hf_json()) and tokenizer_config.json (PreTrainedTokenizerFast; bos = eos = unk =
// <|endoftext|> for GPT-2's kind; Llama 3's bos <|begin_of_text|>, eos <|end_of_text|>, no unk, as
// its own files say: never a token the vocabulary lacks; model_max_length: the model's context;
// chat_template: the tokenizer's, where it has one).
// File name -> contents.
std::map<std::string, std::string> tokenizer_files(const Tokenizer& tok, int64_t model_max_length);

}  // namespace kiln
