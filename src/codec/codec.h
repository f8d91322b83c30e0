// The codec layer's interface: encode (with optional error feedback), decode,
// decode-accumulate, and the exact encoded size, for every codec in wire.h.
//
// The functions here validate everything once and then call the kernels of
// the active implementation (scalar, AVX2 or AVX-512, chosen by measurement:
// calibrate.h) on codecThreads() threads (parallel.h); neither choice
// changes a byte of the output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "src/codec/wire.h"

namespace squall::codec {

// Error-feedback state of one buffer, double-buffered so that a call can be
// abandoned (the non-finite rule) without a second pass: encode reads
// current(), writes next(), and commit() flips them only when every block of
// the call was finite.
//
// Buffers of 128 KiB and more are mapped from the kernel's zero pages, so
// creating a residual costs microseconds whatever its size: its pages are
// faulted in and zeroed by the first encode that writes them (on the thread
// that runs the collective, not on the one that created the state).
class Residual {
 public:
  static Status create(size_t count, std::unique_ptr<Residual>* out);
  ~Residual();
  Residual(const Residual&) = delete;
  Residual& operator=(const Residual&) = delete;

  size_t count() const { return count_; }
  const float* current() const { return buffers_[current_]; }
  float* current() { return buffers_[current_]; }
  float* next() { return buffers_[current_ ^ 1]; }
  // Makes next() current when `finite`; otherwise counts a skipped call.
  void commit(bool finite);
  void reset();
  uint64_t skipped() const { return skipped_; }

 private:
  explicit Residual(size_t count) : count_(count) {}
  size_t count_;
  float* buffers_[2] = {nullptr, nullptr};
  size_t mappedBytes_ = 0;  // each buffer's mapping; 0: from aligned_alloc
  int current_ = 0;
  uint64_t skipped_ = 0;
};

struct EncodeResult {
  size_t bytes = 0;
  bool finite = true;  // false: a block was non-finite; do not commit residuals
};

Status encodedSize(const Spec& spec, size_t count, size_t* bytes);

// The checks every encoder (CPU and CUDA) makes before touching memory: the
// data type, the input and output pointers, the spec, the output's capacity
// and its overlap with the input. `layout` gets the encoding's layout; errors
// are logged under `subsys`, the caller's.
Status checkEncodeArgs(const Spec& spec, const void* input, DType dtype, size_t count,
                       const void* output, size_t capacity, Subsys subsys, Layout* layout);

// How a call writes its large fp32 outputs (residualOut, a decode's
// output): kStream with non-temporal stores where the implementation has
// them and the buffer is 64-byte aligned (streamStores in kernels.h). For
// buffers far larger than the caches, which are not read again soon, it
// halves the memory traffic of every written byte. The values are the same.
enum class Stores : uint8_t { kCached, kStream };

// kStream when `bytes` of buffers are touched by a call: more than the last
// level cache holds (so cached stores would be evicted unread anyway).
Stores storesFor(size_t bytes);

// Whether two specs encode alike (an element-wise codec's block and any
// codec's scale kind but onebit's are not part of the encoding).
bool sameEncoding(const Spec& a, const Spec& b);

// Low-level encode: reads residualIn (may be null), writes residualOut for
// every element (may alias nothing else). Callers such as the collectives
// encode sub-ranges with this and commit the residual once per call.
Status encodeRaw(const Spec& spec, const void* input, DType dtype, size_t count,
                 const float* residualIn, float* residualOut, void* output, size_t capacity,
                 EncodeResult* result, Stores stores = Stores::kCached);

// Encode with an optional Residual object, committed when the call is finite.
Status encode(const Spec& spec, const void* input, DType dtype, size_t count, Residual* residual,
              void* output, size_t capacity, EncodeResult* result);

Status decode(const void* input, size_t bytes, float* output, size_t count,
              Stores stores = Stores::kCached);
Status decodeAccumulate(const void* input, size_t bytes, float* accumulator, size_t count);

// The sum of n encodings of the same `count` elements, each `bytes` long and
// made with one spec: out[i] = d_0[i] + d_1[i] + ... + d_{n-1}[i], added in
// that order, divided by `divisor` when it is above 1 (divideAll). The bits
// are those of decode, n - 1 decodeAccumulate calls and divideAll, but the
// output is written once and never read: each tile of whole blocks is
// summed in a buffer the L1 cache holds (parallel.h, SumJob).
Status decodeSum(const uint8_t* const* encodings, size_t n, size_t bytes, float* out, size_t count,
                 int divisor, Stores stores = Stores::kCached);

// The same sum, encoded with error feedback with `spec` (residualIn and
// residualOut as in encodeRaw) into `output`, without ever being stored: the
// bytes and residuals of decodeSum followed by encodeRaw, in one pass.
Status encodeSum(const Spec& spec, const uint8_t* const* encodings, size_t n, size_t bytes,
                 size_t count, int divisor, const float* residualIn, float* residualOut,
                 void* output, size_t capacity, EncodeResult* result,
                 Stores stores = Stores::kCached);

// acc[i] /= n for i < count, exactly (see parallel.h).
void divideAll(float* acc, size_t count, int n);

// Reads the codec and element count recorded in an encoded buffer.
Status inspect(const void* input, size_t bytes, Spec* spec, size_t* count);

// Whether an encoded buffer decodes to finite values only: every scale of a
// block codec (a non-finite block is stored with a NaN scale), every value
// of an element-wise one. Reads the scales only for the block codecs, so it
// is cheap next to decoding. Every rank that holds the same bytes gets the
// same answer, which is what lets the collectives decide together whether a
// call's residuals are committed.
Status encodingFinite(const void* input, size_t bytes, bool* finite);

// "scalar", "avx2" or "avx512".
const char* implementationName();

}  // namespace squall::codec
