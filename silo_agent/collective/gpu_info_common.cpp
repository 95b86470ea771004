#include "silo_agent/collective/gpu_info.h"

namespace xsilo::collective {

std::string GpuInfo::describe() const {
  if (!built) return "built without CUDA/NCCL";
  const std::string nccl = std::to_string(nccl_version / 10000) + "." +
                           std::to_string(nccl_version / 100 % 100) + "." +
                           std::to_string(nccl_version % 100);
  return "CUDA + NCCL " + nccl + ", " + std::to_string(devices) + " GPU(s)" +
         (devices == 0 && !cuda_error.empty() ? " (" + cuda_error + ")" : "");
}

#ifndef XSILO_WITH_CUDA
GpuInfo gpu_info() { return {}; }
#endif

}  // namespace xsilo::collective
