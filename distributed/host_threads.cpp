// distributed/host_threads.cpp -- the node's cores divided among its ranks.
#include "distributed/host_threads.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <ATen/Parallel.h>

namespace kiln {

HostThreads divide_host_threads(int ranks_on_node) {
  HostThreads h;
  h.cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  h.ranks_on_node = std::max(1, ranks_on_node);
  cpu_set_t set;
  CPU_ZERO(&set);
  h.cpus_allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? std::max(1, CPU_COUNT(&set)) : h.cores;
  if (std::getenv("OMP_NUM_THREADS") != nullptr) {
    h.rule = "OMP_NUM_THREADS";
  } else {
    const int share = std::max(1, std::min(h.cores / h.ranks_on_node, h.cpus_allowed));
    if (h.ranks_on_node > 1 || h.cpus_allowed < at::get_num_threads()) {
      at::set_num_threads(share);
      h.rule = "divided";
    } else {
      h.rule = "default";
    }
  }
  h.intra_op = at::get_num_threads();
  return h;
}

}  // namespace kiln
