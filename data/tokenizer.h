// data/tokenizer.h -- text <-> token ids, behind one small interface.
//
// What sampling needs from a tokenizer: encode a prompt, decode the ids it generates (one at a
// time, to stream them: a byte-level tokenizer's token is a whole number of bytes, so the pieces
// concatenate to the text), and the end-of-text id that ends a document. Two implement it: the
// byte-level one, kiln prep's default (data/prep.h): byte b -> id b, end-of-text 256, 257 ids;
// and a byte-level BPE read from a Hugging Face tokenizer.json (data/hf_tokenizer.h). A run's
// tokenizer is the one beside its data (`kiln prep` writes tokenizer.json with the shards) or
// --tokenizer's; every checkpoint carries it (tokenizer.json), and kiln sample reads it there.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string name() const = 0;
  // Ids are in [0, vocab_size()); a model's vocabulary must hold them all.
  virtual int64_t vocab_size() const = 0;
  virtual int64_t eot() const = 0;  // end-of-text: precedes every document in the training data
  // eot's token as text ("<|endoftext|>"; Llama 3's "<|begin_of_text|>"): the prefix transformers'
  // text-generation pipeline puts before a prompt, as kiln sample puts eot (config.json's "prefix").
  virtual std::string eot_text() const;
  // The token that ends a document, as text: eot_text(), or where eot opens documents instead
  // (Llama 3's <|begin_of_text|>) the tokenizer's own end, <|end_of_text|> (tokenizer_config.json's eos).
  virtual std::string eos_text() const { return eot_text(); }
  // The model's unknown token where it names one (SentencePiece's kind: <unk>); "" otherwise.
  virtual std::string unk_text() const { return ""; }
  // The ids that end a sampled text: eot, and a tokenizer's own ends where its documents are
  // opened by another token (Llama 3: <|end_of_text|>, <|eot_id|>).
  virtual std::vector<int64_t> end_tokens() const { return {eot()}; }
  // The ids of `text` (no end-of-text added).
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // The bytes of `ids` (end-of-text decodes to nothing). Throws Error for an id outside the
  // vocabulary.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // The tokenizer as a Hugging Face tokenizer.json (data/hf_tokenizer.h): what prep and
  // checkpoints write beside the tokens and weights.
  virtual std::string hf_json() const = 0;
  // The chat template (Jinja, as transformers' apply_chat_template takes it) the data was made
  // with (kiln prep --chat), which checkpoints carry in tokenizer_config.json; "" for none.
  const std::string& chat_template() const { return chat_template_; }
  void set_chat_template(std::string text) { chat_template_ = std::move(text); }

 private:
  std::string chat_template_;
};

// kiln prep's tokenizer: every byte is its own id; end-of-text is 256 (kByteEot).
class ByteTokenizer : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override;
  int64_t eot() const override;
  std::vector<int64_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::string hf_json() const override;
};

// The tokenizer a checkpoint's model was trained with (checkpoint_dir: a checkpoint directory):
// its tokenizer.json; the byte-level one for checkpoints written before they carried one.
std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const std::string& checkpoint_dir);

// A training run's tokenizer and where it came from.
struct DataTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;  // null: unknown
  std::string source;  // the tokenizer.json read; "default" (the byte-level one); "none"
};

// The tokenizer tokenizer_for_data finds for `flag` and `data`, before it is held against a
// model's vocabulary (null where there is none, `source` saying why). ConfigError as there.
DataTokenizer find_data_tokenizer(const std::string& flag, const std::vector<std::string>& data);

// The tokenizer of a run: `flag` (--tokenizer FILE) if given; else the tokenizer.json beside the
// first of the --data files (`data`: their paths, globs expanded), which kiln prep writes; else,
// for synthetic data (`data` empty), the byte-level one, as kiln sample has always read it. Data
// files without a tokenizer.json (llm.c's GPT-2 shards, nanoGPT's train.bin) have none that kiln
// can know: null -- not a guess that would travel with the weights. The tokenizer must fit the
// model's `vocab_size`: one named or found beside the data that does not is refused; the
// byte-level default that does not (synthetic data on a small vocabulary) is dropped. A null
// tokenizer's source says why there is none ("none: ..."). ConfigError for a file that
// --tokenizer names or that lies beside the data and cannot be read as one. `init_from`: the
// directory the model's shape came from (--init-from), whose vocabulary no flag can widen: a
// tokenizer too large for it is refused as not fitting that model, not with --vocab-size advice.
DataTokenizer tokenizer_for_data(const std::string& flag, const std::vector<std::string>& data, int64_t vocab_size,
                                 const std::string& init_from = "");

// `bytes` with every invalid UTF-8 sequence replaced by U+FFFD: generated bytes (a byte-level
// model may stop mid-character) made fit for a JSON record, which must be valid UTF-8.
std::string valid_utf8(const std::string& bytes);

}  // namespace kiln
