// data/prep.cpp -- `kiln prep`: text files into llm.c shards, byte-level or through a BPE tokenizer.
#include "data/prep.h"

#include <algorithm>
#include <stdexcept>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <system_error>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "data/hf_tokenizer.h"
#include "data/paths.h"
#include "data/target_mask.h"
#include "data/token_file.h"
#include "distributed/error.h"
#include "distributed/python_tool.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// C stdio rather than ifstream: a read error (EISDIR for a directory, EIO) must not pass as a
// short document, and ferror reports it where an istreambuf_iterator silently stops.
std::string read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw DataError(path + ": cannot open: " + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, got);
  const bool failed = std::ferror(f) != 0;
  const std::string why = std::strerror(errno);
  std::fclose(f);
  if (failed) throw DataError(path + ": cannot read: " + why);
  return text;
}

std::string shard_path(const fs::path& dir, const char* kind, int64_t index) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s_%06lld.bin", kind, static_cast<long long>(index));
  return (dir / name).string();
}

// Tokens to shards as they come: the first val_tokens into val_000000.bin, then train shards of
// shard_tokens, each written as soon as it is full (the last one at finish) into a staging
// directory inside the output, and moved into it only once all are written -- a failure leaves
// no partial set. Memory: one shard's tokens (4 bytes a token), whatever the corpus. With `masks`,
// every token comes with its target-mask byte, and each shard X.bin with its X.mask.
class ShardWriter {
 public:
  ShardWriter(const fs::path& out, int64_t shard_tokens, int64_t val_tokens, bool masks)
      : out_(out), staging_(out / (".prep-staging-" + std::to_string(::getpid()))), shard_(shard_tokens), val_(val_tokens), masks_(masks) {
    std::error_code ec;
    fs::create_directories(staging_, ec);
    if (ec) throw DataError(out.string() + ": cannot create " + staging_.string() + ": " + ec.message());
  }
  ~ShardWriter() {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // n tokens, and with masks their n mask bytes.
  void add(const int32_t* t, size_t n, const uint8_t* m = nullptr) {
    if (masks_ != (m != nullptr)) throw std::logic_error("ShardWriter::add: mask bytes with every token, or none");
    while (n > 0) {
      const bool in_val = total_ < val_;
      const int64_t room = in_val ? val_ - total_ : shard_ - static_cast<int64_t>(buffer_.size());
      const size_t take = static_cast<size_t>(std::min<int64_t>(room, static_cast<int64_t>(n)));
      buffer_.insert(buffer_.end(), t, t + take);
      if (m != nullptr) {
        mask_.insert(mask_.end(), m, m + take);
        trained_ += std::count(m, m + take, uint8_t{1});
        m += take;
      }
      total_ += static_cast<int64_t>(take);
      t += take;
      n -= take;
      if (total_ == val_ && in_val) flush("val", 0);
      else if (!in_val && static_cast<int64_t>(buffer_.size()) == shard_) flush("train", train_index_++);
    }
  }
  int64_t total() const { return total_; }
  int64_t trained() const { return trained_; }
  // The shards, moved into the output directory (val first). DataError when the corpus holds no
  // training token after the validation ones.
  std::vector<std::string> finish() {
    if (total_ <= val_) {
      throw DataError("prep: val-tokens " + std::to_string(val_) + " leaves no training tokens (the inputs hold " +
                      std::to_string(total_) + " tokens)");
    }
    if (!buffer_.empty()) flush("train", train_index_++);
    std::vector<std::string> out;
    for (const auto* names : {&masks_written_, &written_}) {  // a shard after its mask: never a shard without one
      for (const auto& name : *names) {
        std::error_code ec;
        fs::rename(staging_ / name, out_ / name, ec);
        if (ec) throw DataError(out_.string() + ": cannot move " + name + " into place: " + ec.message());
        if (names == &written_) out.push_back((out_ / name).string());
      }
    }
    return out;
  }

 private:
  void flush(const char* kind, int64_t index) {
    const std::string path = shard_path(staging_, kind, index);
    write_token_shard(path, buffer_);
    if (masks_) {
      write_target_mask(mask_path_for(path), mask_);
      masks_written_.push_back(fs::path(mask_path_for(path)).filename().string());
    }
    written_.push_back(fs::path(path).filename().string());
    buffer_.clear();
    mask_.clear();
  }
  fs::path out_, staging_;
  int64_t shard_, val_, total_ = 0, train_index_ = 0, trained_ = 0;
  bool masks_;
  std::vector<int32_t> buffer_;
  std::vector<uint8_t> mask_;
  std::vector<std::string> written_, masks_written_;
};

// What a long prep is doing, on stderr every 5 s (nothing for a short one). Test hook:
// KILN_TEST_PREP_PROGRESS_S sets the period (0: every update).
class Progress {
 public:
  Progress() {
    if (const char* s = std::getenv("KILN_TEST_PREP_PROGRESS_S")) period_ = std::chrono::duration<double>(std::atof(s));
  }
  void update(int64_t files_done, int64_t files, int64_t tokens) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < period_) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "kiln prep: %lld/%lld file(s), %.1fM tokens (%.2fM tokens/s)\n", static_cast<long long>(files_done),
                 static_cast<long long>(files), static_cast<double>(tokens) / 1e6, static_cast<double>(tokens) / 1e6 / s);
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_ = start_;
  std::chrono::duration<double> period_{5.0};
};

// The corpus through a BPE tokenizer: tools/bpe_tokenizer.py writes every document's ids (end-of-text
// first) as little-endian uint32 into a temporary file, and the tokenizer as tokenizer.json; the
// ids are read back a million at a time into the writer.
void tokenize_bpe(const PrepConfig& cfg, const std::vector<std::string>& inputs, std::unique_ptr<Tokenizer>& tokenizer,
                  ShardWriter& writer, Progress& progress) {
  auto temp = [](const char* stem) {
    std::string path = (fs::temp_directory_path() / (std::string(stem) + "-XXXXXX")).string();
    const int fd = mkstemp(path.data());
    if (fd < 0) throw DataError("prep: cannot create a temporary file in " + fs::temp_directory_path().string() + ": " + std::strerror(errno));
    ::close(fd);
    return path;
  };
  const std::string saved = temp("kiln-prep-tokenizer"), ids = temp("kiln-prep-ids");
  const std::string masks = cfg.chat ? temp("kiln-prep-mask") : "", template_out = cfg.chat ? temp("kiln-prep-template") : "";
  struct Cleanup {
    std::vector<std::string> files;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& f : files) fs::remove(f, ec);
    }
  } cleanup{{saved, ids, masks, template_out}};
  std::vector<std::string> args{"prep", "--save", saved, "--ids-out", ids};
  if (!cfg.tokenizer.empty()) args.insert(args.end(), {"--tokenizer", cfg.tokenizer});
  else args.insert(args.end(), {"--vocab", cfg.vocab, "--merges", cfg.merges});
  args.insert(args.end(), {"--input-format", cfg.input_format, "--jsonl-field", jsonl_field_of(cfg)});
  if (cfg.chat) {
    args.insert(args.end(), {"--chat", "--mask-out", masks, "--template-out", template_out});
    if (!cfg.chat_template.empty()) args.insert(args.end(), {"--chat-template", cfg.chat_template});
  }
  if (!cfg.separator.empty()) args.insert(args.end(), {"--separator", cfg.separator});
  args.insert(args.end(), inputs.begin(), inputs.end());
  // The tool's `progress FILES_DONE FILES IDS` lines, shown every 5 s while it encodes.
  auto on_line = [&](const std::string& line) {
    long long done = 0, files = 0, ids_so_far = 0;
    if (std::sscanf(line.c_str(), "progress %lld %lld %lld", &done, &files, &ids_so_far) == 3) progress.update(done, files, ids_so_far);
  };
  const ToolRun run = run_python_tool("bpe_tokenizer.py", args, "kiln prep with a BPE tokenizer needs Python with the tokenizers package", on_line);
  if (run.exit_code != 0) throw ConfigError(tool_failure(run, "tools/bpe_tokenizer.py"));
  tokenizer = load_tokenizer_alone(saved);  // a temporary file: nothing beside it is the tokenizer's
  if (cfg.chat) tokenizer->set_chat_template(read_file(template_out));
  const int64_t vocab = tokenizer->vocab_size();
  std::FILE* f = std::fopen(ids.c_str(), "rb");
  if (f == nullptr) throw DataError("prep: cannot read back " + ids + ": " + std::strerror(errno));
  std::FILE* mf = cfg.chat ? std::fopen(masks.c_str(), "rb") : nullptr;
  if (cfg.chat && mf == nullptr) {
    std::fclose(f);
    throw DataError("prep: cannot read back " + masks + ": " + std::strerror(errno));
  }
  struct Close {
    std::FILE* f;
    ~Close() {
      if (f != nullptr) std::fclose(f);
    }
  } close_masks{mf};
  std::vector<unsigned char> bytes(size_t{4} << 20);
  std::vector<int32_t> chunk;
  std::vector<uint8_t> mask_chunk;
  size_t got = 0, carry = 0;
  while ((got = std::fread(bytes.data() + carry, 1, bytes.size() - carry, f)) > 0) {
    const size_t have = carry + got;
    const size_t whole = have / 4 * 4;
    chunk.resize(whole / 4);
    for (size_t i = 0; i < chunk.size(); ++i) {
      const unsigned char* b = bytes.data() + 4 * i;
      const uint32_t id = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
      if (static_cast<int64_t>(id) >= vocab) {
        std::fclose(f);
        throw DataError("prep: tools/bpe_tokenizer.py gave id " + std::to_string(id) + ", outside the tokenizer's " +
                        std::to_string(vocab) + " ids");
      }
      chunk[i] = static_cast<int32_t>(id);
    }
    if (mf != nullptr) {  // the ids' mask bytes, one each
      mask_chunk.resize(chunk.size());
      if (std::fread(mask_chunk.data(), 1, mask_chunk.size(), mf) != mask_chunk.size()) {
        std::fclose(f);
        throw DataError("prep: tools/bpe_tokenizer.py wrote fewer mask bytes than ids");
      }
    }
    writer.add(chunk.data(), chunk.size(), mf != nullptr ? mask_chunk.data() : nullptr);
    carry = have - whole;
    std::memmove(bytes.data(), bytes.data() + whole, carry);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw DataError("prep: cannot read back " + ids);
  if (carry != 0) throw DataError("prep: tools/bpe_tokenizer.py wrote a partial id (not whole uint32 ids)");
  if (mf != nullptr && std::fgetc(mf) != EOF) throw DataError("prep: tools/bpe_tokenizer.py wrote more mask bytes than ids");
}

// A document's byte-level tokens into the writer: end-of-text, then its bytes, a million at a time.
void add_bytes(const std::string& text, ShardWriter& writer) {
  const int32_t eot = kByteEot;
  writer.add(&eot, 1);
  std::vector<int32_t> chunk;
  for (size_t at = 0; at < text.size(); at += chunk.size()) {
    chunk.resize(std::min<size_t>(size_t{1} << 20, text.size() - at));
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<unsigned char>(text[at + i]);
    writer.add(chunk.data(), chunk.size());
  }
}

}  // namespace

std::string jsonl_field_of(const PrepConfig& cfg) {
  if (!cfg.jsonl_field.empty()) return cfg.jsonl_field;
  return cfg.chat ? "messages" : "text";
}

std::vector<std::string> split_documents(const std::string& path, std::string contents, const PrepConfig& cfg) {
  const std::string field = jsonl_field_of(cfg);
  if (cfg.chat) {  // one conversation a line: counted here, checked by tools/chat_data.py
    std::vector<std::string> docs;
    size_t start = 0;
    while (start < contents.size()) {
      size_t end = contents.find('\n', start);
      if (end == std::string::npos) end = contents.size();
      if (contents.find_first_not_of(" \t\r", start) < end) docs.push_back(contents.substr(start, end - start));
      start = end + 1;
    }
    return docs;
  }
  const bool jsonl = cfg.input_format == "jsonl" ||
                     (cfg.input_format == "auto" && path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0);
  std::vector<std::string> docs;
  if (jsonl) {
    size_t start = 0;
    for (int64_t line = 1; start < contents.size(); ++line) {
      size_t end = contents.find('\n', start);
      if (end == std::string::npos) end = contents.size();
      const std::string text = contents.substr(start, end - start);
      start = end + 1;
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
      nlohmann::json rec;
      try {
        rec = nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception&) {
        throw DataError(path + ", line " + std::to_string(line) + ": not JSON (a JSONL file holds one JSON object per line)");
      }
      if (!rec.is_object() || !rec.contains(field) || !rec[field].is_string()) {
        throw DataError(path + ", line " + std::to_string(line) + ": no string field '" + field +
                        "' (give --jsonl-field NAME for another)");
      }
      docs.push_back(rec[field].get<std::string>());
    }
    return docs;
  }
  if (cfg.separator.empty()) {
    docs.push_back(std::move(contents));
    return docs;
  }
  size_t start = 0;
  while (start <= contents.size()) {
    size_t at = contents.find(cfg.separator, start);
    if (at == std::string::npos) at = contents.size();
    if (at > start) docs.push_back(contents.substr(start, at - start));
    start = at + cfg.separator.size();
  }
  return docs;
}

std::vector<int32_t> tokenize_bytes(const std::string& text) {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() + 1);
  tokens.push_back(kByteEot);
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

PrepResult run_prep(const PrepConfig& cfg) {
  if (cfg.inputs.empty()) throw ConfigError("prep: no input files");
  if (cfg.shard_tokens <= 0)
    throw ConfigError("prep: shard-tokens must be positive, got " +
                      std::to_string(cfg.shard_tokens));
  if (cfg.val_tokens < 0)
    throw ConfigError("prep: val-tokens must be >= 0, got " + std::to_string(cfg.val_tokens));
  if (cfg.out_dir.empty()) throw ConfigError("prep: no output directory");
  if (!cfg.tokenizer.empty() && (!cfg.vocab.empty() || !cfg.merges.empty()))
    throw ConfigError("prep: give --tokenizer FILE or --vocab with --merges, not both");
  if (cfg.vocab.empty() != cfg.merges.empty()) throw ConfigError("prep: --vocab and --merges go together (GPT-2's vocab.json and merges.txt)");
  for (const std::string* f : {&cfg.tokenizer, &cfg.vocab, &cfg.merges}) {
    if (!f->empty() && !fs::is_regular_file(*f)) throw ConfigError("prep: " + *f + ": no such file");
  }

  if (cfg.input_format != "auto" && cfg.input_format != "text" && cfg.input_format != "jsonl")
    throw ConfigError("prep: --input-format " + cfg.input_format + ": auto, text or jsonl");
  if (cfg.chat && cfg.tokenizer.empty())
    throw ConfigError("prep: --chat needs --tokenizer tokenizer.json: the conversations go through its chat template "
                      "(tokenizer_config.json or chat_template.jinja beside it, or --chat-template FILE)");
  if (!cfg.chat && !cfg.chat_template.empty()) throw ConfigError("prep: --chat-template goes with --chat");
  if (!cfg.chat_template.empty() && !fs::is_regular_file(cfg.chat_template))
    throw ConfigError("prep: --chat-template " + cfg.chat_template + ": no such file");
  if (cfg.chat && cfg.input_format == "text") throw ConfigError("prep: --chat reads JSONL (a conversation a line), not --input-format text");
  if (cfg.chat && !cfg.separator.empty()) throw ConfigError("prep: --chat reads JSONL (a conversation a line): --separator does not apply");
  const std::vector<std::string> inputs = expand_paths(cfg.inputs, "--input");  // quoted globs too
  if (inputs.empty()) throw ConfigError("prep: no input files");

  const fs::path dir(cfg.out_dir);
  std::error_code ec;
  // Shards left by an earlier run would be picked up by a later `--data DIR/train_*.bin` glob
  // beside the new ones: refuse rather than mix corpora or delete the user's files.
  if (fs::is_directory(dir, ec)) {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if ((name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0) && entry.path().extension() == ".bin")
        throw DataError(cfg.out_dir + ": already holds shards (" + name + "); choose an empty directory");
    }
  }
  const bool made_dir = !fs::exists(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) throw DataError(cfg.out_dir + ": cannot create directory: " + ec.message());
  // A failure leaves the output as it was: a directory made here goes again.
  struct RemoveOnFailure {
    fs::path dir;
    bool armed;
    ~RemoveOnFailure() {
      std::error_code ec;
      if (armed) fs::remove_all(dir, ec);
    }
  } undo{dir, made_dir};

  // Streamed: one input file's text and one shard's tokens in memory at a time.
  ShardWriter writer(dir, cfg.shard_tokens, cfg.val_tokens, cfg.chat);
  Progress progress;
  int64_t documents = 0;
  std::unique_ptr<Tokenizer> tokenizer;
  if (!cfg.tokenizer.empty() || !cfg.vocab.empty()) {
    // The documents counted (and a bad JSONL line refused) here, with the byte path's rules; the
    // tool splits them by the same rules (tools/bpe_tokenizer.py, documents()).
    for (const auto& input : inputs) documents += static_cast<int64_t>(split_documents(input, read_file(input), cfg).size());
    tokenize_bpe(cfg, inputs, tokenizer, writer, progress);
  } else {
    tokenizer = std::make_unique<ByteTokenizer>();
    for (size_t k = 0; k < inputs.size(); ++k) {
      for (const std::string& text : split_documents(inputs[k], read_file(inputs[k]), cfg)) {
        add_bytes(text, writer);
        ++documents;
      }
      progress.update(static_cast<int64_t>(k + 1), static_cast<int64_t>(inputs.size()), writer.total());
    }
  }

  PrepResult result;
  result.files = writer.finish();
  result.total_tokens = writer.total();
  result.tokenizer = tokenizer->name();
  result.vocab_size = tokenizer->vocab_size();
  result.eot = tokenizer->eot();
  result.input_files = static_cast<int64_t>(inputs.size());
  result.documents = documents;
  if (cfg.chat) result.trained_tokens = writer.trained();
  // The tokenizer beside the shards, where kiln train looks for it.
  const std::string tok_path = (dir / "tokenizer.json").string();
  {
    std::FILE* f = std::fopen((tok_path + ".tmp").c_str(), "wb");
    const std::string text = tokenizer->hf_json();
    if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0)
      throw DataError(tok_path + ": cannot write: " + std::strerror(errno));
    fs::rename(tok_path + ".tmp", tok_path, ec);
    if (ec) throw DataError(tok_path + ": cannot write: " + ec.message());
  }
  result.tokenizer_file = tok_path;
  if (cfg.chat) {  // the template beside the tokenizer, where kiln train finds it (data/tokenizer.h)
    const std::string path = (dir / "chat_template.jinja").string();
    std::FILE* f = std::fopen((path + ".tmp").c_str(), "wb");
    const std::string& text = tokenizer->chat_template();
    if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0)
      throw DataError(path + ": cannot write: " + std::strerror(errno));
    fs::rename(path + ".tmp", path, ec);
    if (ec) throw DataError(path + ": cannot write: " + ec.message());
    result.chat_template_file = path;
  }
  undo.armed = false;
  return result;
}

}  // namespace kiln
