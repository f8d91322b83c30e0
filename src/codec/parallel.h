// The multi-threaded codec: one encode, decode or decode-accumulate call cut
// into pieces at block boundaries (64-element boundaries for the element-wise
// codecs) and run by a small pool of worker threads plus the caller.
//
// Every block is encoded by exactly one thread with the same kernel it would
// see single-threaded, and a piece boundary is a block boundary, so the
// bytes, the residuals and the decoded floats are identical to the
// single-thread codec for any thread count (tests/unit/codec_threads_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/codec/kernels.h"

namespace squall::codec {

// Threads one codec call may use: SQUALL_CODEC_THREADS when it is set (> 0),
// else the cores this process may run on (sched_getaffinity) divided by the
// ranks that share them: the most that a communicator reported
// (setLocalRanks), else the ranks a launcher announced on this host
// (LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS,
// SLURM_NTASKS_PER_NODE) unless this process is bound to a share of the
// host's cores already (affinity x ranks <= online CPUs). At most 64.
int codecThreads();
// Called by communicators once they know how many of their ranks run on this
// host; the largest count seen is kept (a process's communicators share its
// cores).
void setLocalRanks(int localRanks);
// Overrides codecThreads() for this process (benchmarks, tests); 0 returns
// to the default. Takes precedence over SQUALL_CODEC_THREADS.
void setCodecThreads(int threads);
// The cores this process may run on.
int affinityCores();
// The smallest piece, in elements, worth a thread of its own
// (SQUALL_CODEC_THREAD_MIN_ELEMENTS): below twice this a call runs on the
// caller alone, so small calls never pay for waking workers.
size_t minElementsPerThread();

// How many pieces a call of `count` elements is cut into with `threads`.
int piecesFor(size_t count, int threads);

// A residual stored in bf16 (codec.h, ResidualStore::kBf16), for the
// encodes below: the job's residualIn and residualOut are null, and each
// piece is encoded tile by tile (tiles of whole blocks, at most a block or
// 4096 elements), its owed values widened into an fp32 buffer the L1 cache
// holds, the kernel run on that, and the new values rounded back to bf16.
// The kernels see fp32 only, so every implementation stores the same bits.
struct Bf16Residual {
  const uint16_t* in = nullptr;
  uint16_t* out = nullptr;
};

// to[i] = the bf16 from[i] as fp32 (exact); and to[i] = from[i] rounded to
// the nearest bf16, ties to even (numeric.h's floatToBf16): the active
// implementation's conversions (kernels.h), the same bits on every one.
void widenBf16(const uint16_t* from, float* to, size_t n);
void narrowToBf16(const float* from, uint16_t* to, size_t n);

// Runs the kernel of `job` on up to `threads` threads; returns the AND of the
// pieces' finite flags. When another thread is already using the pool, the
// call runs on the caller alone (same bytes, no waiting on the other call).
// `bf16`: the residual when it is stored in bf16 (above).
bool parallelEncode(EncodeFn fn, const EncodeJob& job, int threads,
                    const Bf16Residual* bf16 = nullptr);
void parallelDecode(DecodeFn fn, const DecodeJob& job, int threads);

// The sum of n encodings of the same `count` elements (one spec, one layout;
// payloads[j] is encoding j's payload), formed tile by tile: each tile of
// whole blocks is decoded from payloads[0], decode-accumulated from
// payloads[1..n-1] in that order and divided by `divisor` (when above 1)
// in a buffer that stays in the L1 cache, then used once. The element
// values are those of decode + (n - 1) decodeAccumulate + divideAll over
// the whole buffer, since every kernel works element by element within its
// blocks.
struct SumJob {
  const uint8_t* const* payloads;
  size_t n;
  size_t count;
  Spec spec;
  Layout layout;
  int divisor;  // <= 1: no division
};

// Stores each tile's sum in output[0, count), streaming when `stream`.
void parallelDecodeSum(const CodecKernels& kernels, const SumJob& sum, float* output, bool stream,
                       int threads);
// Encodes each tile's sum with `encode` (whose job describes the whole
// output: input and dtype are ignored, the sums are its fp32 input); returns
// whether every block was finite.
bool parallelEncodeSum(const CodecKernels& kernels, const SumJob& sum, EncodeFn encode,
                       const EncodeJob& job, int threads, const Bf16Residual* bf16 = nullptr);

// acc[i] /= n, exactly (a multiply by the exact inverse when n is a power
// of two, which gives the same bits as the division).
void divideAll(float* acc, size_t count, int n);

}  // namespace squall::codec
