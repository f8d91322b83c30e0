// The optimizer backend of host memory over a coll::Communicator: the
// kernels of update_kernels.cc on host arrays, the communicator's allreduce
// (avg) and compressed allreduce, whose own abort notice carries a refusal.
#pragma once

#include <memory>
#include <vector>

#include "src/coll/communicator.h"
#include "src/coll/compressed_state.h"
#include "src/optim/backend.h"

namespace squall::optim {

class HostBackend final : public Backend {
 public:
  // `comm` is not owned and must outlive the backend.
  explicit HostBackend(coll::Communicator* comm) : comm_(comm) {}

  // For tests: the compressed state of `channel` (null when absent).
  coll::CompressedState* state(Channel channel) { return slot(channel).state.get(); }

  int nranks() const override { return comm_->size(); }
  int rank() const override { return comm_->rank(); }
  bool onDevice() const override { return false; }
  Status allocate(size_t count, float** out) override;
  Status createChannel(Channel channel, size_t count, const codec::Spec& spec,
                       coll::CompressedAlgo algo) override;
  void setStream(void*) override {}

  Status exchangeStatus(Status check) override;
  Status average(const float* in, float* out, size_t count) override;
  Status compressedAverage(Channel channel, float* buffer, uint64_t* bytes) override;
  Status markResiduals(Channel channel) override;
  Status restoreResiduals(Channel channel) override;
  Status resetResiduals(Channel channel) override;

  Status allFinite(const float* p, size_t n, bool* finite) override;
  Status varianceChange(size_t n, const float* v, float* snap, double a, double b, double* diff,
                        double* total) override;
  Status adamStep(size_t n, float* x, float* m, float* v, const float* g,
                  const AdamScalars& s) override;
  Status momentumStep(size_t n, float* out, const float* m, const float* g, float beta1,
                      float oneMinusB1, const float* maskBy) override;
  Status scale(size_t n, float* v, float factor) override;
  Status frozenStep(size_t n, float* x, const float* m, const float* vHat,
                    const FrozenScalars& s) override;
  Status slowmoStep(size_t n, float* x, float* xPrev, float* u, const float* xAvg, float lr,
                    float alpha, float beta) override;
  Status subtract(size_t n, float* out, const float* a, const float* b) override;
  Status add(size_t n, float* out, const float* a, const float* b) override;
  Status copy(float* dst, const float* src, size_t n) override;

  Status view(const float* buffer, size_t n, std::vector<float>* staging,
              const float** out) const override;
  Status upload(float* buffer, const float* host, size_t n) override;
  void residualSizes(Channel channel, size_t* worker, size_t* server) const override;
  void residualLayout(Channel channel, std::vector<float>* layout) const override;
  Status viewResidual(Channel channel, bool server, std::vector<float>* staging,
                      const float** out) const override;
  Status loadResiduals(Channel channel, const float* worker, const float* server) override;

 private:
  struct Slot {
    std::unique_ptr<coll::CompressedState> state;
    size_t count = 0;
    const float* workerMark = nullptr;  // the current residuals at markResiduals
    const float* serverMark = nullptr;
  };
  Slot& slot(Channel c) { return slots_[static_cast<int>(c)]; }
  const Slot& slot(Channel c) const { return slots_[static_cast<int>(c)]; }

  coll::Communicator* comm_;
  std::vector<std::unique_ptr<float[]>> buffers_;
  Slot slots_[kChannels];
};

}  // namespace squall::optim
