// data/tokenizer.cpp -- the byte-level tokenizer (data/prep.h's) behind the Tokenizer interface,
// and which tokenizer a run or a checkpoint has.
#include "data/tokenizer.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "data/hf_tokenizer.h"
#include "data/prep.h"
#include "distributed/error.h"

namespace kiln {

int64_t ByteTokenizer::vocab_size() const { return kByteVocab; }
int64_t ByteTokenizer::eot() const { return kByteEot; }
std::string Tokenizer::eot_text() const { return kEotToken; }

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

std::string ByteTokenizer::hf_json() const { return byte_level_tokenizer_json(); }

std::unique_ptr<Tokenizer> tokenizer_for_checkpoint(const std::string& checkpoint_dir) {
  const std::filesystem::path file = std::filesystem::path(checkpoint_dir) / "tokenizer.json";
  if (std::filesystem::exists(file)) return load_tokenizer(file.string());
  return std::make_unique<ByteTokenizer>();
}

DataTokenizer find_data_tokenizer(const std::string& flag, const std::vector<std::string>& data) {
  if (!flag.empty()) {
    if (!std::filesystem::exists(flag)) throw ConfigError("--tokenizer " + flag + ": no such file");
    return {load_tokenizer(flag), flag};
  }
  if (data.empty()) return {std::make_unique<ByteTokenizer>(), "default"};
  const std::filesystem::path beside = std::filesystem::path(data.front()).parent_path() / "tokenizer.json";
  if (std::filesystem::exists(beside)) return {load_tokenizer(beside.string()), beside.string()};
  return {nullptr, "none: no tokenizer.json beside the --data files (kiln prep writes one; or give --tokenizer FILE)"};
}

DataTokenizer tokenizer_for_data(const std::string& flag, const std::vector<std::string>& data, int64_t vocab_size,
                                 const std::string& init_from) {
  DataTokenizer t = find_data_tokenizer(flag, data);
  if (!t.tokenizer || t.tokenizer->vocab_size() <= vocab_size) return t;
  const std::string n = std::to_string(t.tokenizer->vocab_size()), v = std::to_string(vocab_size);
  if (t.source != "default" && !init_from.empty()) {
    // The vocabulary is the model's: no flag can widen it, so none is advised.
    throw ConfigError("the tokenizer " + t.source + " has " + n + " ids, more than the " + v + " of the model --init-from " + init_from +
                      " starts from (its vocab_size; --vocab-size cannot change it): this tokenizer does not fit that model; "
                      "prepare the data with the model's own tokenizer (kiln prep --tokenizer), or train without --init-from");
  }
  if (t.source != "default") {
    // --vocab-size was given (left out, kiln train takes the tokenizer's: launch/cli.cpp).
    throw ConfigError("the tokenizer " + t.source + " has " + n + " ids: --vocab-size " + v + " cannot hold them (give --vocab-size " + n +
                      " or more, or leave --vocab-size out to take the tokenizer's)");
  }
  return {nullptr, "none: the byte-level tokenizer's " + n + " ids do not fit --vocab-size " + v};
}

std::string valid_utf8(const std::string& bytes) {
  // nlohmann/json's replacing serialiser does the UTF-8 decoding; parsing its output back gives
  // the repaired string.
  using json = nlohmann::json;
  return json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

}  // namespace kiln
