// The C API of the optimizers (include/squall/optim.h).
//
// A squallOptimizer owns the core::Optimizer (comm.h) its communicator made;
// the communicator must outlive it. This file only translates: the config
// struct (size-versioned: a caller built against an older, shorter struct
// gets the defaults for the fields it lacks), the enums (read as raw ints),
// the codec spec and the info; the algorithms live in src/optim.
#include <cstddef>
#include <cstring>
#include <memory>

#include "squall/optim.h"
#include "src/codec/codec.h"
#include "src/core/api.h"
#include "src/core/api_objects.h"
#include "src/core/comm.h"
#include "src/optim/optimizer.h"

using squall::Status;
using squall::Subsys;
namespace core = squall::core;
namespace optim = squall::optim;

struct squallOptimizer {
  std::unique_ptr<core::Optimizer> impl;
  core::Comm* comm = nullptr;  // the communicator its steps run collectives on
};

static_assert(static_cast<int>(squallModeApmSqueeze) == static_cast<int>(optim::Mode::kApmSqueeze));
static_assert(static_cast<int>(squallModeSync) == static_cast<int>(optim::Mode::kSync));
static_assert(static_cast<int>(squallModeLocal) == static_cast<int>(optim::Mode::kLocal));
static_assert(static_cast<int>(squallPhaseWarmup) == static_cast<int>(optim::Phase::kWarmup));
static_assert(static_cast<int>(squallPhaseCompressed) ==
              static_cast<int>(optim::Phase::kCompressed));

namespace {

Status optimizerOf(squallOptimizer_t o, core::Optimizer** out) {
  SQUALL_REQUIRE(o != nullptr && o->impl != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the optimizer is NULL; create one with squallOptimizerCreate");
  *out = o->impl.get();
  return Status::kOk;
}

Status readConfig(const squallOptimConfig_t* config, optim::Config* out) {
  SQUALL_REQUIRE(config != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the optimizer config is NULL; start from SQUALL_OPTIM_CONFIG_INIT");
  // The size field must cover at least the mode and lr so the config is meaningful.
  SQUALL_REQUIRE(config->size >= offsetof(squallOptimConfig_t, beta1) &&
                     config->size <= sizeof(squallOptimConfig_t),
                 Status::kInvalidArgument, Subsys::kApi,
                 "optimizer config->size is %zu; initialise the config with "
                 "SQUALL_OPTIM_CONFIG_INIT (size %zu)",
                 config->size, sizeof(squallOptimConfig_t));
  squallOptimConfig_t c = SQUALL_OPTIM_CONFIG_INIT;
  std::memcpy(&c, config, config->size);
  const int mode = core::rawEnum(c.mode);
  SQUALL_REQUIRE(mode >= squallModeApmSqueeze && mode <= squallModeLocal, Status::kInvalidArgument,
                 Subsys::kApi,
                 "unknown optimizer mode %d; use squallModeApmSqueeze, squallModeSync or "
                 "squallModeLocal",
                 mode);
  SQUALL_REQUIRE(c.slowmoCompressed == 0 || c.slowmoCompressed == 1, Status::kInvalidArgument,
                 Subsys::kApi, "slowmoCompressed is %d; use 0 or 1", c.slowmoCompressed);
  SQUALL_REQUIRE(c.guard == 0 || c.guard == 1, Status::kInvalidArgument, Subsys::kApi,
                 "guard is %d; use 1 (the APMSqueeze guard, default) or 0 (off)", c.guard);
  out->mode = static_cast<optim::Mode>(mode);
  out->lr = c.lr;
  out->beta1 = c.beta1;
  out->beta2 = c.beta2;
  out->eps = c.eps;
  out->weightDecay = c.weightDecay;
  out->warmupSteps = c.warmupSteps;
  out->warmupFraction = c.warmupFraction;
  out->totalSteps = c.totalSteps;
  SQUALL_TRY(core::toCodecSpec(&c.codec, &out->codec));
  out->slowmoTau = c.slowmoTau;
  out->slowmoAlpha = c.slowmoAlpha;
  out->slowmoBeta = c.slowmoBeta;
  out->slowmoCompressed = c.slowmoCompressed != 0;
  out->guard = c.guard != 0;
  out->maxUpdate = c.maxUpdate;
  out->freezeThreshold = c.freezeThreshold;
  out->freezeWindow = c.freezeWindow;
  SQUALL_REQUIRE(c.warmupCodec == squallCodecNone || c.warmupCodec == squallCodecFp16 ||
                     c.warmupCodec == squallCodecBf16,
                 Status::kInvalidArgument, Subsys::kApi,
                 "warmupCodec is %d; use squallCodecNone, squallCodecFp16 or squallCodecBf16",
                 c.warmupCodec);
  out->warmupCodec = static_cast<squall::codec::CodecId>(c.warmupCodec);
  switch (c.compressedAlgo) {
    case squallOptimAlgoBytes:
      out->compressedAlgo = squall::coll::CompressedAlgo::kAutoBytes;
      break;
    case squallOptimAlgoTwoPhase:
      out->compressedAlgo = squall::coll::CompressedAlgo::kTwoPhase;
      break;
    case squallOptimAlgoAllGather:
      out->compressedAlgo = squall::coll::CompressedAlgo::kAllGather;
      break;
    case squallOptimAlgoTime: out->compressedAlgo = squall::coll::CompressedAlgo::kAuto; break;
    default:
      return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kApi,
                         "compressedAlgo is %d; use squallOptimAlgoBytes, TwoPhase, AllGather or "
                         "Time",
                         c.compressedAlgo);
  }
  return Status::kOk;
}

}  // namespace

extern "C" {

squallResult_t squallOptimizerCreate(squallComm_t comm, size_t count,
                                     const squallOptimConfig_t* config,
                                     squallOptimizer_t* optimizer) {
  return SQUALL_API_GUARD({
    core::Comm* c = nullptr;
    SQUALL_TRY(core::commOf(comm, &c));
    SQUALL_REQUIRE(optimizer != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the optimizer output pointer is NULL");
    optim::Config cfg;
    SQUALL_TRY(readConfig(config, &cfg));
    auto o = std::make_unique<squallOptimizer>();
    SQUALL_TRY(c->createOptimizer(count, cfg, &o->impl));
    o->comm = c;
    *optimizer = o.release();
    return Status::kOk;
  });
}

squallResult_t squallOptimizerDestroy(squallOptimizer_t optimizer) {
  return SQUALL_API_GUARD({
    delete optimizer;
    return Status::kOk;
  });
}

squallResult_t squallOptimizerStep(squallOptimizer_t optimizer, float* params, const float* grads,
                                   float lr) {
  return SQUALL_API_GUARD({
    core::Optimizer* o = nullptr;
    SQUALL_TRY(optimizerOf(optimizer, &o));
    core::chargeSkippedCalls(*optimizer->comm);  // a step runs collectives
    return o->step(params, grads, lr);
  });
}

squallResult_t squallOptimizerGetInfo(squallOptimizer_t optimizer, squallOptimInfo_t* info) {
  return SQUALL_API_GUARD({
    core::Optimizer* o = nullptr;
    SQUALL_TRY(optimizerOf(optimizer, &o));
    SQUALL_REQUIRE(info != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the info output pointer is NULL");
    optim::Info i;
    SQUALL_TRY(o->info(&i));
    info->step = i.step;
    info->phase = static_cast<squallOptimPhase_t>(i.phase);
    info->warmupSteps = i.warmupSteps;
    info->bytesSent = i.bytesSent;
    info->skippedSteps = i.skippedSteps;
    return Status::kOk;
  });
}

squallResult_t squallOptimizerStateSize(squallOptimizer_t optimizer, size_t* bytes) {
  return SQUALL_API_GUARD({
    core::Optimizer* o = nullptr;
    SQUALL_TRY(optimizerOf(optimizer, &o));
    SQUALL_REQUIRE(bytes != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the size output pointer is NULL");
    return o->stateSize(bytes);
  });
}

squallResult_t squallOptimizerSaveState(squallOptimizer_t optimizer, void* buffer, size_t capacity,
                                        size_t* written) {
  return SQUALL_API_GUARD({
    core::Optimizer* o = nullptr;
    SQUALL_TRY(optimizerOf(optimizer, &o));
    SQUALL_REQUIRE(written != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the written output pointer is NULL");
    return o->saveState(buffer, capacity, written);
  });
}

squallResult_t squallOptimizerLoadState(squallOptimizer_t optimizer, const void* buffer,
                                        size_t bytes) {
  return SQUALL_API_GUARD({
    core::Optimizer* o = nullptr;
    SQUALL_TRY(optimizerOf(optimizer, &o));
    return o->loadState(buffer, bytes);
  });
}

squallResult_t squallOptimizerStepOnStream(squallOptimizer_t optimizer, float* dParams,
                                           const float* dGrads, float lr, void* cudaStream) {
  return SQUALL_API_GUARD({
    core::Optimizer* o = nullptr;
    SQUALL_TRY(optimizerOf(optimizer, &o));
    core::chargeSkippedCalls(*optimizer->comm);
    return o->stepOnStream(dParams, dGrads, lr, cudaStream);
  });
}

}  // extern "C"
