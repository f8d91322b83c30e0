// A single-process reference simulation of the compressed allreduce (both
// algorithms) for n virtual ranks, with the scalar codec kernels and no
// transport. It follows the contract of src/coll/compressed_twophase.cc and
// src/coll/compressed_allgather.cc step by step, unsegmented; the collectives
// must match it bit for bit whatever the segment size and implementation.
// With a phase P (compressed_state.h) element i sits at virtual position
// P + i: chunks are cut from the virtual buffer, and the piece holding
// element 0 is encoded as its first U - P elements and the rest.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "src/codec/kernels.h"
#include "src/codec/wire.h"

namespace squall::testing {

// One encoding of `m` elements with the scalar kernels (the residual halves
// may be null); folds the kernel's "all finite" into *finite.
inline std::vector<uint8_t> referenceEncode(const codec::Spec& spec, const float* x, size_t m,
                                            const float* residualIn, float* residualOut,
                                            bool* finite) {
  codec::Layout layout;
  if (codec::layoutFor(spec, m, &layout) != Status::kOk) std::abort();
  std::vector<uint8_t> bytes(layout.totalBytes, 0);
  codec::writeHeader(spec, m, bytes.data());
  if (m != 0) {
    const codec::CodecKernels& k = codec::scalarKernels().codecs[static_cast<int>(spec.codec)];
    *finite = k.encode(codec::EncodeJob{x, codec::DType::kF32, m, spec, layout, residualIn,
                                        residualOut, bytes.data() + codec::kHeaderBytes}) &&
              *finite;
  }
  return bytes;
}

// Decodes (or decode-accumulates) `m` elements with the scalar kernels.
inline void referenceDecode(const codec::Spec& spec, const std::vector<uint8_t>& bytes, float* out,
                            size_t m, bool accumulate) {
  if (m == 0) return;
  codec::Layout layout;
  if (codec::layoutFor(spec, m, &layout) != Status::kOk) std::abort();
  const codec::CodecKernels& k = codec::scalarKernels().codecs[static_cast<int>(spec.codec)];
  codec::DecodeJob job{bytes.data() + codec::kHeaderBytes, m, spec, layout, out};
  (accumulate ? k.accumulate : k.decode)(job);
}

class CompressedReference {
 public:
  // Residual state of one buffer for n virtual ranks.
  CompressedReference(int n, size_t count, const codec::Spec& spec, size_t phase = 0)
      : n_(n), count_(count), spec_(spec), gather_(spec), phase_(phase) {
    unit_ = codec::usesBlocks(spec.codec) ? spec.block : 1;
    const size_t group = unit_ * static_cast<size_t>(n);
    chunk_ = (phase + count + group - 1) / group;
    chunk_ *= unit_;
    for (int r = 0; r < n; ++r) {
      worker_.push_back(Residual(chunk_ * static_cast<size_t>(n)));
      server_.push_back(Residual(chunk_));
    }
  }

  // The servers' code in twoPhase (CompressedState::setGatherSpec): the sum
  // of the decoded pieces is re-encoded with it and every rank decodes it.
  void setGatherSpec(const codec::Spec& gather) { gather_ = gather; }

  // One two-phase call; inputs[r] holds count floats. Returns the output
  // every rank must produce; workerCommitted/serverCommitted report which
  // residuals advanced: all of them when every encode of the call, on every
  // rank, was finite, and none otherwise.
  std::vector<float> twoPhase(const std::vector<std::vector<float>>& inputs, bool average) {
    const size_t n = static_cast<size_t>(n_);
    if (n == 1 || count_ == 0) return inputs[0];
    std::vector<std::vector<std::vector<uint8_t>>> encoded(n);  // [rank][chunk]
    workerCommitted.assign(n, false);
    serverCommitted.assign(n, false);
    bool finite = true;  // every encode of the call, on every rank
    for (size_t j = 0; j < n; ++j) {
      for (size_t c = 0; c < n; ++c) {
        const size_t at = first(c);  // virtual
        encoded[j].push_back(encodePiece(spec_, inputs[j].data() + (at - phase_), realCount(c),
                                         worker_[j].current.data() + at,
                                         worker_[j].next.data() + at, head(c), &finite));
      }
    }
    std::vector<std::vector<uint8_t>> serverEncoded(n);
    for (size_t r = 0; r < n; ++r) {
      const size_t m = realCount(r);
      std::vector<float> acc(m);
      for (size_t j = 0; j < n; ++j)
        decodePiece(spec_, encoded[j][r], acc.data(), m, head(r), j != 0);
      if (average)
        for (float& v : acc) v = v / static_cast<float>(n);
      const size_t at = first(r) - r * chunk_;
      serverEncoded[r] = encodePiece(gather_, acc.data(), m, server_[r].current.data() + at,
                                     server_[r].next.data() + at, head(r), &finite);
    }
    for (size_t r = 0; r < n; ++r) {
      worker_[r].commit(finite);
      server_[r].commit(finite);
      workerCommitted[r] = serverCommitted[r] = finite;
    }
    std::vector<float> out(count_);
    for (size_t c = 0; c < n; ++c)
      if (realCount(c) != 0)
        decodePiece(gather_, serverEncoded[c], out.data() + (first(c) - phase_), realCount(c),
                    head(c), false);
    return out;
  }

  // One all-gather call (no server residual).
  std::vector<float> allGather(const std::vector<std::vector<float>>& inputs, bool average) {
    const size_t n = static_cast<size_t>(n_);
    if (n == 1 || count_ == 0) return inputs[0];
    workerCommitted.assign(n, false);
    serverCommitted.assign(n, false);
    std::vector<std::vector<uint8_t>> encoded(n);
    bool finite = true;  // every rank's encode
    const size_t lead = phase_ != 0 ? std::min(unit_ - phase_, count_) : 0;
    for (size_t j = 0; j < n; ++j) {
      encoded[j] = encodePiece(spec_, inputs[j].data(), count_, worker_[j].current.data() + phase_,
                               worker_[j].next.data() + phase_, lead < count_ ? lead : 0, &finite);
    }
    for (size_t j = 0; j < n; ++j) {
      worker_[j].commit(finite);
      workerCommitted[j] = finite;
    }
    std::vector<float> out(count_);
    for (size_t j = 0; j < n; ++j)
      decodePiece(spec_, encoded[j], out.data(), count_, lead < count_ ? lead : 0, j != 0);
    if (average)
      for (float& v : out) v = v / static_cast<float>(n);
    return out;
  }

  const std::vector<float>& workerResidual(int r) const { return worker_[r].current; }
  const std::vector<float>& serverResidual(int r) const { return server_[r].current; }
  size_t chunk() const { return chunk_; }

  std::vector<bool> workerCommitted, serverCommitted;

 private:
  struct Residual {
    explicit Residual(size_t size) : current(size, 0.0f), next(size, 0.0f) {}
    void commit(bool finite) {
      if (finite) std::swap(current, next);
    }
    std::vector<float> current, next;
  };

  // Chunk c's first element (virtual position), its element count, and
  // the length of its head (0: none).
  size_t first(size_t c) const { return std::max(c * chunk_, phase_); }
  size_t realCount(size_t c) const {
    const size_t end = std::min((c + 1) * chunk_, phase_ + count_);
    return first(c) < end ? end - first(c) : 0;
  }
  size_t head(size_t c) const {
    if (first(c) != phase_ || phase_ == 0) return 0;
    const size_t h = unit_ - phase_;
    return h < realCount(c) ? h : 0;
  }

  // A piece: its first `h` elements and the rest as two encodings.
  static std::vector<uint8_t> encodePiece(const codec::Spec& spec, const float* x, size_t m,
                                          const float* residualIn, float* residualOut, size_t h,
                                          bool* finite) {
    if (h == 0) return referenceEncode(spec, x, m, residualIn, residualOut, finite);
    std::vector<uint8_t> bytes = referenceEncode(spec, x, h, residualIn, residualOut, finite);
    const std::vector<uint8_t> rest =
        referenceEncode(spec, x + h, m - h, residualIn + h, residualOut + h, finite);
    bytes.insert(bytes.end(), rest.begin(), rest.end());
    return bytes;
  }
  static void decodePiece(const codec::Spec& spec, const std::vector<uint8_t>& bytes, float* out,
                          size_t m, size_t h, bool accumulate) {
    if (h == 0) return referenceDecode(spec, bytes, out, m, accumulate);
    codec::Layout layout;
    if (codec::layoutFor(spec, h, &layout) != Status::kOk) std::abort();
    const std::vector<uint8_t> first(bytes.begin(),
                                     bytes.begin() + static_cast<ptrdiff_t>(layout.totalBytes));
    const std::vector<uint8_t> rest(bytes.begin() + static_cast<ptrdiff_t>(layout.totalBytes),
                                    bytes.end());
    referenceDecode(spec, first, out, h, accumulate);
    referenceDecode(spec, rest, out + h, m - h, accumulate);
  }

  int n_;
  size_t count_;
  codec::Spec spec_, gather_;
  size_t phase_ = 0;
  size_t unit_ = 1;
  size_t chunk_ = 0;
  std::vector<Residual> worker_, server_;
};

// The compressed reduce-scatter (src/coll/compressed_reducescatter.cc) for
// n virtual ranks, unsegmented: rank j encodes each piece c of its input,
// elements [c R, (c + 1) R), on its own with its worker residual; rank r's
// output is the decode of the n encodings of piece r in rank order, divided
// by n for avg. Residuals advance only when every encoding of the call, on
// every rank, was finite.
class ReduceScatterReference {
 public:
  ReduceScatterReference(int n, size_t recvcount, const codec::Spec& spec)
      : n_(static_cast<size_t>(n)), recvcount_(recvcount), spec_(spec) {
    for (size_t r = 0; r < n_; ++r) {
      current_.emplace_back(n_ * recvcount, 0.0f);
      next_.emplace_back(n_ * recvcount, 0.0f);
    }
  }

  // inputs[j] holds n R floats; returns every rank's output of R floats.
  std::vector<std::vector<float>> run(const std::vector<std::vector<float>>& inputs, bool average) {
    std::vector<std::vector<float>> out(n_, std::vector<float>(recvcount_));
    if (n_ == 1 || recvcount_ == 0) {
      for (size_t r = 0; r < n_; ++r) out[r].assign(inputs[r].begin(), inputs[r].end());
      return out;
    }
    std::vector<std::vector<std::vector<uint8_t>>> encoded(n_);  // [rank][piece]
    bool finite = true;
    for (size_t j = 0; j < n_; ++j)
      for (size_t c = 0; c < n_; ++c) {
        const size_t at = c * recvcount_;
        encoded[j].push_back(referenceEncode(spec_, inputs[j].data() + at, recvcount_,
                                             current_[j].data() + at, next_[j].data() + at,
                                             &finite));
      }
    for (size_t r = 0; r < n_; ++r) {
      for (size_t j = 0; j < n_; ++j)
        referenceDecode(spec_, encoded[j][r], out[r].data(), recvcount_, j != 0);
      if (average)
        for (float& v : out[r]) v = v / static_cast<float>(n_);
    }
    committed = finite;
    if (finite) std::swap(current_, next_);
    return out;
  }

  const std::vector<float>& residual(int r) const { return current_[static_cast<size_t>(r)]; }
  bool committed = false;  // whether the last run advanced the residuals

 private:
  size_t n_;
  size_t recvcount_;
  codec::Spec spec_;
  std::vector<std::vector<float>> current_, next_;
};

}  // namespace squall::testing
