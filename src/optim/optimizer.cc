// The optimizer state machine over one flat fp32 buffer, written once over a
// backend (backend.h) that holds the state in host memory or in device
// memory: the schedule below decides, the backend moves and computes.
//
// Adam (mode sync; mode local; APMSqueeze warmup, steps t <= T_w): the
// gradient g is the full-precision allreduce average (sync, warmup) or the
// local gradient (local); m, v and x get the AdamW update of
// update_kernels.cc (torch.optim.AdamW's order of operations), with t the
// number of Adam updates applied so far.
//
// APMSqueeze switch, right after step T_w: v becomes the bias-corrected
// v_hat = v / (1 - beta2^t) and is frozen; m is kept raw (not bias
// corrected), as in the paper. Compressed stage, every later step:
//   m' = beta1 * m + (1 - beta1) * g_local        (no gradient allreduce)
//   m' = compressed_allreduce_avg(m')             (worker + server residuals)
//   x  = x * (1 - lr * wd) + (-lr) * m' / (sqrt(v_hat) + eps)
// The compressed allreduce gives every rank the same bytes, so m, v_hat and x
// stay bit-identical.
//
// Non-finite gradients: Adam steps with a communicated gradient check the
// averaged gradient (identical on every rank) and skip the update on every
// rank; the local mode checks the local gradient. The compressed stage checks
// the reduced m' (a non-finite block decodes to NaN on every rank): the step
// then keeps x and the old m, and the residuals that the call committed are
// rolled back, so the step leaves no trace but skippedSteps. A skipped step
// still counts as a step (the warmup and SlowMo schedules count calls, so
// ranks never disagree about them) but not as an Adam update.
//
// SlowMo (tau > 0) after the base update of steps tau, 2 tau, ...:
//   x_avg = allreduce_avg(x)  (full precision), or, compressed,
//   x_avg = x_prev + compressed_allreduce_avg(x - x_prev)
// (compressing the drift since the last synchronisation, not the parameters
// themselves; x_prev is identical on every rank, see step()), then
// update_kernels.cc's slowmoStep: u = beta u + (x_prev - x_avg) / lr;
// x = x_prev = x_prev - alpha lr u, exact periodic averaging for alpha = 1,
// beta = 0.
//
// A rank that refuses its step for a bad argument (refuseStep) opens the
// step with that refusal instead of kOk (Backend::exchangeStatus) when the
// step would communicate; the peers' step then fails before it changes any
// state, and every rank's step count stays where it was.
//
// bytesSent: compressed calls add the bytes the collective reports (headers
// included); full-precision allreduces add the ring volume 2 (n - 1) / n * 4N
// (an estimate: the collective does not report its bytes, and small buffers
// may take the direct algorithm).
#include "src/optim/optimizer.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "src/optim/backend.h"
#include "src/optim/host_backend.h"
#include "src/optim/state_blob.h"
#include "src/optim/update_kernels.h"

namespace squall::optim {
namespace {

bool inUnitInterval(float b) { return b >= 0.0f && b < 1.0f; }

}  // namespace

Status validateConfig(const Config& c, int64_t* warmupOut) {
  const int mode = static_cast<int>(c.mode);
  SQUALL_REQUIRE(mode >= 0 && mode <= 2, Status::kInvalidArgument, Subsys::kOptim,
                 "unknown optimizer mode %d; use squallModeApmSqueeze, squallModeSync or "
                 "squallModeLocal",
                 mode);
  SQUALL_REQUIRE(std::isfinite(c.lr) && c.lr > 0.0f, Status::kInvalidArgument, Subsys::kOptim,
                 "the learning rate is %g; it must be a finite value > 0", c.lr);
  SQUALL_REQUIRE(inUnitInterval(c.beta1), Status::kInvalidArgument, Subsys::kOptim,
                 "beta1 is %g; it must be in [0, 1)", c.beta1);
  SQUALL_REQUIRE(inUnitInterval(c.beta2), Status::kInvalidArgument, Subsys::kOptim,
                 "beta2 is %g; it must be in [0, 1)", c.beta2);
  SQUALL_REQUIRE(std::isfinite(c.eps) && c.eps > 0.0f, Status::kInvalidArgument, Subsys::kOptim,
                 "eps is %g; it must be a finite value > 0 (it keeps m / (sqrt(v) + eps) "
                 "finite where v is 0)",
                 c.eps);
  SQUALL_REQUIRE(std::isfinite(c.weightDecay) && c.weightDecay >= 0.0f, Status::kInvalidArgument,
                 Subsys::kOptim, "weightDecay is %g; it must be a finite value >= 0",
                 c.weightDecay);
  SQUALL_REQUIRE(c.slowmoTau >= 0, Status::kInvalidArgument, Subsys::kOptim,
                 "slowmoTau is %d; use 0 (SlowMo off) or a period > 0 in steps", c.slowmoTau);
  if (c.slowmoTau > 0) {
    SQUALL_REQUIRE(std::isfinite(c.slowmoAlpha) && c.slowmoAlpha > 0.0f, Status::kInvalidArgument,
                   Subsys::kOptim,
                   "slowmoAlpha is %g; it must be a finite value > 0 (1 for plain averaging)",
                   c.slowmoAlpha);
    SQUALL_REQUIRE(inUnitInterval(c.slowmoBeta), Status::kInvalidArgument, Subsys::kOptim,
                   "slowmoBeta is %g; it must be in [0, 1) (0 for plain averaging)", c.slowmoBeta);
  }
  SQUALL_REQUIRE(std::isfinite(c.maxUpdate) && c.maxUpdate >= 0.0f, Status::kInvalidArgument,
                 Subsys::kOptim,
                 "maxUpdate is %g; use 0 (the bound of full-precision Adam for these betas) or a "
                 "finite bound > 0 on |m| / (sqrt(v_hat) + eps)",
                 c.maxUpdate);
  int64_t warmup = 0;
  if (c.mode == Mode::kApmSqueeze) {
    if (c.warmupSteps >= 0) {
      warmup = c.warmupSteps;
    } else {
      SQUALL_REQUIRE(
          std::isfinite(c.warmupFraction) && c.warmupFraction >= 0.0 && c.warmupFraction <= 1.0,
          Status::kInvalidArgument, Subsys::kOptim, "warmupFraction is %g; it must be in [0, 1]",
          c.warmupFraction);
      SQUALL_REQUIRE(c.totalSteps > 0, Status::kInvalidArgument, Subsys::kOptim,
                     "warmupSteps < 0 asks for warmupFraction (%g) of totalSteps, but totalSteps "
                     "is %lld; set totalSteps to the planned number of steps or set warmupSteps",
                     c.warmupFraction, static_cast<long long>(c.totalSteps));
      warmup = std::llround(c.warmupFraction * static_cast<double>(c.totalSteps));
    }
    SQUALL_REQUIRE(warmup >= 1, Status::kInvalidArgument, Subsys::kOptim,
                   "APMSqueeze needs at least one warmup step to estimate the variance (the "
                   "resolved warmup is %lld steps)",
                   static_cast<long long>(warmup));
    SQUALL_REQUIRE(std::isfinite(c.freezeThreshold) && c.freezeThreshold >= 0.0,
                   Status::kInvalidArgument, Subsys::kOptim,
                   "freezeThreshold is %g; use 0 (the fixed warmup) or a relative change > 0 of "
                   "the variance below which the warmup ends",
                   c.freezeThreshold);
    SQUALL_REQUIRE(c.freezeThreshold == 0.0 || c.freezeWindow >= 1, Status::kInvalidArgument,
                   Subsys::kOptim,
                   "freezeWindow is %lld; the adaptive warmup compares the variance over a window "
                   "of >= 1 steps",
                   static_cast<long long>(c.freezeWindow));
  }
  if (c.mode == Mode::kApmSqueeze) {
    const auto wc = c.warmupCodec;
    SQUALL_REQUIRE(
        wc == codec::CodecId::kNone || wc == codec::CodecId::kFp16 || wc == codec::CodecId::kBf16,
        Status::kInvalidArgument, Subsys::kOptim,
        "warmupCodec is %d; the warmup averages gradients in fp32 (none), fp16 or bf16",
        static_cast<int>(wc));
  }
  const bool needCodec = c.mode == Mode::kApmSqueeze || (c.slowmoTau > 0 && c.slowmoCompressed);
  if (needCodec) SQUALL_TRY(codec::validateSpec(c.codec));

  *warmupOut = warmup;
  return Status::kOk;
}

FrozenScalars frozenScalarsOf(const Config& c, float lr) {
  return frozenScalars(lr, c.beta1, c.beta2, c.eps, c.weightDecay, c.guard, c.maxUpdate);
}

Status Optimizer::create(coll::Communicator* comm, size_t count, const Config& c,
                         std::unique_ptr<Optimizer>* out) {
  SQUALL_REQUIRE(comm != nullptr, Status::kInvalidArgument, Subsys::kOptim,
                 "the optimizer needs a communicator");
  return createOn(std::make_unique<HostBackend>(comm), count, c, out);
}

Status Optimizer::createOn(std::unique_ptr<Backend> backend, size_t count, const Config& c,
                           std::unique_ptr<Optimizer>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kOptim,
                 "the optimizer output pointer is NULL");
  SQUALL_REQUIRE(backend != nullptr, Status::kInvalidArgument, Subsys::kOptim,
                 "the optimizer needs a backend");
  int64_t warmup = 0;
  SQUALL_TRY(validateConfig(c, &warmup));
  std::unique_ptr<Optimizer> o(new Optimizer());
  Backend& b = *backend;
  o->backend_ = std::move(backend);
  o->count_ = count;
  o->config_ = c;
  o->warmupSteps_ = warmup;
  SQUALL_TRY(b.allocate(count, &o->m_));
  SQUALL_TRY(b.allocate(count, &o->v_));
  SQUALL_TRY(b.allocate(count, &o->scratch_));
  o->momentumChannel_ = c.mode == Mode::kApmSqueeze;
  if (o->momentumChannel_)
    SQUALL_TRY(b.createChannel(Channel::kMomentum, count, c.codec, c.compressedAlgo));
  if (o->adaptiveWarmup()) SQUALL_TRY(b.allocate(count, &o->vSnap_));
  o->warmupChannel_ = c.mode == Mode::kApmSqueeze && c.warmupCodec != codec::CodecId::kNone;
  if (o->warmupChannel_) {
    codec::Spec spec;
    spec.codec = c.warmupCodec;
    SQUALL_TRY(b.createChannel(Channel::kWarmup, count, spec, c.compressedAlgo));
  }
  if (c.slowmoTau > 0) {
    SQUALL_TRY(b.allocate(count, &o->xPrev_));
    SQUALL_TRY(b.allocate(count, &o->u_));
    SQUALL_TRY(b.allocate(count, &o->xAvg_));
    o->slowmoChannel_ = c.slowmoCompressed;
    if (o->slowmoChannel_)
      SQUALL_TRY(b.createChannel(Channel::kSlowmo, count, c.codec, c.compressedAlgo));
  }
  SQUALL_INFO(Subsys::kOptim,
              "optimizer (%s): mode %d, %zu parameters, warmup %lld, SlowMo tau %d, rank %d/%d",
              b.onDevice() ? "device" : "host", static_cast<int>(c.mode), count,
              static_cast<long long>(warmup), c.slowmoTau, b.rank(), b.nranks());
  *out = std::move(o);
  return Status::kOk;
}

Optimizer::~Optimizer() = default;

bool Optimizer::onDevice() const { return backend_->onDevice(); }

coll::CompressedState* Optimizer::momentumState() {
  auto* host = dynamic_cast<HostBackend*>(backend_.get());
  return host != nullptr ? host->state(Channel::kMomentum) : nullptr;
}

coll::CompressedState* Optimizer::slowmoState() {
  auto* host = dynamic_cast<HostBackend*>(backend_.get());
  return host != nullptr ? host->state(Channel::kSlowmo) : nullptr;
}

Info Optimizer::info() const {
  Info i;
  i.step = step_;
  i.phase = phase_;
  i.warmupSteps = frozenAt_ > 0 ? frozenAt_ : warmupSteps_;
  i.bytesSent = bytesSent_;
  i.skippedSteps = skipped_;
  i.varianceChange = varianceChange_;
  return i;
}

Status Optimizer::fullAverage(const float* in, float* out) {
  const int n = backend_->nranks();
  if (n == 1) return backend_->copy(out, in, count_);
  SQUALL_TRY(backend_->average(in, out, count_));
  bytesSent_ +=
      2 * static_cast<uint64_t>(n - 1) * sizeof(float) * count_ / static_cast<uint64_t>(n);
  return Status::kOk;
}

// The warmup's average through fp16 / bf16. Stateless: the residuals are
// zeroed after the call, so nothing of it enters the state blob and a step
// skipped for a non-finite gradient leaves nothing behind.
Status Optimizer::warmupAverage(const float* in, float* out) {
  if (!warmupChannel_ || backend_->nranks() == 1) return fullAverage(in, out);
  SQUALL_TRY(backend_->copy(out, in, count_));
  uint64_t bytes = 0;
  SQUALL_TRY(backend_->compressedAverage(Channel::kWarmup, out, &bytes));
  bytesSent_ += bytes;
  return backend_->resetResiduals(Channel::kWarmup);
}

Status Optimizer::compressedAverage(Channel channel, float* buffer, bool* finite) {
  SQUALL_TRY(backend_->markResiduals(channel));
  uint64_t bytes = 0;
  SQUALL_TRY(backend_->compressedAverage(channel, buffer, &bytes));
  bytesSent_ += bytes;
  SQUALL_TRY(backend_->allFinite(buffer, count_, finite));
  if (!*finite) SQUALL_TRY(backend_->restoreResiduals(channel));
  return Status::kOk;
}

Status Optimizer::adamStep(float* params, const float* grads, float lr, bool allReduce) {
  const float* g = grads;
  if (allReduce) {
    SQUALL_TRY(warmupChannel_ ? warmupAverage(grads, scratch_) : fullAverage(grads, scratch_));
    g = scratch_;
  }
  bool finite = true;
  SQUALL_TRY(backend_->allFinite(g, count_, &finite));
  if (!finite) {
    ++skipped_;
    SQUALL_WARN(Subsys::kOptim, "step %lld: non-finite %s gradient; the update is skipped",
                static_cast<long long>(step_ + 1), allReduce ? "averaged" : "local");
    return Status::kOk;
  }
  ++adamSteps_;
  const AdamScalars s =
      adamScalars(lr, config_.beta1, config_.beta2, config_.eps, config_.weightDecay, adamSteps_);
  return backend_->adamStep(count_, params, m_, v_, g, s);
}

Status Optimizer::switchToCompressed() {
  if (adamSteps_ > 0) {
    const double bc2 =
        1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(adamSteps_));
    SQUALL_TRY(backend_->scale(count_, v_, static_cast<float>(bc2)));
  } else {
    SQUALL_WARN(Subsys::kOptim, "every warmup step was skipped; the frozen variance is zero");
  }
  phase_ = Phase::kCompressed;
  frozenAt_ = step_ + 1;
  SQUALL_INFO(Subsys::kOptim,
              "APMSqueeze: variance frozen after step %lld (bound %lld, last relative change %g)",
              static_cast<long long>(frozenAt_), static_cast<long long>(warmupSteps_),
              varianceChange_);
  return Status::kOk;
}

// The adaptive warmup's test at the end of a window. v is the same on every
// rank (Adam on the averaged gradient, the same Adam update count), and the
// sums run in a fixed order (update_kernels.h), so every rank computes the
// same change and takes the same decision without communicating.
Status Optimizer::varianceSettled(bool* settled) {
  *settled = false;
  if (adamSteps_ == 0) return Status::kOk;  // nothing measured yet: no snapshot either
  const double b2 = config_.beta2;
  const double now = 1.0 / (1.0 - std::pow(b2, static_cast<double>(adamSteps_)));
  const double then =
      snapAdamSteps_ > 0 ? 1.0 / (1.0 - std::pow(b2, static_cast<double>(snapAdamSteps_))) : 0.0;
  double diff = 0.0, total = 0.0;
  SQUALL_TRY(backend_->varianceChange(count_, v_, vSnap_, now, then, &diff, &total));
  const bool compared = snapAdamSteps_ > 0 && snapAdamSteps_ < adamSteps_;
  snapAdamSteps_ = adamSteps_;
  // A zero variance (every gradient zero so far) says nothing: keep warming up.
  if (!compared || !(total > 0.0)) return Status::kOk;
  varianceChange_ = diff / total;
  *settled = varianceChange_ < config_.freezeThreshold;
  return Status::kOk;
}

Status Optimizer::compressedStep(float* params, const float* grads, float lr) {
  const float b1 = config_.beta1;
  SQUALL_TRY(backend_->momentumStep(count_, scratch_, m_, grads, b1,
                                    static_cast<float>(1.0 - static_cast<double>(b1)),
                                    config_.guard ? v_ : nullptr));
  bool finite = true;
  SQUALL_TRY(compressedAverage(Channel::kMomentum, scratch_, &finite));
  if (!finite) {
    ++skipped_;
    SQUALL_WARN(Subsys::kOptim,
                "step %lld: the compressed momentum is non-finite (a rank's gradient was); the "
                "update is skipped on every rank",
                static_cast<long long>(step_ + 1));
    return Status::kOk;
  }
  std::swap(m_, scratch_);
  return backend_->frozenStep(count_, params, m_, v_, frozenScalarsOf(config_, lr));
}

Status Optimizer::slowmoSync(float* params, float lr) {
  if (slowmoChannel_) {
    SQUALL_TRY(backend_->subtract(count_, xAvg_, params, xPrev_));
    bool finite = true;
    SQUALL_TRY(compressedAverage(Channel::kSlowmo, xAvg_, &finite));
    if (!finite) {
      SQUALL_WARN(Subsys::kOptim, "step %lld: the SlowMo average is non-finite; skipped",
                  static_cast<long long>(step_));
      return Status::kOk;
    }
    SQUALL_TRY(backend_->add(count_, xAvg_, xPrev_, xAvg_));
  } else {
    SQUALL_TRY(fullAverage(params, xAvg_));
  }
  return backend_->slowmoStep(count_, params, xPrev_, u_, xAvg_, lr, config_.slowmoAlpha,
                              config_.slowmoBeta);
}

bool Optimizer::nextStepCommunicates() const {
  if (backend_->nranks() == 1) return false;
  if (config_.mode != Mode::kLocal) return true;  // sync, APMSqueeze: every step
  if (config_.slowmoTau == 0) return false;
  return (step_ == 0 && slowmoChannel_) || (step_ + 1) % config_.slowmoTau == 0;
}

Status Optimizer::openStep(Status check) {
  return nextStepCommunicates() ? backend_->exchangeStatus(check) : check;
}

Status Optimizer::refuseStep(Status check) {
  return check == Status::kOk ? Status::kOk : openStep(check);
}

namespace {

Status checkStepArguments(size_t count, const float* params, const float* grads, float lr) {
  SQUALL_REQUIRE(count == 0 || (params != nullptr && grads != nullptr), Status::kInvalidArgument,
                 Subsys::kOptim, "the parameter or gradient pointer is NULL");
  // NaN compares false with everything, so "lr > 0 or keep the configured
  // one" alone would take a NaN for "keep" and hide the caller's bug.
  SQUALL_REQUIRE(std::isfinite(lr), Status::kInvalidArgument, Subsys::kOptim,
                 "the learning rate override is %g; pass a finite value > 0, or a value <= 0 "
                 "(such as 0) to use the configured one",
                 lr);
  return Status::kOk;
}

Status checkMemory(bool deviceStep, bool deviceState) {
  if (deviceStep == deviceState) return Status::kOk;
  return deviceState
             ? SQUALL_FAIL(Status::kInvalidUsage, Subsys::kOptim,
                           "this optimizer keeps its state in device memory and steps device "
                           "buffers; call the step on a CUDA stream (squallOptimizerStepOnStream)")
             : SQUALL_FAIL(Status::kInvalidUsage, Subsys::kOptim,
                           "this optimizer keeps its state in host memory and steps host buffers; "
                           "copy device buffers to the host around the step");
}

}  // namespace

Status Optimizer::step(float* params, const float* grads, float lr) {
  return run(params, grads, lr, false, nullptr);
}

Status Optimizer::stepOnStream(float* dParams, const float* dGrads, float lr, void* cudaStream) {
  return run(dParams, dGrads, lr, true, cudaStream);
}

Status Optimizer::run(float* params, const float* grads, float lr, bool device, void* stream) {
  Status check = checkMemory(device, backend_->onDevice());
  if (check == Status::kOk) {
    check = checkStepArguments(count_, params, grads, lr);
    if (device) backend_->setStream(stream);
  }
  SQUALL_TRY(openStep(check));
  const float rate = lr > 0.0f ? lr : config_.lr;
  if (config_.slowmoTau > 0 && step_ == 0) {
    // x_prev starts at the parameters. With compressed synchronisations it is
    // their full-precision average, so that it is identical on every rank
    // even if the ranks' initial parameters differ.
    if (slowmoChannel_) {
      SQUALL_TRY(fullAverage(params, xPrev_));
    } else {
      SQUALL_TRY(backend_->copy(xPrev_, params, count_));
    }
  }
  switch (config_.mode) {
    case Mode::kSync: SQUALL_TRY(adamStep(params, grads, rate, true)); break;
    case Mode::kLocal: SQUALL_TRY(adamStep(params, grads, rate, false)); break;
    case Mode::kApmSqueeze:
      if (phase_ == Phase::kWarmup) {
        SQUALL_TRY(adamStep(params, grads, rate, true));
        bool freeze = step_ + 1 >= warmupSteps_;
        if (!freeze && adaptiveWarmup() && (step_ + 1) % config_.freezeWindow == 0)
          SQUALL_TRY(varianceSettled(&freeze));
        if (freeze) SQUALL_TRY(switchToCompressed());
      } else {
        SQUALL_TRY(compressedStep(params, grads, rate));
      }
      break;
  }
  ++step_;
  if (config_.slowmoTau > 0 && step_ % config_.slowmoTau == 0) SQUALL_TRY(slowmoSync(params, rate));
  return Status::kOk;
}

// ---- State save / load (format in state_blob.h) ----------------------------
//
// Sections: "m", "v" (v_hat once compressed), and with APMSqueeze "worker"
// (the worker residual's first count values: the padding beyond them is never
// encoded and stays zero) and "server" (this rank's chunk); with SlowMo
// "x_prev" and "u", and when compressed "sm_worker" and "sm_server"; with
// the adaptive warmup "v_snap" (v at the end of the last window). The
// device backend stages its buffers through host memory into the same blob.

namespace {

struct Names {
  Channel channel;
  const char* worker;
  const char* server;
  const char* layout;  // present only for the hierarchical layout
};
constexpr Names kMomentumNames{Channel::kMomentum, "worker", "server", "layout"};
constexpr Names kSlowmoNames{Channel::kSlowmo, "sm_worker", "sm_server", "sm_layout"};

std::string describeLayout(const std::vector<float>& l) {
  if (l.size() != 3) return "the flat compressed allreduce";
  char text[128];
  std::snprintf(text, sizeof(text),
                "the hierarchical compressed allreduce of %d hosts x %d ranks (local index %d)",
                static_cast<int>(l[0]), static_cast<int>(l[1]), static_cast<int>(l[2]));
  return text;
}

BlobHeader stateHeader(const Config& config, size_t count, int nranks, int rank, const Info& info,
                       int64_t adamSteps) {
  BlobHeader h;
  h.count = count;
  h.nranks = nranks;
  h.rank = rank;
  h.mode = static_cast<int32_t>(config.mode);
  h.phase = static_cast<int32_t>(info.phase);
  h.step = info.step;
  h.adamSteps = adamSteps;
  h.warmupSteps = info.warmupSteps;
  h.skippedSteps = info.skippedSteps;
  h.bytesSent = info.bytesSent;
  h.lr = config.lr;
  h.beta1 = config.beta1;
  h.beta2 = config.beta2;
  h.eps = config.eps;
  h.weightDecay = config.weightDecay;
  h.slowmoTau = config.slowmoTau;
  h.slowmoAlpha = config.slowmoAlpha;
  h.slowmoBeta = config.slowmoBeta;
  h.slowmoCompressed = config.slowmoCompressed ? 1 : 0;
  h.codec = static_cast<uint32_t>(config.codec.codec);
  h.scale = static_cast<uint32_t>(config.codec.scale);
  h.block = config.codec.block;
  h.freezeWindow = config.freezeWindow;
  h.freezeThreshold = config.freezeThreshold;
  return h;
}

}  // namespace

// With `staging` null only the names and sizes are filled in (stateSize).
Status Optimizer::sections(std::vector<SectionView>* out,
                           std::vector<std::vector<float>>* staging) const {
  // One staging vector per section at most: reserved, so that the views into
  // the earlier ones stay valid.
  if (staging != nullptr) staging->reserve(kMaxSections);
  auto add = [&](const char* name, size_t n, auto&& viewOf) -> Status {
    const float* data = nullptr;
    if (staging != nullptr) {
      staging->emplace_back();
      SQUALL_TRY(viewOf(&staging->back(), &data));
    }
    out->push_back({name, data, n});
    return Status::kOk;
  };
  auto buffer = [&](const char* name, const float* b) {
    return add(name, count_, [&](std::vector<float>* s, const float** d) {
      return backend_->view(b, count_, s, d);
    });
  };
  auto residuals = [&](bool present, const Names& names) -> Status {
    if (!present) return Status::kOk;
    size_t worker = 0, server = 0;
    backend_->residualSizes(names.channel, &worker, &server);
    std::vector<float> layout;
    backend_->residualLayout(names.channel, &layout);
    if (!layout.empty()) {
      SQUALL_TRY(add(names.layout, layout.size(), [&](std::vector<float>* s, const float** d) {
        *s = layout;
        *d = s->data();
        return Status::kOk;
      }));
    }
    SQUALL_TRY(add(names.worker, worker, [&](std::vector<float>* s, const float** d) {
      return backend_->viewResidual(names.channel, false, s, d);
    }));
    return add(names.server, server, [&](std::vector<float>* s, const float** d) {
      return backend_->viewResidual(names.channel, true, s, d);
    });
  };
  SQUALL_TRY(buffer("m", m_));
  SQUALL_TRY(buffer("v", v_));
  if (vSnap_ != nullptr) SQUALL_TRY(buffer("v_snap", vSnap_));
  SQUALL_TRY(residuals(momentumChannel_, kMomentumNames));
  if (config_.slowmoTau > 0) {
    SQUALL_TRY(buffer("x_prev", xPrev_));
    SQUALL_TRY(buffer("u", u_));
  }
  return residuals(slowmoChannel_, kSlowmoNames);
}

size_t Optimizer::stateSize() const {
  std::vector<SectionView> views;
  (void)sections(&views, nullptr);  // cannot fail without staging
  return blobSize(views);
}

Status Optimizer::saveState(void* buffer, size_t capacity, size_t* written) const {
  std::vector<SectionView> views;
  std::vector<std::vector<float>> staging;
  SQUALL_TRY(sections(&views, &staging));
  BlobHeader h =
      stateHeader(config_, count_, backend_->nranks(), backend_->rank(), info(), adamSteps_);
  h.warmupSteps = warmupSteps_;  // the bound (info() gives the actual length once frozen)
  h.frozenAt = frozenAt_;
  h.snapAdamSteps = snapAdamSteps_;
  h.varianceChange = varianceChange_;
  return writeBlob(h, views, buffer, capacity, written);
}

namespace {

Status requireSection(const ParsedBlob& blob, const char* name, size_t count, const Section** out) {
  const Section* s = blob.find(name);
  if (s == nullptr)
    return SQUALL_FAIL(Status::kCorruptData, Subsys::kOptim,
                       "the optimizer state lacks its '%s' section", name);
  if (s->data.size() != count)
    return SQUALL_FAIL(Status::kCorruptData, Subsys::kOptim,
                       "section '%s' of the optimizer state holds %zu values, expected %zu", name,
                       s->data.size(), count);
  *out = s;
  return Status::kOk;
}

// Finds the residual sections of `names` in `blob`: the worker's always, the
// server's (*s) only when it can be restored (sameChunk: same group size and
// rank) and the backend keeps one, although it must be present.
Status checkResiduals(const ParsedBlob& blob, const Backend& backend, bool present,
                      const Names& names, bool sameChunk, const Section** w, const Section** s) {
  *w = *s = nullptr;
  if (!present) return Status::kOk;
  // The layout first: residuals of another layout hold other elements.
  std::vector<float> mine, saved;
  backend.residualLayout(names.channel, &mine);
  if (const Section* l = blob.find(names.layout); l != nullptr) saved = l->data;
  if (saved != mine)
    return SQUALL_FAIL(Status::kInvalidUsage, Subsys::kOptim,
                       "the optimizer state's residuals ('%s') were saved under %s, but this "
                       "optimizer runs %s; load it in a job with the same hosts and ranks per host "
                       "and the same SQUALL_HIERARCHY setting as the one that saved it",
                       names.worker, describeLayout(saved).c_str(), describeLayout(mine).c_str());
  size_t worker = 0, server = 0;
  backend.residualSizes(names.channel, &worker, &server);
  SQUALL_TRY(requireSection(blob, names.worker, worker, w));
  if (blob.find(names.server) == nullptr)
    return SQUALL_FAIL(Status::kCorruptData, Subsys::kOptim,
                       "the optimizer state lacks its '%s' section", names.server);
  if (sameChunk && server != 0) SQUALL_TRY(requireSection(blob, names.server, server, s));
  return Status::kOk;
}

bool sameSpec(const BlobHeader& h, const codec::Spec& spec) {
  return h.codec == static_cast<uint32_t>(spec.codec) &&
         h.scale == static_cast<uint32_t>(spec.scale) && h.block == spec.block;
}

Status checkStateHeader(const BlobHeader& h, const Config& config, size_t count, bool usesCodec) {
  // What must match the optimizer: a different shape or algorithm is a usage error.
  SQUALL_REQUIRE(h.count == count, Status::kInvalidUsage, Subsys::kOptim,
                 "the optimizer state was saved for %llu parameters; this optimizer has %zu",
                 static_cast<unsigned long long>(h.count), count);
  SQUALL_REQUIRE(h.mode == static_cast<int32_t>(config.mode), Status::kInvalidUsage, Subsys::kOptim,
                 "the optimizer state was saved in mode %d; this optimizer uses %d", h.mode,
                 static_cast<int>(config.mode));
  SQUALL_REQUIRE(
      h.slowmoTau == config.slowmoTau &&
          (config.slowmoTau == 0 || (h.slowmoCompressed != 0) == config.slowmoCompressed),
      Status::kInvalidUsage, Subsys::kOptim,
      "the optimizer state was saved with SlowMo tau %d (compressed %d); this "
      "optimizer has tau %d (compressed %d)",
      h.slowmoTau, h.slowmoCompressed, config.slowmoTau, config.slowmoCompressed ? 1 : 0);
  SQUALL_REQUIRE(!usesCodec || sameSpec(h, config.codec), Status::kInvalidUsage, Subsys::kOptim,
                 "the optimizer state was saved with codec %u (scale %u, block %u); this "
                 "optimizer uses codec %u (scale %u, block %u): the residuals do not carry over",
                 h.codec, h.scale, h.block, static_cast<unsigned>(config.codec.codec),
                 static_cast<unsigned>(config.codec.scale), config.codec.block);
  // What the blob must say about itself to be consistent.
  SQUALL_REQUIRE(h.nranks >= 1 && h.rank >= 0 && h.rank < h.nranks, Status::kCorruptData,
                 Subsys::kOptim, "the optimizer state names rank %d of %d", h.rank, h.nranks);
  SQUALL_REQUIRE(h.phase == 0 || (h.phase == 1 && config.mode == Mode::kApmSqueeze),
                 Status::kCorruptData, Subsys::kOptim,
                 "the optimizer state has phase %d, impossible in mode %d", h.phase, h.mode);
  SQUALL_REQUIRE(h.step >= 0 && h.adamSteps >= 0 && h.adamSteps <= h.step && h.warmupSteps >= 0 &&
                     h.skippedSteps <= static_cast<uint64_t>(h.step),
                 Status::kCorruptData, Subsys::kOptim,
                 "the optimizer state's counters are inconsistent (step %lld, Adam updates %lld, "
                 "warmup %lld, skipped %llu)",
                 static_cast<long long>(h.step), static_cast<long long>(h.adamSteps),
                 static_cast<long long>(h.warmupSteps),
                 static_cast<unsigned long long>(h.skippedSteps));
  SQUALL_REQUIRE(h.frozenAt >= 0 && h.frozenAt <= h.step && (h.phase == 1 || h.frozenAt == 0) &&
                     h.snapAdamSteps >= 0 && h.snapAdamSteps <= h.adamSteps,
                 Status::kCorruptData, Subsys::kOptim,
                 "the optimizer state's warmup fields are inconsistent (frozen after step %lld, "
                 "snapshot after %lld Adam updates, step %lld)",
                 static_cast<long long>(h.frozenAt), static_cast<long long>(h.snapAdamSteps),
                 static_cast<long long>(h.step));
  return Status::kOk;
}

}  // namespace

Status Optimizer::loadState(const void* buffer, size_t bytes) {
  ParsedBlob blob;
  SQUALL_TRY(parseBlob(buffer, bytes, &blob));
  const BlobHeader& h = blob.header;
  const bool usesCodec = momentumChannel_ || slowmoChannel_;
  SQUALL_TRY(checkStateHeader(h, config_, count_, usesCodec));
  const int nranks = backend_->nranks(), rank = backend_->rank();
  const bool sameChunk = h.nranks == nranks && h.rank == rank;
  const Section *m = nullptr, *v = nullptr, *xPrev = nullptr, *u = nullptr, *snap = nullptr;
  const Section *w = nullptr, *s = nullptr, *smw = nullptr, *sms = nullptr;
  SQUALL_TRY(requireSection(blob, "m", count_, &m));
  SQUALL_TRY(requireSection(blob, "v", count_, &v));
  // A state saved without the adaptive warmup (or by version 1) has no
  // snapshot: the measurement restarts at the next window end.
  if (vSnap_ != nullptr && blob.find("v_snap") != nullptr)
    SQUALL_TRY(requireSection(blob, "v_snap", count_, &snap));
  SQUALL_TRY(checkResiduals(blob, *backend_, momentumChannel_, kMomentumNames, sameChunk, &w, &s));
  if (config_.slowmoTau > 0) {
    SQUALL_TRY(requireSection(blob, "x_prev", count_, &xPrev));
    SQUALL_TRY(requireSection(blob, "u", count_, &u));
  }
  SQUALL_TRY(checkResiduals(blob, *backend_, slowmoChannel_, kSlowmoNames, sameChunk, &smw, &sms));

  // Accepted. Tell about what does not carry over or differs.
  if (!sameChunk && usesCodec) {
    if (h.nranks != nranks)
      SQUALL_WARN(Subsys::kOptim, "server residual reset: saved with %d ranks, loading into %d",
                  h.nranks, nranks);
    else
      SQUALL_WARN(Subsys::kOptim, "server residual reset: saved by rank %d, loading on rank %d",
                  h.rank, rank);
  }
  if (h.lr != config_.lr || h.beta1 != config_.beta1 || h.beta2 != config_.beta2 ||
      h.eps != config_.eps || h.weightDecay != config_.weightDecay ||
      (config_.slowmoTau > 0 &&
       (h.slowmoAlpha != config_.slowmoAlpha || h.slowmoBeta != config_.slowmoBeta)))
    SQUALL_WARN(Subsys::kOptim,
                "the optimizer state was saved with other hyper-parameters (lr %g, betas %g %g, "
                "eps %g, weight decay %g); continuing with this optimizer's",
                h.lr, h.beta1, h.beta2, h.eps, h.weightDecay);
  if (config_.mode == Mode::kApmSqueeze && h.version >= 2 &&
      (h.freezeThreshold != config_.freezeThreshold || h.freezeWindow != config_.freezeWindow))
    SQUALL_WARN(Subsys::kOptim,
                "the optimizer state was saved with the adaptive warmup at threshold %g, window "
                "%lld; continuing with this optimizer's (%g, %lld)",
                h.freezeThreshold, static_cast<long long>(h.freezeWindow), config_.freezeThreshold,
                static_cast<long long>(config_.freezeWindow));
  if (config_.mode == Mode::kApmSqueeze && h.warmupSteps != warmupSteps_)
    SQUALL_WARN(Subsys::kOptim,
                "the optimizer state was saved with %lld warmup steps; this optimizer resolved "
                "%lld; the saved schedule is kept",
                static_cast<long long>(h.warmupSteps), static_cast<long long>(warmupSteps_));

  SQUALL_TRY(backend_->upload(m_, m->data.data(), count_));
  SQUALL_TRY(backend_->upload(v_, v->data.data(), count_));
  if (vSnap_ != nullptr && snap != nullptr)
    SQUALL_TRY(backend_->upload(vSnap_, snap->data.data(), count_));
  if (momentumChannel_)
    SQUALL_TRY(backend_->loadResiduals(Channel::kMomentum, w->data.data(),
                                       s != nullptr ? s->data.data() : nullptr));
  if (config_.slowmoTau > 0) {
    SQUALL_TRY(backend_->upload(xPrev_, xPrev->data.data(), count_));
    SQUALL_TRY(backend_->upload(u_, u->data.data(), count_));
  }
  if (slowmoChannel_)
    SQUALL_TRY(backend_->loadResiduals(Channel::kSlowmo, smw->data.data(),
                                       sms != nullptr ? sms->data.data() : nullptr));
  if (config_.mode == Mode::kApmSqueeze) warmupSteps_ = h.warmupSteps;
  phase_ = static_cast<Phase>(h.phase);
  // Version 1 froze at the bound, always.
  frozenAt_ = phase_ == Phase::kCompressed ? (h.frozenAt > 0 ? h.frozenAt : h.warmupSteps) : 0;
  snapAdamSteps_ = snap != nullptr ? h.snapAdamSteps : 0;
  varianceChange_ = h.varianceChange;
  step_ = h.step;
  adamSteps_ = h.adamSteps;
  skipped_ = h.skippedSteps;
  bytesSent_ = h.bytesSent;
  return Status::kOk;
}

}  // namespace squall::optim
