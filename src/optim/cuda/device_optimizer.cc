// The device optimizer (device_optimizer.h): optimizer.cc's state machine with
// device buffers, NCCL and the kernels of update_kernels.cu. Each method
// mirrors the host method of the same name; comments here only note where
// the device path differs.
//
// Compiled by the host compiler against the CUDA runtime and NCCL, or against
// the CPU emulation of both in tests/gpu/emu for the logic tests.
#include "src/optim/cuda/device_optimizer.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "src/common/cuda_status.h"
#include "src/optim/cuda/update_kernels_cuda.h"
#include "src/optim/state_blob.h"

namespace squall::optim::cuda {
namespace {

Status allocZero(float** p, size_t count) {
  void* raw = nullptr;
  const size_t bytes = (count == 0 ? 1 : count) * sizeof(float);
  SQUALL_CUDA_TRY(cudaMalloc(&raw, bytes));
  *p = static_cast<float*>(raw);
  SQUALL_CUDA_TRY(cudaMemset(raw, 0, bytes));
  return Status::kOk;
}

Status copy(void* dst, const void* src, size_t floats, cudaMemcpyKind kind, cudaStream_t s) {
  if (floats == 0 || dst == src) return Status::kOk;
  SQUALL_CUDA_TRY(cudaMemcpyAsync(dst, src, floats * sizeof(float), kind, s));
  return Status::kOk;
}

}  // namespace

Status DeviceOptimizer::create(const transport::nccl::DeviceComm& comm, size_t count,
                               const Config& c, std::unique_ptr<DeviceOptimizer>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kOptim,
                 "the optimizer output pointer is NULL");
  const int nranks = comm.size();
  const int rank = comm.rank();
  SQUALL_REQUIRE(nranks >= 1 && comm.handle() != nullptr, Status::kInvalidArgument, Subsys::kOptim,
                 "the device optimizer needs an NCCL communicator");
  int64_t warmup = 0;
  SQUALL_TRY(validateConfig(c, &warmup));
  std::unique_ptr<DeviceOptimizer> o(new DeviceOptimizer());
  o->comm_ = comm;
  o->nranks_ = nranks;
  o->rank_ = rank;
  o->count_ = count;
  o->config_ = c;
  o->warmupSteps_ = warmup;
  SQUALL_TRY(allocZero(&o->m_, count));
  SQUALL_TRY(allocZero(&o->v_, count));
  SQUALL_TRY(allocZero(&o->scratch_, count));
  void* flag = nullptr;
  SQUALL_CUDA_TRY(cudaMalloc(&flag, 8 * sizeof(int)));
  o->flag_ = static_cast<int*>(flag);
  SQUALL_CUDA_TRY(cudaMemset(flag, 0, 8 * sizeof(int)));
  if (c.mode == Mode::kApmSqueeze)
    SQUALL_TRY(
        coll::device::DeviceCompressedState::create(nranks, rank, count, c.codec, &o->momentum_));
  if (c.slowmoTau > 0) {
    SQUALL_TRY(allocZero(&o->xPrev_, count));
    SQUALL_TRY(allocZero(&o->u_, count));
    SQUALL_TRY(allocZero(&o->xAvg_, count));
    if (c.slowmoCompressed)
      SQUALL_TRY(coll::device::DeviceCompressedState::create(nranks, rank, count, c.codec,
                                                             &o->slowmoState_));
  }
  SQUALL_INFO(Subsys::kOptim,
              "device optimizer: mode %d, %zu parameters, warmup %lld, SlowMo tau %d, rank %d/%d",
              static_cast<int>(c.mode), count, static_cast<long long>(warmup), c.slowmoTau, rank,
              nranks);
  *out = std::move(o);
  return Status::kOk;
}

DeviceOptimizer::~DeviceOptimizer() {
  momentum_.reset();
  slowmoState_.reset();
  for (float* p : {m_, v_, scratch_, xPrev_, u_, xAvg_}) cudaFree(p);
  cudaFree(flag_);
}

Info DeviceOptimizer::info() const {
  Info i;
  i.step = step_;
  i.phase = phase_;
  i.warmupSteps = warmupSteps_;
  i.bytesSent = bytesSent_;
  i.skippedSteps = skipped_;
  return i;
}

Status DeviceOptimizer::fullAverage(const float* in, float* out, cudaStream_t s) {
  const int n = nranks_;
  if (n == 1) return copy(out, in, count_, cudaMemcpyDeviceToDevice, s);
  if (count_ == 0) return Status::kOk;
  // Sum, then divide on the device: the host collectives' avg (finishAverage).
  SQUALL_TRY(comm_.allReduceSum(in, out, count_, DataType::kF32, s));
  SQUALL_TRY(divide(count_, out, static_cast<float>(n), s));
  bytesSent_ +=
      2 * static_cast<uint64_t>(n - 1) * sizeof(float) * count_ / static_cast<uint64_t>(n);
  return Status::kOk;
}

Status DeviceOptimizer::readFlag(const float* data, bool* finite, cudaStream_t s) {
  int host = 0;
  SQUALL_CUDA_TRY(cudaMemsetAsync(flag_, 0, sizeof(int), s));
  SQUALL_TRY(flagNonFinite(count_, data, flag_, s));
  SQUALL_CUDA_TRY(cudaMemcpyAsync(&host, flag_, sizeof(int), cudaMemcpyDeviceToHost, s));
  // The one host wait of a step: the skip decision (and the Adam step count
  // that the next step's bias correction uses) is taken on the host.
  SQUALL_CUDA_TRY(cudaStreamSynchronize(s));
  *finite = host == 0;
  return Status::kOk;
}

Status DeviceOptimizer::compressedAverage(coll::device::DeviceCompressedState* state, float* buffer,
                                          bool* finite, cudaStream_t s) {
  // The residuals' current indices before the call (device to device), so that
  // a non-finite result can restore them: the call writes only the buffers
  // that are not current, so the restored residuals are those before the call.
  const codec::DeviceResidual* worker = state->worker();
  const codec::DeviceResidual* server = state->server();
  if (worker != nullptr)
    SQUALL_CUDA_TRY(
        cudaMemcpyAsync(flag_ + 1, worker->control, sizeof(int), cudaMemcpyDeviceToDevice, s));
  if (server != nullptr)
    SQUALL_CUDA_TRY(
        cudaMemcpyAsync(flag_ + 2, server->control, sizeof(int), cudaMemcpyDeviceToDevice, s));
  SQUALL_TRY(coll::device::compressedAllReduce(comm_, s, buffer, buffer, DataType::kF32,
                                               ReduceOp::kAvg, state));
  bytesSent_ += state->bytesSent();
  SQUALL_TRY(readFlag(buffer, finite, s));
  if (!*finite) {
    if (worker != nullptr)
      SQUALL_CUDA_TRY(
          cudaMemcpyAsync(worker->control, flag_ + 1, sizeof(int), cudaMemcpyDeviceToDevice, s));
    if (server != nullptr)
      SQUALL_CUDA_TRY(
          cudaMemcpyAsync(server->control, flag_ + 2, sizeof(int), cudaMemcpyDeviceToDevice, s));
  }
  return Status::kOk;
}

Status DeviceOptimizer::adamStep(float* x, const float* g, float lr, bool allReduce,
                                 cudaStream_t s) {
  const float* grad = g;
  if (allReduce) {
    SQUALL_TRY(fullAverage(g, scratch_, s));
    grad = scratch_;
  }
  bool finite = true;
  SQUALL_TRY(readFlag(grad, &finite, s));
  if (!finite) {
    ++skipped_;
    SQUALL_WARN(Subsys::kOptim, "step %lld: non-finite %s gradient; the update is skipped",
                static_cast<long long>(step_ + 1), allReduce ? "averaged" : "local");
    return Status::kOk;
  }
  ++adamSteps_;
  const AdamScalars sc =
      adamScalars(lr, config_.beta1, config_.beta2, config_.eps, config_.weightDecay, adamSteps_);
  return cuda::adamStep(count_, x, m_, v_, grad, sc, s);
}

Status DeviceOptimizer::switchToCompressed(cudaStream_t s) {
  if (adamSteps_ > 0) {
    const double bc2 =
        1.0 - std::pow(static_cast<double>(config_.beta2), static_cast<double>(adamSteps_));
    SQUALL_TRY(scale(count_, v_, static_cast<float>(bc2), s));
  } else {
    SQUALL_WARN(Subsys::kOptim, "every warmup step was skipped; the frozen variance is zero");
  }
  phase_ = Phase::kCompressed;
  SQUALL_INFO(Subsys::kOptim, "APMSqueeze (device): variance frozen after step %lld",
              static_cast<long long>(step_ + 1));
  return Status::kOk;
}

Status DeviceOptimizer::compressedStep(float* x, const float* g, float lr, cudaStream_t s) {
  const float b1 = config_.beta1;
  SQUALL_TRY(momentumStep(count_, scratch_, m_, g, b1,
                          static_cast<float>(1.0 - static_cast<double>(b1)),
                          config_.guard ? v_ : nullptr, s));
  bool finite = true;
  SQUALL_TRY(compressedAverage(momentum_.get(), scratch_, &finite, s));
  if (!finite) {
    ++skipped_;
    SQUALL_WARN(Subsys::kOptim,
                "step %lld: the compressed momentum is non-finite (a rank's gradient was); the "
                "update is skipped on every rank",
                static_cast<long long>(step_ + 1));
    return Status::kOk;
  }
  std::swap(m_, scratch_);
  return frozenStep(count_, x, m_, v_, frozenScalarsOf(config_, lr), s);
}

Status DeviceOptimizer::slowmoSync(float* x, float lr, cudaStream_t s) {
  if (slowmoState_ != nullptr) {
    SQUALL_TRY(subtract(count_, xAvg_, x, xPrev_, s));
    bool finite = true;
    SQUALL_TRY(compressedAverage(slowmoState_.get(), xAvg_, &finite, s));
    if (!finite) {
      SQUALL_WARN(Subsys::kOptim, "step %lld: the SlowMo average is non-finite; skipped",
                  static_cast<long long>(step_));
      return Status::kOk;
    }
    SQUALL_TRY(add(count_, xAvg_, xPrev_, xAvg_, s));
  } else {
    SQUALL_TRY(fullAverage(x, xAvg_, s));
  }
  return slowmoStep(count_, x, xPrev_, u_, xAvg_, lr, config_.slowmoAlpha, config_.slowmoBeta, s);
}

Status DeviceOptimizer::step(float* x, const float* g, float lr, cudaStream_t s) {
  SQUALL_REQUIRE(count_ == 0 || (x != nullptr && g != nullptr), Status::kInvalidArgument,
                 Subsys::kOptim, "the parameter or gradient pointer is NULL");
  SQUALL_REQUIRE(!(lr > 0.0f) || std::isfinite(lr), Status::kInvalidArgument, Subsys::kOptim,
                 "the learning rate override is %g; pass a finite value > 0, or <= 0 to use the "
                 "configured one",
                 lr);
  lastStream_ = s;
  const float rate = lr > 0.0f ? lr : config_.lr;
  if (config_.slowmoTau > 0 && step_ == 0) {
    if (slowmoState_ != nullptr) {
      SQUALL_TRY(fullAverage(x, xPrev_, s));
    } else {
      SQUALL_TRY(copy(xPrev_, x, count_, cudaMemcpyDeviceToDevice, s));
    }
  }
  switch (config_.mode) {
    case Mode::kSync: SQUALL_TRY(adamStep(x, g, rate, true, s)); break;
    case Mode::kLocal: SQUALL_TRY(adamStep(x, g, rate, false, s)); break;
    case Mode::kApmSqueeze:
      if (phase_ == Phase::kWarmup) {
        SQUALL_TRY(adamStep(x, g, rate, true, s));
        if (step_ + 1 >= warmupSteps_) SQUALL_TRY(switchToCompressed(s));
      } else {
        SQUALL_TRY(compressedStep(x, g, rate, s));
      }
      break;
  }
  ++step_;
  if (config_.slowmoTau > 0 && step_ % config_.slowmoTau == 0) SQUALL_TRY(slowmoSync(x, rate, s));
  return Status::kOk;
}

// ---- State save / load: the sections of optimizer.cc, staged through host
// memory (synchronous: cudaMemcpy after the last stream's work).

Status DeviceOptimizer::stageResidual(const codec::DeviceResidual* r, size_t n,
                                      std::vector<float>* out) {
  const float* current = nullptr;
  SQUALL_TRY(codec::cudaResidualCurrent(*r, lastStream_, &current));
  out->assign(n, 0.0f);
  if (n != 0)
    SQUALL_CUDA_TRY(cudaMemcpy(out->data(), current, n * sizeof(float), cudaMemcpyDeviceToHost));
  return Status::kOk;
}

Status DeviceOptimizer::restoreResidual(const codec::DeviceResidual* r, const float* data,
                                        size_t n) {
  SQUALL_TRY(codec::cudaResidualReset(*r, lastStream_));
  SQUALL_CUDA_TRY(cudaStreamSynchronize(lastStream_));
  if (data != nullptr && n != 0)  // after a reset buffer 0 is current
    SQUALL_CUDA_TRY(cudaMemcpy(r->buf[0], data, n * sizeof(float), cudaMemcpyHostToDevice));
  return Status::kOk;
}

size_t DeviceOptimizer::stateSize() const {
  // Only the section sizes matter for the size.
  std::vector<SectionView> v{{"m", nullptr, count_}, {"v", nullptr, count_}};
  auto residuals = [&](const coll::device::DeviceCompressedState* st, const char* w,
                       const char* sv) {
    if (st == nullptr) return;
    v.push_back({w, nullptr, count_});
    v.push_back({sv, nullptr, st->worker() != nullptr ? st->chunk() : 0});
  };
  residuals(momentum_.get(), "worker", "server");
  if (config_.slowmoTau > 0) {
    v.push_back({"x_prev", nullptr, count_});
    v.push_back({"u", nullptr, count_});
  }
  residuals(slowmoState_.get(), "sm_worker", "sm_server");
  return blobSize(v);
}

Status DeviceOptimizer::saveState(void* buffer, size_t capacity, size_t* written) {
  SQUALL_CUDA_TRY(cudaStreamSynchronize(lastStream_));
  std::vector<std::vector<float>> host;
  host.reserve(8);
  std::vector<SectionView> sections;
  auto stage = [&](const char* name, const float* d) -> Status {
    host.emplace_back(count_, 0.0f);
    if (count_ != 0)
      SQUALL_CUDA_TRY(
          cudaMemcpy(host.back().data(), d, count_ * sizeof(float), cudaMemcpyDeviceToHost));
    sections.push_back({name, host.back().data(), count_});
    return Status::kOk;
  };
  auto residuals = [&](const coll::device::DeviceCompressedState* st, const char* w,
                       const char* sv) -> Status {
    if (st == nullptr) return Status::kOk;
    host.emplace_back();
    if (st->worker() != nullptr) SQUALL_TRY(stageResidual(st->worker(), count_, &host.back()));
    host.back().resize(count_, 0.0f);
    sections.push_back({w, host.back().data(), count_});
    host.emplace_back();
    if (st->server() != nullptr) SQUALL_TRY(stageResidual(st->server(), st->chunk(), &host.back()));
    sections.push_back({sv, host.back().data(), host.back().size()});
    return Status::kOk;
  };
  SQUALL_TRY(stage("m", m_));
  SQUALL_TRY(stage("v", v_));
  SQUALL_TRY(residuals(momentum_.get(), "worker", "server"));
  if (config_.slowmoTau > 0) {
    SQUALL_TRY(stage("x_prev", xPrev_));
    SQUALL_TRY(stage("u", u_));
  }
  SQUALL_TRY(residuals(slowmoState_.get(), "sm_worker", "sm_server"));
  return writeBlob(stateHeader(config_, count_, nranks_, rank_, info(), adamSteps_), sections,
                   buffer, capacity, written);
}

Status DeviceOptimizer::loadState(const void* buffer, size_t bytes) {
  ParsedBlob blob;
  SQUALL_TRY(parseBlob(buffer, bytes, &blob));
  const BlobHeader& h = blob.header;
  const bool usesCodec = momentum_ != nullptr || slowmoState_ != nullptr;
  SQUALL_TRY(checkStateHeader(h, config_, count_, usesCodec));
  auto need = [&](const char* name, size_t n, const Section** out) -> Status {
    const Section* s = blob.find(name);
    SQUALL_REQUIRE(s != nullptr && s->data.size() == n, Status::kCorruptData, Subsys::kOptim,
                   "the optimizer state lacks section '%s' of %zu values", name, n);
    *out = s;
    return Status::kOk;
  };
  const bool sameChunk = h.nranks == nranks_ && h.rank == rank_;
  const Section *m = nullptr, *v = nullptr, *xPrev = nullptr, *u = nullptr;
  const Section *w = nullptr, *sv = nullptr, *smw = nullptr, *sms = nullptr;
  SQUALL_TRY(need("m", count_, &m));
  SQUALL_TRY(need("v", count_, &v));
  auto residuals = [&](const coll::device::DeviceCompressedState* st, const char* wn,
                       const char* sn, const Section** wo, const Section** so) -> Status {
    if (st == nullptr) return Status::kOk;
    SQUALL_TRY(need(wn, count_, wo));
    SQUALL_REQUIRE(blob.find(sn) != nullptr, Status::kCorruptData, Subsys::kOptim,
                   "the optimizer state lacks its '%s' section", sn);
    if (sameChunk && st->server() != nullptr) SQUALL_TRY(need(sn, st->chunk(), so));
    return Status::kOk;
  };
  SQUALL_TRY(residuals(momentum_.get(), "worker", "server", &w, &sv));
  if (config_.slowmoTau > 0) {
    SQUALL_TRY(need("x_prev", count_, &xPrev));
    SQUALL_TRY(need("u", count_, &u));
  }
  SQUALL_TRY(residuals(slowmoState_.get(), "sm_worker", "sm_server", &smw, &sms));
  if (!sameChunk && usesCodec)
    SQUALL_WARN(Subsys::kOptim,
                "server residual reset: saved by rank %d of %d, loading on %d of %d", h.rank,
                h.nranks, rank_, nranks_);

  SQUALL_CUDA_TRY(cudaStreamSynchronize(lastStream_));
  auto put = [&](float* d, const Section* s) -> Status {
    if (count_ != 0)
      SQUALL_CUDA_TRY(
          cudaMemcpy(d, s->data.data(), count_ * sizeof(float), cudaMemcpyHostToDevice));
    return Status::kOk;
  };
  auto restore = [&](const coll::device::DeviceCompressedState* st, const Section* ws,
                     const Section* ss) -> Status {
    if (st == nullptr) return Status::kOk;
    if (st->worker() != nullptr) SQUALL_TRY(restoreResidual(st->worker(), ws->data.data(), count_));
    if (st->server() != nullptr)
      SQUALL_TRY(
          restoreResidual(st->server(), ss != nullptr ? ss->data.data() : nullptr, st->chunk()));
    return Status::kOk;
  };
  SQUALL_TRY(put(m_, m));
  SQUALL_TRY(put(v_, v));
  SQUALL_TRY(restore(momentum_.get(), w, sv));
  if (config_.slowmoTau > 0) {
    SQUALL_TRY(put(xPrev_, xPrev));
    SQUALL_TRY(put(u_, u));
  }
  SQUALL_TRY(restore(slowmoState_.get(), smw, sms));
  if (config_.mode == Mode::kApmSqueeze) warmupSteps_ = h.warmupSteps;
  phase_ = static_cast<Phase>(h.phase);
  step_ = h.step;
  adamSteps_ = h.adamSteps;
  skipped_ = h.skippedSteps;
  bytesSent_ = h.bytesSent;
  return Status::kOk;
}

}  // namespace squall::optim::cuda
