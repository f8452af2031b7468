// data/tokenizer.cpp -- the byte-level tokenizer (data/prep.h's) behind the Tokenizer interface.
#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

#include "data/prep.h"
#include "runtime/error.h"

namespace kiln {

int64_t ByteTokenizer::vocab_size() const { return kByteVocab; }
int64_t ByteTokenizer::eot() const { return kByteEot; }

std::vector<int64_t> ByteTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const int64_t id : ids) {
    if (id == kByteEot) continue;
    if (id < 0 || id > 255) throw Error("byte tokenizer: id " + std::to_string(id) + " is not a byte or end-of-text (256)");
    text.push_back(static_cast<char>(id));
  }
  return text;
}

std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const std::string& /*checkpoint_dir*/) {
  return std::make_unique<ByteTokenizer>();
}

std::string valid_utf8(const std::string& bytes) {
  // nlohmann/json's replacing serialiser does the UTF-8 decoding; parsing its output back gives
  // the repaired string.
  using json = nlohmann::json;
  return json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

}  // namespace kiln
