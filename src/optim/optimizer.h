// The APMSqueeze / sync / local Adam optimizers with optional SlowMo, over one
// flat fp32 buffer (the algorithms are described in optimizer.cc and
// docs/optim.md). Every rank creates one with the same count and config and
// calls step() (stepOnStream() on the device) once per training step; the
// communicator must outlive it and must not run other operations
// concurrently with a step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/codec/wire.h"
#include "src/coll/communicator.h"
#include "src/coll/compressed_state.h"
#include "src/coll/context.h"
#include "src/common/status.h"
#include "src/optim/backend.h"
#include "src/optim/state_blob.h"
#include "src/optim/update_kernels.h"

namespace squall::optim {

// Numerically identical to squallOptimMode_t / squallOptimPhase_t.
enum class Mode : int32_t { kApmSqueeze = 0, kSync = 1, kLocal = 2 };
enum class Phase : int32_t { kWarmup = 0, kCompressed = 1 };

// The neutral defaults of the schedule (fixed fp32 warmup, the codec's
// default block); the library's defaults for users are
// SQUALL_OPTIM_CONFIG_INIT's (include/squall/optim.h) and squall.optim's.
struct Config {
  Mode mode = Mode::kApmSqueeze;
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weightDecay = 0.0f;
  // APMSqueeze warmup: at most warmupSteps (< 0: round(warmupFraction *
  // totalSteps)) steps; with freezeThreshold > 0 it ends earlier, after the
  // first step t (a multiple of freezeWindow, t >= 2 freezeWindow) where the
  // bias-corrected variance moved by less than freezeThreshold since step
  // t - freezeWindow: sum |v_hat_t - v_hat_{t-W}| / sum v_hat_t.
  int64_t warmupSteps = -1;
  double warmupFraction = 0.15;
  int64_t totalSteps = 0;
  double freezeThreshold = 0.0;  // 0: the fixed warmup
  // The APMSqueeze warmup's gradient average: kNone (fp32), or kFp16 / kBf16
  // (stateless: each rank's gradient rounded, summed in fp32, the sum
  // rounded again; no residual carries the rounding to the next step).
  codec::CodecId warmupCodec = codec::CodecId::kNone;
  int64_t freezeWindow = 8;
  codec::Spec codec;
  int slowmoTau = 0;  // 0: SlowMo off
  float slowmoAlpha = 1.0f;
  float slowmoBeta = 0.5f;
  bool slowmoCompressed = false;
  // The compressed allreduces' algorithm on the host: kAutoBytes (the one
  // sending fewer bytes), kAuto (the communicator's time model), or fixed.
  coll::CompressedAlgo compressedAlgo = coll::CompressedAlgo::kAutoBytes;
  bool guard = true;       // APMSqueeze compressed stage: mask v_hat == 0, clip the ratio
  float maxUpdate = 0.0f;  // the clip; 0: adamRatioBound(beta1, beta2)
};

struct Info {
  int64_t step = 0;
  Phase phase = Phase::kWarmup;
  int64_t warmupSteps = 0;  // the steps of the warmup once frozen, its upper bound before
  uint64_t bytesSent = 0;
  uint64_t skippedSteps = 0;
  double varianceChange = -1.0;  // the last measured relative change (< 0: none yet)
};

// Checks a config (with messages naming the bad field) and resolves the
// APMSqueeze warmup length.
Status validateConfig(const Config& config, int64_t* warmupSteps);

// The scalars of the compressed-stage update at learning rate lr.
FrozenScalars frozenScalarsOf(const Config& config, float lr);

// One schedule (optimizer.cc) over a backend (backend.h): host memory over a
// coll::Communicator (create), or device memory over NCCL
// (optim::cuda::createDeviceOptimizer, src/optim/cuda/device_optimizer.h).
class Optimizer {
 public:
  // Checks the config (with messages naming the bad field) and allocates the
  // state in host memory: m, v, and the compressed states the config needs.
  static Status create(coll::Communicator* comm, size_t count, const Config& config,
                       std::unique_ptr<Optimizer>* out);
  // The same over another backend (owned from here on).
  static Status createOn(std::unique_ptr<Backend> backend, size_t count, const Config& config,
                         std::unique_ptr<Optimizer>* out);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // True when the state (and the buffers a step takes) is in device memory.
  bool onDevice() const;

  // One step on host buffers; lr > 0 overrides the configured learning rate
  // for this step. kInvalidUsage on a device optimizer.
  Status step(float* params, const float* grads, float lr);

  // One step on device buffers, enqueued on `cudaStream` (a cudaStream_t);
  // it returns after the stream has reached the step's skip decision (see
  // docs/optim.md, "Device buffers"). kInvalidUsage on a host optimizer.
  Status stepOnStream(float* dParams, const float* dGrads, float lr, void* cudaStream);

  // This rank refuses its next step for a bad argument (`check`, not kOk).
  // When that step would communicate, the peers, waiting in its first
  // collective, are told and their step fails at once, before it changes any
  // state, so the ranks stay in step. Returns `check`; kOk passes through.
  Status refuseStep(Status check);

  Info info() const;
  size_t count() const { return count_; }
  const Config& config() const { return config_; }

  // On the device these wait for the stream of the last step.
  size_t stateSize() const;
  Status saveState(void* buffer, size_t capacity, size_t* written) const;
  Status loadState(const void* buffer, size_t bytes);

  // For tests: the compressed state of the momentum (null outside APMSqueeze,
  // and on the device), and of compressed SlowMo.
  coll::CompressedState* momentumState();
  coll::CompressedState* slowmoState();

 private:
  Optimizer() = default;
  Status run(float* params, const float* grads, float lr, bool device, void* stream);
  bool nextStepCommunicates() const;
  bool adaptiveWarmup() const {
    return config_.mode == Mode::kApmSqueeze && config_.freezeThreshold > 0.0;
  }
  Status openStep(Status check);
  Status adamStep(float* params, const float* grads, float lr, bool allReduce);
  Status compressedStep(float* params, const float* grads, float lr);
  Status slowmoSync(float* params, float lr);
  Status compressedAverage(Channel channel, float* buffer, bool* finite);
  Status fullAverage(const float* in, float* out);
  Status warmupAverage(const float* in, float* out);
  Status switchToCompressed();
  Status varianceSettled(bool* settled);
  Status sections(std::vector<SectionView>* out, std::vector<std::vector<float>>* staging) const;

  std::unique_ptr<Backend> backend_;
  size_t count_ = 0;
  Config config_;
  int64_t warmupSteps_ = 0;       // resolved: the upper bound of the warmup
  int64_t frozenAt_ = 0;          // the step after which the variance froze (0: not yet)
  int64_t snapAdamSteps_ = 0;     // the Adam updates behind vSnap_ (0: no snapshot yet)
  double varianceChange_ = -1.0;  // the last measured relative change
  bool momentumChannel_ = false;  // APMSqueeze: the momentum's residuals
  bool slowmoChannel_ = false;    // compressed SlowMo: the drift's residuals
  bool warmupChannel_ = false;    // APMSqueeze warmup through fp16 / bf16

  int64_t step_ = 0;       // step() calls that completed (applied or skipped)
  int64_t adamSteps_ = 0;  // Adam updates applied (the t of the bias correction)
  Phase phase_ = Phase::kWarmup;
  uint64_t bytesSent_ = 0;
  uint64_t skipped_ = 0;

  // Buffers of count_ floats in the backend's memory. v_ holds the frozen,
  // bias-corrected v_hat once compressed; x_prev, u and x_avg with SlowMo.
  float* m_ = nullptr;
  float* v_ = nullptr;
  float* scratch_ = nullptr;
  float* xPrev_ = nullptr;
  float* u_ = nullptr;
  float* xAvg_ = nullptr;
  float* vSnap_ = nullptr;  // APMSqueeze with freezeThreshold > 0: v at the last window end
};

}  // namespace squall::optim
