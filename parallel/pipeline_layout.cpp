// parallel/pipeline_layout.cpp -- the stage split of the blocks.
#include "parallel/pipeline_layout.h"

#include <algorithm>
#include <sstream>

#include "distributed/error.h"

namespace kiln {

std::vector<int64_t> pipeline_block_counts(int64_t n_layer, int64_t stages, const std::string& split, int64_t chunks) {
  if (stages < 1) throw ConfigError("--pp must be at least 1 (got " + std::to_string(stages) + ")");
  if (chunks < 1) throw ConfigError("--pp-virtual must be at least 1 (got " + std::to_string(chunks) + ")");
  const int64_t pp = stages * chunks;  // virtual stages
  const std::string want = chunks == 1 ? "--pp " + std::to_string(pp) + " stages"
                                       : "--pp " + std::to_string(stages) + " x --pp-virtual " + std::to_string(chunks) +
                                             " = " + std::to_string(pp) + " virtual stages";
  if (!split.empty()) {
    std::vector<int64_t> counts;
    std::stringstream in(split);
    std::string item;
    while (std::getline(in, item, ',')) {
      size_t used = 0;
      int64_t v = -1;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size() || v < 1) {
        throw ConfigError("--pp-split '" + split + "': each stage's block count must be a whole number >= 1 (got '" +
                          item + "')");
      }
      counts.push_back(v);
    }
    int64_t sum = 0;
    for (int64_t c : counts) sum += c;
    if (static_cast<int64_t>(counts.size()) != pp || sum != n_layer) {
      throw ConfigError("--pp-split '" + split + "' gives " + std::to_string(counts.size()) + " stage(s) holding " +
                        std::to_string(sum) + " block(s); want " + want + " holding the model's " +
                        std::to_string(n_layer) + " blocks");
    }
    return counts;
  }
  if (pp > n_layer) {
    if (chunks > 1) {
      throw ConfigError(want + " are more than the model's " + std::to_string(n_layer) +
                        " blocks: every virtual stage needs at least one block (--pp-virtual " +
                        std::to_string(std::max<int64_t>(1, n_layer / stages)) + " fits)");
    }
    throw ConfigError("--pp " + std::to_string(pp) + " is larger than the model's " + std::to_string(n_layer) +
                      " blocks: every pipeline stage needs at least one block");
  }
  std::vector<int64_t> counts(static_cast<size_t>(pp), n_layer / pp);
  int64_t extra = n_layer % pp;
  std::vector<int64_t> order;  // middle stages, then the first, then the last
  for (int64_t s = 1; s + 1 < pp; ++s) order.push_back(s);
  order.push_back(0);
  if (pp > 1) order.push_back(pp - 1);
  for (size_t i = 0; extra > 0; ++i, --extra) ++counts[static_cast<size_t>(order[i % order.size()])];
  return counts;
}

std::vector<int64_t> pipeline_block_starts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> starts{0};
  for (int64_t c : counts) starts.push_back(starts.back() + c);
  return starts;
}

}  // namespace kiln
