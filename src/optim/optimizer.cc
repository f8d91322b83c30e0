// The optimizer state machine over one flat fp32 buffer.
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
// bytesSent: compressed calls add the bytes the collective reports (headers
// included); full-precision allreduces add the ring volume 2 (n - 1) / n * 4N
// (an estimate: the collective does not report its bytes, and small buffers
// may take the direct algorithm).
#include "src/optim/optimizer.h"

#include <cmath>
#include <cstring>

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
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kOptim,
                 "the optimizer output pointer is NULL");
  int64_t warmup = 0;
  SQUALL_TRY(validateConfig(c, &warmup));
  const int mode = static_cast<int>(c.mode);
  std::unique_ptr<Optimizer> o(new Optimizer());
  o->comm_ = comm;
  o->count_ = count;
  o->config_ = c;
  o->warmupSteps_ = warmup;
  o->m_.assign(count, 0.0f);
  o->v_.assign(count, 0.0f);
  o->scratch_.assign(count, 0.0f);
  if (c.mode == Mode::kApmSqueeze)
    SQUALL_TRY(coll::CompressedState::create(comm->size(), count, c.codec, &o->momentum_));
  if (c.slowmoTau > 0) {
    o->xPrev_.assign(count, 0.0f);
    o->u_.assign(count, 0.0f);
    o->xAvg_.assign(count, 0.0f);
    if (c.slowmoCompressed)
      SQUALL_TRY(coll::CompressedState::create(comm->size(), count, c.codec, &o->slowmoState_));
  }
  SQUALL_INFO(Subsys::kOptim, "optimizer: mode %d, %zu parameters, warmup %lld, SlowMo tau %d",
              mode, count, static_cast<long long>(warmup), c.slowmoTau);
  *out = std::move(o);
  return Status::kOk;
}

Info Optimizer::info() const {
  Info i;
  i.step = step_;
  i.phase = phase_;
  i.warmupSteps = warmupSteps_;
  i.bytesSent = bytesSent_;
  i.skippedSteps = skipped_;
  return i;
}

Status Optimizer::fullAverage(const float* in, float* out) {
  const int n = comm_->size();
  if (n == 1) {
    if (in != out && count_ != 0) std::memcpy(out, in, count_ * sizeof(float));
    return Status::kOk;
  }
  SQUALL_TRY(comm_->allReduce(in, out, count_, DataType::kF32, ReduceOp::kAvg));
  bytesSent_ +=
      2 * static_cast<uint64_t>(n - 1) * sizeof(float) * count_ / static_cast<uint64_t>(n);
  return Status::kOk;
}

Status Optimizer::compressedAverage(coll::CompressedState* state, float* buffer, bool* finite) {
  const float* workerBefore = state->worker().current();
  const float* serverBefore = state->server().current();
  SQUALL_TRY(comm_->compressedAllReduce(buffer, buffer, DataType::kF32, ReduceOp::kAvg, state));
  bytesSent_ += state->lastStats().bytesSent;
  *finite = allFinite(buffer, count_);
  if (!*finite) {
    // The residuals are double-buffered and a commit flips them: flipping
    // again restores the previous residual, which the call did not touch.
    if (state->worker().current() != workerBefore) state->worker().commit(true);
    if (state->server().current() != serverBefore) state->server().commit(true);
  }
  return Status::kOk;
}

Status Optimizer::adamStep(float* params, const float* grads, float lr, bool allReduce) {
  const float* g = grads;
  if (allReduce) {
    SQUALL_TRY(fullAverage(grads, scratch_.data()));
    g = scratch_.data();
  }
  if (!allFinite(g, count_)) {
    ++skipped_;
    SQUALL_WARN(Subsys::kOptim, "step %lld: non-finite %s gradient; the update is skipped",
                static_cast<long long>(step_ + 1), allReduce ? "averaged" : "local");
    return Status::kOk;
  }
  ++adamSteps_;
  const AdamScalars s =
      adamScalars(lr, config_.beta1, config_.beta2, config_.eps, config_.weightDecay, adamSteps_);
  optim::adamStep(count_, params, m_.data(), v_.data(), g, s);
  return Status::kOk;
}

void Optimizer::switchToCompressed() {
  if (adamSteps_ > 0) {
    const double bc2 =
        1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(adamSteps_));
    scale(count_, v_.data(), static_cast<float>(bc2));
  } else {
    SQUALL_WARN(Subsys::kOptim, "every warmup step was skipped; the frozen variance is zero");
  }
  phase_ = Phase::kCompressed;
  SQUALL_INFO(Subsys::kOptim, "APMSqueeze: variance frozen after step %lld",
              static_cast<long long>(step_ + 1));
}

Status Optimizer::compressedStep(float* params, const float* grads, float lr) {
  const float b1 = config_.beta1;
  momentumStep(count_, scratch_.data(), m_.data(), grads, b1,
               static_cast<float>(1.0 - static_cast<double>(b1)),
               config_.guard ? v_.data() : nullptr);
  bool finite = true;
  SQUALL_TRY(compressedAverage(momentum_.get(), scratch_.data(), &finite));
  if (!finite) {
    ++skipped_;
    SQUALL_WARN(Subsys::kOptim,
                "step %lld: the compressed momentum is non-finite (a rank's gradient was); the "
                "update is skipped on every rank",
                static_cast<long long>(step_ + 1));
    return Status::kOk;
  }
  m_.swap(scratch_);
  frozenStep(count_, params, m_.data(), v_.data(), frozenScalarsOf(config_, lr));
  return Status::kOk;
}

Status Optimizer::slowmoSync(float* params, float lr) {
  if (slowmoState_ != nullptr) {
    for (size_t i = 0; i < count_; ++i) xAvg_[i] = params[i] - xPrev_[i];
    bool finite = true;
    SQUALL_TRY(compressedAverage(slowmoState_.get(), xAvg_.data(), &finite));
    if (!finite) {
      SQUALL_WARN(Subsys::kOptim, "step %lld: the SlowMo average is non-finite; skipped",
                  static_cast<long long>(step_));
      return Status::kOk;
    }
    for (size_t i = 0; i < count_; ++i) xAvg_[i] = xPrev_[i] + xAvg_[i];
  } else {
    SQUALL_TRY(fullAverage(params, xAvg_.data()));
  }
  slowmoStep(count_, params, xPrev_.data(), u_.data(), xAvg_.data(), lr, config_.slowmoAlpha,
             config_.slowmoBeta);
  return Status::kOk;
}

bool Optimizer::nextStepCommunicates() const {
  if (comm_->size() == 1) return false;
  if (config_.mode != Mode::kLocal) return true;  // sync, APMSqueeze: every step
  if (config_.slowmoTau == 0) return false;
  return (step_ == 0 && slowmoState_ != nullptr) || (step_ + 1) % config_.slowmoTau == 0;
}

Status Optimizer::refuseStep(Status check) {
  return check != Status::kOk && nextStepCommunicates() ? comm_->refuse(check) : check;
}

namespace {

Status checkStepArguments(size_t count, const float* params, const float* grads, float lr) {
  SQUALL_REQUIRE(count == 0 || (params != nullptr && grads != nullptr), Status::kInvalidArgument,
                 Subsys::kOptim, "the parameter or gradient pointer is NULL");
  SQUALL_REQUIRE(!(lr > 0.0f) || std::isfinite(lr), Status::kInvalidArgument, Subsys::kOptim,
                 "the learning rate override is %g; pass a finite value > 0, or <= 0 to use the "
                 "configured one",
                 lr);
  return Status::kOk;
}

}  // namespace

Status Optimizer::step(float* params, const float* grads, float lr) {
  SQUALL_TRY(refuseStep(checkStepArguments(count_, params, grads, lr)));
  const float rate = lr > 0.0f ? lr : config_.lr;
  if (config_.slowmoTau > 0 && step_ == 0) {
    // x_prev starts at the parameters. With compressed synchronisations it is
    // their full-precision average, so that it is identical on every rank
    // even if the ranks' initial parameters differ.
    if (slowmoState_ != nullptr) {
      SQUALL_TRY(fullAverage(params, xPrev_.data()));
    } else if (count_ != 0) {
      std::memcpy(xPrev_.data(), params, count_ * sizeof(float));
    }
  }
  switch (config_.mode) {
    case Mode::kSync: SQUALL_TRY(adamStep(params, grads, rate, true)); break;
    case Mode::kLocal: SQUALL_TRY(adamStep(params, grads, rate, false)); break;
    case Mode::kApmSqueeze:
      if (phase_ == Phase::kWarmup) {
        SQUALL_TRY(adamStep(params, grads, rate, true));
        if (step_ + 1 >= warmupSteps_) switchToCompressed();
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
// "x_prev" and "u", and when compressed "sm_worker" and "sm_server".

namespace {

void addResidualSections(coll::CompressedState* state, const char* worker, const char* server,
                         size_t count, std::vector<SectionView>* out) {
  if (state == nullptr) return;
  out->push_back({worker, state->worker().current(), count});
  out->push_back({server, state->server().current(), state->chunk()});
}

}  // namespace

std::vector<SectionView> Optimizer::sections() const {
  // CompressedState hands out its residuals through non-const accessors only;
  // nothing here writes through them.
  auto* self = const_cast<Optimizer*>(this);
  std::vector<SectionView> out{{"m", m_.data(), count_}, {"v", v_.data(), count_}};
  addResidualSections(self->momentum_.get(), "worker", "server", count_, &out);
  if (config_.slowmoTau > 0) {
    out.push_back({"x_prev", xPrev_.data(), count_});
    out.push_back({"u", u_.data(), count_});
  }
  addResidualSections(self->slowmoState_.get(), "sm_worker", "sm_server", count_, &out);
  return out;
}

size_t Optimizer::stateSize() const { return blobSize(sections()); }

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
  return h;
}

Status Optimizer::saveState(void* buffer, size_t capacity, size_t* written) const {
  return writeBlob(stateHeader(config_, count_, comm_->size(), comm_->rank(), info(), adamSteps_),
                   sections(), buffer, capacity, written);
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

// Checks the residual sections of `state` in `blob`; sets *keepServer to
// whether the server residual can be restored (same group size and rank).
Status checkResiduals(const ParsedBlob& blob, coll::CompressedState* state, const char* worker,
                      const char* server, size_t count, bool sameChunk, const Section** w,
                      const Section** s) {
  *w = *s = nullptr;
  if (state == nullptr) return Status::kOk;
  SQUALL_TRY(requireSection(blob, worker, count, w));
  const Section* found = blob.find(server);
  if (found == nullptr)
    return SQUALL_FAIL(Status::kCorruptData, Subsys::kOptim,
                       "the optimizer state lacks its '%s' section", server);
  if (sameChunk) SQUALL_TRY(requireSection(blob, server, state->chunk(), s));
  return Status::kOk;
}

void restoreResiduals(coll::CompressedState* state, const Section* w, const Section* s) {
  if (state == nullptr) return;
  state->reset();
  if (!w->data.empty())
    std::memcpy(state->worker().current(), w->data.data(), w->data.size() * sizeof(float));
  if (s != nullptr && !s->data.empty())
    std::memcpy(state->server().current(), s->data.data(), s->data.size() * sizeof(float));
}

bool sameSpec(const BlobHeader& h, const codec::Spec& spec) {
  return h.codec == static_cast<uint32_t>(spec.codec) &&
         h.scale == static_cast<uint32_t>(spec.scale) && h.block == spec.block;
}

}  // namespace

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
  return Status::kOk;
}

Status Optimizer::loadState(const void* buffer, size_t bytes) {
  ParsedBlob blob;
  SQUALL_TRY(parseBlob(buffer, bytes, &blob));
  const BlobHeader& h = blob.header;
  const bool usesCodec = momentum_ != nullptr || slowmoState_ != nullptr;
  SQUALL_TRY(checkStateHeader(h, config_, count_, usesCodec));
  const bool sameChunk = h.nranks == comm_->size() && h.rank == comm_->rank();
  const Section *m = nullptr, *v = nullptr, *xPrev = nullptr, *u = nullptr;
  const Section *w = nullptr, *s = nullptr, *smw = nullptr, *sms = nullptr;
  SQUALL_TRY(requireSection(blob, "m", count_, &m));
  SQUALL_TRY(requireSection(blob, "v", count_, &v));
  SQUALL_TRY(checkResiduals(blob, momentum_.get(), "worker", "server", count_, sameChunk, &w, &s));
  if (config_.slowmoTau > 0) {
    SQUALL_TRY(requireSection(blob, "x_prev", count_, &xPrev));
    SQUALL_TRY(requireSection(blob, "u", count_, &u));
  }
  SQUALL_TRY(checkResiduals(blob, slowmoState_.get(), "sm_worker", "sm_server", count_, sameChunk,
                            &smw, &sms));

  // Accepted. Tell about what does not carry over or differs.
  if (!sameChunk && (momentum_ != nullptr || slowmoState_ != nullptr)) {
    if (h.nranks != comm_->size())
      SQUALL_WARN(Subsys::kOptim, "server residual reset: saved with %d ranks, loading into %d",
                  h.nranks, comm_->size());
    else
      SQUALL_WARN(Subsys::kOptim, "server residual reset: saved by rank %d, loading on rank %d",
                  h.rank, comm_->rank());
  }
  if (h.lr != config_.lr || h.beta1 != config_.beta1 || h.beta2 != config_.beta2 ||
      h.eps != config_.eps || h.weightDecay != config_.weightDecay ||
      (config_.slowmoTau > 0 &&
       (h.slowmoAlpha != config_.slowmoAlpha || h.slowmoBeta != config_.slowmoBeta)))
    SQUALL_WARN(Subsys::kOptim,
                "the optimizer state was saved with other hyper-parameters (lr %g, betas %g %g, "
                "eps %g, weight decay %g); continuing with this optimizer's",
                h.lr, h.beta1, h.beta2, h.eps, h.weightDecay);
  if (config_.mode == Mode::kApmSqueeze && h.warmupSteps != warmupSteps_)
    SQUALL_WARN(Subsys::kOptim,
                "the optimizer state was saved with %lld warmup steps; this optimizer resolved "
                "%lld; the saved schedule is kept",
                static_cast<long long>(h.warmupSteps), static_cast<long long>(warmupSteps_));

  std::memcpy(m_.data(), m->data.data(), count_ * sizeof(float));
  std::memcpy(v_.data(), v->data.data(), count_ * sizeof(float));
  restoreResiduals(momentum_.get(), w, s);
  if (config_.slowmoTau > 0) {
    std::memcpy(xPrev_.data(), xPrev->data.data(), count_ * sizeof(float));
    std::memcpy(u_.data(), u->data.data(), count_ * sizeof(float));
  }
  restoreResiduals(slowmoState_.get(), smw, sms);
  if (config_.mode == Mode::kApmSqueeze) warmupSteps_ = h.warmupSteps;
  phase_ = static_cast<Phase>(h.phase);
  step_ = h.step;
  adamSteps_ = h.adamSteps;
  skipped_ = h.skippedSteps;
  bytesSent_ = h.bytesSent;
  return Status::kOk;
}

}  // namespace squall::optim
