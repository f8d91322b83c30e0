// What the interposer takes over, decided from facts every rank shares.
//
// The decision for a call must be the same on every rank of its communicator,
// or ranks would run different collectives and hang: so it looks only at the
// communicator, element count, element type, reduction and the position of the
// call in the communicator's sequence, never at buffer addresses, timing or
// anything else that differs between processes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/codec/wire.h"
#include "src/common/types.h"

namespace squall::preload {

// Why a call was or was not compressed. Every value but kCompress passes the
// call through to the real library unchanged.
enum class Verdict : uint8_t {
  kCompress = 0,
  kDisabled,      // SQUALL_PRELOAD_ENABLE=0
  kType,          // element type not compressible or not in SQUALL_PRELOAD_DTYPES
  kOp,            // reduction not in SQUALL_PRELOAD_OPS (min, max, user-defined ops, ...)
  kSmall,         // below SQUALL_PRELOAD_MIN_BYTES
  kCommunicator,  // intercommunicator, untracked or single-rank communicator
  kGroup,         // inside ncclGroupStart/ncclGroupEnd
  kWarmup,        // among the first SQUALL_PRELOAD_WARMUP eligible calls
  kLearning,      // the step is being learnt, or the call did not fit the learnt step
  kResidualCap,   // its error-feedback state alone exceeds SQUALL_PRELOAD_RESIDUAL_MB
  kEngine,        // no engine for this communicator (e.g. no CUDA in this build)
  kReentry,       // a call made by Squall itself while it runs a compressed call
  kNonBlocking,   // a non-blocking NCCL communicator (ncclConfig_t.blocking = 0)
  kCapture,       // the caller's stream is being captured into a CUDA graph
  kRevoked,       // ncclCommRevoke was called on the communicator
  kSuspended,     // between ncclCommSuspend and ncclCommResume
  kCollConfig,    // ncclAllReduceConfig with a config the interposer cannot honour
  kCollective,    // a collective not in SQUALL_PRELOAD_COLLECTIVES
  kCount
};
const char* verdictName(Verdict verdict);

// The collectives the interposer may compress.
enum class Coll : uint8_t {
  kAllReduce = 0,
  kReduceScatter,
  kAllGather,  // quantized, no residual: only where chosen (parameters)
  kCount
};
// As SQUALL_PRELOAD_COLLECTIVES and the report name it: "allreduce",
// "reduce_scatter", "all_gather".
const char* collName(Coll coll);

// The static facts of one call. `dtype`/`op` are meaningful only when known.
struct CallFacts {
  size_t count = 0;
  bool dtypeKnown = false;
  DataType dtype = DataType::kF32;
  bool opKnown = false;
  ReduceOp op = ReduceOp::kSum;
};

// The default code: SQUALL_PRELOAD_CODEC's default in params.def
// (int4:block=256, the fewest bits that kept the momentum-SGD and Adam jobs
// of tests/plugin/preload/horovod_quality.py within 3%; docs/preload.md),
// as text and parsed.
const char* defaultCodecText();
const codec::Spec& defaultCodec();

// A code as squallCodecSpecParse reads it back: "int8:block=2048", "fp16".
std::string specText(const codec::Spec& spec);

// The all-gather code SQUALL_PRELOAD_GATHER_CODEC=auto picks for `codec`:
// int8 (blocks of 2048) behind int2 and int4, the code itself otherwise.
codec::Spec gatherCodecFor(const codec::Spec& codec);

struct Policy {
  bool enabled = true;
  std::string codecText = defaultCodecText();
  codec::Spec codec = defaultCodec();
  // The two-phase allreduce's all-gather code (SQUALL_PRELOAD_GATHER_CODEC).
  codec::Spec gather = gatherCodecFor(defaultCodec());
  size_t minBytes = 8192;
  bool dtypes[3] = {true, true, true};  // fp32, fp16, bf16
  bool sum = true, avg = true;
  bool collectives[static_cast<int>(Coll::kCount)] = {true, true, false};
  // The quantized all-gather's code (SQUALL_PRELOAD_ALLGATHER_CODEC).
  std::string allGatherText = "int8:block=256";
  codec::Spec allGather = {codec::CodecId::kInt8, codec::Scale::kMeanAbs, 256};
  int64_t warmupCalls = 0;
  int64_t stepElements = 0;  // 0: learnt
  int64_t stepLearnCalls = 48;
  size_t residualCapBytes = size_t{4096} << 20;
  std::string reportPath;
  std::string ncclLibrary = "libnccl.so.2";

  // From the SQUALL_PRELOAD_* variables; a value that does not parse is
  // reported and its default kept.
  static Policy fromEnvironment();

  // The decision from the call's own facts (before warmup, step and memory):
  // `facts.count` is the elements of the call's input (a reduce-scatter's
  // whole input, n x recvcount).
  Verdict judge(const CallFacts& facts, Coll coll = Coll::kAllReduce) const;
};

size_t elementBytes(DataType dtype);

// What a full-precision ring allreduce sends per rank: 2 (n-1)/n of the buffer.
uint64_t fullPrecisionBytes(size_t count, DataType dtype, int nranks);

}  // namespace squall::preload
