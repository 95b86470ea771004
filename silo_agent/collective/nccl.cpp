#include "silo_agent/collective/nccl.h"

#ifdef XSILO_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <thread>
#endif

namespace xsilo::collective {

#ifndef XSILO_WITH_CUDA

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator>, const Options&, Communicator*,
                                                     const std::vector<int>&, const Agree&) {
  throw CollectiveError("the nccl backend needs a build with CUDA and NCCL; this one has neither", -1);
}

#else

namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CollectiveError(std::string(what) + ": " + cudaGetErrorString(e), -1);
}

ncclRedOp_t nccl_op(Op op) {
  switch (op) {
    case Op::sum: return ncclSum;
    case Op::min: return ncclMin;
    case Op::max: return ncclMax;
    case Op::product: return ncclProd;
  }
  return ncclSum;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> boot, const Options& opts, NcclCommunicator* previous,
                   const std::vector<int>& excluded, const Agree& agree)
      : boot_(std::move(boot)), opts_(opts) {
    try {
      start(previous, excluded, agree);
    } catch (...) {
      release();  // no destructor runs for a constructor that throws
      throw;
    }
  }

  ~NcclCommunicator() override { release(); }

  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }
  std::string backend() const override { return "nccl"; }

  using Communicator::all_reduce;
  void all_reduce(std::span<float> data, Op op) override {
    if (data.empty()) return;
    on_device();
    stage_in(data);
    launch(ncclAllReduce(buffer_, buffer_, data.size(), ncclFloat, nccl_op(op), comm_, stream_), "ncclAllReduce");
    stage_out(data);
  }
  void broadcast(std::span<float> data, int root) override {
    if (data.empty()) return;
    on_device();
    stage_in(data);
    launch(ncclBroadcast(buffer_, buffer_, data.size(), ncclFloat, root, comm_, stream_), "ncclBroadcast");
    stage_out(data);
  }
  void barrier() override {
    float one = 1;
    all_reduce(std::span<float>(&one, 1));
  }

 private:
  // The current device is per thread, and the collectives may run on another thread than the one
  // that built the communicator (the agent's bucket reducer does): without this, a worker whose
  // GPU is not device 0 would stage its buffer on device 0, beside a communicator on another.
  void on_device() { check_cuda(cudaSetDevice(device_), "cudaSetDevice"); }
  void stage_in(std::span<const float> data) {
    if (data.size() > capacity_) {
      if (buffer_) cudaFree(buffer_);
      buffer_ = nullptr;
      check_cuda(cudaMalloc(&buffer_, data.size() * sizeof(float)), "cudaMalloc");
      capacity_ = data.size();
    }
    check_cuda(cudaMemcpyAsync(buffer_, data.data(), data.size_bytes(), cudaMemcpyHostToDevice, stream_), "copy to GPU");
  }
  void stage_out(std::span<float> data) {
    check_cuda(cudaMemcpyAsync(data.data(), buffer_, data.size_bytes(), cudaMemcpyDeviceToHost, stream_), "copy from GPU");
    // Poll instead of cudaStreamSynchronize: a peer that died leaves the kernel waiting forever.
    const auto deadline = Clock::now() + opts_.step_timeout;
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) fail(std::string("CUDA stream: ") + cudaGetErrorString(q));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) fail(std::string("NCCL: ") + ncclGetErrorString(async));
      if (Clock::now() > deadline) fail("a peer did not answer within " + std::to_string(opts_.step_timeout.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void launch(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress) fail(std::string(what) + ": " + ncclGetErrorString(r));
    wait_ready(what);
  }
  // The three steps of a start (nccl.h), or a shrink of `previous` after a re-formation.
  void start(NcclCommunicator* previous, const std::vector<int>& excluded, const Agree& agree) {
    std::string why;
    try {
      int devices = 0;
      check_cuda(cudaGetDeviceCount(&devices), "no CUDA device");
      if (devices == 0) throw CollectiveError("no CUDA device for the nccl backend", -1);
      device_ = boot_->rank() % devices;
      check_cuda(cudaSetDevice(device_), "cudaSetDevice");
      check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    } catch (const CollectiveError& e) {
      if (!agree) throw;
      why = e.what();
    }
    vote(agree, why, "a GPU and its stream");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    if (previous && previous->comm_) {
      // Shrink: the survivors keep their order, so the new ranks match the TCP mesh's.
      std::vector<int> gone(excluded);
      ncclResult_t r = ncclCommShrink(previous->comm_, gone.data(), static_cast<int>(gone.size()), &comm_, &config,
                                      NCCL_SHRINK_ABORT);
      if (r != ncclSuccess && r != ncclInProgress) throw CollectiveError(std::string("ncclCommShrink: ") + ncclGetErrorString(r), -1);
      wait_ready("ncclCommShrink");
      return;
    }
    // Rank 0 draws the unique id; it reaches the others over the TCP mesh, after a word saying
    // whether there is one (rank 0 always sends, so no rank waits for a broadcast that never comes).
    ncclUniqueId id{};
    bool drawn = true;
    if (boot_->rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
      if (!agree) throw CollectiveError("ncclGetUniqueId failed", -1);
      drawn = false;
    }
    std::vector<float> carrier(1 + (sizeof id + sizeof(float) - 1) / sizeof(float));
    carrier[0] = drawn ? 1.0f : 0.0f;
    std::memcpy(carrier.data() + 1, &id, sizeof id);
    boot_->broadcast(carrier, 0);
    if (carrier[0] != 1.0f) throw NcclUnavailable("NCCL did not start inside this host: its rank 0 could not draw NCCL's unique id");
    std::memcpy(&id, carrier.data() + 1, sizeof id);
    why.clear();
    try {
      const ncclResult_t r = ncclCommInitRankConfig(&comm_, boot_->size(), id, boot_->rank(), &config);
      if (r != ncclSuccess && r != ncclInProgress) throw CollectiveError(std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r), -1);
      wait_ready("ncclCommInitRankConfig", agree ? opts_.step_timeout / 2 : opts_.step_timeout);
    } catch (const CollectiveError& e) {
      if (!agree) throw;
      why = e.what();
    }
    vote(agree, why, "the communicator's init");
  }

  // Every rank's vote on a step of the start; throws on every rank alike when any failed it.
  static void vote(const Agree& agree, const std::string& why, const char* step) {
    if (!agree || agree(why.empty())) return;
    throw NcclUnavailable("NCCL did not start inside this host (" + std::string(step) + "): " +
                          (why.empty() ? std::string("another worker of the host failed it") : why));
  }

  void release() {
    cudaSetDevice(device_);
    if (comm_) ncclCommAbort(comm_);  // abort never blocks on peers, destroy could; it ends an init in flight too
    comm_ = nullptr;
    if (buffer_) cudaFree(buffer_);
    buffer_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  // A non-blocking call returns ncclInProgress until the communicator is ready again.
  void wait_ready(const char* what, std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    if (timeout.count() < 0) timeout = opts_.step_timeout;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(std::string(what) + ": " + ncclGetErrorString(state));
      if (Clock::now() > deadline) fail(std::string(what) + " did not finish within " + std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  // The communicator stays as it is: the re-formed group shrinks it with NCCL_SHRINK_ABORT,
  // which aborts what is still in flight (the flow NCCL recommends after an error). If it is
  // never shrunk, the destructor aborts it.
  [[noreturn]] void fail(const std::string& what) { throw CollectiveError(what, -1); }
  std::unique_ptr<Communicator> boot_;
  Options opts_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  float* buffer_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> boot, const Options& opts,
                                                     Communicator* previous, const std::vector<int>& excluded_ranks,
                                                     const Agree& agree) {
  auto* prev = dynamic_cast<NcclCommunicator*>(previous);
  return std::make_unique<NcclCommunicator>(std::move(boot), opts, prev, excluded_ranks, prev ? Agree{} : agree);
}

#endif

}  // namespace xsilo::collective
