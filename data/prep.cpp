// data/prep.cpp -- `kiln prep`: byte-level tokenization of text files into llm.c shards.
#include "data/prep.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "data/token_file.h"
#include "data/paths.h"
#include "runtime/error.h"

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

}  // namespace

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

  // The whole corpus is held in memory (int32 per byte, so 4x the text size). Fine for the
  // corpora prep is meant for; a streaming writer would be needed for multi-GB inputs.
  std::vector<int32_t> corpus;
  const std::vector<std::string> inputs = expand_paths(cfg.inputs, "--input");  // quoted globs too
  if (inputs.empty()) throw ConfigError("prep: no input files");
  for (const auto& input : inputs) {
    const std::vector<int32_t> doc = tokenize_bytes(read_file(input));
    corpus.insert(corpus.end(), doc.begin(), doc.end());
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
  result.input_files = static_cast<int64_t>(inputs.size());
  auto write = [&](const std::string& path, int64_t begin, int64_t end) {
    write_token_shard(path, std::vector<int32_t>(corpus.begin() + begin, corpus.begin() + end));
    result.files.push_back(path);
  };
  if (cfg.val_tokens > 0) write(shard_path(dir, "val", 0), 0, cfg.val_tokens);
  int64_t index = 0;
  for (int64_t begin = cfg.val_tokens; begin < total; begin += cfg.shard_tokens, ++index)
    write(shard_path(dir, "train", index), begin, std::min(total, begin + cfg.shard_tokens));
  return result;
}

}  // namespace kiln
