// tests/test_tokenizer.cpp -- tokenizer.json read and written (data/hf_tokenizer.h), the run's and
// the checkpoint's tokenizer (data/tokenizer.h), and the Python tool's failure line
// (distributed/python_tool.h). Encoding through Python's tokenizers is tested end to end in
// tests/hf/tokenizer.sh, against the library itself.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/hf_tokenizer.h"
#include "data/tokenizer.h"
#include "distributed/error.h"
#include "distributed/python_tool.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("kiln_test_tokenizer_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path.string();
}

// A small byte-level BPE as the tokenizers library writes one: the 256 byte characters, two
// merges, <|endoftext|> as an added special token with id 258 and a non-special added token.
json small_bpe() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[kiln::byte_char(static_cast<unsigned char>(b))] = b;
  vocab["\xc4\xa0t"] = 256;  // "Ġt": " t" (space is U+0120 in GPT-2's table)
  vocab["\xc4\xa0th"] = 257;
  return json{{"version", "1.0"},
              {"added_tokens", json::array({json{{"id", 258}, {"content", "<|endoftext|>"}, {"special", true}},
                                            json{{"id", 259}, {"content", "<pad-ish>"}, {"special", false}}})},
              {"pre_tokenizer", {{"type", "ByteLevel"}}},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({"\xc4\xa0", "t"}), json::array({"\xc4\xa0t", "h"})})}}}};
}

}  // namespace

TEST(Tokenizer, Gpt2ByteTable) {
  // GPT-2's bytes_to_unicode: printable bytes stand for themselves; the others, in byte order,
  // for U+0100, U+0101, ...: byte 0 -> U+0100, space (32) -> U+0120 'Ġ', 0xAD -> U+0143.
  EXPECT_EQ(kiln::byte_char('a'), "a");
  EXPECT_EQ(kiln::byte_char(0xE9), "\xc3\xa9");  // é stands for itself
  EXPECT_EQ(kiln::byte_char(0), "\xc4\x80");
  EXPECT_EQ(kiln::byte_char(' '), "\xc4\xa0");
  EXPECT_EQ(kiln::byte_char(0xAD), "\xc5\x83");
  std::set<std::string> distinct;
  for (int b = 0; b < 256; ++b) distinct.insert(kiln::byte_char(static_cast<unsigned char>(b)));
  EXPECT_EQ(distinct.size(), 256u);
}

TEST(Tokenizer, BpeDecodesThroughTheVocabulary) {
  const fs::path d = temp_dir("bpe");
  const auto tok = kiln::load_tokenizer(write(d / "tokenizer.json", small_bpe().dump()));
  EXPECT_EQ(tok->name(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 260);
  EXPECT_EQ(tok->eot(), 258);
  // "Ġth" + "e" + EOT (nothing) + "Ġt" + 0xC3 0xA9 (é as two byte tokens) + the added token's text.
  EXPECT_EQ(tok->decode({257, 'e', 258, 256, 0xC3, 0xA9, 259}), " the t\xc3\xa9<pad-ish>");
  EXPECT_THROW(tok->decode({260}), kiln::Error);
  EXPECT_THROW(tok->decode({-1}), kiln::Error);
  EXPECT_EQ(tok->hf_json(), small_bpe().dump());  // saved with checkpoints as read
  EXPECT_TRUE(tok->encode("").empty());           // no Python for nothing
  fs::remove_all(d);
}

TEST(Tokenizer, ByteLevelFileIsTheByteTokenizer) {
  const fs::path d = temp_dir("byte");
  const std::string text = kiln::byte_level_tokenizer_json();
  const auto tok = kiln::load_tokenizer(write(d / "tokenizer.json", text));
  EXPECT_EQ(tok->name(), "byte");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eot(), 256);
  EXPECT_EQ(tok->hf_json(), text);
  const json j = json::parse(text);
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["vocab"]["\xc4\xa0"], 32);  // 'Ġ' is the space byte
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(j["added_tokens"][0]["id"], 256);
  // The same vocabulary read as a BPE decodes every byte to itself.
  const kiln::BpeTokenizer bpe((d / "tokenizer.json").string(), text);
  for (int64_t b = 0; b < 256; ++b) EXPECT_EQ(bpe.decode({b}), std::string(1, static_cast<char>(b)));
  // With one merge it is a BPE, not the byte-level tokenizer.
  json merged = j;
  merged["model"]["merges"] = json::array({json::array({"a", "b"})});
  merged["model"]["vocab"]["ab"] = 257;
  merged["added_tokens"][0]["id"] = 258;
  merged["model"]["vocab"].erase("<|endoftext|>");
  EXPECT_EQ(kiln::load_tokenizer(write(d / "merged.json", merged.dump()))->name(), "bpe");
  fs::remove_all(d);
}

// Llama 3's tokenizer.json has no <|endoftext|>: its documents open with <|begin_of_text|> (kiln's
// document token then), and a sample ends at <|end_of_text|> or <|eot_id|> too.
TEST(Tokenizer, Llama3DocumentAndEndTokens) {
  const fs::path d = temp_dir("llama3");
  json t = small_bpe();
  t["added_tokens"] = json::array({json{{"id", 258}, {"content", "<|begin_of_text|>"}, {"special", true}},
                                   json{{"id", 259}, {"content", "<|end_of_text|>"}, {"special", true}},
                                   json{{"id", 260}, {"content", "<|eot_id|>"}, {"special", true}}});
  const auto tok = kiln::load_tokenizer(write(d / "tokenizer.json", t.dump()));
  EXPECT_EQ(tok->eot(), 258);
  EXPECT_EQ(tok->end_tokens(), (std::vector<int64_t>{258, 259, 260}));
  EXPECT_EQ(tok->decode({258, 256, 104, 259}), " th");  // special tokens decode to nothing
  // GPT-2's kind keeps its one end-of-text token.
  EXPECT_EQ(kiln::load_tokenizer(write(d / "gpt2.json", small_bpe().dump()))->end_tokens(), (std::vector<int64_t>{258}));
  fs::remove_all(d);
}

// SentencePiece's kind (data/hf_tokenizer.h): the decoder chains of Llama 2's files and of the
// Metaspace decoder, each on tokens whose decode the tokenizers library (0.23.3) gave as written
// here; tests/hf/tokenizer_llama.sh compares with the library itself on sampled ids.
TEST(Tokenizer, SentencePieceKindDecodesAsTheLibrary) {
  const fs::path d = temp_dir("sp");
  const std::string R = "\xe2\x96\x81";  // U+2581, SentencePiece's space
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", R + R + "Hi", "<0xE6>", "<0x97>", "<0xA5>", R + "x",
                                           "<0x41>", "<0x0a>", R + R + "world", R, "x" + R, R + "a" + R + "b", "c" + R + "d",
                                           "<0xC0>", "<0x80>", "<0xED>", "<0xA0>"};
  json vocab = json::object();
  for (size_t i = 0; i < pieces.size(); ++i) vocab[pieces[i]] = static_cast<int64_t>(i);
  json added = json::array();
  for (int64_t i = 0; i < 3; ++i) added.push_back(json{{"id", i}, {"content", pieces[static_cast<size_t>(i)]}, {"special", true}});
  auto tokenizer = [&](const std::string& name, const json& decoder) {
    const json j{{"version", "1.0"},
                 {"added_tokens", added},
                 {"decoder", decoder},
                 {"model", {{"type", "BPE"}, {"byte_fallback", true}, {"unk_token", "<unk>"}, {"vocab", vocab}, {"merges", json::array()}}}};
    return kiln::load_tokenizer(write(d / name, j.dump()));
  };
  const json llama2{{"type", "Sequence"},
                    {"decoders", json::array({json{{"type", "Replace"}, {"pattern", {{"String", R}}}, {"content", " "}},
                                              json{{"type", "ByteFallback"}}, json{{"type", "Fuse"}},
                                              json{{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  auto t = tokenizer("llama2.json", llama2);
  EXPECT_EQ(t->eot(), 1);  // <s> opens a document
  EXPECT_EQ(t->end_tokens(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(t->eos_text(), "</s>");
  // The library: ' Hi\ufffd\ufffd\ufffd\ufffd\ufffd xA\n' -- one leading space stripped of two, the
  // run E6 97 A5 E6 97 not UTF-8 (one U+FFFD a byte), lower-case hex taken, specials left out.
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(t->decode({1, 3, 4, 5, 6, 4, 5, 7, 8, 9, 2}), " Hi" + fffd + fffd + fffd + fffd + fffd + " xA\n");
  EXPECT_EQ(t->decode({4, 5, 6}), "\xe6\x97\xa5");  // a whole character: its bytes
  // An overlong form and a surrogate are not UTF-8 either (the library: '\ufffd' x 2, x 3).
  EXPECT_EQ(t->decode({15, 16}), fffd + fffd);
  EXPECT_EQ(t->decode({17, 18, 16}), fffd + fffd + fffd);
  const json meta{{"type", "Metaspace"}, {"replacement", R}, {"prepend_scheme", "first"}, {"split", true}};
  auto m = tokenizer("meta.json", meta);
  EXPECT_EQ(m->decode({3, 10, 11, 12}), "Hi  world x ");  // the library: 'Hello  world x ' for these shapes
  EXPECT_EQ(m->decode({13, 14}), "abc d");                // every U+2581 of the first token dropped
  auto never = tokenizer("never.json", json{{"type", "Metaspace"}, {"replacement", R}, {"prepend_scheme", "never"}});
  EXPECT_EQ(never->decode({13, 14}), " a bc d");
  auto strip = tokenizer("strip.json", json{{"type", "Strip"}, {"content", R}, {"start", 2}, {"stop", 1}});
  EXPECT_EQ(strip->decode({10, 12}), "worldx");  // the library: up to 2 leading and 1 trailing, a token at a time
}

TEST(Tokenizer, RefusesWhatItCannotRead) {
  const fs::path d = temp_dir("refuse");
  auto refused = [&](const std::string& name, const std::string& text, const std::string& says) {
    try {
      kiln::load_tokenizer(write(d / name, text));
      ADD_FAILURE() << name << ": accepted";
    } catch (const kiln::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    }
  };
  refused("notjson.json", "{\"model\": ", "not JSON");
  json wordpiece = small_bpe();
  wordpiece["model"]["type"] = "WordPiece";
  refused("wordpiece.json", wordpiece.dump(), "byte-level BPE");
  // SentencePiece's kind is read since issue 51; a decoder step kiln does not re-do is refused.
  json fallback = small_bpe();
  fallback["model"]["byte_fallback"] = true;
  fallback["decoder"] = json{{"type", "Sequence"}, {"decoders", json::array({json{{"type", "ByteFallback"}}, json{{"type", "CTC"}}})}};
  refused("fallback.json", fallback.dump(), "decoder has a CTC step, which kiln does not decode");
  json no_eot = small_bpe();
  no_eot["added_tokens"].erase(0);
  refused("noeot.json", no_eot.dump(), "no <|endoftext|>");
  try {
    kiln::load_tokenizer((d / "missing.json").string());
    ADD_FAILURE() << "a missing file accepted";
  } catch (const kiln::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.json"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

TEST(Tokenizer, FilesThatAutoTokenizerLoads) {
  const kiln::ByteTokenizer byte;
  const auto files = kiln::tokenizer_files(byte, 64);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files.at("tokenizer.json"), kiln::byte_level_tokenizer_json());
  const json config = json::parse(files.at("tokenizer_config.json"));
  EXPECT_EQ(config["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(config["eos_token"], "<|endoftext|>");
  EXPECT_EQ(config["bos_token"], "<|endoftext|>");
  EXPECT_EQ(config["model_max_length"], 64);
}

TEST(Tokenizer, RunAndCheckpointFindTheirs) {
  const fs::path d = temp_dir("find");
  fs::create_directories(d / "shards");
  fs::create_directories(d / "bare");
  write(d / "shards" / "tokenizer.json", small_bpe().dump());
  // Synthetic data: the byte-level tokenizer. Shards with a tokenizer.json beside them: that one.
  // Shards without one: none (not a guess). --tokenizer wins.
  EXPECT_EQ(kiln::tokenizer_for_data("", {}, 512).tokenizer->name(), "byte");
  EXPECT_EQ(kiln::tokenizer_for_data("", {}, 512).source, "default");
  auto beside = kiln::tokenizer_for_data("", {(d / "shards" / "train_000000.bin").string()}, 512);
  EXPECT_EQ(beside.tokenizer->name(), "bpe");
  EXPECT_EQ(beside.source, (d / "shards" / "tokenizer.json").string());
  auto bare = kiln::tokenizer_for_data("", {(d / "bare" / "train.bin").string()}, 512);
  EXPECT_EQ(bare.tokenizer, nullptr);
  EXPECT_EQ(bare.source.rfind("none: no tokenizer.json beside", 0), 0u) << bare.source;
  EXPECT_EQ(kiln::tokenizer_for_data((d / "shards" / "tokenizer.json").string(), {(d / "bare" / "train.bin").string()}, 512).tokenizer->eot(), 258);
  EXPECT_THROW(kiln::tokenizer_for_data((d / "nope.json").string(), {}, 512), kiln::ConfigError);
  // It must fit the model: a found or named one that does not is refused; the byte-level default
  // is dropped (synthetic data on a vocabulary below 257).
  EXPECT_THROW(kiln::tokenizer_for_data("", {(d / "shards" / "train_000000.bin").string()}, 259), kiln::ConfigError);
  EXPECT_EQ(kiln::tokenizer_for_data("", {(d / "shards" / "train_000000.bin").string()}, 260).tokenizer->vocab_size(), 260);
  auto small = kiln::tokenizer_for_data("", {}, 256);
  EXPECT_EQ(small.tokenizer, nullptr);
  EXPECT_EQ(small.source, "none: the byte-level tokenizer's 257 ids do not fit --vocab-size 256");
  // A checkpoint: its tokenizer.json; one written before checkpoints carried one: byte-level.
  EXPECT_EQ(kiln::tokenizer_for_checkpoint((d / "shards").string())->name(), "bpe");
  EXPECT_EQ(kiln::tokenizer_for_checkpoint((d / "bare").string())->name(), "byte");
  fs::remove_all(d);
}

// A tool's stderr reaches the callback a whole line at a time as it comes -- the first read's
// lines too (kiln prep's BPE progress once missed them: a line-start search ran past the read).
TEST(PythonTool, StderrLinesReachTheCallback) {
  std::vector<std::string> lines;
  const kiln::ToolRun run = kiln::run_python_tool("bpe_tokenizer.py", {"encode"}, "the test needs Python",
                                                  [&](const std::string& line) { lines.push_back(line); });
  EXPECT_EQ(run.exit_code, 2);
  ASSERT_EQ(lines.size(), 1u) << run.err;
  EXPECT_EQ(lines[0], "kiln: error: bpe_tokenizer.py encode: give --tokenizer tokenizer.json");
  EXPECT_EQ(run.err, lines[0] + "\n");
}

TEST(PythonTool, FailureLine) {
  kiln::ToolRun run;
  run.exit_code = 2;
  run.err = "Traceback...\nkiln: error: kiln prep: x.txt: cannot read: No such file or directory\n";
  EXPECT_EQ(kiln::tool_failure(run, "tools/bpe_tokenizer.py"), "kiln prep: x.txt: cannot read: No such file or directory");
  run.err = "something\nImportError: no module named tokenizers\n";
  EXPECT_EQ(kiln::tool_failure(run, "tools/bpe_tokenizer.py"), "tools/bpe_tokenizer.py failed: ImportError: no module named tokenizers");
  run.err = "";
  run.exit_code = 139;
  EXPECT_EQ(kiln::tool_failure(run, "tools/bpe_tokenizer.py"), "tools/bpe_tokenizer.py failed with exit status 139");
}
