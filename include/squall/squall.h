/*
 * Squall: error-compensated 1-bit collectives for slow networks.
 *
 * This is the public C API (C99). Every function returns a squallResult_t;
 * outputs are written only when it is squallSuccess, except where a
 * collective below says "On failure" (its output may then be partial). On
 * failure, squallGetLastError() on the same thread returns a sentence that
 * says what went wrong and what to do about it.
 *
 * A collective called with a NULL communicator is refused at once. When the
 * calling thread holds exactly one communicator (made on it, not destroyed)
 * and no squallCommSplit on it has returned NULL, the call is counted as
 * skipped: the next collective or optimizer step that thread runs on its
 * communicator first fails the skipped operation for the peers (so they stop
 * waiting and every rank's calls line up again), then runs. Otherwise the
 * communicator it was meant for is unknown (a NULL from squallCommSplit,
 * SQUALL_SPLIT_NOCOLOR, is one the peers do not expect calls on) and it is
 * not counted.
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

/* What this build of the library has, as a bitwise OR of
 * squallCapability_t. A capability says the code is there; whether a GPU,
 * an NCCL or UCX is present is decided when a call needs it. */
typedef enum {
  squallCapabilityDevice = 1, /* CUDA kernels and communicators from NCCL */
  squallCapabilityUcx = 2,    /* the UCX transport (libucp is opened at run time) */
} squallCapability_t;
SQUALL_API squallResult_t squallGetCapabilities(unsigned* capabilities);

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
  squallCodecInt2 = 5,   /* block-scaled ternary (-s, 0, +s; s = max|z|), 2 bits per element
                            + 4 bytes per block */
  squallCodecInt4 = 6,   /* block-scaled int4 (-7..7), 4 bits per element + 4 bytes per block */
  squallNumCodecs = 7
} squallCodec_t;

typedef enum {
  squallScaleMeanAbs = 0, /* s = mean(|z|): the L2-optimal scale of a sign code */
  squallScaleRms = 1      /* s = ||z|| / sqrt(n): DeepSpeed's choice */
} squallScale_t;

typedef struct {
  squallCodec_t codec;
  squallScale_t scale; /* onebit only; ignored by the others */
  uint32_t blockSize;  /* onebit, int2, int4, int8: a power of two >= 64; others: ignored */
} squallCodecSpec_t;

#define SQUALL_DEFAULT_BLOCK_SIZE 2048u
#define SQUALL_CODEC_SPEC_ONEBIT \
  { squallCodecOnebit, squallScaleMeanAbs, SQUALL_DEFAULT_BLOCK_SIZE }

/* Parses "onebit", "onebit:block=4096", "onebit:scale=rms", "int2", "int4",
 * "int8:block=256", "fp16", "bf16" or "none" (options separated by ':'). */
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

/* ---- Communicators ------------------------------------------------------ */

typedef enum {
  squallSum = 0,
  squallAvg = 1, /* sum / nranks (integers: truncating division) */
  squallMin = 2,
  squallMax = 3,
  squallNumRedOps = 4
} squallRedOp_t;

typedef enum {
  squallTransportDefault = 0, /* SQUALL_TRANSPORT, else ucx when built in and every
                                 rank can load it, else tcp */
  squallTransportUcx = 1,
  squallTransportTcp = 2,
  squallTransportMpi = 3 /* only through squallCommInitFromMpi */
} squallTransport_t;

/* Rendezvous information: the root's address and a random job secret. Create
 * it on one rank, send it to the others (e.g. with a broadcast of your
 * launcher), and pass it to squallCommInitRank everywhere. */
#define SQUALL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[SQUALL_UNIQUE_ID_BYTES];
} squallUniqueId;

typedef struct {
  size_t size;                 /* sizeof(squallConfig_t) */
  squallTransport_t transport; /* data plane */
  int timeoutSeconds;          /* 0: SQUALL_TIMEOUT_S */
} squallConfig_t;
#define SQUALL_CONFIG_INIT \
  { sizeof(squallConfig_t), squallTransportDefault, 0 }

typedef struct squallComm* squallComm_t;

SQUALL_API squallResult_t squallGetUniqueId(squallUniqueId* id);
/* Collective over the nranks ranks; config may be NULL. */
SQUALL_API squallResult_t squallCommInitRank(squallComm_t* comm, int nranks, squallUniqueId id,
                                             int rank, const squallConfig_t* config);
/* torchrun / launcher style: MASTER_ADDR, MASTER_PORT (+ SQUALL_PORT_OFFSET) or
 * SQUALL_PORT, RANK, WORLD_SIZE. */
SQUALL_API squallResult_t squallCommInitFromEnv(squallComm_t* comm, const squallConfig_t* config);
/* Runs over an existing MPI communicator: `mpiComm` points to an MPI_Comm of
 * the MPI the process has loaded, which must be Open MPI (libmpi.so.40; found
 * at run time, SQUALL_MPI_LIBRARY when none is loaded). squallUnsupported when
 * Squall was built without MPI, or when that MPI is not Open MPI or cannot be
 * found. */
SQUALL_API squallResult_t squallCommInitFromMpi(squallComm_t* comm, const void* mpiComm,
                                                const squallConfig_t* config);
/* Ranks with the same color form a new communicator, ordered by (key, rank).
 * color SQUALL_SPLIT_NOCOLOR (negative) takes part but gets *newcomm = NULL. */
#define SQUALL_SPLIT_NOCOLOR (-1)
SQUALL_API squallResult_t squallCommSplit(squallComm_t comm, int color, int key,
                                          squallComm_t* newcomm);
SQUALL_API squallResult_t squallCommDestroy(squallComm_t comm);
SQUALL_API squallResult_t squallCommRank(squallComm_t comm, int* rank);
SQUALL_API squallResult_t squallCommSize(squallComm_t comm, int* size);
/* "ucx", "tcp", "mpi", ... */
SQUALL_API squallResult_t squallCommTransport(squallComm_t comm, const char** name);

/* What this rank has handed to the transport over the communicator's
 * lifetime, every collective included (counted where each message is posted,
 * so it is exact for any algorithm). A communicator from NCCL counts nothing
 * and returns squallUnsupported. */
typedef struct {
  uint64_t operations;    /* collectives started */
  uint64_t bytesSent;     /* payload bytes sent by this rank, headers included */
  uint64_t bytesReceived; /* payload bytes received by this rank */
} squallCommStats_t;
SQUALL_API squallResult_t squallCommGetStats(squallComm_t comm, squallCommStats_t* stats);

/* Full-precision collectives on host buffers. sendbuf may equal recvbuf for
 * allreduce; every rank must call the same collectives in the same order.
 * On failure (a peer died, the deadline passed, ranks disagree), an
 * allreduce above SQUALL_ALLREDUCE_SMALL_BYTES may leave recvbuf holding a
 * copy of sendbuf or partial sums (in place: the input is lost); below it,
 * recvbuf is untouched. */
SQUALL_API squallResult_t squallAllReduce(const void* sendbuf, void* recvbuf, size_t count,
                                          squallDataType_t dtype, squallRedOp_t op,
                                          squallComm_t comm);
/* recvbuf holds nranks * sendcount elements, in rank order. Ranks that
 * disagree on the count or type fail before recvbuf is written. On failure
 * during the exchange (a peer died, the deadline passed), recvbuf may hold
 * the blocks received so far when it is larger than 64 KiB; up to 64 KiB it
 * is untouched. squallAllToAll behaves the same. */
SQUALL_API squallResult_t squallAllGather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                          squallDataType_t dtype, squallComm_t comm);
/* Block j (count elements) of sendbuf goes to rank j. */
SQUALL_API squallResult_t squallAllToAll(const void* sendbuf, void* recvbuf, size_t count,
                                         squallDataType_t dtype, squallComm_t comm);
/* On failure, a non-root rank's buffer may hold part of the root's data. */
SQUALL_API squallResult_t squallBroadcast(void* buffer, size_t count, squallDataType_t dtype,
                                          int root, squallComm_t comm);
SQUALL_API squallResult_t squallBarrier(squallComm_t comm);

/* The error-compensated compressed allreduce of one buffer. A compressor holds
 * the buffer's error-feedback residuals between calls: create one per buffer
 * (per parameter group), on every rank, with the same count and codec. */
typedef struct squallCompressor* squallCompressor_t;

typedef struct {
  uint64_t calls;         /* compressed allreduces (or reduce-scatters) run */
  uint64_t skippedCalls;  /* calls whose residuals were kept: non-finite input */
  uint64_t bytesSent;     /* by this rank, last call, headers included */
  uint64_t bytesReceived; /* by this rank, last call */
} squallCompressorStats_t;

SQUALL_API squallResult_t squallCompressorCreate(squallComm_t comm, size_t count,
                                                 const squallCodecSpec_t* spec,
                                                 squallCompressor_t* compressor);
/* The same for a buffer that is one piece of a longer sequence (a call of a
 * fused step): its element 0 is `phase` elements (below the codec's block)
 * into one of the sequence's codec blocks, so its blocks are the sequence's
 * wherever it begins. Host communicators with the flat layout honour the
 * phase; the hierarchical layout and communicators from NCCL keep the
 * buffer's own blocks. */
SQUALL_API squallResult_t squallCompressorCreateAt(squallComm_t comm, size_t count, size_t phase,
                                                   const squallCodecSpec_t* spec,
                                                   squallCompressor_t* compressor);
/* A compressor for the compressed reduce-scatter of nranks x recvcount
 * elements (squallCompressedReduceScatter), on every rank with the same
 * recvcount and codec: its residual covers the whole input. It runs the
 * reduce-scatter only, and one from squallCompressorCreate the allreduce
 * only (squallInvalidUsage otherwise). On a communicator from NCCL its
 * residual lives in device memory (squallCompressedReduceScatterOnStream). */
SQUALL_API squallResult_t squallCompressorCreateReduceScatter(squallComm_t comm, size_t recvcount,
                                                              const squallCodecSpec_t* spec,
                                                              squallCompressor_t* compressor);
/* A compressor for the quantized all-gather of sendcount elements per rank
 * (squallCompressedAllGather: sharded data parallel's parameter gathers),
 * on every rank with the same sendcount and a compressed code (not none).
 * It keeps no residual: what is gathered is a copy of values each rank keeps
 * exactly (its parameter shard), so error feedback has nothing to carry. */
SQUALL_API squallResult_t squallCompressorCreateAllGather(squallComm_t comm, size_t sendcount,
                                                          const squallCodecSpec_t* spec,
                                                          squallCompressor_t* compressor);
SQUALL_API squallResult_t squallCompressorDestroy(squallCompressor_t compressor);
/* Zeroes the residuals (e.g. after loading parameters from elsewhere). */
SQUALL_API squallResult_t squallCompressorReset(squallCompressor_t compressor);
SQUALL_API squallResult_t squallCompressorGetStats(squallCompressor_t compressor,
                                                   squallCompressorStats_t* stats);

/* How a compressor's allreduce chooses between its two algorithms, the
 * two-phase one (a compressed reduce-scatter, then an all-gather of the
 * reduced chunks: 2 (n-1)/n encodings sent per rank) and the all-gather one
 * (one round: n-1 encodings). squallCompressorAlgoTime, the default: the
 * communicator's alpha-beta time model, or SQUALL_COMPRESSED_ALGO where that
 * names an algorithm. squallCompressorAlgoBytes: the one that sends fewer
 * bytes (two-phase from 3 ranks on), for traffic that is rare or overlapped
 * with compute, where the extra round costs nothing. TwoPhase and AllGather
 * fix the algorithm (over the variable). Set it alike on every rank, before
 * a call or between calls. A reduce-scatter compressor has one algorithm
 * and takes Time and Bytes only; one of a communicator from NCCL runs
 * two-phase and refuses AllGather (squallInvalidUsage). */
typedef enum {
  squallCompressorAlgoBytes = 0,
  squallCompressorAlgoTwoPhase = 1,
  squallCompressorAlgoAllGather = 2,
  squallCompressorAlgoTime = 3,
} squallCompressorAlgo_t;
SQUALL_API squallResult_t squallCompressorSetAlgorithm(squallCompressor_t compressor,
                                                       squallCompressorAlgo_t algorithm);
/* The code the two-phase allreduce's second round sends: each rank's reduced
 * chunk is re-encoded with it (and its own error feedback) for the
 * all-gather. Default: the compressor's own code. A wider one behind a
 * narrow code (int8 behind int4: 2 (n-1)/n x 6.1 bits per element instead
 * of 4.1) keeps the second encoding's error small, and the bytes choice
 * (squallCompressorAlgoBytes) counts it. Set it alike on every rank,
 * before a call or between calls; a compressed code only (squallCodecNone is
 * squallInvalidArgument). A reduce-scatter compressor has no all-gather
 * (squallInvalidUsage). One of a communicator from NCCL takes it before
 * its first call only (its device buffers are sized for it; later:
 * squallInvalidUsage). */
SQUALL_API squallResult_t squallCompressorSetGatherCodec(squallCompressor_t compressor,
                                                         const squallCodecSpec_t* spec);

/* Checkpoints: the compressor's residuals on this rank (the error it still
 * owes), as a self-describing byte string, so a resumed job sends what the
 * stopped one would have. Call when no call on the compressor is in flight;
 * each rank saves and loads its own. StateSize gives the bytes SaveState
 * writes (`written`). LoadState takes only a state of this rank, group size,
 * layout, count, phase and codec (squallInvalidArgument naming the
 * difference otherwise) and checks its length and checksum
 * (squallCorruptData); on any failure the residuals are untouched. On a
 * communicator from NCCL the residuals are copied through host memory after
 * the stream the compressor last ran on has finished (not on a stream being
 * captured); its states have the host layout, so one saved there loads on a
 * host communicator of the same shape and the other way round. */
SQUALL_API squallResult_t squallCompressorStateSize(squallCompressor_t compressor, size_t* bytes);
SQUALL_API squallResult_t squallCompressorSaveState(squallCompressor_t compressor, void* buffer,
                                                    size_t capacity, size_t* written);
SQUALL_API squallResult_t squallCompressorLoadState(squallCompressor_t compressor,
                                                    const void* buffer, size_t bytes);

/* dtype: fp32, fp16 or bf16 (for both buffers); op: squallSum or squallAvg.
 * Every rank ends with bit-identical output. On failure recvbuf and the
 * compressor's residuals are untouched (also for the Async form and, on a
 * host communicator, the OnStream form). */
SQUALL_API squallResult_t squallCompressedAllReduce(const void* sendbuf, void* recvbuf,
                                                    squallDataType_t dtype, squallRedOp_t op,
                                                    squallCompressor_t compressor,
                                                    squallComm_t comm);

/* The error-compensated compressed reduce-scatter (sharded data parallel):
 * sendbuf holds nranks x recvcount elements, rank r's piece at
 * r x recvcount; rank r's recvbuf receives the sum of every rank's piece r
 * (squallAvg: divided by nranks), each piece encoded on its own with the
 * compressor's residual (so recvcount need not be a multiple of the codec's
 * block) and the pieces summed in rank order: the same bytes run to run.
 * recvcount must be the compressor's (squallCompressorCreateReduceScatter).
 * dtype: fp32, fp16 or bf16 (for both buffers). recvbuf may be rank r's piece
 * of sendbuf (in place). Each rank sends about (nranks - 1) / nranks of the
 * encoded input. A non-finite input gives NaN in the outputs it reaches and
 * leaves every rank's residual as it was; one rank copies its input. On
 * failure recvbuf and the residual are untouched (also for the Async form).
 * Host buffers on a host communicator; device buffers:
 * squallCompressedReduceScatterOnStream. */
SQUALL_API squallResult_t squallCompressedReduceScatter(const void* sendbuf, void* recvbuf,
                                                        size_t recvcount, squallDataType_t dtype,
                                                        squallRedOp_t op,
                                                        squallCompressor_t compressor,
                                                        squallComm_t comm);

/* The quantized all-gather: each rank encodes its sendcount elements once
 * with the compressor's code, the encodings are all-gathered, and every rank
 * decodes all of them, its own included, into recvbuf (nranks x sendcount,
 * rank r's at r x sendcount), so every rank holds the same values. sendcount
 * must be the compressor's; dtype fp32, fp16 or bf16 (both buffers); sendbuf
 * may be this rank's piece of recvbuf (in place). Each rank sends (nranks -
 * 1) encodings. On failure recvbuf is untouched. Host buffers on a host
 * communicator; device buffers: ...OnStream (on a communicator from NCCL on
 * the stream, capturable; on a host one staged through pinned memory). */
SQUALL_API squallResult_t squallCompressedAllGather(const void* sendbuf, void* recvbuf,
                                                    size_t sendcount, squallDataType_t dtype,
                                                    squallCompressor_t compressor,
                                                    squallComm_t comm);
SQUALL_API squallResult_t squallCompressedAllGatherOnStream(const void* sendbuf, void* recvbuf,
                                                            size_t sendcount,
                                                            squallDataType_t dtype,
                                                            squallCompressor_t compressor,
                                                            squallComm_t comm, void* cudaStream);

/* Asynchronous forms: the operation runs in the background, in call order
 * with the other operations of the communicator; buffers must stay valid
 * until it has completed. squallTest polls; squallWait blocks, returns the
 * operation's result and frees the request. */
typedef struct squallRequest* squallRequest_t;

SQUALL_API squallResult_t squallAllReduceAsync(const void* sendbuf, void* recvbuf, size_t count,
                                               squallDataType_t dtype, squallRedOp_t op,
                                               squallComm_t comm, squallRequest_t* request);
SQUALL_API squallResult_t squallCompressedAllReduceAsync(const void* sendbuf, void* recvbuf,
                                                         squallDataType_t dtype, squallRedOp_t op,
                                                         squallCompressor_t compressor,
                                                         squallComm_t comm,
                                                         squallRequest_t* request);
SQUALL_API squallResult_t squallCompressedReduceScatterAsync(
    const void* sendbuf, void* recvbuf, size_t recvcount, squallDataType_t dtype, squallRedOp_t op,
    squallCompressor_t compressor, squallComm_t comm, squallRequest_t* request);
SQUALL_API squallResult_t squallTest(squallRequest_t request, int* done);
SQUALL_API squallResult_t squallWait(squallRequest_t request);

/* ---- GPU (CUDA) buffers ------------------------------------------------- */

/* These need Squall built with CUDA and NCCL; otherwise they return
 * squallUnsupported. No device code of them has run on hardware yet (see
 * docs/cuda.md). */

/* Wraps an existing NCCL communicator: `ncclComm` is the ncclComm_t itself
 * (a pointer), cast to void*. It is not owned: destroy the squallComm before
 * ncclCommDestroy. Such a communicator runs squallCompressedAllReduceOnStream
 * (and squallCommRank/Size, squallCompressorCreate/Reset/GetStats/Destroy);
 * use NCCL directly for uncompressed collectives. */
SQUALL_API squallResult_t squallCommInitFromNccl(squallComm_t* comm, void* ncclComm);

/* The compressed allreduce of device buffers, enqueued on `cudaStream` (a
 * cudaStream_t cast to void*; NULL is the legacy default stream).
 *  - On a communicator from squallCommInitFromNccl everything runs on the
 *    stream (codec kernels, NCCL send/recv and all-gather); the call does not
 *    wait for the device and may be captured into a CUDA graph. The
 *    compressor's state lives in device memory. Outputs are bit-identical to
 *    the host algorithm's.
 *  - On a host communicator (UCX, TCP, MPI) the buffers are staged through
 *    pinned host memory: copy to the host on the stream, synchronise the
 *    stream, run squallCompressedAllReduce, copy back on the stream and
 *    synchronise again. Not capturable.
 * dtype: fp32, fp16 or bf16; op: squallSum or squallAvg. sendbuf may equal
 * recvbuf. On failure, recvbuf is untouched on a host communicator and may be
 * partial on one from NCCL (the work was already on the stream). */
SQUALL_API squallResult_t squallCompressedAllReduceOnStream(const void* sendbuf, void* recvbuf,
                                                            squallDataType_t dtype,
                                                            squallRedOp_t op,
                                                            squallCompressor_t compressor,
                                                            squallComm_t comm, void* cudaStream);

/* The compressed reduce-scatter of device buffers (as
 * squallCompressedReduceScatter), enqueued on `cudaStream` the way
 * squallCompressedAllReduceOnStream is: on a communicator from NCCL entirely
 * on the stream (capturable; the n non-finite flags travel in one NCCL
 * all-gather of an int per rank, so every rank keeps its residual when any
 * rank's input was not finite), with the same bits as the host algorithm;
 * on a host communicator staged through pinned host memory. recvcount must
 * be the compressor's (squallCompressorCreateReduceScatter); recvbuf may be
 * this rank's piece of sendbuf. On failure, recvbuf is untouched on a host
 * communicator and may be partial on one from NCCL. */
SQUALL_API squallResult_t squallCompressedReduceScatterOnStream(
    const void* sendbuf, void* recvbuf, size_t recvcount, squallDataType_t dtype, squallRedOp_t op,
    squallCompressor_t compressor, squallComm_t comm, void* cudaStream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SQUALL_SQUALL_H_ */
