// The CUDA/NCCL build: linked everywhere the toolkit exists, exercised where a GPU exists.
#include <gtest/gtest.h>

#include "silo_agent/collective/gpu_info.h"

namespace xsilo::collective {
namespace {

TEST(Gpu, CudaAndNcclAreLinkedAndReportTheirVersions) {
  const auto g = gpu_info();
  if (!g.built) GTEST_SKIP() << "built without the CUDA toolkit (XSILO_CUDA=OFF or not found)";
  EXPECT_GE(g.nccl_version, 20000) << g.describe();
  if (g.devices == 0) {
    GTEST_SKIP() << "no GPU on this machine: " << g.describe();
  }
  EXPECT_GT(g.devices, 0);
}

}  // namespace
}  // namespace xsilo::collective
