// The NCCL front end: ncclAllReduce and ncclReduceScatter (and their Config
// forms with no config, or one left at NCCL's defaults) of fp32/fp16/bf16
// sums and averages on a communicator this process created through the
// interposed ncclCommInit* / ncclCommSplit / ncclCommShrink / ncclCommGrow
// run as Squall's compressed allreduce and reduce-scatter on the caller's
// stream; everything else goes to the real NCCL unchanged: calls inside ncclGroupStart/ncclGroupEnd
// (NCCL fuses a group into one launch and the caller expects it so), other reductions (prod, min,
// max, ncclRedOpCreate* ops), other types, small buffers, communicators
// created elsewhere, non-blocking, revoked or suspended communicators, calls
// on a stream being captured into a CUDA graph, and calls whose
// ncclCollConfig_t asks for what Squall cannot honour (coll_config.h).
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "plugin/preload/coll_config.h"
#include "plugin/preload/compressors.h"
#include "plugin/preload/interposer.h"
#include "plugin/preload/nccl_abi.h"
#include "plugin/preload/real_nccl.h"
#include "plugin/preload/report.h"
#include "plugin/preload/residual_map.h"
#include "src/codec/codec.h"
#include "src/core/comm.h"
#include "src/transport/nccl/nccl_table.h"

namespace squall::preload {
namespace {

// The quantized all-gather's compressors by element type and count: scratch
// only (no residual), so they may go at any time (kMaxGathers).
using Gathers = std::map<std::pair<DataType, size_t>, std::unique_ptr<core::Compressor>>;
constexpr size_t kMaxGathers = 64;

// What holds device memory: the compressors, then the engine they were made
// on (members go in reverse order).
struct DeviceState {
  std::unique_ptr<core::Comm> engine;
  Compressors residuals;
  Compressors scatterResiduals;
  Gathers gathers;
};

struct CommState {
  CommState(const Policy& p, bool nonBlocking, bool revoked = false)
      : nonBlocking(nonBlocking),
        revoked(revoked),
        colls{StepState(p), StepState(p), StepState(p)} {}
  // A state whose communicator was aborted or revoked frees its device
  // memory off this thread (releaseDevice).
  ~CommState() { releaseDevice(releaseOffThread.load()); }

  // Hands the engine and the compressors to core::releaseLater (`offThread`,
  // which never waits for the device) or destroys them here; the state keeps
  // its step and counters, and makes a new engine if it compresses again.
  void releaseDevice(bool offThread) {
    if (engine == nullptr) return;  // compressors are made on the engine only
    StepState& all = of(Coll::kAllReduce);
    StepState& scatter = of(Coll::kReduceScatter);
    auto doomed = std::make_shared<DeviceState>(
        DeviceState{std::move(engine), std::move(all.residuals), std::move(scatter.residuals),
                    std::move(gathers)});
    gathers.clear();
    all.residuals = Compressors(policy().residualCapBytes);
    scatter.residuals = Compressors(policy().residualCapBytes);
    const int device = doomed->engine->device();
    InsideSquall inside;
    if (offThread) {
      core::releaseLater(std::move(doomed), device);
    } else {
      doomed.reset();
    }
  }

  // Both fixed when NCCL hands the communicator out.
  const bool nonBlocking;                     // its calls return before NCCL has finished them
  const bool revoked;                         // a stand-in for a revoked communicator's state
  std::atomic<bool> releaseOffThread{false};  // set by abort and revoke, without the lock
  std::mutex mutex;  // the fields below, and this communicator's compressed call
  // 0 while `pending`: NCCL handed the communicator out before it was ready
  // (non-blocking init, or init inside a group) and refuses to say its size
  // until then.
  int nranks = 0;
  bool pending = true;
  bool suspended = false;              // between ncclCommSuspend and ncclCommResume
  std::unique_ptr<core::Comm> engine;  // outlives the compressors of `colls`
  // Per collective: its calls are placed in steps of their own (a step's
  // reduce-scatters are not its allreduces), with residuals of their own.
  StepState colls[static_cast<int>(Coll::kCount)];
  Gathers gathers;
  bool engineFailed = false;

  StepState& of(Coll coll) { return colls[static_cast<int>(coll)]; }
};

// The registry's lock, held only to look a state up: each state has its own,
// so that threads reducing on different communicators never wait for each
// other. A call holds a reference to its state, which a concurrent abort
// (torch's watchdog aborts from another thread) may take out of the registry.
std::mutex gMutex;
std::map<ncclComm_t, std::shared_ptr<CommState>> gComms;
thread_local int tGroupDepth = 0;

// `name` is absent from the real NCCL: none was found, or it is older than
// the entry point (ncclCommInitRankScalable needs 2.23, ncclCommShrink 2.27,
// ncclCommRevoke 2.28, ncclCommGrow, ncclCommSuspend and ncclCommResume
// 2.29; `since`, where given, names the version, as for ncclAllReduceConfig,
// 2.31).
ncclResult_t missing(const char* name, const char* since = nullptr) {
  const RealNccl& real = realNccl();
  std::string why = real.found ? "it is older than this call" : "no NCCL was found";
  if (real.found && since != nullptr) {
    const int v = real.version;
    why = (v > 0 ? "it is NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) +
                       "." + std::to_string(v % 100)
                 : std::string("it does not say its version")) +
          ", older than " + since + ", which " + name + " needs";
  }
  SQUALL_WARN(Subsys::kApi,
              "the interposer finds no %s in the real NCCL (%s); set SQUALL_NCCL_LIBRARY to "
              "the real libnccl.so.2, one recent enough for %s",
              name, why.c_str(), name);
  return real.found ? nccl_abi::kInvalidUsage : nccl_abi::kSystemError;
}

// Drops a detached state: the last holder destroys it, and its compressors
// and engine free device memory, which waits for the device unless the
// state was marked releaseOffThread.
void drop(std::shared_ptr<CommState> state) {
  if (state == nullptr) return;
  InsideSquall inside;
  state.reset();
}

// Learns a ready communicator's size (and the report's fallback rank).
bool resolve(ncclComm_t comm, CommState* s) {
  const RealNccl& real = realNccl();
  int n = 0, rank = -1;
  if (real.commCount == nullptr || real.commCount(comm, &n) != nccl_abi::kSuccess) return false;
  // The report is named by the launcher's rank; without one, by the rank in
  // the first communicator (torch's first is the world).
  if (real.commUserRank != nullptr && real.commUserRank(comm, &rank) == nccl_abi::kSuccess)
    Report::get().setFallbackRank(rank);
  s->nranks = n;
  s->pending = false;
  return true;
}

// `ready`: the init returned ncclSuccess outside a group. Otherwise NCCL
// refuses every query until the communicator is ready, and the state stays
// pending until its first collective: NCCL accepts that only on a ready
// communicator, so every rank resolves its state at the same call.
void track(ncclComm_t comm, bool ready, bool nonBlocking) {
  if (comm == nullptr) return;
  auto state = std::make_shared<CommState>(policy(), nonBlocking);
  if (ready) resolve(comm, state.get());
  std::shared_ptr<CommState> stale;  // of a communicator freed behind our back
  {
    std::lock_guard<std::mutex> lock(gMutex);
    std::shared_ptr<CommState>& slot = gComms[comm];
    stale = std::move(slot);
    slot = std::move(state);
  }
  drop(std::move(stale));
}

std::shared_ptr<CommState> peek(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gComms.find(comm);
  return it == gComms.end() ? nullptr : it->second;
}

// NCCL_COMM_BLOCKING as NCCL reads it: 0 or 1, else -1 (unset: no say).
int blockingFromEnvironment() {
  const char* text = std::getenv("NCCL_COMM_BLOCKING");
  if (text == nullptr || text[0] == '\0') return -1;
  const long long value = std::strtoll(text, nullptr, 0);
  return value == 0 || value == 1 ? static_cast<int>(value) : -1;
}

// Whether NCCL makes the communicator of `config` non-blocking, by NCCL's
// rule: NCCL_COMM_BLOCKING (0 or 1) overrides the rest; else the config's
// `blocking` when it sets one; else, given no config, the parent's (split,
// shrink and grow copy the parent's config); else blocking.
bool nonBlockingOf(const ncclConfig_t* config, ncclComm_t parent) {
  const int env = blockingFromEnvironment();
  if (env >= 0) return env == 0;
  if (config != nullptr) {
    nccl_config::Head head;
    std::memcpy(&head, config, sizeof head);
    return head.magic == nccl_config::kMagic && head.version >= nccl_config::kBlockingSince &&
           head.blocking == 0;
  }
  if (parent == nullptr) return false;
  const std::shared_ptr<CommState> of = peek(parent);
  return of != nullptr && of->nonBlocking;
}

// After an init, split, shrink or grow that returned `r`, given `config`
// (of `parent`, for those made from one): whether NCCL handed out a
// communicator (ncclInProgress hands it out unready, as does anything inside
// a group), and if so, tracks it. Only a non-blocking communicator's init
// returns ncclInProgress. Squall's own engine's communicators are not
// tracked.
void trackHandedOut(ncclResult_t r, const ncclComm_t* comm, const ncclConfig_t* config,
                    ncclComm_t parent) {
  if ((r != nccl_abi::kSuccess && r != nccl_abi::kInProgress) || comm == nullptr || insideSquall())
    return;
  track(*comm, r == nccl_abi::kSuccess && tGroupDepth == 0,
        r == nccl_abi::kInProgress || nonBlockingOf(config, parent));
}

// Under the state's lock, at a collective on a pending communicator.
void resolvePending(ncclComm_t comm, CommState* s) {
  const RealNccl& real = realNccl();
  ncclResult_t async = nccl_abi::kInProgress;
  if (real.commGetAsyncError != nullptr &&
      (real.commGetAsyncError(comm, &async) != nccl_abi::kSuccess || async != nccl_abi::kSuccess))
    return;  // not ready (NCCL fails the call) or failed: still pending
  resolve(comm, s);
}

// Takes `comm`'s state out of the registry without destroying it; with
// `only`, just that state (a communicator NCCL has made at the same address
// since keeps its own).
std::shared_ptr<CommState> detach(ncclComm_t comm, const CommState* only = nullptr) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gComms.find(comm);
  if (it == gComms.end() || (only != nullptr && it->second.get() != only)) return nullptr;
  std::shared_ptr<CommState> state = std::move(it->second);
  gComms.erase(it);
  return state;
}

// Takes a revoked communicator's state out of the registry, leaving a
// stand-in that passes its calls through: NCCL refuses them until the
// communicator is destroyed. The state's device memory goes off this thread
// (a compressed call that was under way may still hold the state; it frees
// it when it returns).
void markRevoked(ncclComm_t comm) {
  std::shared_ptr<CommState> revoked;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    auto it = gComms.find(comm);
    if (it == gComms.end()) return;
    revoked = std::move(it->second);
    it->second = std::make_shared<CommState>(policy(), revoked->nonBlocking, true);
    it->second->pending = false;
  }
  revoked->releaseOffThread = true;
  drop(std::move(revoked));
}

// The runtime's cudaStreamIsCapturing: (stream, cudaStreamCaptureStatus*)
// -> cudaError_t; a status other than none (0) is a capture, and so is the
// error that says the legacy stream is captured through another one
// (cudaErrorStreamCaptureImplicit).
using CaptureQuery = int (*)(cudaStream_t, int*);
constexpr int kCudaErrorStreamCaptureImplicit = 906;

// Whether `stream` is being captured into a CUDA graph, asked of the CUDA
// runtime the process has loaded globally (the one the application made the
// stream with, torch's) when there is one, else of the runtime Squall is
// built with (which a build with a static CUDA runtime keeps to itself). A
// runtime that cannot answer says no: the compressed path then meets the
// same error.
bool capturing(cudaStream_t stream) {
  static const auto query = [] {
    CaptureQuery q = nullptr;
    void* symbol = dlsym(RTLD_DEFAULT, "cudaStreamIsCapturing");
    std::memcpy(&q, &symbol, sizeof q);
    return q;
  }();
  if (query != nullptr) {
    int status = 0;
    const int err = query(stream, &status);
    return err == 0 ? status != 0 : err == kCudaErrorStreamCaptureImplicit;
  }
  bool captured = false;
  return core::streamIsCapturing(stream, &captured) == Status::kOk && captured;
}

// What the communicator's state (and the stream's) lets a call that would be
// placed in the step do: kCompress, or why it passes through unplaced. None
// of these advances the step or the warmup: a captured call runs again on
// every replay of the graph without coming here.
Verdict standingOf(const CommState* s, int nranks, cudaStream_t stream) {
  if (s == nullptr) return Verdict::kCommunicator;
  if (s->revoked) return Verdict::kRevoked;
  if (s->suspended) return Verdict::kSuspended;
  if (s->nonBlocking) return Verdict::kNonBlocking;
  if (nranks < 2) return Verdict::kCommunicator;
  if (capturing(stream)) return Verdict::kCapture;
  return Verdict::kCompress;
}

bool factsOf(ncclDataType_t type, ncclRedOp_t op, size_t count, CallFacts* facts) {
  facts->count = count;
  facts->dtypeKnown = true;
  if (type == nccl_abi::kFloat32)
    facts->dtype = DataType::kF32;
  else if (type == nccl_abi::kFloat16)
    facts->dtype = DataType::kF16;
  else if (type == nccl_abi::kBfloat16)
    facts->dtype = DataType::kBf16;
  else
    facts->dtypeKnown = false;
  facts->opKnown = op == nccl_abi::kSum || op == nccl_abi::kAvg;
  facts->op = op == nccl_abi::kAvg ? ReduceOp::kAvg : ReduceOp::kSum;
  return true;
}

// Bytes of one element of an NCCL type, for the report's full-precision size.
size_t ncclTypeBytes(ncclDataType_t type) {
  switch (type) {
    case 0:
    case 1: return 1;  // int8, uint8
    case 2:
    case 3: return 4;  // int32, uint32
    case 4:
    case 5:
    case 8: return 8;  // int64, uint64, float64
    case 6:
    case 9: return 2;   // float16, bfloat16
    case 7: return 4;   // float32
    default: return 1;  // fp8 and newer
  }
}

// What NCCL's ring sends per rank at full precision: an allreduce of `count`
// elements 2 (n-1)/n of them, a reduce-scatter of n x `count` and an
// all-gather of `count` per rank (n-1) x count.
uint64_t fullBytes(Coll coll, size_t count, ncclDataType_t type, int nranks) {
  if (nranks <= 1) return 0;
  const double bytes = static_cast<double>(count) * static_cast<double>(ncclTypeBytes(type));
  return static_cast<uint64_t>(coll == Coll::kAllReduce ? 2.0 * (nranks - 1) / nranks * bytes
                                                        : (nranks - 1) * bytes);
}

// Says once per process, for each thing a config may ask that the
// interposer cannot honour, that such calls pass through.
void warnOnce(CollConfigIssue issue) {
  static std::atomic<bool> said[static_cast<int>(CollConfigIssue::kCount)] = {};
  if (said[static_cast<int>(issue)].exchange(true)) return;
  const std::string what =
      issue == CollConfigIssue::kMagic  ? "lacks NCCL's magic (not from NCCL's initializer)"
      : issue == CollConfigIssue::kSize ? "is of a size the interposer does not know"
                                        : std::string("sets ") + collConfigIssueName(issue);
  SQUALL_WARN(Subsys::kApi,
              "the interposer passes ncclAllReduceConfig, ncclReduceScatterConfig and "
              "ncclAllGatherConfig calls whose ncclCollConfig_t %s to NCCL unchanged, "
              "uncompressed (the report's coll_config_passed counts them)",
              what.c_str());
}

}  // namespace
}  // namespace squall::preload

using namespace squall;
using namespace squall::preload;

#define SQUALL_EXPORT extern "C" [[gnu::visibility("default")]]

// Passed through; exported so that the interposer's table of the real NCCL
// can be checked against a library without a GPU (check_real_nccl.py).
SQUALL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  const RealNccl& real = realNccl();
  if (real.getVersion == nullptr) return missing("ncclGetVersion");
  return real.getVersion(version);
}

SQUALL_EXPORT ncclResult_t ncclGroupStart() {
  const RealNccl& real = realNccl();
  if (real.groupStart == nullptr) return missing("ncclGroupStart");
  ++tGroupDepth;
  return real.groupStart();
}

SQUALL_EXPORT ncclResult_t ncclGroupEnd() {
  const RealNccl& real = realNccl();
  if (real.groupEnd == nullptr) return missing("ncclGroupEnd");
  if (tGroupDepth > 0) --tGroupDepth;
  return real.groupEnd();
}

// Ends the group like ncclGroupEnd, computing what it would launch without
// launching it.
SQUALL_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  const RealNccl& real = realNccl();
  if (real.groupSimulateEnd == nullptr) return missing("ncclGroupSimulateEnd");
  if (tGroupDepth > 0) --tGroupDepth;
  return real.groupSimulateEnd(simInfo);
}

SQUALL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                            int rank) {
  const RealNccl& real = realNccl();
  if (real.commInitRank == nullptr) return missing("ncclCommInitRank");
  const ncclResult_t r = real.commInitRank(comm, nranks, id, rank);
  trackHandedOut(r, comm, nullptr, nullptr);
  return r;
}

SQUALL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                  int rank, ncclConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.commInitRankConfig == nullptr) return missing("ncclCommInitRankConfig");
  const ncclResult_t r = real.commInitRankConfig(comm, nranks, id, rank, config);
  trackHandedOut(r, comm, config, nullptr);
  return r;
}

// torch's init above TORCH_NCCL_RANKS_PER_ROOT (128) ranks.
SQUALL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank,
                                                    int nIds, ncclUniqueId* ids,
                                                    ncclConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.commInitRankScalable == nullptr) return missing("ncclCommInitRankScalable");
  const ncclResult_t r = real.commInitRankScalable(comm, nranks, rank, nIds, ids, config);
  trackHandedOut(r, comm, config, nullptr);
  return r;
}

SQUALL_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excluded, int nExcluded,
                                          ncclComm_t* newcomm, ncclConfig_t* config, int flags) {
  const RealNccl& real = realNccl();
  if (real.commShrink == nullptr) return missing("ncclCommShrink");
  const ncclResult_t r = real.commShrink(comm, excluded, nExcluded, newcomm, config, flags);
  // An excluded rank gets no communicator (NULL).
  trackHandedOut(r, newcomm, config, comm);
  return r;
}

SQUALL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  const RealNccl& real = realNccl();
  if (real.commInitAll == nullptr) return missing("ncclCommInitAll");
  const ncclResult_t r = real.commInitAll(comms, ndev, devlist);
  // One process drives every rank of these: its calls come one rank at a time
  // inside a group, so they pass through; they are not tracked.
  return r;
}

SQUALL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                         ncclConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.commSplit == nullptr) return missing("ncclCommSplit");
  const ncclResult_t r = real.commSplit(comm, color, key, newcomm, config);
  trackHandedOut(r, newcomm, config, comm);
  return r;
}

// Existing ranks pass their communicator (and rank -1), joining ones NULL;
// every rank gets the grown communicator.
SQUALL_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nranks, const ncclUniqueId* id,
                                        int rank, ncclComm_t* newcomm, ncclConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.commGrow == nullptr) return missing("ncclCommGrow");
  const ncclResult_t r = real.commGrow(comm, nranks, id, rank, newcomm, config);
  trackHandedOut(r, newcomm, config, comm);
  return r;
}

SQUALL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  const RealNccl& real = realNccl();
  if (real.commDestroy == nullptr) return missing("ncclCommDestroy");
  // The engine borrows `comm`: it goes before NCCL destroys it. Destroy waits
  // for the communicator's work to finish anyway, so waiting here first costs
  // nothing.
  drop(detach(comm));
  return real.commDestroy(comm);
}

// torch aborts from its watchdog thread, inside a group, while another
// communicator's kernels may be stuck on a dead peer: nothing here waits for
// the device.
SQUALL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  const RealNccl& real = realNccl();
  if (real.commAbort == nullptr) return missing("ncclCommAbort");
  // NCCL's abort first, with the communicator still tracked (a call the
  // abort makes meets its state); then the state goes, and its device memory
  // is freed off this thread (the engine does not touch `comm` when it is
  // destroyed). A compressed call still under way holds the state until it
  // returns.
  std::shared_ptr<CommState> state = peek(comm);
  const ncclResult_t r = real.commAbort(comm);
  if (state != nullptr) {
    state->releaseOffThread = true;
    detach(comm, state.get());
    drop(std::move(state));
  }
  return r;
}

// A revoked communicator runs nothing more (NCCL refuses its collectives)
// until it is destroyed; its calls pass through as `revoked`.
SQUALL_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags) {
  const RealNccl& real = realNccl();
  if (real.commRevoke == nullptr) return missing("ncclCommRevoke");
  const ncclResult_t r = real.commRevoke(comm, flags);
  if (r == nccl_abi::kSuccess || r == nccl_abi::kInProgress) markRevoked(comm);
  return r;
}

// NCCL does not run a suspended communicator's calls. Its calls pass through
// as `suspended` until it is resumed; with the memory flag (NCCL frees its
// own device memory) the compressors go too, and the residuals start from
// zero after the resume, on every rank alike. The application does not use
// the communicator while it suspends it, so the state's lock is free.
SQUALL_EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  const RealNccl& real = realNccl();
  if (real.commSuspend == nullptr) return missing("ncclCommSuspend");
  const ncclResult_t r = real.commSuspend(comm, flags);
  if (r != nccl_abi::kSuccess && r != nccl_abi::kInProgress) return r;
  if (std::shared_ptr<CommState> state = peek(comm)) {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->suspended = true;
    if ((flags & nccl_flags::kSuspendMemory) != 0) state->releaseDevice(true);
  }
  return r;
}

SQUALL_EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) {
  const RealNccl& real = realNccl();
  if (real.commResume == nullptr) return missing("ncclCommResume");
  const ncclResult_t r = real.commResume(comm);
  if (r != nccl_abi::kSuccess && r != nccl_abi::kInProgress) return r;
  if (std::shared_ptr<CommState> state = peek(comm)) {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->suspended = false;
  }
  return r;
}

namespace {

// A compressible collective as it came through one of its entry points.
struct Call {
  Coll coll;
  const void* send;
  void* recv;
  size_t count;  // NCCL's: the allreduce's elements, the reduce-scatter's recvcount, the
                 // all-gather's sendcount
  ncclDataType_t datatype;
  ncclRedOp_t op;
  ncclComm_t comm;
  cudaStream_t stream;
  const ncclCollConfig_t* config;  // of the Config entry point, perhaps null
};

// A compressed allreduce at `offset` of its step, cut at
// the tensor edges learnt so far (runCut): the runs of small tensors go to
// NCCL's allreduce at full precision, the rest through Squall on the same
// stream. A call of small tensors only goes to NCCL whole.
template <class Forward>
ncclResult_t cutAllReduce(const Call& call, const CallFacts& facts, CommState& s, int64_t offset,
                          uint64_t uncompressed, std::unique_lock<std::mutex>& lock,
                          Forward forward) {
  const CutCall cut{facts.dtype, offset, facts.count, s.nranks, facts.op, call.stream};
  const std::vector<TensorEdges::Run> runs = cutRuns(s.of(Coll::kAllReduce), policy(), cut);
  if (runs.size() == 1 && runs[0].full) {
    lock.unlock();
    Report::get().passed(Verdict::kSmall, uncompressed, Coll::kAllReduce);
    return forward();
  }
  InsideSquall inside;
  struct {
    const Call& call;
    DataType dtype;
    ReduceOp op;
    core::Comm& engine;
    size_t bytes(size_t skip) const { return skip * elementBytes(dtype); }
    int full(size_t skip, size_t n) const {
      return realNccl().allReduce(static_cast<const char*>(call.send) + bytes(skip),
                                  static_cast<char*>(call.recv) + bytes(skip), n, call.datatype,
                                  call.op, call.comm, call.stream);
    }
    int compressed(size_t skip, core::Compressor& c) const {
      return transport::nccl::ncclResultOf(engine.compressedAllReduceOnStream(
          static_cast<const char*>(call.send) + bytes(skip),
          static_cast<char*>(call.recv) + bytes(skip), dtype, op, c, call.stream));
    }
    static int failed(Status why) { return transport::nccl::ncclResultOf(why); }
  } front{call, facts.dtype, facts.op, *s.engine};
  uint64_t sent = 0;
  if (const int rc = runCut(s.of(Coll::kAllReduce), *s.engine, policy(), cut, runs, front, &sent);
      rc != nccl_abi::kSuccess)
    return static_cast<ncclResult_t>(rc);
  Report::get().compressed(policy().codec.codec, sent, uncompressed, Coll::kAllReduce);
  return nccl_abi::kSuccess;
}

// An allreduce or reduce-scatter; `forward` passes it to the entry point it
// came through, with its arguments unchanged. A config the interposer
// cannot honour makes an otherwise compressed call pass through; the call
// still takes its place in the step, as a warmup call does, so a config set
// on some steps only (a profiler's tag) moves no offset.
template <class Forward>
ncclResult_t intercept(const Call& call, Forward forward) {
  const Coll coll = call.coll;
  if (insideSquall()) {  // Squall's own call, were its NCCL table ever to reach this library
    Report::get().passed(Verdict::kReentry, 0, coll);
    return forward();
  }
  const CollConfigIssue configIssue = collConfigIssue(call.config);
  std::shared_ptr<CommState> held = peek(call.comm);
  std::unique_lock<std::mutex> lock;  // released before `held`
  if (held != nullptr) lock = std::unique_lock<std::mutex>(held->mutex);
  CommState* s = held.get();
  if (s != nullptr && s->pending) resolvePending(call.comm, s);
  const int nranks = s != nullptr ? s->nranks : 0;
  // The elements in which the call is placed and judged: the input's, the
  // all-gather's output.
  const size_t count =
      coll == Coll::kAllReduce ? call.count : call.count * static_cast<size_t>(std::max(nranks, 1));
  CallFacts facts;
  factsOf(call.datatype, call.op, count, &facts);
  Verdict verdict = policy().judge(facts, coll);
  if (verdict == Verdict::kCompress && tGroupDepth > 0) verdict = Verdict::kGroup;
  const uint64_t full = fullBytes(coll, call.count, call.datatype, nranks);
  // Small calls of a compressible type and op are placed in the step too.
  bool placed = verdict == Verdict::kCompress || (verdict == Verdict::kSmall && count > 0);
  if (placed) {
    const Verdict standing = standingOf(s, nranks, call.stream);
    if (standing != Verdict::kCompress) {
      verdict = standing;
      placed = false;
    }
  }
  int64_t offset = 0;
  if (placed && coll == Coll::kAllGather) {
    // No residual: no step to place it in.
    if (verdict == Verdict::kSmall) {
      // passed through
    } else if (configIssue != CollConfigIssue::kNone) {
      verdict = Verdict::kCollConfig;
    } else if (s->of(coll).eligible++ < policy().warmupCalls) {
      verdict = Verdict::kWarmup;
    } else if (s->engineFailed) {
      verdict = Verdict::kEngine;
    }
  } else if (placed) {
    StepState& st = s->of(coll);
    const StepTracker::Placement at = st.place(count);
    offset = at.offset;
    if (verdict == Verdict::kSmall) {
      // placed, and passed through
    } else if (configIssue != CollConfigIssue::kNone) {
      verdict = Verdict::kCollConfig;
    } else if (st.eligible++ < policy().warmupCalls) {
      verdict = Verdict::kWarmup;
    } else if (!at.known) {
      verdict = Verdict::kLearning;
    } else if (!st.residuals.fits(residualBytes(count, nranks))) {
      verdict = Verdict::kResidualCap;
    } else if (s->engineFailed) {
      verdict = Verdict::kEngine;
    }
  }
  if (verdict == Verdict::kCompress && !s->engine) {
    InsideSquall inside;
    if (core::Comm::fromNccl(call.comm, &s->engine) != Status::kOk) {
      SQUALL_WARN(Subsys::kApi,
                  "the interposer passes this NCCL communicator's collectives through "
                  "unchanged: %s",
                  lastError().c_str());
      s->engineFailed = true;
      verdict = Verdict::kEngine;
    }
  }
  if (verdict != Verdict::kCompress) {
    if (lock.owns_lock()) lock.unlock();
    if (verdict == Verdict::kCollConfig) {
      warnOnce(configIssue);
      Report::get().passedForConfig(configIssue, full, coll);
    } else {
      Report::get().passed(verdict, full, coll);
    }
    return forward();
  }

  if (coll == Coll::kAllReduce) return cutAllReduce(call, facts, *s, offset, full, lock, forward);
  InsideSquall inside;
  core::Compressor* c = nullptr;
  if (coll == Coll::kAllGather) {
    const std::pair<DataType, size_t> key{facts.dtype, call.count};
    auto it = s->gathers.find(key);
    if (it == s->gathers.end()) {
      if (s->gathers.size() >= kMaxGathers) s->gathers.clear();  // sizes keep changing
      std::unique_ptr<core::Compressor> made;
      const Status built =
          s->engine->createAllGatherCompressor(call.count, policy().allGather, &made);
      if (built != Status::kOk) return transport::nccl::ncclResultOf(built);
      it = s->gathers.emplace(key, std::move(made)).first;
    }
    c = it->second.get();
  } else {
    const ResidualKey key{facts.dtype, offset, count};
    const Status found = compressorFor(s->of(coll).residuals, *s->engine, policy(), key, nranks,
                                       facts.op, call.stream, &c, coll);
    if (found != Status::kOk) return transport::nccl::ncclResultOf(found);
  }
  if (c == nullptr) {
    // The state alone exceeds the cap (decide() normally says so first); the
    // cap and the count are the same on every rank, so all pass it through.
    Report::get().passed(Verdict::kResidualCap, full, coll);
    return forward();
  }
  const Status ran =
      coll == Coll::kAllGather
          ? s->engine->compressedAllGatherOnStream(call.send, call.recv, facts.dtype, *c,
                                                   call.stream)
          : s->engine->compressedReduceScatterOnStream(call.send, call.recv, call.count,
                                                       facts.dtype, facts.op, *c, call.stream);
  if (ran != Status::kOk) return transport::nccl::ncclResultOf(ran);
  // The bytes the algorithm sends, known without waiting for the stream
  // (the compressor's statistics would).
  const codec::CodecId code =
      coll == Coll::kAllGather ? policy().allGather.codec : policy().codec.codec;
  Report::get().compressed(code, c->bytesSentPerCall(), full, coll);
  return nccl_abi::kSuccess;
}

}  // namespace

SQUALL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  const RealNccl& real = realNccl();
  if (real.allReduce == nullptr) return missing("ncclAllReduce");
  return intercept(
      Call{Coll::kAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream, nullptr},
      [&] { return real.allReduce(sendbuff, recvbuff, count, datatype, op, comm, stream); });
}

// NCCL 2.31+: the allreduce with a per-call config. No config is the plain
// call; a config left at NCCL's defaults is compressed like it; any other
// goes to the real ncclAllReduceConfig unchanged (coll_config.h). Against an
// older NCCL every call fails, as it would without the interposer.
SQUALL_EXPORT ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                               ncclDataType_t datatype, ncclRedOp_t op,
                                               ncclComm_t comm, cudaStream_t stream,
                                               const ncclCollConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.allReduceConfig == nullptr) return missing("ncclAllReduceConfig", "2.31");
  return intercept(
      Call{Coll::kAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream, config}, [&] {
        return real.allReduceConfig(sendbuff, recvbuff, count, datatype, op, comm, stream, config);
      });
}

// The reduce-scatter (sharded data parallelism's gradients: FSDP, ZeRO):
// sendbuff holds nranks x recvcount elements, and recvbuff may be this
// rank's piece of it (NCCL's in-place form). Compressed with the allreduce's
// code and residual rules, in steps of its own.
SQUALL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op,
                                             ncclComm_t comm, cudaStream_t stream) {
  const RealNccl& real = realNccl();
  if (real.reduceScatter == nullptr) return missing("ncclReduceScatter");
  return intercept(Call{Coll::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm,
                        stream, nullptr},
                   [&] {
                     return real.reduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm,
                                               stream);
                   });
}

// NCCL 2.31+: the reduce-scatter with a per-call config, as
// ncclAllReduceConfig.
SQUALL_EXPORT ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff,
                                                   size_t recvcount, ncclDataType_t datatype,
                                                   ncclRedOp_t op, ncclComm_t comm,
                                                   cudaStream_t stream,
                                                   const ncclCollConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.reduceScatterConfig == nullptr) return missing("ncclReduceScatterConfig", "2.31");
  return intercept(
      Call{Coll::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config},
      [&] {
        return real.reduceScatterConfig(sendbuff, recvbuff, recvcount, datatype, op, comm, stream,
                                        config);
      });
}

// The all-gather: passed through unless SQUALL_PRELOAD_COLLECTIVES lists
// all_gather (it is also how torch gathers anything else, and a quantized
// copy is right only for values kept exactly elsewhere, such as FSDP's
// parameters); then an fp32/fp16/bf16 call is quantized with
// SQUALL_PRELOAD_ALLGATHER_CODEC, no residual. sendbuff may be this rank's
// piece of recvbuff (NCCL's in-place form).
SQUALL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm,
                                         cudaStream_t stream) {
  const RealNccl& real = realNccl();
  if (real.allGather == nullptr) return missing("ncclAllGather");
  return intercept(
      Call{Coll::kAllGather, sendbuff, recvbuff, sendcount, datatype, nccl_abi::kSum, comm, stream,
           nullptr},
      [&] { return real.allGather(sendbuff, recvbuff, sendcount, datatype, comm, stream); });
}

// NCCL 2.31+: the all-gather with a per-call config, as ncclAllReduceConfig.
SQUALL_EXPORT ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff,
                                               size_t sendcount, ncclDataType_t datatype,
                                               ncclComm_t comm, cudaStream_t stream,
                                               const ncclCollConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.allGatherConfig == nullptr) return missing("ncclAllGatherConfig", "2.31");
  return intercept(Call{Coll::kAllGather, sendbuff, recvbuff, sendcount, datatype, nccl_abi::kSum,
                        comm, stream, config},
                   [&] {
                     return real.allGatherConfig(sendbuff, recvbuff, sendcount, datatype, comm,
                                                 stream, config);
                   });
}
