// The C API of the optimizers (include/squall/optim.h).
//
// A squallOptimizer owns an optim::Optimizer bound to the communicator it was
// created with; the communicator must outlive it. This file only checks and
// translates arguments: the config struct (size-versioned: a caller built
// against an older, shorter struct gets the defaults for the fields it lacks),
// the enums (read as raw ints) and the codec spec; the algorithms live in
// src/optim.
#include <cstddef>
#include <cstring>
#include <memory>

#include "squall/optim.h"
#include "src/codec/codec.h"
#include "src/coll/communicator.h"
#include "src/core/api.h"
#include "src/core/api_objects.h"
#include "src/optim/optimizer.h"

using squall::Status;
using squall::Subsys;
namespace coll = squall::coll;
namespace core = squall::core;
namespace optim = squall::optim;

struct squallOptimizer {
  squallComm_t comm = nullptr;
  std::unique_ptr<optim::Optimizer> impl;  // host communicators
  // Communicators from NCCL: the device optimizer (api_device.cc).
  std::unique_ptr<core::DeviceAttachment> device;
};

static_assert(static_cast<int>(squallModeApmSqueeze) == static_cast<int>(optim::Mode::kApmSqueeze));
static_assert(static_cast<int>(squallModeSync) == static_cast<int>(optim::Mode::kSync));
static_assert(static_cast<int>(squallModeLocal) == static_cast<int>(optim::Mode::kLocal));
static_assert(static_cast<int>(squallPhaseWarmup) == static_cast<int>(optim::Phase::kWarmup));
static_assert(static_cast<int>(squallPhaseCompressed) ==
              static_cast<int>(optim::Phase::kCompressed));

namespace {

Status checkOptimizer(squallOptimizer_t o) {
  SQUALL_REQUIRE(o != nullptr && (o->impl != nullptr || o->device != nullptr),
                 Status::kInvalidArgument, Subsys::kApi,
                 "the optimizer is NULL; create one with squallOptimizerCreate");
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
  return Status::kOk;
}

Status checkStepBuffers(size_t count, const float* params, const float* grads) {
  SQUALL_REQUIRE(count == 0 || (params != nullptr && grads != nullptr), Status::kInvalidArgument,
                 Subsys::kApi,
                 "squallOptimizerStep: params and grads must point to %zu floats each", count);
  if (count != 0) {
    const auto* p = reinterpret_cast<const char*>(params);
    const auto* g = reinterpret_cast<const char*>(grads);
    const size_t bytes = count * sizeof(float);
    SQUALL_REQUIRE(p + bytes <= g || g + bytes <= p, Status::kInvalidArgument, Subsys::kApi,
                   "squallOptimizerStep: params and grads overlap; pass separate buffers");
  }
  return Status::kOk;
}

}  // namespace

extern "C" {

squallResult_t squallOptimizerCreate(squallComm_t comm, size_t count,
                                     const squallOptimConfig_t* config,
                                     squallOptimizer_t* optimizer) {
  return SQUALL_API_GUARD({
    coll::Communicator* c = nullptr;
    // A communicator from NCCL has no host collectives: the optimizer lives on the device.
    if (comm == nullptr || comm->nccl == nullptr) SQUALL_TRY(core::communicatorOf(comm, &c));
    SQUALL_REQUIRE(optimizer != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the optimizer output pointer is NULL");
    optim::Config cfg;
    SQUALL_TRY(readConfig(config, &cfg));
    auto o = std::make_unique<squallOptimizer>();
    o->comm = comm;
    if (comm->nccl != nullptr) {
      SQUALL_TRY(core::createDeviceOptimizer(comm, count, cfg, &o->device));
    } else {
      SQUALL_TRY(optim::Optimizer::create(c, count, cfg, &o->impl));
    }
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
    SQUALL_TRY(checkOptimizer(optimizer));
    SQUALL_REQUIRE(optimizer->device == nullptr, Status::kInvalidUsage, Subsys::kApi,
                   "squallOptimizerStep: this optimizer lives on a communicator from NCCL and "
                   "steps device buffers; call squallOptimizerStepOnStream");
    SQUALL_TRY(
        optimizer->impl->refuseStep(checkStepBuffers(optimizer->impl->count(), params, grads)));
    return optimizer->impl->step(params, grads, lr);
  });
}

squallResult_t squallOptimizerGetInfo(squallOptimizer_t optimizer, squallOptimInfo_t* info) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkOptimizer(optimizer));
    SQUALL_REQUIRE(info != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the info output pointer is NULL");
    optim::Info i;
    if (optimizer->device != nullptr) {
      SQUALL_TRY(core::deviceOptimizerInfo(optimizer->device.get(), &i));
    } else {
      i = optimizer->impl->info();
    }
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
    SQUALL_TRY(checkOptimizer(optimizer));
    SQUALL_REQUIRE(bytes != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the size output pointer is NULL");
    if (optimizer->device != nullptr)
      return core::deviceOptimizerStateSize(optimizer->device.get(), bytes);
    *bytes = optimizer->impl->stateSize();
    return Status::kOk;
  });
}

squallResult_t squallOptimizerSaveState(squallOptimizer_t optimizer, void* buffer, size_t capacity,
                                        size_t* written) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkOptimizer(optimizer));
    SQUALL_REQUIRE(written != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the written output pointer is NULL");
    if (optimizer->device != nullptr)
      return core::deviceOptimizerSaveState(optimizer->device.get(), buffer, capacity, written);
    return optimizer->impl->saveState(buffer, capacity, written);
  });
}

squallResult_t squallOptimizerLoadState(squallOptimizer_t optimizer, const void* buffer,
                                        size_t bytes) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkOptimizer(optimizer));
    if (optimizer->device != nullptr)
      return core::deviceOptimizerLoadState(optimizer->device.get(), buffer, bytes);
    return optimizer->impl->loadState(buffer, bytes);
  });
}

squallResult_t squallOptimizerStepOnStream(squallOptimizer_t optimizer, float* dParams,
                                           const float* dGrads, float lr, void* cudaStream) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkOptimizer(optimizer));
    if (optimizer->device != nullptr)
      return core::deviceOptimizerStep(optimizer->device.get(), dParams, dGrads, lr, cudaStream);
    const size_t count = optimizer->impl->count();
    SQUALL_REQUIRE(count == 0 || (dParams != nullptr && dGrads != nullptr),
                   Status::kInvalidArgument, Subsys::kApi,
                   "squallOptimizerStepOnStream: params and grads must point to %zu floats each",
                   count);
    return core::stagedOptimizerStep(optimizer->impl.get(), dParams, dGrads, lr, cudaStream);
  });
}

}  // extern "C"
