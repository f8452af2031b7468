// distributed/device_peaks.h -- one device's dense BF16 peak, the denominator of MFU.
//
//   MFU = tokens_per_s * F / (G * peak)
// F the model's FLOPs per token (models/flops.h), G the job's distinct devices
// (distributed/job_devices.h), peak one device's dense BF16 tensor-core rate from the table below
// (NVIDIA's data sheets, without sparsity; torchtitan's tools/utils.py). An unknown device gets
// no MFU unless --peak-tflops is given. Torch-free: `kiln plan` uses it too.
#pragma once

#include <optional>
#include <string>

namespace kiln {

// Dense BF16 peak in TFLOP/s for a device name (cudaDeviceProp::name): H100 SXM 989, H100 NVL
// 835, H100 PCIe 756, H200 989, A100 312, ... nullopt when the device is not in the table.
std::optional<double> peak_tflops_for(const std::string& device_name);

}  // namespace kiln
