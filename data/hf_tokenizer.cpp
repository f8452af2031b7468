// data/hf_tokenizer.cpp -- tokenizer.json read and written (see the header for the format).
#include "data/hf_tokenizer.h"

#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/prep.h"
#include "distributed/error.h"
#include "distributed/python_tool.h"

namespace kiln {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// bytes_to_unicode of GPT-2's encoder.py: printable bytes stand for themselves, the rest for
// U+0100 + n in byte order.
struct ByteTable {
  std::array<std::string, 256> char_of;               // byte -> UTF-8 of its character
  std::unordered_map<std::string, unsigned char> byte_of;  // the inverse
  ByteTable() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char_of[b] = utf8_of(printable ? b : next++);
      byte_of[char_of[b]] = static_cast<unsigned char>(b);
    }
  }
};

const ByteTable& table() {
  static const ByteTable t;
  return t;
}

// The bytes a vocabulary string spells: each character through the inverse table; a character
// outside it (none in a byte-level vocabulary) is kept as its own UTF-8.
std::string bytes_of_token(const std::string& token) {
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    const auto lead = static_cast<unsigned char>(token[i]);
    size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 1;
    if (i + len > token.size()) len = token.size() - i;
    const std::string ch = token.substr(i, len);
    const auto it = table().byte_of.find(ch);
    if (it != table().byte_of.end()) out.push_back(static_cast<char>(it->second));
    else out += ch;
    i += len;
  }
  return out;
}

// A byte-fallback token "<0xHH>" (the library's test: six characters, "<0x", two hex digits, ">").
bool byte_token(const std::string& t, char* byte) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>' || !std::isxdigit(static_cast<unsigned char>(t[3])) ||
      !std::isxdigit(static_cast<unsigned char>(t[4])))
    return false;
  *byte = static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
  return true;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("tokenizer " + path + ": cannot read it");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

const std::string& byte_char(unsigned char b) { return table().char_of[b]; }

BpeTokenizer::BpeTokenizer(std::string path, std::string json_text) : path_(std::move(path)), text_(std::move(json_text)) {
  const std::string where = "tokenizer " + path_;
  json j;
  try {
    j = json::parse(text_);
  } catch (const json::parse_error& e) {
    throw ConfigError(where + ": not JSON (" + std::string(e.what()) + "); give a Hugging Face tokenizer.json");
  }
  const json model = j.is_object() ? j.value("model", json()) : json();
  const json decoder = j.is_object() ? j.value("decoder", json()) : json();
  const std::string model_type = model.is_object() ? model.value("type", std::string("none")) : "none";
  const std::string decoder_type = decoder.is_object() ? decoder.value("type", std::string("none")) : "none";
  // SentencePiece's kind (Llama 2, Mistral): Metaspace instead of byte-level, bytes by fallback.
  const std::string text_of_pre = j.is_object() ? j.value("pre_tokenizer", json()).dump() : "";
  sp_ = decoder.dump().find("Metaspace") != std::string::npos || text_of_pre.find("Metaspace") != std::string::npos ||
        (model.is_object() && model.value("byte_fallback", false) == true);
  const std::string kinds = "kiln reads byte-level BPE tokenizers (GPT-2's, Qwen2's, Llama 3's: decoder ByteLevel) and "
                            "SentencePiece-kind BPE ones (Llama 2's, Mistral's: byte fallback, Metaspace)";
  if (model_type != "BPE" || !model.contains("vocab") || !model["vocab"].is_object() || (!sp_ && decoder_type != "ByteLevel")) {
    throw ConfigError(where + ": " + kinds + "; this one is model " + model_type + ", decoder " + decoder_type);
  }
  if (sp_) {  // the decoder chain, step by step (see the header)
    const json chain = decoder_type == "Sequence" ? decoder.value("decoders", json::array()) : json::array({decoder});
    for (const auto& d : chain) {
      DecodeStep s;
      s.type = d.is_object() ? d.value("type", std::string("none")) : "none";
      if (s.type == "Replace") {
        const json pattern = d.value("pattern", json());
        if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string())
          throw ConfigError(where + ": a Replace decoder with a pattern that is not a string, which kiln does not decode");
        s.a = pattern["String"].get<std::string>();
        s.b = d.value("content", std::string());
      } else if (s.type == "Strip") {
        s.a = d.value("content", std::string(" "));
        s.start = d.value("start", int64_t{0});
        s.stop = d.value("stop", int64_t{0});
      } else if (s.type == "Metaspace") {
        s.a = d.value("replacement", std::string("\xe2\x96\x81"));
        // tokenizers >= 0.15 write prepend_scheme; older files add_prefix_space
        s.first = d.contains("prepend_scheme") ? d.value("prepend_scheme", std::string("always")) != "never"
                                               : d.value("add_prefix_space", true);
      } else if (s.type != "ByteFallback" && s.type != "Fuse") {
        throw ConfigError(where + ": a SentencePiece-kind tokenizer whose decoder has a " + s.type +
                          " step, which kiln does not decode (it decodes Replace, ByteFallback, Fuse, Strip and Metaspace)");
      }
      steps_.push_back(s);
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) unk_text_ = model["unk_token"].get<std::string>();
  }
  // id -> (string, special?) from the vocabulary, then the added tokens (which may repeat or extend it).
  std::map<int64_t, std::pair<std::string, bool>> tokens;
  std::map<std::string, int64_t> special_ids;  // the added tokens by content
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) throw ConfigError(where + ": vocabulary entry '" + token + "' has no id");
    tokens[id.get<int64_t>()] = {sp_ ? token : bytes_of_token(token), false};
  }
  for (const auto& added : j.value("added_tokens", json::array())) {
    const int64_t id = added.value("id", int64_t{-1});
    if (id < 0) throw ConfigError(where + ": an added token has no id");
    const std::string content = added.value("content", std::string());
    tokens[id] = {content, added.value("special", false)};
    if (content == kEotToken) eot_ = id;
    special_ids[content] = id;
  }
  if (eot_ < 0) {
    if (auto it = model["vocab"].find(kEotToken); it != model["vocab"].end()) eot_ = it->get<int64_t>();
  }
  if (eot_ < 0 && special_ids.count("<|begin_of_text|>")) {  // Llama 3's BOS
    eot_ = special_ids["<|begin_of_text|>"];
    eot_text_ = eos_text_ = "<|begin_of_text|>";
    if (special_ids.count("<|end_of_text|>")) eos_text_ = "<|end_of_text|>";
  }
  std::string sp_end;
  if (eot_ < 0 && sp_) {  // SentencePiece's kind: <s> opens a document, </s> ends it
    auto id_of = [&](const std::string& t) {
      if (special_ids.count(t)) return special_ids[t];
      const auto it = model["vocab"].find(t);
      return it != model["vocab"].end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{-1};
    };
    eot_ = id_of("<s>");
    eot_text_ = eos_text_ = "<s>";
    if (id_of("</s>") >= 0) eos_text_ = sp_end = "</s>", special_ids["</s>"] = id_of("</s>");
  }
  if (eot_ < 0) {
    throw ConfigError(where + ": the tokenizer has no " + std::string(kEotToken) +
                      " token (nor Llama 3's <|begin_of_text|>, nor SentencePiece's <s>; kiln puts it before every document)");
  }
  ends_ = {eot_};
  if (!sp_end.empty() && special_ids[sp_end] != eot_) ends_.push_back(special_ids[sp_end]);
  for (const char* end : {"<|end_of_text|>", "<|eot_id|>"})
    if (special_ids.count(end) && special_ids[end] != eot_) ends_.push_back(special_ids[end]);
  const int64_t n = tokens.empty() ? 0 : tokens.rbegin()->first + 1;
  bytes_.assign(static_cast<size_t>(n), std::string());
  known_.assign(static_cast<size_t>(n), 0);
  special_.assign(static_cast<size_t>(n), 0);
  for (const auto& [id, t] : tokens) {
    const bool special = t.second || id == eot_;
    bytes_[static_cast<size_t>(id)] = special ? std::string() : t.first;
    known_[static_cast<size_t>(id)] = 1;
    special_[static_cast<size_t>(id)] = special ? 1 : 0;
  }
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text) const {
  if (text.empty()) return {};
  const std::string needs = "a BPE tokenizer's encoding needs Python with the tokenizers package";
  const ToolRun run = run_python_tool("bpe_tokenizer.py", {"encode", "--tokenizer", path_, "--text", text}, needs);
  if (run.exit_code != 0) throw ConfigError(tool_failure(run, "tools/bpe_tokenizer.py"));
  std::vector<int64_t> ids;
  try {
    ids = json::parse(run.out).get<std::vector<int64_t>>();
  } catch (const json::exception& e) {
    throw Error("tools/bpe_tokenizer.py printed no list of ids (" + std::string(e.what()) + ")");
  }
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  for (const int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || !known_[static_cast<size_t>(id)]) {
      throw Error("tokenizer " + path_ + ": id " + std::to_string(id) + " is not in its vocabulary of " + std::to_string(vocab_size()));
    }
  }
  if (sp_) return decode_sp(ids);
  std::string text;
  for (const int64_t id : ids) text += bytes_[static_cast<size_t>(id)];
  return text;
}

std::string BpeTokenizer::decode_sp(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  for (const int64_t id : ids)
    if (!special_[static_cast<size_t>(id)]) tokens.push_back(bytes_[static_cast<size_t>(id)]);
  static const std::string kReplacementChar = "\xef\xbf\xbd";  // U+FFFD
  for (const DecodeStep& s : steps_) {
    if (s.type == "Replace") {
      for (auto& t : tokens) replace_all(t, s.a, s.b);
    } else if (s.type == "ByteFallback") {
      std::vector<std::string> out;
      std::string run;
      size_t bytes = 0;
      auto flush = [&] {
        if (bytes == 0) return;
        if (valid_utf8(run) == run) out.push_back(run);  // UTF-8 as strict as Rust's from_utf8 (the library's)
        else for (size_t k = 0; k < bytes; ++k) out.push_back(kReplacementChar);
        run.clear();
        bytes = 0;
      };
      for (auto& t : tokens) {
        char b = 0;
        if (byte_token(t, &b)) {
          run.push_back(b);
          ++bytes;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      tokens = std::move(out);
    } else if (s.type == "Fuse") {
      std::string all;
      for (const auto& t : tokens) all += t;
      tokens = {all};
    } else if (s.type == "Strip") {
      for (auto& t : tokens) {
        if (s.a.empty()) continue;
        for (int64_t k = 0; k < s.start && t.compare(0, s.a.size(), s.a) == 0; ++k) t.erase(0, s.a.size());
        for (int64_t k = 0; k < s.stop && t.size() >= s.a.size() && t.compare(t.size() - s.a.size(), s.a.size(), s.a) == 0; ++k)
          t.erase(t.size() - s.a.size());
      }
    } else if (s.type == "Metaspace") {
      for (size_t i = 0; i < tokens.size(); ++i) replace_all(tokens[i], s.a, i == 0 && s.first ? "" : " ");
    }
  }
  std::string text;
  for (const auto& t : tokens) text += t;
  return text;
}

namespace {

// The chat template that goes with the tokenizer.json at `path`: chat_template.jinja beside it,
// else the "chat_template" of tokenizer_config.json beside it (a string, or the named list's
// "default"); "" where there is none.
std::string chat_template_beside(const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (std::filesystem::exists(dir / "chat_template.jinja", ec)) return read_text((dir / "chat_template.jinja").string());
  const std::filesystem::path config = dir / "tokenizer_config.json";
  if (!std::filesystem::exists(config, ec)) return "";
  json j;
  try {
    j = json::parse(read_text(config.string()));
  } catch (const json::exception& e) {
    throw ConfigError(config.string() + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("chat_template")) return "";
  const json& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const json& named : t)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") && named["template"].is_string())
        return named["template"].get<std::string>();
  return "";
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::unique_ptr<Tokenizer> tok = load_tokenizer_alone(path);
  tok->set_chat_template(chat_template_beside(path));
  return tok;
}

std::unique_ptr<Tokenizer> load_tokenizer_alone(const std::string& path) {
  auto bpe = std::make_unique<BpeTokenizer>(path, read_text(path));
  // kiln's own byte-level file: the ByteTokenizer, which encodes without Python.
  bool bytes = bpe->vocab_size() == kByteVocab && bpe->eot() == kByteEot;
  try {
    for (int64_t b = 0; bytes && b < 256; ++b) bytes = bpe->decode({b}) == std::string(1, static_cast<char>(b));
  } catch (const Error&) {
    bytes = false;  // an id missing from the vocabulary
  }
  if (bytes) {
    const json model = json::parse(bpe->hf_json())["model"];
    bytes = model.value("merges", json::array()).empty() && model["vocab"].size() <= static_cast<size_t>(kByteVocab);
  }
  if (bytes) return std::make_unique<ByteTokenizer>();
  return bpe;
}

std::string byte_level_tokenizer_json() {
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<unsigned char>(b))] = b;
  vocab[kEotToken] = kByteEot;
  auto byte_level = [](bool add_prefix_space, bool trim_offsets) {
    return ordered_json{{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", trim_offsets}, {"use_regex", true}};
  };
  const ordered_json j{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       ordered_json::array({ordered_json{{"id", kByteEot}, {"content", kEotToken}, {"single_word", false}, {"lstrip", false},
                                         {"rstrip", false}, {"normalized", false}, {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level(false, true)},
      {"post_processor", byte_level(true, false)},
      {"decoder", byte_level(true, true)},
      {"model", ordered_json{{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                             {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                             {"vocab", vocab}, {"merges", ordered_json::array()}}}};
  return j.dump(1) + "\n";
}

std::map<std::string, std::string> tokenizer_files(const Tokenizer& tok, int64_t model_max_length) {
  ordered_json config{{"tokenizer_class", "PreTrainedTokenizerFast"},
                      {"bos_token", tok.eot_text()},
                      {"eos_token", tok.eos_text()}};
  // GPT-2's files name <|endoftext|> as the unknown token too; Llama 3's name none (a byte-level
  // vocabulary has no unknown text), nor does kiln for them.
  if (tok.eot_text() == kEotToken) config["unk_token"] = tok.eot_text();
  // SentencePiece's kind names its model's unknown token (<unk>), which its vocabulary holds.
  else if (!tok.unk_text().empty()) config["unk_token"] = tok.unk_text();
  config["model_max_length"] = model_max_length;
  config["add_prefix_space"] = false;
  config["clean_up_tokenization_spaces"] = false;
  // The data's chat template (kiln prep --chat), for apply_chat_template and the chat pipeline.
  if (!tok.chat_template().empty()) config["chat_template"] = tok.chat_template();
  return {{"tokenizer.json", tok.hf_json()}, {"tokenizer_config.json", config.dump(2) + "\n"}};
}

}  // namespace kiln
