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

// How a residual keeps its elements (Residual, below).
enum class ResidualStore : uint8_t { kF32, kBf16 };

constexpr size_t residualElementBytes(ResidualStore store) {
  return store == ResidualStore::kBf16 ? 2 : 4;
}

// The elements of a residual one encode reads (`in`: the error owed) and
// writes (`out`: the error it leaves), from the encode's first element, in
// the residual's store; in == nullptr: no error feedback.
struct ResidualSpan {
  const void* in = nullptr;
  void* out = nullptr;
  ResidualStore store = ResidualStore::kF32;

  ResidualSpan() = default;
  ResidualSpan(const float* in_, float* out_) : in(in_), out(out_) {}
  ResidualSpan(const void* in_, void* out_, ResidualStore store_)
      : in(in_), out(out_), store(store_) {}
  // The span from element `offset` on (no feedback stays none).
  ResidualSpan at(size_t offset) const {
    if (in == nullptr) return *this;
    const size_t skip = offset * residualElementBytes(store);
    return ResidualSpan(static_cast<const uint8_t*>(in) + skip, static_cast<uint8_t*>(out) + skip,
                        store);
  }
};

// Error-feedback state of one buffer, double-buffered so that a call can be
// abandoned (the non-finite rule) without a second pass: encode reads
// current(), writes next(), and commit() flips them only when every block of
// the call was finite.
//
// Buffers of 128 KiB and more are mapped from the kernel's zero pages, so
// creating a residual costs microseconds whatever its size: its pages are
// faulted in and zeroed by the first encode that writes them (on the thread
// that runs the collective, not on the one that created the state).
//
// The store is fp32, or bf16 for half the memory (and half the residual's
// share of an encode's memory traffic): the encode still computes in fp32,
// reading each owed value widened (exactly) and storing each new one
// rounded to the nearest bf16, ties to even. So a bf16 residual holds
// exactly what an fp32 one would hold if every committed value were
// rounded to bf16.
class Residual {
 public:
  static Status create(size_t count, std::unique_ptr<Residual>* out,
                       ResidualStore store = ResidualStore::kF32);
  ~Residual();
  Residual(const Residual&) = delete;
  Residual& operator=(const Residual&) = delete;

  size_t count() const { return count_; }
  ResidualStore store() const { return store_; }
  // Both halves' bytes (what the residual costs in memory).
  size_t bytes() const { return 2 * count_ * residualElementBytes(store_); }
  // The halves as fp32 arrays: an fp32 store only (null for bf16).
  const float* current() const { return f32(current_); }
  float* current() { return f32(current_); }
  float* next() { return f32(current_ ^ 1); }
  // What an encode of elements [at, count()) reads and writes: the current
  // half and the next, either store.
  ResidualSpan span(size_t at = 0);
  // Element i of the current half, widened; and set to `value` (rounded to
  // the store).
  float value(size_t i) const;
  void setValue(size_t i, float value);
  // The current half's first n elements as fp32, and set from fp32.
  void read(float* to, size_t n) const;
  void write(const float* from, size_t n);
  // Zeroes the current half: nothing owed (the skipped count stays).
  void clear();
  // Makes next() current when `finite`; otherwise counts a skipped call.
  void commit(bool finite);
  void reset();
  uint64_t skipped() const { return skipped_; }

 private:
  Residual(size_t count, ResidualStore store) : count_(count), store_(store) {}
  float* f32(int half) const {
    return store_ == ResidualStore::kF32 ? static_cast<float*>(buffers_[half]) : nullptr;
  }
  size_t count_;
  ResidualStore store_;
  void* buffers_[2] = {nullptr, nullptr};
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
// level cache holds (so cached stores would be evicted unread anyway). For
// a call's output, which its caller reads next.
Stores storesFor(size_t bytes);

// The same for a call's new residuals: kStream past one core's L2 cache. A
// residual is read again only by the next call on the same buffer, after the
// caller's own work (a training step's forward and backward) has been
// through the caches; meanwhile a cached store would first read each line
// (read-for-ownership) of the residual's other half, which the call does not
// otherwise touch.
Stores residualStoresFor(size_t bytes);

// Whether two specs encode alike (an element-wise codec's block and any
// codec's scale kind but onebit's are not part of the encoding).
bool sameEncoding(const Spec& a, const Spec& b);

// Low-level encode: reads residual.in (may be null: no error feedback),
// writes residual.out for every element (may alias nothing else). Callers
// such as the collectives encode sub-ranges with this and commit the
// residual once per call.
Status encodeRaw(const Spec& spec, const void* input, DType dtype, size_t count,
                 ResidualSpan residual, void* output, size_t capacity, EncodeResult* result,
                 Stores stores = Stores::kCached);
// The same with fp32 residual halves.
inline Status encodeRaw(const Spec& spec, const void* input, DType dtype, size_t count,
                        const float* residualIn, float* residualOut, void* output, size_t capacity,
                        EncodeResult* result, Stores stores = Stores::kCached) {
  return encodeRaw(spec, input, dtype, count, ResidualSpan{residualIn, residualOut}, output,
                   capacity, result, stores);
}

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

// The same sum, encoded with error feedback with `spec` (`residual` as in
// encodeRaw) into `output`, without ever being stored: the bytes and
// residuals of decodeSum followed by encodeRaw, in one pass.
Status encodeSum(const Spec& spec, const uint8_t* const* encodings, size_t n, size_t bytes,
                 size_t count, int divisor, ResidualSpan residual, void* output, size_t capacity,
                 EncodeResult* result, Stores stores = Stores::kCached);
inline Status encodeSum(const Spec& spec, const uint8_t* const* encodings, size_t n, size_t bytes,
                        size_t count, int divisor, const float* residualIn, float* residualOut,
                        void* output, size_t capacity, EncodeResult* result,
                        Stores stores = Stores::kCached) {
  return encodeSum(spec, encodings, n, bytes, count, divisor, ResidualSpan{residualIn, residualOut},
                   output, capacity, result, stores);
}

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
