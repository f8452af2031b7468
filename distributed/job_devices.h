// distributed/job_devices.h -- the distinct devices a job computes on, and its energy summed over
// them: the denominators of kiln's per-device figures (docs/metrics.md).
//
// A job of W ranks runs on G <= W distinct devices: ranks that share one GPU (the MPI backend
// lets several ranks stage through one) count it once. A device is named by
//   CUDA  host name + PCI bus id (cudaDeviceGetPCIBusId, "0000:3B:00.0"): the physical GPU,
//         whatever index CUDA_VISIBLE_DEVICES gives it in each process (NVML's energy counter
//         is found by the same bus id, runtime/observe/energy.cpp);
//   CPU   the rank: kiln divides a node's cores among its ranks (runtime/trainer/trainer.cpp), so each
//         rank's share is a device of its own and G = W. --peak-tflops on a CPU run is the peak
//         of one rank's share of the cores.
// With tokens/s the job's (global batch tokens per step / step time) and F FLOPs per token:
//   tflops_job = tokens/s x F / 1e12        the job's model TFLOP/s
//   tflops     = tflops_job / G             per device
//   mfu        = tflops_job / (G x peak)    = tflops / peak, peak being one device's
// Energy: each device's counter is read by the lowest world rank that uses it, and the job's
// joules are the sum over the G devices (each rank adds its device's joules or 0: one all-reduce
// of one double per step). Only when every rank's meter is available, decided at set-up;
// otherwise the job's energy is unknown (null) and nothing is communicated for it -- the CPU's
// case, whose meter is always unavailable.
// All of it goes over the communicator given here, an MPI communicator of the world that is
// none of the mesh's (the mesh's bytes are the step's comm_bytes, which `kiln plan --compare`
// checks exactly). Without one (a world of one, no mpirun): G = 1 and nothing is sent.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "distributed/comm.h"

namespace kiln {

// This rank's device as above: "host/0000:3B:00.0" (CUDA) or "host/cpu/rank 3" (CPU).
std::string device_identity(const c10::Device& device, int world_rank);

// What the identities of all ranks (world order) say: G, and whether rank `rank` is the lowest
// rank on its device (the one that reads its energy).
struct DeviceRoles {
  int count = 1;             // G: distinct identities
  bool reads_energy = true;  // `rank` is the first rank with its identity
};
DeviceRoles device_roles(const std::vector<std::string>& identities, int rank);

class JobDevices {
 public:
  // Collective over `world` (an all-gather of one 256-byte record per rank): every rank calls it.
  // world null: a world of one, nothing communicated. meter_available: this rank's energy meter
  // reads (EnergyMeter::available()).
  JobDevices(const c10::Device& device, bool meter_available, std::shared_ptr<Communicator> world);

  int count() const { return count_; }                  // G
  bool energy_known() const { return energy_known_; }  // every rank's meter is available

  // The job's joules over one stretch, from this rank's counter read before and after it: the sum
  // over the devices. Collective over the world when it has several ranks and energy_known(),
  // otherwise local. nullopt when !energy_known() or a read failed on any rank.
  std::optional<double> job_joules(std::optional<double> before, std::optional<double> after);

 private:
  std::shared_ptr<Communicator> world_;
  int count_ = 1;
  bool reads_energy_ = true;
  bool energy_known_ = false;
};

}  // namespace kiln
