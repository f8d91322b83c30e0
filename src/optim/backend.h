// Where an optimizer's schedule (optimizer.cc) runs: the memory of its state,
// the element-wise kernels of update_kernels.h over that memory, and the
// collectives between the ranks. The schedule is written once over this
// interface; the backends are host memory over coll::Communicator
// (host_backend.cc) and CUDA device memory over NCCL on a stream
// (cuda/device_optimizer.cc).
//
// Every float pointer a method takes is memory of the backend's kind (the
// step's parameters and gradients included). The operations of one step run
// in the order they are called (the device enqueues them on the step's
// stream); only the methods that hand a decision to the host (allFinite,
// exchangeStatus) and the state methods wait for them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "src/codec/wire.h"
#include "src/coll/context.h"
#include "src/common/status.h"
#include "src/optim/update_kernels.h"

namespace squall::optim {

// The compressed allreduces an optimizer keeps residuals for.
// kWarmup: the APMSqueeze warmup's gradient average through a stateless
// fp16/bf16 codec (its residuals are zeroed after every call).
enum class Channel : int { kMomentum = 0, kSlowmo = 1, kWarmup = 2 };
constexpr int kChannels = 3;

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int nranks() const = 0;
  virtual int rank() const = 0;
  virtual bool onDevice() const = 0;

  // ---- Setup (at create; may wait).
  // A zeroed buffer of `count` floats, freed with the backend.
  virtual Status allocate(size_t count, float** out) = 0;
  // The residuals of `channel` for compressed allreduces of `count` floats,
  // run with the algorithm choice `algo` (where the backend has a choice).
  virtual Status createChannel(Channel channel, size_t count, const codec::Spec& spec,
                               coll::CompressedAlgo algo) = 0;

  // The stream the operations of the step that follows go on: a
  // cudaStream_t on the device; ignored on the host.
  virtual void setStream(void* stream) = 0;

  // ---- Collectives (nranks() > 1; every rank calls them in the same order).
  // Every rank calls this first in a step that communicates, with kOk or the
  // reason it refuses the step (lastError() saying why). The refusing rank
  // gets `check` back; the others fail at once (kRemoteError naming it),
  // before the step changes any state. Where the collectives have their own
  // abort path (host) a refusal travels through it and kOk costs nothing.
  virtual Status exchangeStatus(Status check) = 0;
  // out = the full-precision average of `in` across ranks (count floats).
  virtual Status average(const float* in, float* out, size_t count) = 0;
  // buffer = compressed_allreduce_avg(buffer) with the residuals of
  // `channel`, committing them; *bytes: what this rank sent.
  virtual Status compressedAverage(Channel channel, float* buffer, uint64_t* bytes) = 0;
  // Remembers which residuals of `channel` are current, and makes them
  // current again: the rollback of a compressed allreduce whose result is
  // not used (a commit writes only the buffer that is not current).
  virtual Status markResiduals(Channel channel) = 0;
  virtual Status restoreResiduals(Channel channel) = 0;
  // Zeroes the residuals of `channel` (stream-ordered on the device).
  virtual Status resetResiduals(Channel channel) = 0;

  // ---- Kernels of update_kernels.h, on this backend's memory.
  // Waits (on the device) so that the host can decide.
  virtual Status allFinite(const float* p, size_t n, bool* finite) = 0;
  // update_kernels.h's varianceChange (the same bits on every backend); waits.
  virtual Status varianceChange(size_t n, const float* v, float* snap, double a, double b,
                                double* diff, double* total) = 0;
  virtual Status adamStep(size_t n, float* x, float* m, float* v, const float* g,
                          const AdamScalars& s) = 0;
  virtual Status momentumStep(size_t n, float* out, const float* m, const float* g, float beta1,
                              float oneMinusB1, const float* maskBy) = 0;
  virtual Status scale(size_t n, float* v, float factor) = 0;
  virtual Status frozenStep(size_t n, float* x, const float* m, const float* vHat,
                            const FrozenScalars& s) = 0;
  virtual Status slowmoStep(size_t n, float* x, float* xPrev, float* u, const float* xAvg, float lr,
                            float alpha, float beta) = 0;
  virtual Status subtract(size_t n, float* out, const float* a, const float* b) = 0;
  virtual Status add(size_t n, float* out, const float* a, const float* b) = 0;
  virtual Status copy(float* dst, const float* src, size_t n) = 0;

  // ---- State save / load (wait for the last step's stream).
  // Host memory holding the n floats of `buffer`: `buffer` itself on the
  // host, a copy in *staging on the device.
  virtual Status view(const float* buffer, size_t n, std::vector<float>* staging,
                      const float** out) const = 0;
  virtual Status upload(float* buffer, const float* host, size_t n) = 0;
  // The residuals of `channel` as the state blob holds them: the worker's
  // first `worker` values and this rank's server chunk (`server` values).
  virtual void residualSizes(Channel channel, size_t* worker, size_t* server) const = 0;
  virtual Status viewResidual(Channel channel, bool server, std::vector<float>* staging,
                              const float** out) const = 0;
  // Zeroes the residuals of `channel`, then copies in those given (a null
  // `server`: it stays zero).
  virtual Status loadResiduals(Channel channel, const float* worker, const float* server) = 0;
  // How the residuals of `channel` are laid out: empty for the flat
  // compressed allreduce (worker over the buffer, server over chunk `rank`);
  // {hosts, ranks per host, local index} for the hierarchical one (worker
  // over this rank's slice, server over its chunk of the slice). A state
  // saved under another layout does not load.
  virtual void residualLayout(Channel, std::vector<float>* layout) const { layout->clear(); }
};

}  // namespace squall::optim
