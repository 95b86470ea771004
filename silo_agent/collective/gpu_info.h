// What the CUDA/NCCL build found at run time. Compiled with nvcc where the toolkit exists, so
// that GPU code always compiles and links in CI; elsewhere `available` is false.
#pragma once

#include <string>

namespace xsilo::collective {

struct GpuInfo {
  bool built = false;          // the binary was built with CUDA and NCCL
  int devices = 0;             // CUDA devices visible now
  int nccl_version = 0;        // e.g. 22805 for 2.28.5
  std::string cuda_error;      // why there are no devices, when there are none
  std::string describe() const;
};

GpuInfo gpu_info();

}  // namespace xsilo::collective
