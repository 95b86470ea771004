#include <cuda_runtime.h>
#include <nccl.h>

#include "silo_agent/collective/gpu_info.h"

namespace xsilo::collective {

namespace {
// A kernel, so that the device code path is compiled for the configured architectures.
__global__ void touch(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
}  // namespace

GpuInfo gpu_info() {
  GpuInfo g;
  g.built = true;
  ncclGetVersion(&g.nccl_version);
  const cudaError_t err = cudaGetDeviceCount(&g.devices);
  if (err != cudaSuccess) {
    g.devices = 0;
    g.cuda_error = cudaGetErrorString(err);
    return g;
  }
  if (g.devices > 0) {
    float* d = nullptr;
    if (cudaMalloc(&d, 256 * sizeof(float)) == cudaSuccess) {
      touch<<<1, 256>>>(d, 256);
      cudaDeviceSynchronize();
      cudaFree(d);
    }
  }
  return g;
}

}  // namespace xsilo::collective
