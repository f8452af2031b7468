// plan/cluster.h -- the hardware a plan runs on: device, node and links, with presets.
//
// `kiln plan` needs, per device: memory, dense BF16 peak FLOP/s, the fraction of that peak the
// training step sustains, and average power; per node: devices, host memory, the bus bandwidth
// of a collective inside the node and per device between nodes, host<->device bandwidth and the
// host's AdamW rate (for offload). Presets fill all of them for H100, H200, A100, V100 and MI250X
// nodes; every preset value carries its source in cluster.cpp, and any field can be overridden.
//
// Bandwidths are NCCL *bus* bandwidths (nccl-tests doc/PERFORMANCE.md): the time of a collective
// whose per-rank wire traffic is W bytes is W / busbw. kiln's comm_bytes already folds in the
// ring factor's numerator (all_reduce 2x); the (n-1)/n is applied in cost_model.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::plan {

struct ClusterSpec {
  std::string name;                 // preset name, or "custom"
  std::string device;               // device model, for humans ("NVIDIA H100 80GB HBM3")
  int64_t nodes = 1;                // nodes in the job
  int64_t devices_per_node = 8;     // accelerators (processes) per node
  double device_memory = 0;         // bytes usable per device
  double peak_flops = 0;            // dense BF16 tensor-core FLOP/s per device (the MFU denominator)
  double fp8_peak_flops = 0;        // dense FP8 tensor-core FLOP/s per device (--precision fp8's float8 products); 0: none
  double achieved = 0.4;            // fraction of peak a training step's math sustains (HFU), 0 < x <= 1
  double watts = 0;                 // average power per device while training, W
  double intra_node_busbw = 0;      // bytes/s, collectives inside a node (NVLink / Infinity Fabric)
  double inter_node_busbw = 0;      // bytes/s per device, collectives that cross nodes (IB / Slingshot)
  double host_link = 0;             // bytes/s per device, host <-> device copies (PCIe), for offload
  double host_memory = 0;           // bytes of host memory per node, for offload
  double host_adam_rate = 0;        // parameters/s one node's CPUs step with AdamW (offload)
  double disk_write = 2e9;          // bytes/s rank 0 writes a checkpoint at (its file system)

  int64_t devices() const { return nodes * devices_per_node; }
  double sustained_flops() const { return peak_flops * achieved; }  // R per device

  // Throws ConfigError naming the first field that is not usable.
  void validate() const;
};

// A preset by name (h100, h200, a100, v100, mi250x), one node. Throws ConfigError.
ClusterSpec cluster_preset(const std::string& name);
std::vector<std::string> cluster_preset_names();

}  // namespace kiln::plan
