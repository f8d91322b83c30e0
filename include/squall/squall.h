/*
 * Squall: error-compensated 1-bit collectives for slow networks.
 *
 * This is the public C API (C99). Every function returns a squallResult_t;
 * outputs are written only when it is squallSuccess. On failure,
 * squallGetLastError() on the same thread returns a sentence that says what
 * went wrong and what to do about it.
 */
#ifndef SQUALL_SQUALL_H_
#define SQUALL_SQUALL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SQUALL_API __attribute__((visibility("default")))
#else
#define SQUALL_API
#endif

#define SQUALL_VERSION_MAJOR 0
#define SQUALL_VERSION_MINOR 1
#define SQUALL_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch, as returned by squallGetVersion. */
#define SQUALL_VERSION_CODE \
  (SQUALL_VERSION_MAJOR * 10000 + SQUALL_VERSION_MINOR * 100 + SQUALL_VERSION_PATCH)

typedef enum {
  squallSuccess = 0,
  squallInvalidArgument = 1, /* a NULL pointer, a bad size, an unknown enum value */
  squallInvalidUsage = 2,    /* arguments are each fine but do not fit together */
  squallUnsupported = 3,     /* not built in, or not available on this machine */
  squallOutOfMemory = 4,
  squallCorruptData = 5, /* an encoded buffer failed validation */
  squallSystemError = 6, /* the operating system refused (errno is in the message) */
  squallRemoteError = 7, /* a peer failed or misbehaved */
  squallTimeout = 8,
  squallInternalError = 9, /* a bug in Squall: please report it */
  squallInProgress = 10,   /* an asynchronous operation has not finished yet */
  squallNumResults = 11
} squallResult_t;

typedef enum {
  squallFloat32 = 0,
  squallFloat16 = 1,
  squallBfloat16 = 2,
  squallFloat64 = 3,
  squallInt32 = 4,
  squallInt64 = 5,
  squallNumDataTypes = 6
} squallDataType_t;

/* ---- Version and errors ------------------------------------------------ */

/* Writes SQUALL_VERSION_CODE of the loaded library. */
SQUALL_API squallResult_t squallGetVersion(int* version);

/* A short constant name for a result code ("invalid argument"). */
SQUALL_API const char* squallGetErrorString(squallResult_t result);

/* The message of the last failed call on this thread ("" when none). The
 * pointer stays valid until the next Squall call on this thread. */
SQUALL_API const char* squallGetLastError(void);

/* ---- Codecs ------------------------------------------------------------ */

typedef enum {
  squallCodecNone = 0,   /* fp32, 4 bytes per element */
  squallCodecOnebit = 1, /* block-scaled sign, 1 bit per element + 4 bytes per block */
  squallCodecFp16 = 2,   /* IEEE half, round to nearest even */
  squallCodecBf16 = 3,   /* bfloat16, round to nearest even */
  squallCodecInt8 = 4,   /* block-scaled int8, 1 byte per element + 4 bytes per block */
  squallNumCodecs = 5
} squallCodec_t;

typedef enum {
  squallScaleMeanAbs = 0, /* s = mean(|z|): the L2-optimal scale of a sign code */
  squallScaleRms = 1      /* s = ||z|| / sqrt(n): DeepSpeed's choice */
} squallScale_t;

typedef struct {
  squallCodec_t codec;
  squallScale_t scale; /* onebit only; ignored by the others */
  uint32_t blockSize;  /* onebit and int8: a power of two >= 64; others: ignored */
} squallCodecSpec_t;

#define SQUALL_DEFAULT_BLOCK_SIZE 2048u
#define SQUALL_CODEC_SPEC_ONEBIT \
  { squallCodecOnebit, squallScaleMeanAbs, SQUALL_DEFAULT_BLOCK_SIZE }

/* Parses "onebit", "onebit:block=4096", "onebit:scale=rms", "int8:block=256",
 * "fp16", "bf16" or "none" (options separated by ':'). */
SQUALL_API squallResult_t squallCodecSpecParse(const char* text, squallCodecSpec_t* spec);

/* Error-feedback state of one buffer: the part of past inputs that the codec
 * has not yet transmitted. It is added to the next input before encoding.
 * A call whose input holds a non-finite block leaves it untouched. */
typedef struct squallResidual* squallResidual_t;

SQUALL_API squallResult_t squallResidualCreate(size_t count, squallResidual_t* residual);
SQUALL_API squallResult_t squallResidualDestroy(squallResidual_t residual);
SQUALL_API squallResult_t squallResidualGetCount(squallResidual_t residual, size_t* count);
/* Sets every element to zero and clears the skip counter. */
SQUALL_API squallResult_t squallResidualReset(squallResidual_t residual);
/* Copies the current values out of / into the residual (checkpointing). */
SQUALL_API squallResult_t squallResidualRead(squallResidual_t residual, float* values,
                                             size_t count);
SQUALL_API squallResult_t squallResidualWrite(squallResidual_t residual, const float* values,
                                              size_t count);
/* Calls that left the residual untouched because their input was not finite. */
SQUALL_API squallResult_t squallResidualGetSkipped(squallResidual_t residual, uint64_t* calls);

/* Exact size in bytes of `count` elements encoded with `spec` (header included). */
SQUALL_API squallResult_t squallEncodedSize(const squallCodecSpec_t* spec, size_t count,
                                            size_t* bytes);

/* Encodes `count` elements of `input` (fp32, fp16 or bf16) into `output`.
 * With a residual (created for exactly `count` elements), its values are added
 * to the input first and it is updated with what the encoding lost. `output`
 * must hold squallEncodedSize bytes and must not overlap `input`. */
SQUALL_API squallResult_t squallEncode(const squallCodecSpec_t* spec, const void* input,
                                       squallDataType_t dtype, size_t count,
                                       squallResidual_t residual, void* output, size_t capacity,
                                       size_t* written);

/* Decodes an encoded buffer of `bytes` bytes into `count` fp32 values; the
 * element count recorded in the buffer must equal `count`. */
SQUALL_API squallResult_t squallDecode(const void* input, size_t bytes, float* output,
                                       size_t count);

/* Like squallDecode, but adds the decoded values into `accumulator`. */
SQUALL_API squallResult_t squallDecodeAccumulate(const void* input, size_t bytes,
                                                 float* accumulator, size_t count);

/* Reads the header of an encoded buffer: its codec and element count. */
SQUALL_API squallResult_t squallEncodedInspect(const void* input, size_t bytes,
                                               squallCodecSpec_t* spec, size_t* count);

/* The CPU implementation in use: "scalar", "avx2" or "avx512". SQUALL_CODEC_ISA
 * selects a lower one. */
SQUALL_API const char* squallCodecImplementation(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SQUALL_SQUALL_H_ */
