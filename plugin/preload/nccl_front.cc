// The NCCL front end: ncclAllReduce of fp32/fp16/bf16 sums and averages on a
// communicator this process created through the interposed ncclCommInit* /
// ncclCommSplit runs as Squall's compressed allreduce on the caller's stream;
// everything else goes to the real NCCL unchanged: calls inside
// ncclGroupStart/ncclGroupEnd (NCCL fuses a group into one launch and the
// caller expects it so), other reductions (prod, min, max, ncclRedOpCreate*
// ops), other types, small buffers, and communicators created elsewhere.
#include <map>
#include <memory>
#include <mutex>

#include "plugin/preload/interposer.h"
#include "plugin/preload/nccl_abi.h"
#include "plugin/preload/real_nccl.h"
#include "plugin/preload/report.h"
#include "plugin/preload/residual_map.h"
#include "src/codec/codec.h"
#include "src/core/comm.h"

namespace squall::preload {
namespace {

struct CommState {
  explicit CommState(const Policy& p)
      : steps(p.stepElements, p.stepLearnCalls), residuals(p.residualCapBytes) {}
  // 0 while `pending`: NCCL handed the communicator out before it was ready
  // (non-blocking init, or init inside a group) and refuses to say its size
  // until then.
  std::mutex mutex;  // the fields below, and this communicator's compressed call
  int nranks = 0;
  bool pending = true;
  int64_t eligible = 0;
  StepTracker steps;
  std::unique_ptr<core::Comm> engine;  // outlives the compressors below
  ResidualMap<core::Compressor> residuals;
  bool engineFailed = false;
};

// The registry's lock, held only to look a state up: each state has its own,
// so that threads reducing on different communicators never wait for each
// other. A call holds a reference to its state, which a concurrent abort
// (torch's watchdog aborts from another thread) may take out of the registry.
std::mutex gMutex;
std::map<ncclComm_t, std::shared_ptr<CommState>> gComms;
thread_local int tGroupDepth = 0;

// `name` is absent from the real NCCL: none was found, or it is older than
// the entry point (ncclCommInitRankScalable needs 2.23, ncclCommShrink 2.27).
ncclResult_t missing(const char* name) {
  SQUALL_WARN(Subsys::kApi,
              "the interposer finds no %s in the real NCCL (%s); set SQUALL_NCCL_LIBRARY to "
              "the real libnccl.so.2, one recent enough for %s",
              name, realNccl().found ? "it is older than this call" : "no NCCL was found", name);
  return realNccl().found ? nccl_abi::kInvalidUsage : nccl_abi::kSystemError;
}

// Destroys a detached state: its compressors and engine free device memory,
// which waits for the device.
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
void track(ncclComm_t comm, bool ready) {
  if (comm == nullptr) return;
  auto state = std::make_shared<CommState>(policy());
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

// After an init or split that returned `r`: whether NCCL handed out a
// communicator (ncclInProgress hands it out unready, as does anything inside
// a group), and if so, tracks it. Squall's own engine's communicators are
// not tracked.
void trackHandedOut(ncclResult_t r, const ncclComm_t* comm) {
  if ((r != nccl_abi::kSuccess && r != nccl_abi::kInProgress) || comm == nullptr || insideSquall())
    return;
  track(*comm, r == nccl_abi::kSuccess && tGroupDepth == 0);
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

std::shared_ptr<CommState> peek(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gComms.find(comm);
  return it == gComms.end() ? nullptr : it->second;
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

// Bytes one rank sends in the two-phase compressed allreduce of `count`
// elements: its n-1 encoded chunks out, and its encoded chunk to n-1 peers.
uint64_t compressedBytes(size_t count, int nranks) {
  const size_t chunk = (count + static_cast<size_t>(nranks) - 1) / static_cast<size_t>(nranks);
  size_t bytes = 0;
  if (codec::encodedSize(policy().codec, chunk, &bytes) != Status::kOk) return 0;
  return 2ull * static_cast<uint64_t>(nranks - 1) * bytes;
}

}  // namespace
}  // namespace squall::preload

using namespace squall;
using namespace squall::preload;

#define SQUALL_EXPORT extern "C" [[gnu::visibility("default")]]

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
  trackHandedOut(r, comm);
  return r;
}

SQUALL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id,
                                                  int rank, ncclConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.commInitRankConfig == nullptr) return missing("ncclCommInitRankConfig");
  const ncclResult_t r = real.commInitRankConfig(comm, nranks, id, rank, config);
  trackHandedOut(r, comm);
  return r;
}

// torch's init above TORCH_NCCL_RANKS_PER_ROOT (128) ranks.
SQUALL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank,
                                                    int nIds, ncclUniqueId* ids,
                                                    ncclConfig_t* config) {
  const RealNccl& real = realNccl();
  if (real.commInitRankScalable == nullptr) return missing("ncclCommInitRankScalable");
  const ncclResult_t r = real.commInitRankScalable(comm, nranks, rank, nIds, ids, config);
  trackHandedOut(r, comm);
  return r;
}

SQUALL_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excluded, int nExcluded,
                                          ncclComm_t* newcomm, ncclConfig_t* config, int flags) {
  const RealNccl& real = realNccl();
  if (real.commShrink == nullptr) return missing("ncclCommShrink");
  const ncclResult_t r = real.commShrink(comm, excluded, nExcluded, newcomm, config, flags);
  // An excluded rank gets no communicator (NULL).
  trackHandedOut(r, newcomm);
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
  trackHandedOut(r, newcomm);
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

SQUALL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  const RealNccl& real = realNccl();
  if (real.commAbort == nullptr) return missing("ncclCommAbort");
  // NCCL's abort first: freeing the engine's device memory waits for the
  // device, whose kernels may be waiting for a dead peer until the abort
  // releases them. The engine does not touch `comm` when it is destroyed.
  std::shared_ptr<CommState> state = peek(comm);
  const ncclResult_t r = real.commAbort(comm);
  if (state != nullptr) {
    detach(comm, state.get());
    drop(std::move(state));
  }
  return r;
}

SQUALL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
  const RealNccl& real = realNccl();
  if (real.allReduce == nullptr) return missing("ncclAllReduce");
  if (insideSquall()) {  // Squall's own call, were its NCCL table ever to reach this library
    Report::get().passed(Verdict::kReentry, 0);
    return real.allReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  }
  CallFacts facts;
  factsOf(datatype, op, count, &facts);
  Verdict verdict = policy().judge(facts);
  if (verdict == Verdict::kCompress && tGroupDepth > 0) verdict = Verdict::kGroup;

  std::shared_ptr<CommState> held;
  {
    std::lock_guard<std::mutex> registry(gMutex);
    auto it = gComms.find(comm);
    if (it != gComms.end()) held = it->second;
  }
  std::unique_lock<std::mutex> lock;  // released before `held`
  if (held != nullptr) lock = std::unique_lock<std::mutex>(held->mutex);
  CommState* s = held.get();
  if (s != nullptr && s->pending) resolvePending(comm, s);
  const int nranks = s != nullptr ? s->nranks : 0;
  const uint64_t fullBytes =
      nranks > 1
          ? static_cast<uint64_t>(2.0 * (nranks - 1) / nranks * count * ncclTypeBytes(datatype))
          : 0;
  // Small calls of a compressible type and op are placed in the step too.
  const bool placed = verdict == Verdict::kCompress || (verdict == Verdict::kSmall && count > 0);
  if (placed && (s == nullptr || nranks < 2)) verdict = Verdict::kCommunicator;
  int64_t offset = 0;
  if (placed && verdict != Verdict::kCommunicator) {
    StepTracker::Placement at = s->steps.place(count);
    if (at.agree) {
      int64_t proposal[2];
      s->steps.proposal(proposal);
      s->steps.adopt(proposal);
    }
    if (at.relearn) {
      s->residuals.clear();
      Report::get().relearned();
    }
    offset = at.offset;
    if (verdict == Verdict::kSmall) {
      // placed, and passed through
    } else if (s->eligible++ < policy().warmupCalls) {
      verdict = Verdict::kWarmup;
    } else if (!at.known) {
      verdict = Verdict::kLearning;
    } else if (!s->residuals.fits(residualBytes(count, nranks))) {
      verdict = Verdict::kResidualCap;
    } else if (s->engineFailed) {
      verdict = Verdict::kEngine;
    }
  }
  if (verdict == Verdict::kCompress && !s->engine) {
    InsideSquall inside;
    if (core::Comm::fromNccl(comm, &s->engine) != Status::kOk) {
      SQUALL_WARN(Subsys::kApi,
                  "the interposer passes this NCCL communicator's allreduces "
                  "through unchanged: %s",
                  lastError().c_str());
      s->engineFailed = true;
      verdict = Verdict::kEngine;
    }
  }
  if (verdict != Verdict::kCompress) {
    if (lock.owns_lock()) lock.unlock();
    Report::get().passed(verdict, fullBytes);
    return real.allReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
  }

  InsideSquall inside;
  const ResidualKey key{facts.dtype, offset, count};
  core::Compressor* c = s->residuals.find(key);
  if (c == nullptr) {
    std::unique_ptr<core::Compressor> fresh;
    if (s->engine->createCompressor(count, policy().codec, &fresh) != Status::kOk)
      return nccl_abi::kInternalError;
    c = fresh.get();
    const uint64_t before = s->residuals.evictions();
    if (!s->residuals.insert(key, std::move(fresh), residualBytes(count, nranks))) {
      // The state alone exceeds the cap (decide() normally says so first); the
      // cap and the count are the same on every rank, so all pass it through.
      Report::get().passed(Verdict::kResidualCap, fullBytes);
      return real.allReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
    }
    Report::get().evicted(s->residuals.evictions() - before);
  }
  if (s->engine->compressedAllReduceOnStream(sendbuff, recvbuff, facts.dtype, facts.op, *c,
                                             stream) != Status::kOk)
    return nccl_abi::kInternalError;
  // A device compressor's statistics wait for its stream; the report takes
  // what the two-phase algorithm sends instead: 2 (n-1) encoded chunks.
  Report::get().compressed(compressedBytes(count, nranks), fullBytes);
  return nccl_abi::kSuccess;
}
