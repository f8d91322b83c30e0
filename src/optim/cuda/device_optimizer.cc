// The device optimizer backend (device_optimizer.h): device buffers, the
// kernels of update_kernels.cu and NCCL, behind the Backend interface that
// the schedule of optimizer.cc runs on.
//
// Compiled by the host compiler against the CUDA runtime and NCCL, or against
// the CPU emulation of both in tests/gpu/emu for the logic tests.
#include "src/optim/cuda/device_optimizer.h"

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "src/coll/device/device_allreduce.h"
#include "src/common/cuda_status.h"
#include "src/optim/backend.h"
#include "src/optim/cuda/update_kernels_cuda.h"

namespace squall::optim::cuda {
namespace {

// Where flag_ keeps what the host reads back and the residual indices that
// markResiduals saves (worker, server for each channel).
constexpr int kNonFinite = 0;
constexpr int kMarks = 1;
constexpr int kFlagInts = kMarks + 2 * kChannels;

class DeviceBackend final : public Backend {
 public:
  explicit DeviceBackend(const transport::nccl::DeviceComm& comm)
      : comm_(comm), nranks_(comm.size()), rank_(comm.rank()) {}
  ~DeviceBackend() override;
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;

  Status init();

  int nranks() const override { return nranks_; }
  int rank() const override { return rank_; }
  bool onDevice() const override { return true; }
  Status allocate(size_t count, float** out) override;
  // The device compressed allreduce has one algorithm (two-phase).
  Status createChannel(Channel channel, size_t count, const codec::Spec& spec,
                       coll::CompressedAlgo) override;
  void setStream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  Status exchangeStatus(Status check) override;
  Status average(const float* in, float* out, size_t count) override;
  Status compressedAverage(Channel channel, float* buffer, uint64_t* bytes) override;
  Status markResiduals(Channel channel) override { return moveMarks(channel, true); }
  Status restoreResiduals(Channel channel) override { return moveMarks(channel, false); }
  Status resetResiduals(Channel channel) override {
    return states_[static_cast<int>(channel)]->reset(stream_);
  }

  Status allFinite(const float* p, size_t n, bool* finite) override;
  Status varianceChange(size_t n, const float* v, float* snap, double a, double b, double* diff,
                        double* total) override;
  Status adamStep(size_t n, float* x, float* m, float* v, const float* g,
                  const AdamScalars& s) override {
    return cuda::adamStep(n, x, m, v, g, s, stream_);
  }
  Status momentumStep(size_t n, float* out, const float* m, const float* g, float beta1,
                      float oneMinusB1, const float* maskBy) override {
    return cuda::momentumStep(n, out, m, g, beta1, oneMinusB1, maskBy, stream_);
  }
  Status scale(size_t n, float* v, float factor) override {
    return cuda::scale(n, v, factor, stream_);
  }
  Status frozenStep(size_t n, float* x, const float* m, const float* vHat,
                    const FrozenScalars& s) override {
    return cuda::frozenStep(n, x, m, vHat, s, stream_);
  }
  Status slowmoStep(size_t n, float* x, float* xPrev, float* u, const float* xAvg, float lr,
                    float alpha, float beta) override {
    return cuda::slowmoStep(n, x, xPrev, u, xAvg, lr, alpha, beta, stream_);
  }
  Status subtract(size_t n, float* out, const float* a, const float* b) override {
    return cuda::subtract(n, out, a, b, stream_);
  }
  Status add(size_t n, float* out, const float* a, const float* b) override {
    return cuda::add(n, out, a, b, stream_);
  }
  Status copy(float* dst, const float* src, size_t n) override;

  Status view(const float* buffer, size_t n, std::vector<float>* staging,
              const float** out) const override;
  Status upload(float* buffer, const float* host, size_t n) override;
  void residualSizes(Channel channel, size_t* worker, size_t* server) const override;
  Status viewResidual(Channel channel, bool server, std::vector<float>* staging,
                      const float** out) const override;
  Status loadResiduals(Channel channel, const float* worker, const float* server) override;

 private:
  const coll::device::DeviceCompressedState* state(Channel c) const {
    return states_[static_cast<int>(c)].get();
  }
  Status moveMarks(Channel channel, bool save);
  // A zeroed device buffer (at least one byte), freed with the backend.
  Status alloc(size_t bytes, void** out);

  transport::nccl::DeviceComm comm_;
  int nranks_;
  int rank_;
  cudaStream_t stream_ = nullptr;  // of the last step: save and load wait for it
  std::vector<void*> buffers_;
  int* flag_ = nullptr;      // kFlagInts ints
  int* status_ = nullptr;    // one status word per rank (exchangeStatus)
  double* lanes_ = nullptr;  // varianceChange's partial sums, allocated at first use
  int hostStatus_ = 0;       // the source of this rank's word, alive until it is copied
  std::unique_ptr<coll::device::DeviceCompressedState> states_[kChannels];
  size_t counts_[kChannels] = {};
};

DeviceBackend::~DeviceBackend() {
  for (auto& s : states_) s.reset();
  for (void* p : buffers_) cudaFree(p);
}

Status DeviceBackend::alloc(size_t bytes, void** out) {
  const size_t n = bytes == 0 ? 1 : bytes;
  SQUALL_CUDA_TRY(cudaMalloc(out, n));
  buffers_.push_back(*out);
  SQUALL_CUDA_TRY(cudaMemset(*out, 0, n));
  return Status::kOk;
}

Status DeviceBackend::init() {
  void* p = nullptr;
  SQUALL_TRY(alloc(kFlagInts * sizeof(int), &p));
  flag_ = static_cast<int*>(p);
  SQUALL_TRY(alloc(static_cast<size_t>(nranks_) * sizeof(int), &p));
  status_ = static_cast<int*>(p);
  return Status::kOk;
}

Status DeviceBackend::allocate(size_t count, float** out) {
  void* p = nullptr;
  SQUALL_TRY(alloc(count * sizeof(float), &p));
  *out = static_cast<float*>(p);
  return Status::kOk;
}

Status DeviceBackend::createChannel(Channel channel, size_t count, const codec::Spec& spec,
                                    coll::CompressedAlgo) {
  const int c = static_cast<int>(channel);
  counts_[c] = count;
  return coll::device::DeviceCompressedState::create(nranks_, rank_, count, spec, &states_[c]);
}

Status DeviceBackend::exchangeStatus(Status check) {
  // Every rank contributes its word; the host reads them all before the step
  // enqueues anything else, so nobody is left waiting in a collective that a
  // refusing rank never joins.
  hostStatus_ = static_cast<int>(check);
  // A copy, not a reference: a failing exchange below overwrites lastError().
  const std::string reason = lastError();  // NOLINT(performance-unnecessary-copy-initialization)
  std::vector<int> words(static_cast<size_t>(nranks_), 0);
  Status exchanged = [&]() -> Status {
    SQUALL_CUDA_TRY(cudaMemcpyAsync(status_ + rank_, &hostStatus_, sizeof(int),
                                    cudaMemcpyHostToDevice, stream_));
    SQUALL_TRY(comm_.allGather(status_ + rank_, status_, sizeof(int), stream_));
    SQUALL_CUDA_TRY(cudaMemcpyAsync(words.data(), status_, words.size() * sizeof(int),
                                    cudaMemcpyDeviceToHost, stream_));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(stream_));
    return Status::kOk;
  }();
  if (check != Status::kOk) {  // its own reason, logged where it was found
    setLastError(reason);
    return check;
  }
  SQUALL_TRY(exchanged);
  for (int r = 0; r < nranks_; ++r) {
    if (words[static_cast<size_t>(r)] != 0)
      return SQUALL_FAIL(Status::kRemoteError, Subsys::kOptim,
                         "rank %d refused its optimizer step (%s; its log says why), so this "
                         "step is not taken on any rank; fix the call there and step again",
                         r, statusName(static_cast<Status>(words[static_cast<size_t>(r)])));
  }
  return Status::kOk;
}

Status DeviceBackend::average(const float* in, float* out, size_t count) {
  if (count == 0) return Status::kOk;
  // Sum, then divide on the device: the host collectives' avg (finishAverage).
  SQUALL_TRY(comm_.allReduceSum(in, out, count, DataType::kF32, stream_));
  return divide(count, out, static_cast<float>(nranks_), stream_);
}

Status DeviceBackend::compressedAverage(Channel channel, float* buffer, uint64_t* bytes) {
  auto* s = states_[static_cast<int>(channel)].get();
  SQUALL_TRY(coll::device::compressedAllReduce(comm_, stream_, buffer, buffer, DataType::kF32,
                                               ReduceOp::kAvg, s));
  *bytes = s->bytesSent();
  return Status::kOk;
}

Status DeviceBackend::moveMarks(Channel channel, bool save) {
  // Device to device: the residuals' current indices before the call, put
  // back for a rollback (the call writes only the buffers that are not current).
  const auto* s = state(channel);
  int* marks = flag_ + kMarks + 2 * static_cast<ptrdiff_t>(channel);
  const codec::DeviceResidual* residuals[2] = {s->worker(), s->server()};
  for (int i = 0; i < 2; ++i) {
    if (residuals[i] == nullptr) continue;  // one rank: no residuals
    int* control = residuals[i]->control;
    SQUALL_CUDA_TRY(cudaMemcpyAsync(save ? marks + i : control, save ? control : marks + i,
                                    sizeof(int), cudaMemcpyDeviceToDevice, stream_));
  }
  return Status::kOk;
}

Status DeviceBackend::allFinite(const float* p, size_t n, bool* finite) {
  int host = 0;
  SQUALL_CUDA_TRY(cudaMemsetAsync(flag_ + kNonFinite, 0, sizeof(int), stream_));
  SQUALL_TRY(flagNonFinite(n, p, flag_ + kNonFinite, stream_));
  SQUALL_CUDA_TRY(
      cudaMemcpyAsync(&host, flag_ + kNonFinite, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  // A host wait: the skip decision (and the Adam step count that the next
  // step's bias correction uses) is taken on the host.
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream_));
  *finite = host == 0;
  return Status::kOk;
}

Status DeviceBackend::varianceChange(size_t n, const float* v, float* snap, double a, double b,
                                     double* diff, double* total) {
  const size_t bytes = 2 * kVarianceLanes * sizeof(double);
  if (lanes_ == nullptr) {
    void* p = nullptr;
    SQUALL_TRY(alloc(bytes, &p));
    lanes_ = static_cast<double*>(p);
  }
  SQUALL_TRY(varianceLanes(n, v, snap, a, b, lanes_, stream_));
  std::vector<double> host(2 * kVarianceLanes);
  SQUALL_CUDA_TRY(cudaMemcpyAsync(host.data(), lanes_, bytes, cudaMemcpyDeviceToHost, stream_));
  // A host wait, like allFinite's: the freeze decision is taken on the host.
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream_));
  sumVarianceLanes(host.data(), diff, total);
  return Status::kOk;
}

Status DeviceBackend::copy(float* dst, const float* src, size_t n) {
  if (n == 0 || dst == src) return Status::kOk;
  SQUALL_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  return Status::kOk;
}

// ---- State: synchronous copies after the last step's stream.

Status DeviceBackend::view(const float* buffer, size_t n, std::vector<float>* staging,
                           const float** out) const {
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream_));
  staging->assign(n, 0.0f);
  if (n != 0)
    SQUALL_CUDA_TRY(cudaMemcpy(staging->data(), buffer, n * sizeof(float), cudaMemcpyDeviceToHost));
  *out = staging->data();
  return Status::kOk;
}

Status DeviceBackend::upload(float* buffer, const float* host, size_t n) {
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream_));
  if (n != 0) SQUALL_CUDA_TRY(cudaMemcpy(buffer, host, n * sizeof(float), cudaMemcpyHostToDevice));
  return Status::kOk;
}

void DeviceBackend::residualSizes(Channel channel, size_t* worker, size_t* server) const {
  // One rank keeps no residuals: its worker section is zeros, its server
  // section empty.
  const auto* s = state(channel);
  *worker = counts_[static_cast<int>(channel)];
  *server = s->server() != nullptr ? s->chunk() : 0;
}

Status DeviceBackend::viewResidual(Channel channel, bool server, std::vector<float>* staging,
                                   const float** out) const {
  size_t workerCount = 0, serverCount = 0;
  residualSizes(channel, &workerCount, &serverCount);
  const size_t n = server ? serverCount : workerCount;
  const codec::DeviceResidual* r = server ? state(channel)->server() : state(channel)->worker();
  staging->assign(n, 0.0f);
  *out = staging->data();
  if (r == nullptr || n == 0) return Status::kOk;
  const float* current = nullptr;
  SQUALL_TRY(codec::cudaResidualCurrent(*r, stream_, &current));
  SQUALL_CUDA_TRY(cudaMemcpy(staging->data(), current, n * sizeof(float), cudaMemcpyDeviceToHost));
  return Status::kOk;
}

Status DeviceBackend::loadResiduals(Channel channel, const float* worker, const float* server) {
  size_t counts[2] = {0, 0};
  residualSizes(channel, &counts[0], &counts[1]);
  const codec::DeviceResidual* residuals[2] = {state(channel)->worker(), state(channel)->server()};
  const float* data[2] = {worker, server};
  for (int i = 0; i < 2; ++i) {
    if (residuals[i] == nullptr) continue;
    SQUALL_TRY(codec::cudaResidualReset(*residuals[i], stream_));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(stream_));
    if (data[i] != nullptr && counts[i] != 0)  // after a reset buffer 0 is current
      SQUALL_CUDA_TRY(cudaMemcpy(residuals[i]->buf[0], data[i], counts[i] * sizeof(float),
                                 cudaMemcpyHostToDevice));
  }
  return Status::kOk;
}

}  // namespace

Status createDeviceOptimizer(const transport::nccl::DeviceComm& comm, size_t count,
                             const Config& config, std::unique_ptr<Optimizer>* out) {
  SQUALL_REQUIRE(comm.size() >= 1 && comm.handle() != nullptr, Status::kInvalidArgument,
                 Subsys::kOptim, "the device optimizer needs an NCCL communicator");
  int64_t warmup = 0;
  SQUALL_TRY(validateConfig(config, &warmup));  // before any device allocation
  auto backend = std::make_unique<DeviceBackend>(comm);
  SQUALL_TRY(backend->init());
  return Optimizer::createOn(std::move(backend), count, config, out);
}

}  // namespace squall::optim::cuda
