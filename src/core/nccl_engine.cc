// The NCCL engine (built with CUDA and NCCL): a borrowed ncclComm_t behind
// transport::nccl::DeviceComm, compressors holding the device compressed
// state (src/coll/device), and optimizers whose backend is device memory
// over the same DeviceComm (src/optim/cuda). It runs only stream-ordered operations on device
// buffers; Comm refuses the host collectives before they get here.
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "src/codec/codec.h"
#include "src/coll/device/device_allreduce.h"
#include "src/common/cuda_status.h"
#include "src/core/engine.h"
#include "src/optim/cuda/device_optimizer.h"
#include "src/transport/nccl/device_comm.h"

namespace squall::core {
namespace {

using transport::nccl::DeviceComm;

class DeviceCompressor final : public Compressor {
 public:
  DeviceCompressor(const Comm* comm, const codec::Spec& spec,
                   std::unique_ptr<coll::device::DeviceCompressedState> state)
      : Compressor(comm, state->count(), spec, 0,
                   state->allGather()       ? CompressorLayout::kAllGather
                   : state->reduceScatter() ? CompressorLayout::kReduceScatter
                                            : CompressorLayout::kAllReduce),
        state_(std::move(state)) {}

  Status reset() override {
    SQUALL_TRY(state_->reset(lastStream_));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(lastStream_));
    return Status::kOk;
  }
  Status setAlgorithm(coll::CompressedAlgo algo) override {
    if (state_->reduceScatter() || state_->allGather()) {
      SQUALL_REQUIRE(
          algo == coll::CompressedAlgo::kAuto || algo == coll::CompressedAlgo::kAutoBytes,
          Status::kInvalidUsage, Subsys::kApi,
          "a reduce-scatter or all-gather compressor has one algorithm; it takes "
          "squallCompressorAlgoTime or squallCompressorAlgoBytes only");
      return Status::kOk;
    }
    SQUALL_REQUIRE(algo != coll::CompressedAlgo::kAllGather, Status::kInvalidUsage, Subsys::kApi,
                   "a compressor of a communicator from NCCL runs the two-phase allreduce only; "
                   "squallCompressorAlgoAllGather is for host communicators");
    return Status::kOk;
  }
  Status setGatherSpec(const codec::Spec& gather) override { return state_->setGatherSpec(gather); }
  Status stats(CompressorStats* out) override {
    CompressorStats s;
    s.calls = calls_;
    if (state_->worker() != nullptr) {  // waits for the last stream used
      int current = 0;
      unsigned long long skipped = 0;
      SQUALL_TRY(codec::cudaResidualQuery(*state_->worker(), lastStream_, &current, &skipped));
      s.skippedCalls = skipped;
    }
    s.bytesSent = calls_ != 0 ? state_->bytesSent() : 0;
    s.bytesReceived = calls_ != 0 ? state_->bytesReceived() : 0;
    // The device path is always flat.
    s.algorithm = calls_ == 0               ? "none"
                  : state_->allGather()     ? "allgather"
                  : state_->reduceScatter() ? "reducescatter"
                                            : "twophase";
    s.sliceCount = count();
    *out = s;
    return Status::kOk;
  }

  uint64_t bytesSentPerCall() const override { return state_->bytesSent(); }

  // Checkpoints: through host memory, waiting for the last stream used.
  Status residualCounts(size_t* worker, size_t* server) override {
    *worker = state_->workerCount();
    *server = state_->serverCount();
    return Status::kOk;
  }
  Status readResiduals(void* worker, void* server) override {
    return state_->readResiduals(lastStream_, worker, server);
  }
  Status writeResiduals(const void* worker, const void* server) override {
    return state_->writeResiduals(lastStream_, worker, server);
  }

  Status drain(float* owed, ReduceOp op, void* stream) override {
    const auto s = static_cast<cudaStream_t>(stream);
    SQUALL_TRY(
        state_->drain(s, owed, op == ReduceOp::kAvg ? static_cast<float>(comm().size()) : 1));
    lastStream_ = s;
    return Status::kOk;
  }
  Status seed(const float* owed, void* stream) override {
    const auto s = static_cast<cudaStream_t>(stream);
    SQUALL_TRY(state_->seed(s, owed));
    lastStream_ = s;
    return Status::kOk;
  }

  Status run(const DeviceComm& comm, const void* in, void* out, DataType dtype, ReduceOp op,
             cudaStream_t stream) {
    coll::device::DeviceCompressedState* s = state_.get();
    if (s->allGather()) {
      SQUALL_TRY(coll::device::compressedAllGather(comm, stream, in, out, dtype, s));
    } else if (s->reduceScatter()) {
      SQUALL_TRY(coll::device::compressedReduceScatter(comm, stream, in, out, dtype, op, s));
    } else {
      SQUALL_TRY(coll::device::compressedAllReduce(comm, stream, in, out, dtype, op, s));
    }
    lastStream_ = stream;
    ++calls_;
    return Status::kOk;
  }

 private:
  std::unique_ptr<coll::device::DeviceCompressedState> state_;
  cudaStream_t lastStream_ = nullptr;  // for reset and stats
  uint64_t calls_ = 0;
};

class NcclEngine final : public Engine {
 public:
  NcclEngine(const DeviceComm& comm, int device) : comm_(comm), device_(device) {}

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const char* transportName() const override { return "nccl"; }
  int device() const override { return device_; }

  // The device path keeps the buffer's own blocks: `phase` is not honoured.
  Status createCompressor(const Comm* owner, size_t count, const codec::Spec& spec, size_t,
                          coll::Feedback feedback, std::unique_ptr<Compressor>* out) override {
    SQUALL_REQUIRE(feedback == coll::Feedback::kKept, Status::kUnsupported, Subsys::kApi,
                   "the device compressed allreduce always keeps error feedback; make the "
                   "compressor with feedback kept, or on a host communicator");
    std::unique_ptr<coll::device::DeviceCompressedState> state;
    SQUALL_TRY(coll::device::DeviceCompressedState::create(comm_.size(), comm_.rank(), count, spec,
                                                           &state));
    *out = std::make_unique<DeviceCompressor>(owner, spec, std::move(state));
    return Status::kOk;
  }

  Status createReduceScatterCompressor(const Comm* owner, size_t recvcount, const codec::Spec& spec,
                                       coll::Feedback feedback,
                                       std::unique_ptr<Compressor>* out) override {
    SQUALL_REQUIRE(feedback == coll::Feedback::kKept, Status::kUnsupported, Subsys::kApi,
                   "the device compressed reduce-scatter always keeps error feedback; make the "
                   "compressor with feedback kept, or on a host communicator");
    std::unique_ptr<coll::device::DeviceCompressedState> state;
    SQUALL_TRY(coll::device::DeviceCompressedState::createReduceScatter(comm_.size(), comm_.rank(),
                                                                        recvcount, spec, &state));
    *out = std::make_unique<DeviceCompressor>(owner, spec, std::move(state));
    return Status::kOk;
  }

  Status compressedReduceScatterOnStream(const void* in, void* out, size_t, DataType dtype,
                                         ReduceOp op, Compressor& c, void* stream) override {
    return static_cast<DeviceCompressor&>(c).run(comm_, in, out, dtype, op,
                                                 static_cast<cudaStream_t>(stream));
  }

  Status createAllGatherCompressor(const Comm* owner, size_t sendcount, const codec::Spec& spec,
                                   std::unique_ptr<Compressor>* out) override {
    SQUALL_REQUIRE(spec.codec != codec::CodecId::kNone, Status::kInvalidArgument, Subsys::kApi,
                   "a quantized all-gather needs a compressed code, not none; use NCCL's "
                   "all-gather for full precision");
    std::unique_ptr<coll::device::DeviceCompressedState> state;
    SQUALL_TRY(coll::device::DeviceCompressedState::createAllGather(comm_.size(), comm_.rank(),
                                                                    sendcount, spec, &state));
    *out = std::make_unique<DeviceCompressor>(owner, spec, std::move(state));
    return Status::kOk;
  }

  Status compressedAllGatherOnStream(const void* in, void* out, DataType dtype, Compressor& c,
                                     void* stream) override {
    return static_cast<DeviceCompressor&>(c).run(comm_, in, out, dtype, ReduceOp::kSum,
                                                 static_cast<cudaStream_t>(stream));
  }

  Status compressedAllReduce(const void*, void*, DataType, ReduceOp, Compressor&,
                             coll::OperationPtr*) override {
    return SQUALL_FAIL(Status::kInternal, Subsys::kApi,
                       "a host compressed allreduce reached the NCCL engine; please report this");
  }

  Status compressedAllReduceOnStream(const void* in, void* out, DataType dtype, ReduceOp op,
                                     Compressor& c, void* stream) override {
    return static_cast<DeviceCompressor&>(c).run(comm_, in, out, dtype, op,
                                                 static_cast<cudaStream_t>(stream));
  }

  Status createOptimizer(size_t count, const optim::Config& config,
                         std::unique_ptr<optim::Optimizer>* out) override {
    return optim::cuda::createDeviceOptimizer(comm_, count, config, out);
  }

 private:
  DeviceComm comm_;
  int device_;
};

// The thread of releaseLater: started at the first release and never
// stopped (nor the queue destroyed), since it may be waiting for the device
// when the process exits.
class Releaser {
 public:
  static Releaser& get() {
    static Releaser* releaser = new Releaser();
    return *releaser;
  }

  void add(std::shared_ptr<void> doomed, int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Item{std::move(doomed), device});
      if (!started_) {
        std::thread([this] { run(); }).detach();
        started_ = true;
      }
    }
    ready_.notify_one();
  }

 private:
  struct Item {
    std::shared_ptr<void> doomed;
    int device = 0;
  };

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      // Freeing with another device current would make a context there
      // first (and with it hundreds of MB on that device).
      const cudaError_t err = cudaSetDevice(item.device);
      if (err != cudaSuccess) {
        SQUALL_WARN(Subsys::kCuda,
                    "cannot make device %d current to free a released communicator's state "
                    "(%s); it stays allocated until the process exits",
                    item.device, cudaGetErrorString(err));
        kept_.push_back(std::move(item.doomed));
        continue;
      }
      item.doomed.reset();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Item> queue_;
  bool started_ = false;
  std::vector<std::shared_ptr<void>> kept_;  // the releasing thread's only
};

}  // namespace

bool devicePathBuilt() { return true; }

Status createNcclEngine(void* ncclComm, std::unique_ptr<Engine>* out) {
  DeviceComm comm;
  SQUALL_TRY(DeviceComm::wrap(ncclComm, &comm));
  int device = 0;
  SQUALL_CUDA_TRY(cudaGetDevice(&device));
  *out = std::make_unique<NcclEngine>(comm, device);
  return Status::kOk;
}

Status streamIsCapturing(void* cudaStream, bool* capturing) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SQUALL_CUDA_TRY(cudaStreamIsCapturing(static_cast<cudaStream_t>(cudaStream), &status));
  *capturing = status != cudaStreamCaptureStatusNone;
  return Status::kOk;
}

void releaseLater(std::shared_ptr<void> doomed, int device) {
  if (doomed == nullptr) return;
  if (device < 0) {
    doomed.reset();
    return;
  }
  Releaser::get().add(std::move(doomed), device);
}

}  // namespace squall::core
