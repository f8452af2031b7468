// data/paths.h -- the files a flag names: comma lists and quoted globs, expanded here.
//
// `--data "dir/train_*.bin,extra.bin"` (and kiln prep's `--input`) may hold paths and glob
// patterns, comma-separated, quoted so the shell leaves them to kiln. Each pattern expands to its
// matches in sorted order (not the locale's collation, so every rank and machine agrees); empty
// pieces ("a,b," from a shell-built list) are skipped.
#pragma once

#include <string>
#include <vector>

namespace kiln {

// The files `patterns` name. Throws DataError naming the flag for a pattern that matches nothing,
// and for a directory ("... is a directory; pass 'DIR/train_*.bin'", quoted: the pattern its
// files suggest; for kiln prep's --input the folder's commonest extension, 'DIR/*.jsonl', with
// what it holds, or 'DIR/*/*.jsonl' where it holds folders alone, or that it is empty).
std::vector<std::string> expand_paths(const std::vector<std::string>& patterns, const std::string& flag);

}  // namespace kiln
