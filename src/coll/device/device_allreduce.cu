// The device two-phase compressed allreduce over NCCL; see device_allreduce.h
// and docs/cuda.md. The codec work is the CUDA codec's (cuda_codec.h); this
// file adds the NCCL exchange, small element-wise kernels (avg division and
// the output's non-finite check for the codecs other than onebit, whose
// server step is one fused kernel and whose decode flags non-finite scales
// itself; fp32 -> fp16/bf16 rounding of the output) and the state.
//
// Compiled by nvcc for the real build, and by the host compiler against the
// CPU emulation of CUDA in tests/gpu/emu (with the emulation's NCCL table
// installed) for the logic test.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "src/codec/codec.h"
#include "src/codec/numeric.h"
#include "src/coll/device/device_allreduce.h"
#include "src/common/cuda_status.h"

namespace squall::coll::device {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxGrid = 4096;

__global__ void divideKernel(float* acc, size_t count, float divisor) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    acc[i] = __fdiv_rn(acc[i], divisor);
  }
}

template <bool kBf16>
__global__ void roundKernel(const float* in, uint16_t* out, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    out[i] = kBf16 ? codec::floatToBf16(in[i]) : codec::floatToHalf(in[i]);
  }
}

// Raises *flag when any of the count values is NaN or infinite. Many threads
// may raise it at once: an exchange, not a plain store, so the CPU emulation
// (C++ threads) has no data race; the finite case writes nothing.
__global__ void nonFiniteKernel(const float* values, size_t count, int* flag) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof(bits));
    if ((bits & 0x7f800000u) == 0x7f800000u) atomicExch(flag, 1);
  }
}

// One thread: a non-finite decoded output raises both residuals' skip flags
// (control[1]), so their commits keep the current residuals; then clears the
// verdict for the next call.
__global__ void shareVerdictKernel(int* verdict, int* workerControl, int* serverControl) {
  if (*verdict != 0) {
    workerControl[1] = 1;
    serverControl[1] = 1;
  }
  *verdict = 0;
}

// One thread: any rank's raised non-finite flag (flags[0..n)) raises this
// rank's worker residual's (control[1]), so its commit keeps the current
// residual, as every other rank's does.
__global__ void anyVerdictKernel(const int* flags, int n, int* workerControl) {
  for (int j = 0; j < n; ++j)
    if (flags[j] != 0) workerControl[1] = 1;
}

unsigned gridFor(size_t items) {
  return static_cast<unsigned>(std::clamp<size_t>((items + kThreads - 1) / kThreads, 1, kMaxGrid));
}

Status launchFailure(const char* what) { return cudaStatus(cudaGetLastError(), what); }

template <typename T>
Status allocate(T** p, size_t bytes) {
  void* raw = nullptr;
  SQUALL_CUDA_TRY(cudaMalloc(&raw, std::max<size_t>(bytes, 8)));
  *p = static_cast<T*>(raw);
  SQUALL_CUDA_TRY(cudaMemset(raw, 0, std::max<size_t>(bytes, 8)));
  return Status::kOk;
}

}  // namespace

Status DeviceCompressedState::begin(int nranks, int rank, const codec::Spec& spec, size_t piece,
                                    const char* what,
                                    const std::unique_ptr<DeviceCompressedState>* out,
                                    std::unique_ptr<DeviceCompressedState>* made) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "the device compressed-state output pointer is NULL");
  SQUALL_REQUIRE(nranks >= 1 && rank >= 0 && rank < nranks, Status::kInvalidArgument, Subsys::kColl,
                 "rank %d of %d is not a valid position in a communicator", rank, nranks);
  SQUALL_TRY(codec::validateSpec(spec));
  SQUALL_REQUIRE(piece <= SIZE_MAX / 8 / static_cast<size_t>(nranks), Status::kInvalidArgument,
                 Subsys::kColl, "a %s of %d x %zu elements is too large for this machine", what,
                 nranks, piece);
  made->reset(new DeviceCompressedState());
  (*made)->nranks_ = nranks;
  (*made)->rank_ = rank;
  (*made)->spec_ = (*made)->gatherSpec_ = spec;
  return Status::kOk;
}

// The worker residual of count_ (padded to n chunks), the send and receive
// slots, the fp32 scratch of a chunk and the flags; the caller has set the
// sizes and makes the rest.
Status DeviceCompressedState::allocateCommon() {
  const auto nn = static_cast<size_t>(nranks_);
  SQUALL_TRY(codec::encodedSize(spec_, chunk_, &slot_));
  SQUALL_TRY(codec::cudaResidualCreate(chunk_ * nn, &worker_));
  SQUALL_TRY(allocate(&send_, nn * slot_));
  SQUALL_TRY(allocate(&recv_, nn * slot_));
  SQUALL_TRY(allocate(&acc_, chunk_ * sizeof(float)));
  SQUALL_TRY(allocate(&error_, sizeof(int)));
  SQUALL_TRY(allocate(&nonFinite_, sizeof(int)));
  SQUALL_CUDA_TRY(cudaEventCreateWithFlags(&lastUse_, cudaEventDisableTiming));
  return Status::kOk;
}

Status DeviceCompressedState::create(int nranks, int rank, size_t count, const codec::Spec& spec,
                                     std::unique_ptr<DeviceCompressedState>* out) {
  std::unique_ptr<DeviceCompressedState> s;
  SQUALL_TRY(begin(nranks, rank, spec, 0, "compressed allreduce", out, &s));
  s->count_ = count;
  const size_t unit = codec::usesBlocks(spec.codec) ? spec.block : 1;
  const size_t group = unit * static_cast<size_t>(nranks);
  SQUALL_REQUIRE(count <= SIZE_MAX / 8 - group, Status::kInvalidArgument, Subsys::kColl,
                 "a compressed allreduce of %zu elements is too large for this machine", count);
  const size_t padded = (count + group - 1) / group * group;
  s->chunk_ = padded / static_cast<size_t>(nranks);
  if (nranks == 1 || count == 0) {  // the identity: no state on the device
    *out = std::move(s);
    return Status::kOk;
  }
  SQUALL_TRY(s->allocateCommon());
  s->gslot_ = s->slot_;
  SQUALL_TRY(codec::cudaResidualCreate(s->chunk_, &s->server_));
  SQUALL_TRY(allocate(&s->gather_, static_cast<size_t>(nranks) * s->gslot_));
  SQUALL_TRY(s->tally());
  *out = std::move(s);
  return Status::kOk;
}

Status DeviceCompressedState::createAllGather(int nranks, int rank, size_t sendcount,
                                              const codec::Spec& spec,
                                              std::unique_ptr<DeviceCompressedState>* out) {
  std::unique_ptr<DeviceCompressedState> s;
  SQUALL_TRY(begin(nranks, rank, spec, sendcount, "quantized all-gather", out, &s));
  s->allGather_ = true;
  s->chunk_ = s->count_ = sendcount;
  if (nranks == 1 || sendcount == 0) {  // a copy: no state on the device
    *out = std::move(s);
    return Status::kOk;
  }
  SQUALL_TRY(codec::encodedSize(spec, sendcount, &s->slot_));
  s->gslot_ = s->slot_;
  SQUALL_TRY(allocate(&s->send_, s->slot_));
  SQUALL_TRY(allocate(&s->gather_, static_cast<size_t>(nranks) * s->slot_));
  SQUALL_TRY(allocate(&s->acc_, sendcount * sizeof(float)));
  SQUALL_TRY(allocate(&s->error_, sizeof(int)));
  SQUALL_CUDA_TRY(cudaEventCreateWithFlags(&s->lastUse_, cudaEventDisableTiming));
  s->bytesSent_ = s->bytesReceived_ = static_cast<uint64_t>(nranks - 1) * s->slot_;
  *out = std::move(s);
  return Status::kOk;
}

Status DeviceCompressedState::createReduceScatter(int nranks, int rank, size_t recvcount,
                                                  const codec::Spec& spec,
                                                  std::unique_ptr<DeviceCompressedState>* out) {
  std::unique_ptr<DeviceCompressedState> s;
  SQUALL_TRY(begin(nranks, rank, spec, recvcount, "compressed reduce-scatter", out, &s));
  s->reduceScatter_ = true;
  s->chunk_ = recvcount;
  s->count_ = recvcount * static_cast<size_t>(nranks);
  if (nranks == 1 || recvcount == 0) {  // a copy: no state on the device
    *out = std::move(s);
    return Status::kOk;
  }
  SQUALL_TRY(s->allocateCommon());
  SQUALL_TRY(allocate(&s->verdicts_, static_cast<size_t>(nranks) * sizeof(int)));
  SQUALL_TRY(s->tally());
  *out = std::move(s);
  return Status::kOk;
}

// Bytes per call: n-1 pieces of my chunk in, chunk j out to every j, and the
// all-gather moves (n-1) whole gather slots each way (the reduce-scatter: its
// n-1 flags instead).
Status DeviceCompressedState::tally() {
  bytesSent_ = bytesReceived_ = 0;
  const auto nn = static_cast<size_t>(nranks_);
  const auto r = static_cast<size_t>(rank_);
  if (reduceScatter_) {
    bytesSent_ = bytesReceived_ = (nn - 1) * (slot_ + sizeof(int));
    return Status::kOk;
  }
  for (size_t j = 0; j < nn; ++j) {
    if (j == r) continue;
    size_t bytes = 0;
    if (realCount(j) != 0) {
      SQUALL_TRY(codec::encodedSize(spec_, realCount(j), &bytes));
      bytesSent_ += bytes;
    }
    if (realCount(r) != 0) {
      SQUALL_TRY(codec::encodedSize(spec_, realCount(r), &bytes));
      bytesReceived_ += bytes;
    }
    bytesSent_ += gslot_;
    bytesReceived_ += gslot_;
  }
  return Status::kOk;
}

Status DeviceCompressedState::setGatherSpec(const codec::Spec& spec) {
  SQUALL_TRY(codec::validateSpec(spec));
  SQUALL_REQUIRE(!reduceScatter_ && !allGather_, Status::kInvalidUsage, Subsys::kColl,
                 "only the compressed allreduce has a second round to choose a code for");
  SQUALL_REQUIRE(spec.codec != codec::CodecId::kNone, Status::kInvalidArgument, Subsys::kColl,
                 "the all-gather's code must be a compressed one; leave it unset for the "
                 "allreduce's own");
  SQUALL_REQUIRE(!touched_, Status::kInvalidUsage, Subsys::kColl,
                 "the all-gather's code of a device compressed allreduce is chosen before its "
                 "first call (its buffers are sized for it); make a new compressor");
  gatherSpec_ = spec;
  if (worker_ == nullptr) return Status::kOk;  // the identity: nothing is sent
  size_t gslot = 0;
  SQUALL_TRY(codec::encodedSize(spec, chunk_, &gslot));
  if (gslot != gslot_) {
    uint8_t* gather = nullptr;
    SQUALL_TRY(allocate(&gather, static_cast<size_t>(nranks_) * gslot));
    cudaFree(gather_);
    gather_ = gather;
    gslot_ = gslot;
  }
  return tally();
}

DeviceCompressedState::~DeviceCompressedState() {
  if (lastUse_ != nullptr) cudaEventDestroy(lastUse_);  // released once reached; never waits
  codec::cudaResidualDestroy(worker_);
  codec::cudaResidualDestroy(server_);
  cudaFree(send_);
  cudaFree(recv_);
  cudaFree(gather_);
  cudaFree(acc_);
  cudaFree(error_);
  cudaFree(nonFinite_);
  cudaFree(verdicts_);
}

size_t DeviceCompressedState::realCount(size_t c) const {
  if (reduceScatter_) return chunk_;
  const size_t begin = c * chunk_;
  const size_t end = std::min(begin + chunk_, count_);
  return begin < end ? end - begin : 0;
}

Status DeviceCompressedState::enter(cudaStream_t stream, bool* captured) {
  touched_ = true;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SQUALL_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
  *captured = capture != cudaStreamCaptureStatusNone;
  if (!*captured && used_ && stream != lastStream_) {
    SQUALL_CUDA_TRY(cudaStreamWaitEvent(stream, lastUse_, 0));
  }
  return Status::kOk;
}

Status DeviceCompressedState::leave(cudaStream_t stream, bool captured) {
  if (captured) return Status::kOk;
  SQUALL_CUDA_TRY(cudaEventRecord(lastUse_, stream));
  lastStream_ = stream;
  used_ = true;
  return Status::kOk;
}

Status DeviceCompressedState::reset(cudaStream_t stream) {
  if (worker_ == nullptr) return Status::kOk;  // the identity keeps no state
  bool captured = false;
  SQUALL_TRY(enter(stream, &captured));
  SQUALL_TRY(codec::cudaResidualReset(*worker_, stream));
  if (server_ != nullptr) SQUALL_TRY(codec::cudaResidualReset(*server_, stream));
  return leave(stream, captured);
}

Status DeviceCompressedState::drain(cudaStream_t stream, float* owed, float serverScale) {
  if (worker_ == nullptr) return Status::kOk;  // the identity keeps no state
  bool captured = false;
  SQUALL_TRY(enter(stream, &captured));
  SQUALL_REQUIRE(!captured, Status::kInvalidUsage, Subsys::kColl,
                 "a compressor's residuals cannot be drained on a stream being captured");
  const float* worker = nullptr;
  const float* server = nullptr;
  SQUALL_TRY(codec::cudaResidualCurrent(*worker_, stream, &worker));
  if (server_ != nullptr) SQUALL_TRY(codec::cudaResidualCurrent(*server_, stream, &server));
  // This rank's chunk: elements [rank * chunk, ...) below count (none for the
  // reduce-scatter, which keeps no server residual).
  const size_t first = std::min(static_cast<size_t>(rank_) * chunk_, count_);
  const size_t served = server == nullptr ? 0 : std::min(chunk_, count_ - first);
  std::vector<float> held(count_ + served);
  if (count_ != 0)
    SQUALL_CUDA_TRY(cudaMemcpyAsync(held.data(), worker, count_ * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
  if (served != 0)
    SQUALL_CUDA_TRY(cudaMemcpyAsync(held.data() + count_, server, served * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream));
  SQUALL_CUDA_TRY(cudaMemsetAsync(const_cast<float*>(worker), 0,
                                  chunk_ * static_cast<size_t>(nranks_) * sizeof(float), stream));
  if (server != nullptr)
    SQUALL_CUDA_TRY(cudaMemsetAsync(const_cast<float*>(server), 0, chunk_ * sizeof(float), stream));
  SQUALL_TRY(leave(stream, captured));
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < count_; ++i) owed[i] += held[i];
  for (size_t j = 0; j < served; ++j) owed[first + j] += serverScale * held[count_ + j];
  return Status::kOk;
}

Status DeviceCompressedState::seed(cudaStream_t stream, const float* owed) {
  if (worker_ == nullptr || count_ == 0) return Status::kOk;
  bool captured = false;
  SQUALL_TRY(enter(stream, &captured));
  SQUALL_REQUIRE(!captured, Status::kInvalidUsage, Subsys::kColl,
                 "a compressor's residuals cannot be seeded on a stream being captured");
  const float* worker = nullptr;
  SQUALL_TRY(codec::cudaResidualCurrent(*worker_, stream, &worker));
  std::vector<float> sum(count_);
  SQUALL_CUDA_TRY(
      cudaMemcpyAsync(sum.data(), worker, count_ * sizeof(float), cudaMemcpyDeviceToHost, stream));
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < count_; ++i) sum[i] += owed[i];
  SQUALL_CUDA_TRY(cudaMemcpyAsync(const_cast<float*>(worker), sum.data(), count_ * sizeof(float),
                                  cudaMemcpyHostToDevice, stream));
  SQUALL_TRY(leave(stream, captured));
  // `sum` is pageable and local: the copy must have read it before it goes.
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  return Status::kOk;
}

size_t DeviceCompressedState::workerCount() const {
  return worker_ != nullptr ? worker_->count : 0;
}
size_t DeviceCompressedState::serverCount() const {
  return server_ != nullptr ? server_->count : 0;
}

Status DeviceCompressedState::copyResiduals(cudaStream_t stream, void* worker, void* server,
                                            bool toHost) {
  if (worker_ == nullptr) return Status::kOk;  // the identity keeps no state
  bool captured = false;
  SQUALL_TRY(enter(stream, &captured));
  SQUALL_REQUIRE(!captured, Status::kInvalidUsage, Subsys::kColl,
                 "a compressor's residuals cannot be saved or loaded on a stream being captured");
  const codec::DeviceResidual* residuals[2] = {worker_, server_};
  void* host[2] = {worker, server};
  for (int i = 0; i < 2; ++i) {
    if (residuals[i] == nullptr || residuals[i]->count == 0) continue;
    const float* current = nullptr;
    SQUALL_TRY(codec::cudaResidualCurrent(*residuals[i], stream, &current));
    const size_t bytes = residuals[i]->count * sizeof(float);
    SQUALL_CUDA_TRY(toHost
                        ? cudaMemcpyAsync(host[i], current, bytes, cudaMemcpyDeviceToHost, stream)
                        : cudaMemcpyAsync(const_cast<float*>(current), host[i], bytes,
                                          cudaMemcpyHostToDevice, stream));
  }
  SQUALL_TRY(leave(stream, captured));
  // The host side is the caller's pageable memory: done before returning.
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  return Status::kOk;
}

Status DeviceCompressedState::readResiduals(cudaStream_t stream, void* worker, void* server) {
  return copyResiduals(stream, worker, server, true);
}

Status DeviceCompressedState::writeResiduals(cudaStream_t stream, const void* worker,
                                             const void* server) {
  return copyResiduals(stream, const_cast<void*>(worker), const_cast<void*>(server), false);
}

Status DeviceCompressedState::takeDecodeError(cudaStream_t stream, bool* error) {
  *error = false;
  if (error_ == nullptr) return Status::kOk;
  bool captured = false;
  SQUALL_TRY(enter(stream, &captured));
  int value = 0;
  SQUALL_CUDA_TRY(cudaMemcpyAsync(&value, error_, sizeof(int), cudaMemcpyDeviceToHost, stream));
  SQUALL_CUDA_TRY(cudaMemsetAsync(error_, 0, sizeof(int), stream));
  SQUALL_TRY(leave(stream, captured));
  SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  *error = value != 0;
  return Status::kOk;
}

namespace {

// Which collective a state was made for, and its name in messages.
enum class Layout { kAllReduce, kReduceScatter, kAllGather };
Layout layoutOf(const DeviceCompressedState& state) {
  return state.allGather()       ? Layout::kAllGather
         : state.reduceScatter() ? Layout::kReduceScatter
                                 : Layout::kAllReduce;
}
const char* layoutName(Layout layout) {
  return layout == Layout::kAllGather       ? "all-gather"
         : layout == Layout::kReduceScatter ? "reduce-scatter"
                                            : "allreduce";
}

// What every collective checks before enqueuing anything: the state's
// layout, the type, the op and the buffers (`what` names the collective).
Status checkCall(const char* what, Layout layout, const void* in, const void* out, DataType dtype,
                 ReduceOp op, const DeviceCompressedState* state) {
  SQUALL_REQUIRE(state != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "the device compressed state is NULL");
  SQUALL_REQUIRE(layoutOf(*state) == layout, Status::kInvalidUsage, Subsys::kColl,
                 "the device compressed state was made for the %s; the %s needs one of its own",
                 layoutName(layoutOf(*state)), what);
  SQUALL_REQUIRE(dtype == DataType::kF32 || dtype == DataType::kF16 || dtype == DataType::kBf16,
                 Status::kInvalidArgument, Subsys::kColl, "the %s takes fp32, fp16 or bf16, not %s",
                 what, dataTypeName(dtype));
  SQUALL_REQUIRE(op == ReduceOp::kSum || op == ReduceOp::kAvg, Status::kInvalidArgument,
                 Subsys::kColl, "the %s supports sum and avg, not %s", what, reduceOpName(op));
  SQUALL_REQUIRE(state->count() == 0 || (in != nullptr && out != nullptr), Status::kInvalidArgument,
                 Subsys::kColl, "the send and receive buffers must be set");
  return Status::kOk;
}

Status checkComm(const transport::nccl::DeviceComm& comm, const DeviceCompressedState& state) {
  SQUALL_REQUIRE(comm.size() == state.nranks() && comm.rank() == state.rank(),
                 Status::kInvalidUsage, Subsys::kColl,
                 "the device compressed state was made for rank %d of %d but the communicator is "
                 "rank %d of %d; create the state for the communicator it is used with",
                 state.rank(), state.nranks(), comm.rank(), comm.size());
  return Status::kOk;
}

codec::DType codecTypeOf(DataType dtype) {
  return dtype == DataType::kF16    ? codec::DType::kF16
         : dtype == DataType::kBf16 ? codec::DType::kBf16
                                    : codec::DType::kF32;
}

// fp32 values of the scratch into `m` fp16 or bf16 elements of the output.
Status roundInto(DataType dtype, const float* values, void* out, size_t m, cudaStream_t stream) {
  auto* halves = static_cast<uint16_t*>(out);
  if (dtype == DataType::kBf16) {
    launchKernel(roundKernel<true>, gridFor(m), kThreads, stream, values, halves, m);
  } else {
    launchKernel(roundKernel<false>, gridFor(m), kThreads, stream, values, halves, m);
  }
  return launchFailure("the output rounding kernel");
}

}  // namespace

Status compressedAllReduce(const transport::nccl::DeviceComm& comm, cudaStream_t stream,
                           const void* in, void* out, DataType dtype, ReduceOp op,
                           DeviceCompressedState* state) {
  SQUALL_TRY(checkCall("compressed allreduce", Layout::kAllReduce, in, out, dtype, op, state));
  const size_t count = state->count_;
  const size_t esize = dataTypeSize(dtype);
  const int n = state->nranks_;
  if (n == 1 || count == 0) {
    if (out != in && count != 0) {
      SQUALL_CUDA_TRY(cudaMemcpyAsync(out, in, count * esize, cudaMemcpyDeviceToDevice, stream));
    }
    return Status::kOk;
  }
  SQUALL_TRY(checkComm(comm, *state));
  const auto nn = static_cast<size_t>(n);
  const auto rr = static_cast<size_t>(state->rank_);
  const size_t chunk = state->chunk_;
  const size_t slot = state->slot_;
  const size_t gslot = state->gslot_;
  const codec::Spec spec = state->spec_;
  const codec::Spec gspec = state->gatherSpec_;
  const codec::DType inType = codecTypeOf(dtype);
  const auto* input = static_cast<const uint8_t*>(in);
  auto encodedOf = [&](size_t m, size_t* bytes) { return codec::encodedSize(spec, m, bytes); };
  bool captured = false;
  SQUALL_TRY(state->enter(stream, &captured));

  // 1. Worker: encode every chunk into its send slot, except my own chunk,
  // which goes to my receive slot (never received into): the n pieces of my
  // chunk then lie one slot apart, as cudaServeChunk reads them.
  for (size_t c = 0; c < nn; ++c) {
    const size_t m = state->realCount(c);
    if (m == 0) continue;
    uint8_t* slotOut = (c == rr ? state->recv_ : state->send_) + c * slot;
    size_t bytes = 0;
    SQUALL_TRY(codec::cudaEncodeChunk(spec, input + c * chunk * esize, inType, m, state->worker_,
                                      c * chunk, slotOut, slot, stream, &bytes));
  }
  // The worker's commit waits for the end of the call (see 5).

  // 2. All-to-all of the encoded chunks: chunk j to rank j.
  const size_t mine = state->realCount(rr);
  size_t mineBytes = 0;
  SQUALL_TRY(encodedOf(mine, &mineBytes));
  SQUALL_TRY(comm.groupStart());
  for (size_t j = 0; j < nn; ++j) {
    if (j == rr) continue;
    const size_t m = state->realCount(j);
    if (m != 0) {
      size_t bytes = 0;
      SQUALL_TRY(encodedOf(m, &bytes));
      SQUALL_TRY(comm.send(state->send_ + j * slot, bytes, static_cast<int>(j), stream));
    }
    if (mine != 0) {
      SQUALL_TRY(comm.recv(state->recv_ + j * slot, mineBytes, static_cast<int>(j), stream));
    }
  }
  SQUALL_TRY(comm.groupEnd());

  // 3. Server: sum the pieces of my chunk in rank order, divide, encode with
  // the second round's code, straight into my slot of the gather buffer.
  // Onebit both ways does it in one kernel that reads the pieces and writes
  // only the encoding and the residual; the rest go through the fp32
  // accumulator (the same bits either way).
  const bool fused = spec.codec == codec::CodecId::kOnebit && codec::sameEncoding(spec, gspec);
  if (mine != 0 && fused) {
    size_t bytes = 0;
    SQUALL_TRY(codec::cudaServeChunk(
        spec, state->recv_, slot, n, mineBytes, mine, op == ReduceOp::kAvg, *state->server_, 0,
        state->gather_ + rr * gslot, gslot, stream, &bytes, state->error_));
  } else if (mine != 0) {
    for (size_t j = 0; j < nn; ++j) {
      const uint8_t* piece = state->recv_ + j * slot;
      SQUALL_TRY(j == 0 ? codec::cudaDecode(spec, piece, mineBytes, state->acc_, mine, stream,
                                            state->error_)
                        : codec::cudaDecodeAccumulate(spec, piece, mineBytes, state->acc_, mine,
                                                      stream, state->error_));
    }
    if (op == ReduceOp::kAvg) {
      launchKernel(divideKernel, gridFor(mine), kThreads, stream, state->acc_, mine,
                   static_cast<float>(n));
      SQUALL_TRY(launchFailure("the avg division kernel"));
    }
    size_t bytes = 0;
    SQUALL_TRY(codec::cudaEncodeChunk(gspec, state->acc_, codec::DType::kF32, mine, state->server_,
                                      0, state->gather_ + rr * gslot, gslot, stream, &bytes));
  }

  // 4. All-gather the server chunks (in place: mine is already in its slot)
  // and decode them all. The verdict of 5 is whether a decoded fp32 value
  // (before any rounding to fp16/bf16) is not finite: the onebit decode
  // raises it from the scales, the other codecs need a pass over the values.
  SQUALL_TRY(comm.allGather(state->gather_ + rr * gslot, state->gather_, gslot, stream));
  const bool onebit = gspec.codec == codec::CodecId::kOnebit;
  int* decodeVerdict = onebit ? state->nonFinite_ : nullptr;
  for (size_t c = 0; c < nn; ++c) {
    const size_t m = state->realCount(c);
    if (m == 0) continue;
    size_t bytes = 0;
    SQUALL_TRY(codec::encodedSize(gspec, m, &bytes));
    const uint8_t* encoded = state->gather_ + c * gslot;
    if (dtype == DataType::kF32) {
      SQUALL_TRY(codec::cudaDecode(gspec, encoded, bytes, static_cast<float*>(out) + c * chunk, m,
                                   stream, state->error_, decodeVerdict));
    } else {
      SQUALL_TRY(codec::cudaDecode(gspec, encoded, bytes, state->acc_, m, stream, state->error_,
                                   decodeVerdict));
      SQUALL_TRY(roundInto(dtype, state->acc_, static_cast<uint16_t*>(out) + c * chunk, m, stream));
    }
    if (!onebit) {
      launchKernel(
          nonFiniteKernel, gridFor(m), kThreads, stream,
          static_cast<const float*>(dtype == DataType::kF32 ? static_cast<float*>(out) + c * chunk
                                                            : state->acc_),
          m, state->nonFinite_);
      SQUALL_TRY(launchFailure("the non-finite check of the output"));
    }
  }

  // 5. Commit both residuals, or neither on every rank: a non-finite block on
  // any rank reaches every rank's output as NaN (its server's scale is
  // non-finite), so the decoded output is a verdict all ranks share, and a
  // bad call leaves every residual as it was.
  launchKernel(shareVerdictKernel, 1, 1, stream, state->nonFinite_, state->worker_->control,
               state->server_->control);
  SQUALL_TRY(launchFailure("the residual verdict kernel"));
  SQUALL_TRY(codec::cudaResidualCommit(*state->worker_, stream));
  SQUALL_TRY(codec::cudaResidualCommit(*state->server_, stream));
  return state->leave(stream, captured);
}

Status compressedReduceScatter(const transport::nccl::DeviceComm& comm, cudaStream_t stream,
                               const void* in, void* out, DataType dtype, ReduceOp op,
                               DeviceCompressedState* state) {
  SQUALL_TRY(
      checkCall("compressed reduce-scatter", Layout::kReduceScatter, in, out, dtype, op, state));
  const size_t piece = state->chunk_;
  const size_t esize = dataTypeSize(dtype);
  const int n = state->nranks_;
  if (n == 1 || piece == 0) {
    if (out != in && piece != 0) {
      SQUALL_CUDA_TRY(cudaMemcpyAsync(out, in, piece * esize, cudaMemcpyDeviceToDevice, stream));
    }
    return Status::kOk;
  }
  SQUALL_TRY(checkComm(comm, *state));
  const auto nn = static_cast<size_t>(n);
  const auto rr = static_cast<size_t>(state->rank_);
  const size_t slot = state->slot_;
  const codec::Spec spec = state->spec_;
  const auto* input = static_cast<const uint8_t*>(in);
  bool captured = false;
  SQUALL_TRY(state->enter(stream, &captured));

  // 1. Encode every piece (my own into my receive slot, beside the pieces
  // the others send me); a non-finite block raises the worker's flag.
  for (size_t c = 0; c < nn; ++c) {
    uint8_t* slotOut = (c == rr ? state->recv_ : state->send_) + c * slot;
    size_t bytes = 0;
    SQUALL_TRY(codec::cudaEncodeChunk(spec, input + c * piece * esize, codecTypeOf(dtype), piece,
                                      state->worker_, c * piece, slotOut, slot, stream, &bytes));
  }

  // 2. Piece j to rank j; the pieces of mine from every rank.
  SQUALL_TRY(comm.groupStart());
  for (size_t j = 0; j < nn; ++j) {
    if (j == rr) continue;
    SQUALL_TRY(comm.send(state->send_ + j * slot, slot, static_cast<int>(j), stream));
    SQUALL_TRY(comm.recv(state->recv_ + j * slot, slot, static_cast<int>(j), stream));
  }
  SQUALL_TRY(comm.groupEnd());

  // 3. Every rank's verdict: a non-finite block reaches only its server.
  SQUALL_TRY(comm.allGather(state->worker_->control + 1, state->verdicts_, sizeof(int), stream));

  // 4. Sum the n encodings of my piece in rank order, then divide; in
  // place, the input was read in full by the encodes before.
  float* sum = dtype == DataType::kF32 ? static_cast<float*>(out) : state->acc_;
  for (size_t j = 0; j < nn; ++j) {
    const uint8_t* encoded = state->recv_ + j * slot;
    SQUALL_TRY(j == 0 ? codec::cudaDecode(spec, encoded, slot, sum, piece, stream, state->error_)
                      : codec::cudaDecodeAccumulate(spec, encoded, slot, sum, piece, stream,
                                                    state->error_));
  }
  if (op == ReduceOp::kAvg) {
    launchKernel(divideKernel, gridFor(piece), kThreads, stream, sum, piece, static_cast<float>(n));
    SQUALL_TRY(launchFailure("the avg division kernel"));
  }
  if (dtype != DataType::kF32) SQUALL_TRY(roundInto(dtype, sum, out, piece, stream));

  // 5. Commit the worker residual unless some rank's flag was raised.
  launchKernel(anyVerdictKernel, 1, 1, stream, static_cast<const int*>(state->verdicts_), n,
               state->worker_->control);
  SQUALL_TRY(launchFailure("the residual verdict kernel"));
  SQUALL_TRY(codec::cudaResidualCommit(*state->worker_, stream));
  return state->leave(stream, captured);
}

Status compressedAllGather(const transport::nccl::DeviceComm& comm, cudaStream_t stream,
                           const void* in, void* out, DataType dtype,
                           DeviceCompressedState* state) {
  SQUALL_TRY(checkCall("quantized all-gather", Layout::kAllGather, in, out, dtype, ReduceOp::kSum,
                       state));  // it reduces nothing: sum passes the op check
  const size_t count = state->count_;
  const size_t esize = dataTypeSize(dtype);
  const int n = state->nranks_;
  uint8_t* mine = static_cast<uint8_t*>(out) + static_cast<size_t>(state->rank_) * count * esize;
  if (n == 1 || count == 0) {
    if (mine != in && count != 0) {
      SQUALL_CUDA_TRY(cudaMemcpyAsync(mine, in, count * esize, cudaMemcpyDeviceToDevice, stream));
    }
    return Status::kOk;
  }
  SQUALL_TRY(checkComm(comm, *state));
  const size_t slot = state->slot_;
  bool captured = false;
  SQUALL_TRY(state->enter(stream, &captured));
  // Encoded before anything is written: the input may be a piece of the output.
  size_t bytes = 0;
  SQUALL_TRY(codec::cudaEncodeChunk(state->spec_, in, codecTypeOf(dtype), count, nullptr, 0,
                                    state->send_, slot, stream, &bytes));
  SQUALL_TRY(comm.allGather(state->send_, state->gather_, slot, stream));
  for (int j = 0; j < n; ++j) {
    const uint8_t* encoded = state->gather_ + static_cast<size_t>(j) * slot;
    uint8_t* piece = static_cast<uint8_t*>(out) + static_cast<size_t>(j) * count * esize;
    if (dtype == DataType::kF32) {
      SQUALL_TRY(codec::cudaDecode(state->spec_, encoded, slot, reinterpret_cast<float*>(piece),
                                   count, stream, state->error_));
    } else {
      SQUALL_TRY(codec::cudaDecode(state->spec_, encoded, slot, state->acc_, count, stream,
                                   state->error_));
      SQUALL_TRY(roundInto(dtype, state->acc_, piece, count, stream));
    }
  }
  return state->leave(stream, captured);
}

}  // namespace squall::coll::device
