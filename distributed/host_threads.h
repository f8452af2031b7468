// distributed/host_threads.h -- how many CPU threads each rank's intra-op pool gets.
//
// A node's ranks share its cores. LibTorch's intra-op pool takes every core by default, so R
// ranks on a node would run R pools of all cores each and crawl; and mpirun binds each rank to
// one core by default (--bind-to core when it starts 2 ranks or fewer, --bind-to socket above),
// which leaves a pool of many threads on one core. kiln divides the node's cores among its ranks,
// on CPU and GPU runs alike (on a GPU run the host AdamW of --offload and the data work on them):
//   threads = min(cores / ranks_on_node, cpus this rank may run on)        (at least 1)
// applied when the node has several ranks, or when this rank may use fewer CPUs than LibTorch's
// default would take. OMP_NUM_THREADS, when set, wins (LibTorch reads it itself). The config
// record logs the decision ("host_threads"). For runs that use the host's cores (offload), launch
// with `--bind-to none` (or `--map-by ppr:R:node:PE=C`, C cores each): docs/zero.md.
#pragma once

#include <string>

namespace kiln {

struct HostThreads {
  int cores = 1;          // the node's (std::thread::hardware_concurrency)
  int cpus_allowed = 1;   // this rank's affinity mask (sched_getaffinity): what binding left it
  int ranks_on_node = 1;  // the launcher's local size
  int intra_op = 1;       // the pool's threads now
  std::string rule;       // "OMP_NUM_THREADS", "divided" or "default"
};

// Decides and applies the rule above (at::set_num_threads).
HostThreads divide_host_threads(int ranks_on_node);

}  // namespace kiln
