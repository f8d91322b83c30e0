// The host engine: coll::Communicator over a transport, and the bootstrap
// it rendezvoused through, destroyed in the reverse order. Compressors hold a
// coll::CompressedState, optimizers are optim::Optimizer over host memory;
// device buffers are staged through host memory (host_staging.cc).
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "src/coll/compressed_common.h"
#include "src/coll/compressed_state.h"
#include "src/core/engine.h"
#include "src/core/host_hierarchy.h"

namespace squall::core {
namespace {

class HostCompressor final : public Compressor {
 public:
  HostCompressor(const Comm* comm, size_t count, const codec::Spec& spec,
                 std::unique_ptr<coll::CompressedState> state)
      : Compressor(comm, count, spec, state->phase(),
                   state->reduceScatter() ? CompressorLayout::kReduceScatter
                                          : CompressorLayout::kAllReduce),
        state_(std::move(state)) {}

  Status reset() override {
    state_->reset();
    return Status::kOk;
  }
  Status setAlgorithm(coll::CompressedAlgo algo) override {
    SQUALL_REQUIRE(!state_->reduceScatter() || algo == coll::CompressedAlgo::kAuto ||
                       algo == coll::CompressedAlgo::kAutoBytes,
                   Status::kInvalidUsage, Subsys::kApi,
                   "a reduce-scatter compressor has one algorithm; it takes "
                   "squallCompressorAlgoTime or squallCompressorAlgoBytes only");
    state_->setAlgorithm(algo);
    return Status::kOk;
  }
  Status setGatherSpec(const codec::Spec& spec) override { return state_->setGatherSpec(spec); }
  uint64_t bytesSentPerCall() const override { return state_->lastStats().bytesSent; }
  Status stats(CompressorStats* out) override {
    out->calls = calls_;
    out->skippedCalls = keepsFeedback() ? state_->worker().skipped() : 0;
    out->bytesSent = state_->lastStats().bytesSent;
    out->bytesReceived = state_->lastStats().bytesReceived;
    out->algorithm = state_->lastStats().algorithm;
    out->crossBytesSent = state_->lastStats().crossBytesSent;
    out->hosts = state_->hosts();
    out->ranksPerHost = state_->hierarchical() ? state_->localRanks() : 1;
    out->sliceBegin = state_->hierarchical() ? state_->sliceBegin(state_->localIndex()) : 0;
    out->sliceCount = state_->workerCount();
    return Status::kOk;
  }

  Status drain(float* owed, ReduceOp op, void*) override {
    SQUALL_TRY(flatOnly("drain"));
    if (!keepsFeedback()) return Status::kOk;  // nothing is owed
    coll::CompressedState& s = *state_;
    const size_t phase = s.phase(), n = count();
    codec::Residual& worker = s.worker();
    for (size_t i = 0; i < n; ++i) owed[i] += worker.value(phase + i);
    worker.clear();
    if (s.reduceScatter()) return Status::kOk;  // no server residual
    // This rank's chunk of the virtual layout (compressed_state.h).
    const float scale = op == ReduceOp::kAvg ? static_cast<float>(s.nranks()) : 1.0f;
    const size_t first = static_cast<size_t>(comm().rank()) * s.chunk();
    codec::Residual& server = s.server();
    for (size_t j = 0; j < s.chunk(); ++j) {
      const size_t at = first + j;
      if (at >= phase && at - phase < n) owed[at - phase] += scale * server.value(j);
    }
    server.clear();
    return Status::kOk;
  }
  Status seed(const float* owed, void*) override {
    SQUALL_TRY(flatOnly("seed"));
    SQUALL_REQUIRE(keepsFeedback(), Status::kInvalidUsage, Subsys::kApi,
                   "this compressor was made without error feedback and holds no residual to "
                   "seed; make it with feedback kept to carry an owed error into its calls");
    codec::Residual& worker = state_->worker();
    const size_t phase = state_->phase();
    for (size_t i = 0; i < count(); ++i)
      worker.setValue(phase + i, worker.value(phase + i) + owed[i]);
    return Status::kOk;
  }

  Status residualCounts(size_t* worker, size_t* server) override {
    *worker = keepsFeedback() ? state_->worker().count() : 0;
    *server = keepsFeedback() && !state_->reduceScatter() ? state_->server().count() : 0;
    return Status::kOk;
  }
  Status readResiduals(void* worker, void* server) override {
    size_t w = 0, s = 0;
    SQUALL_TRY(residualCounts(&w, &s));
    if (w != 0) state_->worker().read(static_cast<float*>(worker), w);
    if (s != 0) state_->server().read(static_cast<float*>(server), s);
    return Status::kOk;
  }
  Status writeResiduals(const void* worker, const void* server) override {
    size_t w = 0, s = 0;
    SQUALL_TRY(residualCounts(&w, &s));
    if (w != 0) state_->worker().write(static_cast<const float*>(worker), w);
    if (s != 0) state_->server().write(static_cast<const float*>(server), s);
    return Status::kOk;
  }

  coll::CompressedState& state() { return *state_; }
  std::unique_ptr<Staging>& staging() { return staging_; }
  void called() { ++calls_; }

 private:
  bool keepsFeedback() const { return state_->feedback() == coll::Feedback::kKept; }
  Status flatOnly(const char* what) const {
    SQUALL_REQUIRE(!state_->hierarchical(), Status::kUnsupported, Subsys::kApi,
                   "a compressor of the hierarchical layout cannot %s its residuals: each rank "
                   "holds the worker residual of one slice only",
                   what);
    return Status::kOk;
  }

  std::unique_ptr<coll::CompressedState> state_;
  std::unique_ptr<Staging> staging_;  // pinned buffers, once given device pointers
  uint64_t calls_ = 0;
};

// The quantized all-gather's compressor: no residual, only the scratch of
// one call (the encodings, and the decoded values of fp16/bf16 outputs).
class HostGatherCompressor final : public Compressor {
 public:
  HostGatherCompressor(const Comm* comm, size_t count, const codec::Spec& spec)
      : Compressor(comm, count, spec, 0, CompressorLayout::kAllGather) {}

  Status reset() override { return Status::kOk; }  // nothing is kept between calls
  Status setAlgorithm(coll::CompressedAlgo algo) override {
    SQUALL_REQUIRE(algo == coll::CompressedAlgo::kAuto || algo == coll::CompressedAlgo::kAutoBytes,
                   Status::kInvalidUsage, Subsys::kApi,
                   "a quantized all-gather compressor has one algorithm; it takes "
                   "squallCompressorAlgoTime or squallCompressorAlgoBytes only");
    return Status::kOk;
  }
  Status setGatherSpec(const codec::Spec&) override {
    return SQUALL_FAIL(Status::kInvalidUsage, Subsys::kApi,
                       "only the compressed allreduce has a second round to choose a code for");
  }
  uint64_t bytesSentPerCall() const override { return bytesSent_; }
  Status stats(CompressorStats* out) override {
    *out = CompressorStats{};
    out->calls = calls_;
    out->bytesSent = out->bytesReceived = bytesSent_;
    out->algorithm = calls_ != 0 ? "allgather" : "none";
    out->sliceCount = count();
    return Status::kOk;
  }
  Status drain(float*, ReduceOp, void*) override { return Status::kOk; }  // nothing is owed
  Status seed(const float*, void*) override {
    return SQUALL_FAIL(Status::kInvalidUsage, Subsys::kApi,
                       "a quantized all-gather keeps no residual to seed");
  }

  // Encode, all-gather the encodings (whole 8-byte words), decode them all.
  Status run(coll::Communicator& comm, const void* in, void* out, DataType dtype) {
    const size_t n = static_cast<size_t>(comm.size()), r = static_cast<size_t>(comm.rank());
    const size_t m = count(), esize = dataTypeSize(dtype);
    auto* pieces = static_cast<uint8_t*>(out);
    if (n == 1 || m == 0) {
      if (m != 0 && pieces + r * m * esize != in) std::memmove(pieces, in, m * esize);
      ++calls_;
      return Status::kOk;
    }
    size_t slot = 0;
    SQUALL_TRY(codec::encodedSize(spec(), m, &slot));
    SQUALL_REQUIRE(slot % sizeof(uint64_t) == 0, Status::kInternal, Subsys::kApi,
                   "an encoding of %zu bytes is not whole 8-byte words; please report this", slot);
    const size_t words = slot / sizeof(uint64_t);
    send_.resize(words);
    gathered_.resize(n * words);
    codec::EncodeResult result;
    SQUALL_TRY(codec::encode(spec(), in, coll::codecDType(dtype), m, nullptr, send_.data(), slot,
                             &result));
    SQUALL_TRY(comm.allGather(send_.data(), gathered_.data(), words, DataType::kI64));
    if (dtype != DataType::kF32) decoded_.resize(m);
    for (size_t j = 0; j < n; ++j) {
      const uint64_t* encoded = gathered_.data() + j * words;
      if (dtype == DataType::kF32) {
        SQUALL_TRY(codec::decode(encoded, slot, reinterpret_cast<float*>(pieces) + j * m, m));
      } else {
        SQUALL_TRY(codec::decode(encoded, slot, decoded_.data(), m));
        coll::storeDecoded(dtype, decoded_.data(), out, j * m, m);
      }
    }
    bytesSent_ = static_cast<uint64_t>(n - 1) * slot;
    ++calls_;
    return Status::kOk;
  }
  std::unique_ptr<Staging>& staging() { return staging_; }

 private:
  std::vector<uint64_t> send_, gathered_;
  std::vector<float> decoded_;
  std::unique_ptr<Staging> staging_;
  uint64_t calls_ = 0, bytesSent_ = 0;
};

class HostEngine final : public Engine {
 public:
  HostEngine(std::unique_ptr<bootstrap::Bootstrap> bootstrap,
             std::unique_ptr<transport::Transport> transport, const CommConfig& config)
      : bootstrap_(std::move(bootstrap)), transport_(std::move(transport)) {
    coll::Options options = coll::Options::fromEnvironment();
    options.timeout = config.timeout;
    coll_ = std::make_unique<coll::Communicator>(transport_.get(), options);
  }
  ~HostEngine() override {
    coll_.reset();  // stops the worker before the transport goes
    transport_.reset();
    bootstrap_.reset();
  }

  int rank() const override { return coll_->rank(); }
  int size() const override { return coll_->size(); }
  const char* transportName() const override { return transport_->name(); }
  coll::Communicator* host() override { return coll_.get(); }
  bool canSplit() const override { return bootstrap_ != nullptr; }

  Status createCompressor(const Comm* owner, size_t count, const codec::Spec& spec, size_t phase,
                          coll::Feedback feedback, std::unique_ptr<Compressor>* out) override {
    std::unique_ptr<coll::CompressedState> state;
    SQUALL_TRY(coll_->createCompressedState(count, spec, phase, &state, feedback,
                                            coll::residualStoreParam()));
    *out = std::make_unique<HostCompressor>(owner, count, spec, std::move(state));
    return Status::kOk;
  }

  Status compressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op, Compressor& c,
                             coll::OperationPtr* operation) override {
    auto& h = static_cast<HostCompressor&>(c);
    if (operation != nullptr) {
      SQUALL_TRY(coll_->startCompressedAllReduce(in, out, dtype, op, &h.state(), operation));
    } else {
      SQUALL_TRY(coll_->compressedAllReduce(in, out, dtype, op, &h.state()));
    }
    h.called();
    return Status::kOk;
  }

  Status createReduceScatterCompressor(const Comm* owner, size_t recvcount, const codec::Spec& spec,
                                       coll::Feedback feedback,
                                       std::unique_ptr<Compressor>* out) override {
    std::unique_ptr<coll::CompressedState> state;
    SQUALL_TRY(coll::CompressedState::createReduceScatter(size(), recvcount, spec, &state, feedback,
                                                          coll::residualStoreParam()));
    const size_t count = state->count();
    *out = std::make_unique<HostCompressor>(owner, count, spec, std::move(state));
    return Status::kOk;
  }

  Status compressedReduceScatter(const void* in, void* out, size_t recvcount, DataType dtype,
                                 ReduceOp op, Compressor& c,
                                 coll::OperationPtr* operation) override {
    auto& h = static_cast<HostCompressor&>(c);
    if (operation != nullptr) {
      SQUALL_TRY(coll_->startCompressedReduceScatter(in, out, recvcount, dtype, op, &h.state(),
                                                     operation));
    } else {
      SQUALL_TRY(coll_->compressedReduceScatter(in, out, recvcount, dtype, op, &h.state()));
    }
    h.called();
    return Status::kOk;
  }

  Status compressedReduceScatterOnStream(const void* in, void* out, size_t, DataType dtype,
                                         ReduceOp op, Compressor& c, void* stream) override {
    auto& h = static_cast<HostCompressor&>(c);
    SQUALL_TRY(
        stagedCompressedReduceScatter(*coll_, h.state(), &h.staging(), in, out, dtype, op, stream));
    h.called();
    return Status::kOk;
  }

  Status createAllGatherCompressor(const Comm* owner, size_t sendcount, const codec::Spec& spec,
                                   std::unique_ptr<Compressor>* out) override {
    SQUALL_TRY(codec::validateSpec(spec));
    SQUALL_REQUIRE(spec.codec != codec::CodecId::kNone, Status::kInvalidArgument, Subsys::kApi,
                   "a quantized all-gather needs a compressed code, not none; use "
                   "squallAllGather for full precision");
    *out = std::make_unique<HostGatherCompressor>(owner, sendcount, spec);
    return Status::kOk;
  }
  Status compressedAllGather(const void* in, void* out, DataType dtype, Compressor& c) override {
    return static_cast<HostGatherCompressor&>(c).run(*coll_, in, out, dtype);
  }
  Status compressedAllGatherOnStream(const void* in, void* out, DataType dtype, Compressor& c,
                                     void* stream) override {
    auto& g = static_cast<HostGatherCompressor&>(c);
    const size_t bytes = g.count() * dataTypeSize(dtype);
    return stagedCall(&g.staging(), in, bytes, out, bytes * static_cast<size_t>(size()), stream,
                      [&](const void* pinnedIn, void* pinnedOut) {
                        return g.run(*coll_, pinnedIn, pinnedOut, dtype);
                      });
  }

  Status compressedAllReduceOnStream(const void* in, void* out, DataType dtype, ReduceOp op,
                                     Compressor& c, void* stream) override {
    auto& h = static_cast<HostCompressor&>(c);
    SQUALL_TRY(
        stagedCompressedAllReduce(*coll_, h.state(), &h.staging(), in, out, dtype, op, stream));
    h.called();
    return Status::kOk;
  }

  Status createOptimizer(size_t count, const optim::Config& config,
                         std::unique_ptr<optim::Optimizer>* out) override {
    return optim::Optimizer::create(coll_.get(), count, config, out);
  }

 private:
  std::unique_ptr<bootstrap::Bootstrap> bootstrap_;  // null over MPI
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<coll::Communicator> coll_;
};

}  // namespace

Status createHostEngine(std::unique_ptr<bootstrap::Bootstrap> bootstrap,
                        std::unique_ptr<transport::Transport> transport, const CommConfig& config,
                        std::unique_ptr<Engine>* out) {
  // Over MPI there is no bootstrap to agree through: the flat algorithm.
  std::unique_ptr<coll::Hierarchy> hierarchy;
  if (bootstrap != nullptr) SQUALL_TRY(discoverHierarchy(*bootstrap, &hierarchy));
  auto engine = std::make_unique<HostEngine>(std::move(bootstrap), std::move(transport), config);
  if (hierarchy != nullptr) engine->host()->setHierarchy(std::move(hierarchy));
  *out = std::move(engine);
  return Status::kOk;
}

}  // namespace squall::core
