// plan/cluster.cpp -- GPU node presets and their sources.
//
// Every number below is a published figure or derived from one (arithmetic shown); "unverified"
// marks a typical value no source at hand confirmed -- override it with the matching flag.
// References (the long versions are in /shared/reference/anchors_performance.md, sections 0, 8):
//   [dsH100]  NVIDIA H100 data sheet: SXM5 80 GB HBM3, 989 TFLOP/s dense BF16, up to 700 W.
//   [dsH200]  NVIDIA H200 data sheet: 141 GB HBM3e, 989 TFLOP/s dense BF16, up to 700 W.
//   [dsA100]  NVIDIA A100 data sheet: SXM4 80 GB, 312 TFLOP/s dense BF16, 400 W.
//   [dsV100]  NVIDIA V100 data sheet: SXM2 32 GB, 125 TFLOP/s FP16 tensor (no BF16), 300 W.
//   [dsMI250X] AMD Instinct MI250X: 383 TFLOP/s BF16 matrix, 128 GB HBM2e, 560 W per module of
//             two GCDs; each GCD is one device to the runtime (64 GB, 191.5 TFLOP/s, 280 W).
//   [nt212]   nccl-tests #212 / nccl #1455: ~370 GB/s ring busbw on 8x H100 NVLink4 (NVLS
//             all-reduce up to ~480); nccl-tests #272: 475 GB/s all-reduce busbw on 8x H200.
//   [nt149]   nccl-tests #149, #178: ~200-208 GB/s all-reduce busbw on 8x A100 SXM NVLink3.
//   [nt290]   nccl-tests #290: 46-48 GB/s per NDR 400 Gb/s NIC (one NIC per GPU on DGX H100/H200).
//   [nc412]   nccl #412: ~24 GB/s per HDR 200 Gb/s NIC (DGX A100: one per GPU).
//   [dsOff]   DeepSpeed ZeRO-Offload tutorial: 10B-parameter CPU AdamW step ~6.2-6.5 s on a 2020
//             DGX-2 host, i.e. ~1.5-1.6e9 parameters/s (derived in anchors section 5).
#include "plan/cluster.h"

#include <cmath>
#include <cstdio>

#include "distributed/error.h"

namespace kiln::plan {

namespace {
constexpr double GB = 1e9;
constexpr double TFLOPS = 1e12;

ClusterSpec h100() {
  ClusterSpec c;
  c.name = "h100";
  c.device = "NVIDIA H100 SXM 80GB (DGX H100 node)";
  c.devices_per_node = 8;
  c.device_memory = 80 * GB;         // [dsH100]
  c.peak_flops = 989 * TFLOPS;       // [dsH100]; torchtitan get_peak_flops
  c.fp8_peak_flops = 1979 * TFLOPS;  // [dsH100] FP8 tensor core, dense (3958 with sparsity)
  c.watts = 700;                     // [dsH100] board power; average draw in training is lower: override with --watts
  c.intra_node_busbw = 370 * GB;     // [nt212] ring (all-gather / reduce-scatter; all-reduce can reach ~480 with NVLS)
  c.inter_node_busbw = 46 * GB;      // [nt290] one NDR 400 Gb/s NIC per GPU
  c.host_link = 50 * GB;             // PCIe Gen5 x16: 64 GB/s line rate, ~50 achieved (unverified)
  c.host_memory = 2048 * GB;         // DGX H100: 2 TB system memory
  c.host_adam_rate = 1.5e9;          // [dsOff] (a 2020 host; a newer one is faster: unverified)
  return c;
}

ClusterSpec h200() {
  ClusterSpec c = h100();
  c.name = "h200";
  c.device = "NVIDIA H200 141GB (DGX/HGX H200 node)";
  c.device_memory = 141 * GB;        // [dsH200]
  c.peak_flops = 989 * TFLOPS;       // [dsH200]: same tensor cores as H100 SXM
  c.fp8_peak_flops = 1979 * TFLOPS;  // [dsH200] FP8, dense
  c.watts = 700;                     // [dsH200]
  c.intra_node_busbw = 370 * GB;     // [nt212] (NVLink4, as H100; all-reduce with NVLS: 475 GB/s, nccl-tests #272)
  c.inter_node_busbw = 46 * GB;      // [nt290]; torchtitan's H200 benchmark: 400 Gb/s CX-7 per GPU
  return c;
}

ClusterSpec a100() {
  ClusterSpec c;
  c.name = "a100";
  c.device = "NVIDIA A100 SXM4 80GB (DGX A100 node)";
  c.devices_per_node = 8;
  c.device_memory = 80 * GB;         // [dsA100]
  c.peak_flops = 312 * TFLOPS;       // [dsA100]
  c.watts = 400;                     // [dsA100]
  c.intra_node_busbw = 200 * GB;     // [nt149]
  c.inter_node_busbw = 24 * GB;      // [nc412] HDR 200 Gb/s per GPU
  c.host_link = 25 * GB;             // PCIe Gen4 x16: 32 GB/s line rate, ~25 achieved (unverified)
  c.host_memory = 1024 * GB;         // DGX A100 (the 80 GB model ships with 2 TB)
  c.host_adam_rate = 1.5e9;          // [dsOff]
  return c;
}

ClusterSpec v100() {
  ClusterSpec c;
  c.name = "v100";
  c.device = "NVIDIA V100 SXM2 32GB (DGX-1 node)";
  c.devices_per_node = 8;
  c.device_memory = 32 * GB;         // [dsV100]
  c.peak_flops = 125 * TFLOPS;       // [dsV100]: FP16 tensor cores (V100 has no BF16: kiln would run fp16)
  c.watts = 300;                     // [dsV100]
  c.intra_node_busbw = 130 * GB;     // NVLink2 hybrid cube mesh, all-reduce busbw (unverified)
  c.inter_node_busbw = 6.25 * GB;    // DGX-1: 4x EDR 100 Gb/s per 8 GPUs = 50 GB/s / 8 (line rate, derived)
  c.host_link = 12 * GB;             // PCIe Gen3 x16: 16 GB/s line rate, ~12 achieved (unverified)
  c.host_memory = 512 * GB;          // DGX-1
  c.host_adam_rate = 1.5e9;          // [dsOff] (measured on a V100 DGX-2 host)
  return c;
}

ClusterSpec mi250x() {
  ClusterSpec c;
  c.name = "mi250x";
  c.device = "AMD MI250X GCD (Frontier-class node: 4 MI250X = 8 GCDs)";
  c.devices_per_node = 8;
  c.device_memory = 64 * GB;         // [dsMI250X] 128 GB per module / 2 GCDs
  c.peak_flops = 191.5 * TFLOPS;     // [dsMI250X] 383 / 2
  c.watts = 280;                     // [dsMI250X] 560 W per module / 2
  c.intra_node_busbw = 100 * GB;     // Infinity Fabric, RCCL all-reduce inside a node (unverified)
  c.inter_node_busbw = 12.5 * GB;    // Frontier: 4 Slingshot-11 NICs x 25 GB/s per 8 GCDs (line rate, derived)
  c.host_link = 36 * GB;             // Frontier: CPU-GCD Infinity Fabric 36 GB/s per direction
  c.host_memory = 512 * GB;          // Frontier node DDR4
  c.host_adam_rate = 1.5e9;          // [dsOff] (unverified for this host)
  return c;
}
}  // namespace

std::vector<std::string> cluster_preset_names() { return {"h100", "h200", "a100", "v100", "mi250x"}; }

ClusterSpec cluster_preset(const std::string& name) {
  if (name == "h100") return h100();
  if (name == "h200") return h200();
  if (name == "a100") return a100();
  if (name == "v100") return v100();
  if (name == "mi250x") return mi250x();
  std::string names;
  for (const auto& n : cluster_preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw ConfigError("unknown --gpu '" + name + "' (presets: " + names + ")");
}

void ClusterSpec::validate() const {
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  auto positive = [&](const char* flag, double v) {
    if (!(v > 0) || !std::isfinite(v)) throw ConfigError(std::string("--") + flag + " must be positive (got " + num(v) + ")");
  };
  if (nodes < 1) throw ConfigError("--nodes must be at least 1 (got " + std::to_string(nodes) + ")");
  if (devices_per_node < 1) throw ConfigError("--gpus-per-node must be at least 1 (got " + std::to_string(devices_per_node) + ")");
  positive("device-memory-gb", device_memory);
  positive("peak-tflops", peak_flops);
  if (!(achieved > 0 && achieved <= 1)) throw ConfigError("--achieved must be in (0, 1] (got " + num(achieved) + ")");
  positive("watts", watts);
  positive("intra-node-gbs", intra_node_busbw);
  positive("inter-node-gbs", inter_node_busbw);
  positive("host-link-gbs", host_link);
  positive("host-memory-gb", host_memory);
  positive("host-adam-gparams", host_adam_rate);
  positive("disk-gbs", disk_write);
}

}  // namespace kiln::plan
