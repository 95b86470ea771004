// Peer for `xsilo bench allreduce`: OpenMPI's MPI_Allreduce (sum, float32, in place), timed the
// same way as ours. Run by the bench under mpirun with the TCP transport only.
// Usage: xsilo_mpi_allreduce SIZE_BYTES...
#include <mpi.h>

#include <vector>

#include "peer_common.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (std::size_t bytes : xsilo_bench::sizes_from(argc, argv, 1)) {
    const int count = static_cast<int>(bytes / sizeof(float));
    std::vector<float> v(static_cast<std::size_t>(count), 1.0f);
    const int iters = xsilo_bench::iterations_for(bytes);
    for (int i = 0; i < 2; ++i) MPI_Allreduce(MPI_IN_PLACE, v.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = xsilo_bench::now();
    for (int i = 0; i < iters; ++i) MPI_Allreduce(MPI_IN_PLACE, v.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double t = (xsilo_bench::now() - t0) / iters;
    if (rank == 0) xsilo_bench::print_result(bytes, t);
  }
  MPI_Finalize();
  return 0;
}
