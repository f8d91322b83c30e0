// The APMSqueeze / sync / local Adam optimizers with optional SlowMo, over one
// flat fp32 buffer (the algorithms are described in optimizer.cc and
// docs/optim.md). Every rank creates one with the same count and config and
// calls step() once per training step; the communicator must outlive it and
// must not run other operations concurrently with step().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/codec/wire.h"
#include "src/coll/communicator.h"
#include "src/coll/compressed_state.h"
#include "src/common/status.h"
#include "src/optim/state_blob.h"
#include "src/optim/update_kernels.h"

namespace squall::optim {

// Numerically identical to squallOptimMode_t / squallOptimPhase_t.
enum class Mode : int32_t { kApmSqueeze = 0, kSync = 1, kLocal = 2 };
enum class Phase : int32_t { kWarmup = 0, kCompressed = 1 };

struct Config {
  Mode mode = Mode::kApmSqueeze;
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weightDecay = 0.0f;
  int64_t warmupSteps = -1;  // < 0: round(warmupFraction * totalSteps)
  double warmupFraction = 0.15;
  int64_t totalSteps = 0;
  codec::Spec codec;
  int slowmoTau = 0;  // 0: SlowMo off
  float slowmoAlpha = 1.0f;
  float slowmoBeta = 0.5f;
  bool slowmoCompressed = false;
  bool guard = true;       // APMSqueeze compressed stage: mask v_hat == 0, clip the ratio
  float maxUpdate = 0.0f;  // the clip; 0: adamRatioBound(beta1, beta2)
};

struct Info {
  int64_t step = 0;
  Phase phase = Phase::kWarmup;
  int64_t warmupSteps = 0;
  uint64_t bytesSent = 0;
  uint64_t skippedSteps = 0;
};

// Checks a config (with messages naming the bad field) and resolves the
// APMSqueeze warmup length; shared by the host and device optimizers.
Status validateConfig(const Config& config, int64_t* warmupSteps);

// The scalars of the compressed-stage update at learning rate lr; shared by
// the host and device optimizers.
FrozenScalars frozenScalarsOf(const Config& config, float lr);

// The header of a state blob: what the optimizer is and how far it got.
// Shared by the host optimizer and the device one (src/optim/cuda), whose
// blobs are interchangeable.
BlobHeader stateHeader(const Config& config, size_t count, int nranks, int rank, const Info& info,
                       int64_t adamSteps);

// Checks that a parsed state blob's header fits an optimizer of `count`
// parameters with `config` (kInvalidUsage naming what differs) and is
// consistent in itself (kCorruptData). `usesCodec`: the optimizer keeps
// compressed-allreduce residuals, so the codec must match too. Shared by the
// host and device optimizers.
Status checkStateHeader(const BlobHeader& h, const Config& config, size_t count, bool usesCodec);

class Optimizer {
 public:
  // Checks the config (with messages naming the bad field) and allocates the
  // state: m, v, and the compressed states the config needs.
  static Status create(coll::Communicator* comm, size_t count, const Config& config,
                       std::unique_ptr<Optimizer>* out);

  // One step; lr > 0 overrides the configured learning rate for this step.
  Status step(float* params, const float* grads, float lr);

  // This rank refuses its next step for a bad argument (`check`, not kOk).
  // When that step would communicate, the peers, waiting in its first
  // collective, are told (coll::Communicator::refuse) and their step fails at
  // once, before it changes any state, so the ranks stay in step. Returns
  // `check`; kOk passes through.
  Status refuseStep(Status check);

  Info info() const;
  size_t count() const { return count_; }
  const Config& config() const { return config_; }

  size_t stateSize() const;
  Status saveState(void* buffer, size_t capacity, size_t* written) const;
  Status loadState(const void* buffer, size_t bytes);

  // For tests: the compressed state of the momentum (null outside APMSqueeze).
  coll::CompressedState* momentumState() { return momentum_.get(); }
  coll::CompressedState* slowmoState() { return slowmoState_.get(); }

 private:
  Optimizer() = default;
  bool nextStepCommunicates() const;
  Status adamStep(float* params, const float* grads, float lr, bool allReduce);
  Status compressedStep(float* params, const float* grads, float lr);
  Status slowmoSync(float* params, float lr);
  Status compressedAverage(coll::CompressedState* state, float* buffer, bool* finite);
  Status fullAverage(const float* in, float* out);
  void switchToCompressed();
  std::vector<SectionView> sections() const;

  coll::Communicator* comm_ = nullptr;
  size_t count_ = 0;
  Config config_;
  int64_t warmupSteps_ = 0;  // resolved

  int64_t step_ = 0;       // step() calls that completed (applied or skipped)
  int64_t adamSteps_ = 0;  // Adam updates applied (the t of the bias correction)
  Phase phase_ = Phase::kWarmup;
  uint64_t bytesSent_ = 0;
  uint64_t skipped_ = 0;

  std::vector<float> m_, v_;  // v_ holds the frozen, bias-corrected v_hat once compressed
  std::vector<float> scratch_, backup_;
  std::unique_ptr<coll::CompressedState> momentum_;
  // SlowMo.
  std::vector<float> xPrev_, u_, xAvg_;
  std::unique_ptr<coll::CompressedState> slowmoState_;
};

}  // namespace squall::optim
