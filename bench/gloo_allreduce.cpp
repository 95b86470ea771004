// Peer for `xsilo bench allreduce`: Gloo's ring-chunked all-reduce over its TCP transport,
// rendezvous through a file store, timed the same way as ours.
// Usage: xsilo_gloo_allreduce RANK SIZE STORE_DIR SIZE_BYTES...
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <memory>
#include <vector>

#include "peer_common.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s RANK SIZE STORE_DIR SIZE_BYTES...\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(argv[3]);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, device);
  for (std::size_t bytes : xsilo_bench::sizes_from(argc, argv, 4)) {
    const int count = static_cast<int>(bytes / sizeof(float));
    std::vector<float> v(static_cast<std::size_t>(count), 1.0f);
    gloo::AllreduceRingChunked<float> allreduce(context, {v.data()}, count);
    gloo::BarrierAllToAll barrier(context);
    const int iters = xsilo_bench::iterations_for(bytes);
    for (int i = 0; i < 2; ++i) allreduce.run();
    barrier.run();
    const double t0 = xsilo_bench::now();
    for (int i = 0; i < iters; ++i) allreduce.run();
    const double t = (xsilo_bench::now() - t0) / iters;
    if (rank == 0) xsilo_bench::print_result(bytes, t);
  }
  return 0;
}
