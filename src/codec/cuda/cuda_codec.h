// The CUDA codec: the same wire format (wire.h) and the same bytes, residuals
// and decoded floats as the scalar reference (kernels_scalar.cc), computed on
// the device.
//
// Every function here is stream-ordered and graph-capturable: it validates
// its arguments on the host (the spec and sizes through wire.h, which needs no
// device memory), then only enqueues kernels on `stream`. Nothing waits for
// the device except cudaResidualQuery, which says so.
//
// Error feedback on the device works like codec::Residual, without the host:
//   * a DeviceResidual holds two residual buffers and a small control block in
//     device memory: which buffer is current, a "non-finite seen" flag, and a
//     counter of skipped calls;
//   * the encode kernel reads the current index on the device, reads
//     buf[current] and writes buf[current ^ 1], and raises the flag when a
//     block (or, for none/fp16/bf16, an element) is non-finite;
//   * a one-thread commit kernel then flips the current index when the flag
//     is clear, otherwise increments the skipped counter, and clears the flag.
// A non-finite call therefore leaves the current residual untouched, with one
// pass over the data in the common case and no host round trip.
//
// Pointers are device pointers unless the name says otherwise. The encoded
// output must be 8-byte aligned (encodings are multiples of 8 bytes, so
// concatenated chunks stay aligned); fp32 input must be 4-byte aligned and
// fp16/bf16 input 2-byte aligned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "src/codec/wire.h"

namespace squall::codec {

// Device-side error-feedback state. Create with cudaResidualCreate; the
// struct itself lives on the host and holds device pointers only, so it can
// be copied into kernel arguments.
struct DeviceResidual {
  float* buf[2] = {nullptr, nullptr};     // count floats each
  int* control = nullptr;                 // [0] current buffer (0/1), [1] non-finite flag
  unsigned long long* skipped = nullptr;  // calls not committed (non-finite)
  size_t count = 0;
};

// Allocates (cudaMalloc) and zeroes a residual of `count` elements; synchronous.
Status cudaResidualCreate(size_t count, DeviceResidual** out);
// Frees it (cudaFree synchronises the device). Accepts nullptr.
void cudaResidualDestroy(DeviceResidual* residual);
// Zeroes both buffers, the current index, the flag and the skipped counter.
Status cudaResidualReset(const DeviceResidual& residual, cudaStream_t stream);
// Copies the current index and the skipped counter to the host and waits for
// `stream`: for tests and diagnostics, not for the hot path.
Status cudaResidualQuery(const DeviceResidual& residual, cudaStream_t stream, int* current,
                         unsigned long long* skipped);
// The buffer that is current after everything enqueued on `stream` so far;
// waits for `stream` (diagnostics and tests).
Status cudaResidualCurrent(const DeviceResidual& residual, cudaStream_t stream,
                           const float** current);

// Encodes `count` elements of `dtype` at dInput into dOutput (header
// included) and, with a residual, commits it on the device. `*bytes` gets the
// encoded size (known on the host; the output is not yet written when this
// returns).
Status cudaEncode(const Spec& spec, const void* dInput, DType dtype, size_t count,
                  const DeviceResidual* residualOrNull, void* dOutput, size_t capacity,
                  cudaStream_t stream, size_t* bytes);

// Encodes elements [offset, offset + count) of a larger buffer whose residual
// is `residual` (which may be null), without committing: the collectives
// encode several chunks of one buffer and then call cudaResidualCommit once.
// dInput points at the chunk itself.
Status cudaEncodeChunk(const Spec& spec, const void* dInput, DType dtype, size_t count,
                       const DeviceResidual* residualOrNull, size_t residualOffset, void* dOutput,
                       size_t capacity, cudaStream_t stream, size_t* bytes);

// The device-side commit described above (one tiny kernel).
Status cudaResidualCommit(const DeviceResidual& residual, cudaStream_t stream);

// Decodes an encoding that lives in device memory. The host cannot read its
// header without a copy and a sync, so the caller states what it expects (the
// collectives know every chunk's spec and count): `bytes` must be the exact
// encoded size of `count` elements with `expected`, so the kernels never read
// past it. On the device, every thread block checks the header against the
// expectation; on a mismatch it writes quiet NaNs (decode) or adds them
// (accumulate) and sets *dError to 1 when dError is not null. A caller with a
// host copy of the header can validate it first with codec::inspect.
//
// dNonFinite (onebit only; kUnsupported for other codecs), when not null, is
// set to 1 when a decoded value is NaN or infinite: a onebit value is not
// finite exactly when its block's scale is not (or the header is wrong), so
// this costs one test per block, not a pass over the output. For int8 a
// finite scale times q can still overflow, so there is no such shortcut.
Status cudaDecode(const Spec& expected, const void* dInput, size_t bytes, float* dOutput,
                  size_t count, cudaStream_t stream, int* dError, int* dNonFinite = nullptr);
// Same, adding the decoded values to dAccumulator (one add per element: the
// rank order of several calls is the caller's).
Status cudaDecodeAccumulate(const Spec& expected, const void* dInput, size_t bytes,
                            float* dAccumulator, size_t count, cudaStream_t stream, int* dError);

// The server step of the two-phase allreduce in one kernel, onebit only
// (kUnsupported otherwise: the other codecs keep cudaDecode,
// cudaDecodeAccumulate, a division and cudaEncodeChunk). Piece j of the chunk
// lies at dPieces + j * pieceStride, j = 0..pieces-1 in rank order, each
// exactly pieceBytes, the encoded size of `count` elements with `spec`. The
// output is bit for bit what that unfused sequence gives: every element's
// value is the decoded piece 0 plus the decoded pieces 1.. in order (one
// rounded add each), divided by `pieces` when `average`, then encoded with
// error feedback from `server` at serverOffset (not committed: call
// cudaResidualCommit), raising its non-finite flag as cudaEncodeChunk does.
// A piece whose header is not the expected one raises *dError (when not null)
// and, as in the unfused sequence, makes the whole chunk NaN. No accumulator
// is needed: the pieces are read twice per element and nothing else is
// written but the output and the residual.
Status cudaServeChunk(const Spec& spec, const void* dPieces, size_t pieceStride, int pieces,
                      size_t pieceBytes, size_t count, bool average, const DeviceResidual& server,
                      size_t serverOffset, void* dOutput, size_t capacity, cudaStream_t stream,
                      size_t* bytes, int* dError);

}  // namespace squall::codec
