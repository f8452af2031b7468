// data/prep.cpp -- `kiln prep`: text files into llm.c shards, byte-level or through a BPE tokenizer.
#include "data/prep.h"

#include <algorithm>
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

// The corpus through a BPE tokenizer: tools/bpe_tokenizer.py writes every document's ids (end-of-text
// first) as little-endian uint32 and the tokenizer as tokenizer.json, read back here.
std::vector<int32_t> tokenize_bpe(const PrepConfig& cfg, const std::vector<std::string>& inputs, std::unique_ptr<Tokenizer>& tokenizer) {
  std::string saved = (fs::temp_directory_path() / "kiln-prep-tokenizer-XXXXXX").string();
  const int fd = mkstemp(saved.data());
  if (fd < 0) throw DataError("prep: cannot create a temporary file in " + fs::temp_directory_path().string() + ": " + std::strerror(errno));
  ::close(fd);
  std::vector<std::string> args{"prep", "--save", saved};
  if (!cfg.tokenizer.empty()) args.insert(args.end(), {"--tokenizer", cfg.tokenizer});
  else args.insert(args.end(), {"--vocab", cfg.vocab, "--merges", cfg.merges});
  args.insert(args.end(), {"--input-format", cfg.input_format, "--jsonl-field", cfg.jsonl_field});
  if (!cfg.separator.empty()) args.insert(args.end(), {"--separator", cfg.separator});
  args.insert(args.end(), inputs.begin(), inputs.end());
  ToolRun run;
  try {
    run = run_python_tool("bpe_tokenizer.py", args, "kiln prep with a BPE tokenizer needs Python with the tokenizers package");
    if (run.exit_code != 0) throw ConfigError(tool_failure(run, "tools/bpe_tokenizer.py"));
    tokenizer = load_tokenizer(saved);
  } catch (...) {
    fs::remove(saved);
    throw;
  }
  fs::remove(saved);
  if (run.out.size() % 4 != 0) throw DataError("prep: tools/bpe_tokenizer.py wrote " + std::to_string(run.out.size()) + " bytes, not whole uint32 ids");
  std::vector<int32_t> corpus(run.out.size() / 4);
  const auto* bytes = reinterpret_cast<const unsigned char*>(run.out.data());
  for (size_t i = 0; i < corpus.size(); ++i) {
    const uint32_t id = bytes[4 * i] | (bytes[4 * i + 1] << 8) | (bytes[4 * i + 2] << 16) | (static_cast<uint32_t>(bytes[4 * i + 3]) << 24);
    if (static_cast<int64_t>(id) >= tokenizer->vocab_size()) {
      throw DataError("prep: tools/bpe_tokenizer.py gave id " + std::to_string(id) + ", outside the tokenizer's " +
                      std::to_string(tokenizer->vocab_size()) + " ids");
    }
    corpus[i] = static_cast<int32_t>(id);
  }
  return corpus;
}

}  // namespace

std::vector<std::string> split_documents(const std::string& path, const std::string& contents, const PrepConfig& cfg) {
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
      if (!rec.is_object() || !rec.contains(cfg.jsonl_field) || !rec[cfg.jsonl_field].is_string()) {
        throw DataError(path + ", line " + std::to_string(line) + ": no string field '" + cfg.jsonl_field +
                        "' (give --jsonl-field NAME for another)");
      }
      docs.push_back(rec[cfg.jsonl_field].get<std::string>());
    }
    return docs;
  }
  if (cfg.separator.empty()) return {contents};
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

  // The whole corpus is held in memory (int32 per token). Fine for the corpora prep is meant
  // for; a streaming writer would be needed for multi-GB inputs.
  if (cfg.input_format != "auto" && cfg.input_format != "text" && cfg.input_format != "jsonl")
    throw ConfigError("prep: --input-format " + cfg.input_format + ": auto, text or jsonl");
  if (cfg.jsonl_field.empty()) throw ConfigError("prep: --jsonl-field: give a field name");
  std::vector<int32_t> corpus;
  int64_t documents = 0;
  const std::vector<std::string> inputs = expand_paths(cfg.inputs, "--input");  // quoted globs too
  if (inputs.empty()) throw ConfigError("prep: no input files");
  std::unique_ptr<Tokenizer> tokenizer;
  if (!cfg.tokenizer.empty() || !cfg.vocab.empty()) {
    // The documents counted (and a bad JSONL line refused) here, with the byte path's rules; the
    // tool splits them by the same rules (tools/bpe_tokenizer.py, documents()).
    for (const auto& input : inputs) documents += static_cast<int64_t>(split_documents(input, read_file(input), cfg).size());
    corpus = tokenize_bpe(cfg, inputs, tokenizer);
  } else {
    tokenizer = std::make_unique<ByteTokenizer>();
    for (const auto& input : inputs) {
      for (const std::string& text : split_documents(input, read_file(input), cfg)) {
        const std::vector<int32_t> doc = tokenize_bytes(text);
        corpus.insert(corpus.end(), doc.begin(), doc.end());
        ++documents;
      }
    }
  }
  const int64_t total = static_cast<int64_t>(corpus.size());
  // Checked before anything is written, so a bad split leaves the output directory untouched.
  if (cfg.val_tokens >= total)
    throw DataError("prep: val-tokens " + std::to_string(cfg.val_tokens) +
                    " leaves no training tokens (the inputs hold " + std::to_string(total) +
                    " tokens)");

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
  fs::create_directories(dir, ec);
  if (ec) throw DataError(cfg.out_dir + ": cannot create directory: " + ec.message());

  PrepResult result;
  result.total_tokens = total;
  result.tokenizer = tokenizer->name();
  result.vocab_size = tokenizer->vocab_size();
  result.eot = tokenizer->eot();
  result.input_files = static_cast<int64_t>(inputs.size());
  result.documents = documents;
  auto write = [&](const std::string& path, int64_t begin, int64_t end) {
    write_token_shard(path, std::vector<int32_t>(corpus.begin() + begin, corpus.begin() + end));
    result.files.push_back(path);
  };
  if (cfg.val_tokens > 0) write(shard_path(dir, "val", 0), 0, cfg.val_tokens);
  int64_t index = 0;
  for (int64_t begin = cfg.val_tokens; begin < total; begin += cfg.shard_tokens, ++index)
    write(shard_path(dir, "train", index), begin, std::min(total, begin + cfg.shard_tokens));
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
  return result;
}

}  // namespace kiln
