// The host optimizer backend (host_backend.h).
#include "src/optim/host_backend.h"

#include <cstring>

namespace squall::optim {

Status HostBackend::allocate(size_t count, float** out) {
  buffers_.push_back(std::make_unique<float[]>(count));  // value-initialised: zeros
  *out = buffers_.back().get();
  return Status::kOk;
}

Status HostBackend::createChannel(Channel channel, size_t count, const codec::Spec& spec,
                                  coll::CompressedAlgo algo) {
  Slot& s = slot(channel);
  s.count = count;
  SQUALL_TRY(comm_->createCompressedState(count, spec, 0, &s.state));
  s.state->setAlgorithm(algo);
  return Status::kOk;
}

Status HostBackend::exchangeStatus(Status check) {
  // The communicator's next collective carries a refusal to the peers (its
  // abort notice), so a rank that goes on has nothing to send here.
  return check == Status::kOk ? Status::kOk : comm_->refuse(check);
}

Status HostBackend::average(const float* in, float* out, size_t count) {
  return comm_->allReduce(in, out, count, DataType::kF32, ReduceOp::kAvg);
}

Status HostBackend::compressedAverage(Channel channel, float* buffer, uint64_t* bytes) {
  coll::CompressedState* state = slot(channel).state.get();
  SQUALL_TRY(comm_->compressedAllReduce(buffer, buffer, DataType::kF32, ReduceOp::kAvg, state));
  *bytes = state->lastStats().bytesSent;
  return Status::kOk;
}

Status HostBackend::markResiduals(Channel channel) {
  Slot& s = slot(channel);
  s.workerMark = s.state->worker().current();
  s.serverMark = s.state->server().current();
  return Status::kOk;
}

Status HostBackend::restoreResiduals(Channel channel) {
  // The residuals are double-buffered and a commit flips them: flipping
  // again restores the previous residual, which the call did not touch.
  Slot& s = slot(channel);
  if (s.state->worker().current() != s.workerMark) s.state->worker().commit(true);
  if (s.state->server().current() != s.serverMark) s.state->server().commit(true);
  return Status::kOk;
}

Status HostBackend::resetResiduals(Channel channel) {
  slot(channel).state->reset();
  return Status::kOk;
}

Status HostBackend::allFinite(const float* p, size_t n, bool* finite) {
  *finite = optim::allFinite(p, n);
  return Status::kOk;
}

Status HostBackend::varianceChange(size_t n, const float* v, float* snap, double a, double b,
                                   double* diff, double* total) {
  optim::varianceChange(n, v, snap, a, b, diff, total);
  return Status::kOk;
}

Status HostBackend::adamStep(size_t n, float* x, float* m, float* v, const float* g,
                             const AdamScalars& s) {
  optim::adamStep(n, x, m, v, g, s);
  return Status::kOk;
}

Status HostBackend::momentumStep(size_t n, float* out, const float* m, const float* g, float beta1,
                                 float oneMinusB1, const float* maskBy) {
  optim::momentumStep(n, out, m, g, beta1, oneMinusB1, maskBy);
  return Status::kOk;
}

Status HostBackend::scale(size_t n, float* v, float factor) {
  optim::scale(n, v, factor);
  return Status::kOk;
}

Status HostBackend::frozenStep(size_t n, float* x, const float* m, const float* vHat,
                               const FrozenScalars& s) {
  optim::frozenStep(n, x, m, vHat, s);
  return Status::kOk;
}

Status HostBackend::slowmoStep(size_t n, float* x, float* xPrev, float* u, const float* xAvg,
                               float lr, float alpha, float beta) {
  optim::slowmoStep(n, x, xPrev, u, xAvg, lr, alpha, beta);
  return Status::kOk;
}

Status HostBackend::subtract(size_t n, float* out, const float* a, const float* b) {
  optim::subtract(n, out, a, b);
  return Status::kOk;
}

Status HostBackend::add(size_t n, float* out, const float* a, const float* b) {
  optim::add(n, out, a, b);
  return Status::kOk;
}

Status HostBackend::copy(float* dst, const float* src, size_t n) {
  if (dst != src && n != 0) std::memcpy(dst, src, n * sizeof(float));
  return Status::kOk;
}

Status HostBackend::view(const float* buffer, size_t, std::vector<float>*,
                         const float** out) const {
  *out = buffer;
  return Status::kOk;
}

Status HostBackend::upload(float* buffer, const float* host, size_t n) {
  return copy(buffer, host, n);
}

void HostBackend::residualSizes(Channel channel, size_t* worker, size_t* server) const {
  // The worker residual's padding beyond count is never encoded and stays zero.
  const Slot& s = slot(channel);
  *worker = s.state->workerCount();
  *server = s.state->chunk();
}

void HostBackend::residualLayout(Channel channel, std::vector<float>* layout) const {
  layout->clear();
  const coll::CompressedState& s = *slot(channel).state;
  if (!s.hierarchical()) return;
  *layout = {static_cast<float>(s.hosts()), static_cast<float>(s.localRanks()),
             static_cast<float>(s.localIndex())};
}

Status HostBackend::viewResidual(Channel channel, bool server, std::vector<float>*,
                                 const float** out) const {
  // CompressedState hands out its residuals through non-const accessors
  // only; nothing here writes through them.
  coll::CompressedState* s = slot(channel).state.get();
  *out = server ? s->server().current() : s->worker().current();
  return Status::kOk;
}

Status HostBackend::loadResiduals(Channel channel, const float* worker, const float* server) {
  coll::CompressedState* s = slot(channel).state.get();
  s->reset();
  SQUALL_TRY(copy(s->worker().current(), worker, s->workerCount()));
  if (server != nullptr) SQUALL_TRY(copy(s->server().current(), server, s->chunk()));
  return Status::kOk;
}

}  // namespace squall::optim
